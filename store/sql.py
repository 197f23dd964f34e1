"""One ``Store`` for SQLite and PostgreSQL on SQLAlchemy 2 Core.

Every write transaction of a master starts with the *fence*: an UPDATE of the
group's row guarded by ``epoch = :mine`` that must touch exactly one row. It
proves the epoch and takes the row lock that serialises against a new master's
``claim_epoch``. Under READ COMMITTED (PostgreSQL's default):

* fence first: the claim's ``UPDATE amq_groups`` waits for our row lock; when
  we commit, PostgreSQL re-reads the row for the claim (EvalPlanQual), so the
  claim counts our batch and the new master's later reads see our rows;
* claim first: our fence waits for the claim's row lock, re-reads the row,
  finds a new epoch, touches 0 rows, and we roll back with ``Fenced``.

On SQLite every write transaction is ``BEGIN IMMEDIATE``: one writer at a
time for the whole file, so the same two outcomes hold.

Dequeue and FOR UPDATE SKIP LOCKED: DESIGN.md asks for SKIP LOCKED "where the
backend has it". We deliberately do not use it. SKIP LOCKED is for many
competing consumers; here one fenced master reads, on the same thread that
writes, and pages with an id cursor. The only rows another transaction could
lock are those of a deposed master's last transaction; skipping them would
move the cursor past them and lose them until the next activation, while a
plain READ COMMITTED SELECT returns their committed state without waiting.
FOR UPDATE would also dirty every page it reads.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import sqlite3
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import psycopg
from sqlalchemy import (
    ARRAY,
    BigInteger,
    Connection,
    Engine,
    all_,
    and_,
    any_,
    bindparam,
    case,
    create_engine,
    delete,
    event,
    exists,
    func,
    insert,
    inspect,
    select,
    text,
    update,
)
from sqlalchemy.dialects import postgresql as pg_dialect
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.exc import SQLAlchemyError, StatementError
from sqlalchemy.pool import QueuePool

from lockers.connections.errors import one_line
from lockers.connections.postgres import (
    STORE_IDLE_IN_TRANSACTION_TIMEOUT_MS,
    STORE_POOL_TUNING,
    STORE_STATEMENT_TIMEOUT_MS,
    server_options,
)
from store import pg_batch, schema
from store.api import (
    Batch,
    BatchResult,
    DeletedDestination,
    DestinationRow,
    Fenced,
    Integrity,
    NewMessage,
    Recovery,
    Ref,
    Store,
    StoredMessage,
    StoreError,
    StoreRejected,
    StoreUnusable,
    SubscriptionRow,
)
from store.url import StoreURL, parse_store_url

log = logging.getLogger(__name__)

T = TypeVar("T")

# -- limits and defaults ---------------------------------------------------

#: Ids per ``IN (...)`` list on SQLite: before 3.32 it allowed 999 host
#: parameters per statement; 500 leaves room for the others.
IN_CHUNK = 500
#: Ids per ``= ANY(:array)`` on PostgreSQL. One array parameter keeps one
#: statement shape (psycopg prepares it once, and the planner uses the primary
#: key; a long IN list of parameters got a worse plan, 4 ms for 64 keys). The
#: bound only caps a statement's size: the committer's MAX_BATCH_OPS fits.
ARRAY_CHUNK = 5000
#: Connections per store: the committer thread, plus the background integrity
#: check and registry heartbeats, which may run on other threads.
POOL_SIZE = 2
POOL_OVERFLOW = 2
#: How long a thread waits for a pooled connection before giving up (s).
POOL_TIMEOUT_S = 10.0
#: The pool's libpq keepalives, connect timeout and server-side statement and
#: idle-in-transaction timeouts (STORE_*) live in lockers.connections.postgres, beside the
#: lock session's, with the reason they differ.
#: The integrity check counts every row: allow it 10 minutes (0 = no limit).
INTEGRITY_STATEMENT_TIMEOUT_MS = 600_000
#: SQLite: how long a writer waits for another process's write lock (ms).
#: Writes are short; 10 s is far beyond a healthy wait.
SQLITE_BUSY_TIMEOUT_MS = 10_000
#: How long open() retries a SQLite file that is busy being created by another
#: broker, and how long it pauses between tries (s).
SQLITE_OPEN_RETRY_S = 10.0
SQLITE_OPEN_RETRY_PAUSE_S = 0.05
#: UPDATE/DELETE ... RETURNING appeared in SQLite 3.35 (2021).
SQLITE_MIN_VERSION = (3, 35, 0)
#: Registry rows older than this are left out by ``read_registry`` (ms): a
#: node heartbeats every few seconds, so 30 s means it is gone.
REGISTRY_MAX_AGE_MS = 30_000
#: How long a schema upgrade's ALTER TABLE waits for its table lock on PostgreSQL
#: (ms): a healthy master holds it for a commit's milliseconds; the ALTER blocks
#: the table for everyone while it waits, so it should not wait 15 s.
UPGRADE_LOCK_TIMEOUT_MS = 2_000
#: The two-int advisory lock key serialising schema creation: "amql", 1. The
#: two-int key space is separate from pg_advisory_lock(bigint) used by lockers.
SCHEMA_LOCK_KEY = (0x616D716C, 1)
APPLICATION_NAME = "amqlite-store"
#: PostgreSQL truncates application_name to NAMEDATALEN - 1 bytes.
APPLICATION_NAME_MAX = 63
#: How long a claim waits for the group row before it looks for a deposed
#: master's session holding it (a paused process can hold it indefinitely:
#: idle_in_transaction_session_timeout does not fire while a message is half
#: read). A healthy batch holds the row for milliseconds.
CLAIM_LOCK_TIMEOUT_MS = 1_000
#: Claims attempted (terminating stale sessions in between) before giving up.
CLAIM_ATTEMPTS = 5
#: SQLSTATE lock_not_available (lock_timeout expired).
LOCK_NOT_AVAILABLE = "55P03"
#: PostgreSQL plans a never-analyzed table as if it held a row or two: the
#: dedup lookup then filters the group's whole window instead of probing the
#: primary key (5 ms instead of 0.3 ms per batch of 64 keys, growing with the
#: window). Autovacuum analyzes a new table only a minute or more later, so we
#: ANALYZE the hot tables once ourselves, after this many inserts, if nobody has.
ANALYZE_AFTER_ROWS = 1000
HOT_TABLES = ("amq_messages", "amq_dedup", "amq_sub_pending")


def _add_subscription_owner(conn: Connection) -> None:
    """v1 -> v2: ``amq_subscriptions.owner``. Existing rows keep NULL (no owner
    known): the first login that uses such a subscription becomes its owner."""
    _add_column(conn, schema.subscriptions.c.owner)


def _add_column(conn: Connection, column: Any) -> None:
    """ALTER TABLE ... ADD COLUMN unless it is there (a store a newer amqlite
    began to upgrade, or a table ``create_all`` has just made with it). Both
    SQLite and PostgreSQL add a nullable column without rewriting the table."""
    table = column.table.name
    if column.name in {c["name"] for c in inspect(conn).get_columns(table)}:
        return
    if conn.dialect.name == "postgresql":
        # While ALTER waits for its lock, every other use of the table queues behind
        # it (a running master's commits too): give up soon; the node retries opening.
        conn.execute(text(f"SET LOCAL lock_timeout = {UPGRADE_LOCK_TIMEOUT_MS}"))
    ddl = column.type.compile(dialect=conn.dialect)
    conn.execute(text(f'ALTER TABLE {table} ADD COLUMN "{column.name}" {ddl}'))


#: Schema upgrades: ``UPGRADES[v](conn)`` turns a version-v store into v+1. It
#: runs inside the schema lock's transaction (advisory xact lock on
#: PostgreSQL, BEGIN IMMEDIATE on SQLite), after ``create_all`` has added any
#: new tables, so nodes starting at once upgrade one after the other and the
#: later ones find the new version. Version 1 was the first.
UPGRADES: dict[int, Callable[[Connection], None]] = {1: _add_subscription_owner}


def _now_ms() -> int:
    return int(time.time() * 1000)


def _chunks(seq: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for i in range(0, len(seq), size):
        yield seq[i : i + size]


#: Headers as compact JSON; one encoder, not one per call as json.dumps with
#: arguments would build.
_encode_headers = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


#: SQLSTATE classes that blame the data, not the server: 22 data exception
#: (string too long, numeric out of range, untranslatable character, ...) and
#: 23 integrity constraint violation.
REJECTED_SQLSTATE_CLASSES = ("22", "23")


def _is_rejection(exc: BaseException) -> bool:
    """True when ``exc`` says the store refused the data, not that it is gone.

    A driver refuses some values before they leave Python: sqlite3 raises
    OverflowError for an int past 2**63, psycopg a DataError without SQLSTATE
    for a NUL in text, both UnicodeEncodeError for a lone surrogate (a
    ValueError). Errors SQLAlchemy raised for a DBAPI error (DBAPIError) or
    for a bound value (StatementError) are judged by what they wrap."""
    if isinstance(exc, StatementError):  # DBAPIError included (a subclass)
        return exc.orig is not None and _is_rejection(exc.orig)
    if isinstance(exc, (OverflowError, ValueError)):
        return True
    if isinstance(exc, (sqlite3.DataError, sqlite3.IntegrityError)):
        return True
    if isinstance(exc, psycopg.Error):
        state = exc.sqlstate
        if state is None:  # refused in psycopg itself, before the server saw it
            return isinstance(exc, psycopg.DataError)
        return state[:2] in REJECTED_SQLSTATE_CLASSES and state != pg_batch.FENCED_SQLSTATE
    return False


#: What a PostgreSQL server says while it cannot take connections *yet*: these
#: are worth waiting for; any other FATAL at connect time is final.
TRANSIENT_CONNECT_ERRORS = (
    "the database system is starting up",
    "the database system is shutting down",
    "the database system is in recovery mode",
    "too many connections",
    "remaining connection slots are reserved",
    "terminating connection due to administrator command",
)
#: SQLSTATE classes that opening a store will meet again however often it retries:
#: 28 invalid authorization, 42 access rule violation (42501 insufficient_privilege:
#: a role that does not own the tables cannot ALTER them for a schema upgrade).
PERMANENT_SQLSTATE_CLASSES = ("28", "42")
#: What SQLite says when the file cannot be used at all (permissions, a directory).
SQLITE_PERMANENT_ERRORS = (
    "unable to open database file",
    "attempt to write a readonly database",
    "file is not a database",
)


def _is_permanent(exc: StoreError) -> bool:
    """True when opening failed because of what the settings name (no such
    database or role, a refused password, an unwritable file), not because the
    server is not there yet. psycopg gives no SQLSTATE for a refused connection,
    so the server's FATAL message is what tells."""
    cause = exc.__cause__
    orig = getattr(cause, "orig", None) or cause
    if isinstance(orig, sqlite3.Error):
        text_ = str(orig).lower()
        return any(m in text_ for m in SQLITE_PERMANENT_ERRORS)
    if isinstance(orig, psycopg.OperationalError):
        text_ = str(orig)
        if "FATAL:" not in text_:
            return False  # refused, timed out, unresolvable: the network, not the settings
        return not any(m in text_ for m in TRANSIENT_CONNECT_ERRORS)
    if isinstance(orig, psycopg.Error) and orig.sqlstate is not None:
        # A role that may not create or upgrade the schema: retrying changes nothing.
        return orig.sqlstate.startswith(PERMANENT_SQLSTATE_CLASSES)
    return False


def _store_error(description: str, what: str, exc: BaseException) -> StoreError:
    """``StoreRejected`` or ``StoreError`` for a failed ``what``, caused by ``exc``."""
    cls = StoreRejected if _is_rejection(exc) else StoreError
    err = cls(f"{description}: {what} failed: {one_line(exc)}")
    err.__cause__ = exc
    return err


def _retry_while_locked(engine: Engine, sqlite: bool, fn: Callable[[], T]) -> T:
    """``fn()``, retried on a fresh connection for up to ``SQLITE_OPEN_RETRY_S``
    while SQLite answers "database is locked" (``fn`` raises ``StoreError``) without
    waiting: brokers opening a new file at once (switching it to WAL needs the file
    to itself), or a reader while a broker creates it."""
    deadline = time.monotonic() + SQLITE_OPEN_RETRY_S
    while True:
        try:
            return fn()
        except StoreError as exc:
            locked = sqlite and "database is locked" in str(exc)
            if not locked or time.monotonic() > deadline:
                raise
            engine.dispose()
            time.sleep(SQLITE_OPEN_RETRY_PAUSE_S)


def _greatest(col: Any, value: Any) -> Any:
    """greatest() that both dialects understand."""
    return case((col > value, col), else_=value)


def store_application_name(group: str) -> str:
    """``application_name`` of a group's store sessions, so a new master can find
    the sessions of a deposed one. PostgreSQL keeps 63 bytes: a long group name
    is shortened with a hash so two groups never share a name."""
    name = f"{APPLICATION_NAME}:{group}"
    if len(name.encode()) <= APPLICATION_NAME_MAX:
        return name
    digest = hashlib.blake2b(group.encode(), digest_size=6).hexdigest()
    return f"{APPLICATION_NAME}:{group[:30]}~{digest}"


def _is_lock_timeout(exc: BaseException) -> bool:
    cause: BaseException | None = exc
    while cause is not None:
        if getattr(cause, "sqlstate", None) == LOCK_NOT_AVAILABLE:
            return True
        cause = cause.__cause__ or getattr(cause, "orig", None)
    return False


def _make_engine(parsed: StoreURL, opts: dict[str, Any]) -> Engine:
    """An engine for one store; ``opts`` override the module's defaults."""
    pool = {
        "poolclass": QueuePool,
        "pool_size": opts.get("pool_size", POOL_SIZE),
        "max_overflow": opts.get("max_overflow", POOL_OVERFLOW),
        "pool_timeout": opts.get("pool_timeout", POOL_TIMEOUT_S),
    }
    if parsed.dialect == "sqlite":
        return _make_sqlite_engine(parsed, opts, pool)
    query = parsed.url.query
    statement_timeout = opts.get("statement_timeout_ms", STORE_STATEMENT_TIMEOUT_MS)
    idle_timeout = opts.get("idle_in_transaction_timeout_ms",
                            STORE_IDLE_IN_TRANSACTION_TIMEOUT_MS)
    # A RECEIPT promises the message survives a crash: never inherit a server or
    # role default of synchronous_commit = off.
    server = "-c synchronous_commit=on " + server_options(statement_timeout, idle_timeout)
    defaults: dict[str, Any] = {
        **STORE_POOL_TUNING.libpq(),
        "connect_timeout": opts.get("connect_timeout_s", STORE_POOL_TUNING.connect_timeout),
        "application_name": opts.get("application_name", APPLICATION_NAME),
    }
    connect_args = {k: v for k, v in defaults.items() if k not in query}
    user_options = query.get("options")
    connect_args["options"] = f"{user_options} {server}" if user_options else server
    return create_engine(parsed.url, connect_args=connect_args, **pool)


def _make_sqlite_engine(parsed: StoreURL, opts: dict[str, Any], pool: dict[str, Any]) -> Engine:
    if sqlite3.sqlite_version_info < SQLITE_MIN_VERSION:
        raise StoreError(
            f"SQLite {sqlite3.sqlite_version} is too old: amqlite needs "
            f"{'.'.join(map(str, SQLITE_MIN_VERSION))} or newer"
        )
    assert parsed.path is not None
    try:
        parsed.path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise StoreUnusable(f"cannot create {parsed.path.parent}: {e.strerror}") from None
    busy = int(opts.get("busy_timeout_ms", SQLITE_BUSY_TIMEOUT_MS))
    engine = create_engine(
        parsed.url, connect_args={"check_same_thread": False, "timeout": busy / 1000}, **pool
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # We emit BEGIN ourselves (below): the sqlite3 module's legacy mode
        # would run SELECTs outside the transaction.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        try:
            cur.execute(f"PRAGMA busy_timeout = {busy}")
            mode = cur.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreError(f"{parsed.description}: SQLite refused WAL mode ({mode})")
            # A RECEIPT promises durability. In WAL mode synchronous=NORMAL
            # skips the fsync at commit, so a power loss may drop the last
            # committed transactions; FULL syncs the WAL on every commit.
            cur.execute("PRAGMA synchronous = FULL")
        finally:
            cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        # Writers take the file's write lock up front: a deferred transaction
        # that reads and then writes can fail with SQLITE_BUSY (no wait) when
        # another process wrote in between.
        write = conn.get_execution_options().get("amq_write", False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

    return engine


class _Changes:
    """Row-count changes of one transaction, for the counters."""

    __slots__ = ("depth", "msgs", "pending")

    def __init__(self) -> None:
        self.depth: defaultdict[int, int] = defaultdict(int)
        self.pending: defaultdict[int, int] = defaultdict(int)
        self.msgs = 0  # message rows inserted minus deleted

    def deleted_messages(self, destination_ids: Sequence[int]) -> None:
        for d in destination_ids:
            self.depth[d] -= 1
        self.msgs -= len(destination_ids)


class SqlStore(Store):
    """The store on SQLite or PostgreSQL. Driven by one thread (the group
    committer); ``check_integrity`` and the registry methods may run on another
    thread because each operation checks its own connection out of the pool."""

    def __init__(self, url: str, group: str, **opts: Any) -> None:
        super().__init__(group)
        self._parsed = parse_store_url(url)
        self.description = self._parsed.description
        self.dialect = self._parsed.dialect
        self._opts = {"application_name": store_application_name(group), **opts}
        self._engine: Engine | None = None
        #: PostgreSQL: the committer thread's own connection for pipelined
        #: batches (``store.pg_batch``), outside the pool.
        self._writer: psycopg.Connection[Any] | None = None
        #: Batches committed by the one-round-trip path (for tests and metrics).
        self.pipelined_commits = 0
        self._sqlite = self.dialect == "sqlite"
        self._dinsert = sqlite_dialect.insert if self._sqlite else pg_dialect.insert
        self._chunk = IN_CHUNK if self._sqlite else ARRAY_CHUNK
        self._inserted_since_open = 0
        self._analyze_pending = not self._sqlite
        #: Test seam: called inside ``commit_batch`` right after the fence, while
        #: the transaction holds the group row lock.
        self.after_fence: Callable[[], None] | None = None
        self._build_statements()

    # -- statements, built once (SQLAlchemy caches their compiled form) ---
    def _driver_insert(
        self, table: Any, columns: Sequence[str], constants: dict[str, str] | None = None
    ) -> str:
        """Driver-level INSERT for the hot path: rows go to the DBAPI's
        executemany as tuples (psycopg pipelines them), skipping SQLAlchemy's
        per-row parameter processing, which cost more than building the rows."""
        constants = constants or {}
        names = [*columns, *constants]
        missing = [n for n in names if n not in table.c]
        assert not missing, f"{table.name} has no column {missing}"
        ph = "?" if self._sqlite else "%s"
        values = [ph] * len(columns) + list(constants.values())
        return f"INSERT INTO {table.name} ({', '.join(names)}) VALUES ({', '.join(values)})"

    def _in(self, col: Any, name: str, negate: bool = False) -> Any:
        """``col IN :name`` for a list: an expanding IN on SQLite, ``= ANY`` of
        one array parameter on PostgreSQL (see ARRAY_CHUNK)."""
        if self._sqlite:
            values = bindparam(name, expanding=True)
            return col.not_in(values) if negate else col.in_(values)
        array = bindparam(name, type_=ARRAY(col.type))
        return col != all_(array) if negate else col == any_(array)

    def _build_statements(self) -> None:
        g, m, d, s = schema.groups, schema.messages, schema.destinations, schema.subscriptions
        p, dd = schema.sub_pending, schema.dedup
        p2 = p.alias("p2")
        self._sql_ins_msg = self._driver_insert(
            m,
            ("grp", "id", "destination_id", "message_id", "producer_id", "producer_seq",
             "dedup_key", "priority", "expires_at", "enqueued_at", "delivery_count",
             "inflight_epoch", "headers", "body"),
        )
        self._sql_ins_dedup = self._driver_insert(
            dd, ("grp", "dedup_key", "producer_id", "producer_seq", "msg_id", "created_at")
        )
        self._sql_ins_pending = self._driver_insert(
            p, ("grp", "sub_id", "msg_id"), {"delivery_count": "0", "inflight_epoch": "NULL"}
        )
        grp = bindparam("g")
        in_ = self._in
        max_id = bindparam("max_id", type_=BigInteger)
        self._s_fence = (
            update(g)
            .where(g.c.grp == grp, g.c.epoch == bindparam("e"))
            .values(
                msg_count=g.c.msg_count + bindparam("delta", type_=BigInteger),
                max_msg_id=_greatest(g.c.max_msg_id, max_id),
                checkpoint_at=bindparam("now", type_=BigInteger),
            )
        )
        self._s_count_fix = (
            update(g)
            .where(g.c.grp == grp)
            .values(msg_count=g.c.msg_count + bindparam("delta", type_=BigInteger))
        )
        self._s_dedup_lookup = select(dd.c.dedup_key).where(
            dd.c.grp == grp, in_(dd.c.dedup_key, "keys")
        )
        self._s_deliver_q = (
            update(m)
            .where(m.c.grp == grp, in_(m.c.id, "ids"))
            .values(
                delivery_count=m.c.delivery_count + bindparam("n"),
                inflight_epoch=bindparam("e"),
            )
        )
        self._s_deliver_s = (
            update(p)
            .where(p.c.grp == grp, p.c.sub_id == bindparam("s"), in_(p.c.msg_id, "ids"))
            .values(
                delivery_count=p.c.delivery_count + bindparam("n"),
                inflight_epoch=bindparam("e"),
            )
        )
        self._s_undeliver_q = (
            update(m)
            .where(m.c.grp == grp, in_(m.c.id, "ids"))
            .values(delivery_count=m.c.delivery_count - 1, inflight_epoch=None)
        )
        self._s_release_q = (
            update(m).where(m.c.grp == grp, in_(m.c.id, "ids")).values(inflight_epoch=None)
        )
        self._s_release_s = (
            update(p)
            .where(p.c.grp == grp, p.c.sub_id == bindparam("s"), in_(p.c.msg_id, "ids"))
            .values(inflight_epoch=None)
        )
        self._s_move_lookup = select(m.c.id, m.c.destination_id).where(
            m.c.grp == grp, in_(m.c.id, "ids")
        )
        self._s_move = (
            update(m)
            .where(m.c.grp == grp, m.c.id == bindparam("i"))
            .values(destination_id=bindparam("d"), inflight_epoch=None)
        )
        self._s_ack_q = (
            delete(m).where(m.c.grp == grp, in_(m.c.id, "ids")).returning(m.c.destination_id)
        )
        self._s_ack_s = delete(p).where(
            p.c.grp == grp, p.c.sub_id == bindparam("s"), in_(p.c.msg_id, "ids")
        )
        no_pending = ~exists().where(p2.c.grp == m.c.grp, p2.c.msg_id == m.c.id)
        self._s_delete_orphans = (
            delete(m)
            .where(m.c.grp == grp, in_(m.c.id, "ids"), no_pending)
            .returning(m.c.destination_id)
        )
        self._s_delete_sub_orphans = (
            delete(m)
            .where(
                m.c.grp == grp,
                m.c.id.in_(select(p.c.msg_id).where(p.c.grp == grp, in_(p.c.sub_id, "subs"))),
                ~exists().where(
                    p2.c.grp == m.c.grp,
                    p2.c.msg_id == m.c.id,
                    in_(p2.c.sub_id, "subs", negate=True),
                ),
            )
            .returning(m.c.destination_id)
        )
        self._s_delete_sub_pending = delete(p).where(p.c.grp == grp, in_(p.c.sub_id, "subs"))
        self._s_delete_subs = delete(s).where(s.c.grp == grp, in_(s.c.id, "subs"))
        dest = bindparam("d", type_=BigInteger)
        self._s_delete_destination = delete(d).where(d.c.grp == grp, d.c.id == dest)
        self._s_destination_subs = select(s.c.id).where(s.c.grp == grp,
                                                        s.c.destination_id == dest)
        self._s_delete_destination_messages = delete(m).where(m.c.grp == grp,
                                                              m.c.destination_id == dest)
        self._s_depth = (
            update(d)
            .where(d.c.grp == grp, d.c.id == bindparam("i"))
            .values(depth=d.c.depth + bindparam("n"))
        )
        self._s_claim_sub = (
            update(s)
            .where(s.c.grp == grp, s.c.id == bindparam("i"), s.c.owner.is_(None))
            .values(owner=bindparam("o"))
        )
        self._s_pending = (
            update(s)
            .where(s.c.grp == grp, s.c.id == bindparam("i"))
            .values(pending=s.c.pending + bindparam("n"))
        )
        msg_cols = (
            m.c.id, m.c.destination_id, m.c.message_id, m.c.headers, m.c.body, m.c.priority,
            m.c.expires_at, m.c.enqueued_at,
        )
        tail_cols = (m.c.producer_id, m.c.producer_seq, m.c.dedup_key)
        self._s_page = (
            select(*msg_cols, m.c.delivery_count, *tail_cols)
            .where(
                m.c.grp == grp,
                m.c.destination_id == bindparam("d"),
                m.c.id > bindparam("after"),
            )
            .order_by(m.c.id)
            .limit(bindparam("n"))
        )
        self._s_sub_page = (
            select(*msg_cols, p.c.delivery_count, *tail_cols)
            .select_from(p.join(m, and_(m.c.grp == p.c.grp, m.c.id == p.c.msg_id)))
            .where(p.c.grp == grp, p.c.sub_id == bindparam("s"), p.c.msg_id > bindparam("after"))
            .order_by(p.c.msg_id)
            .limit(bindparam("n"))
        )
        self._s_expired = (
            select(m.c.id)
            .where(m.c.grp == grp, m.c.expires_at > 0, m.c.expires_at <= bindparam("now"))
            .order_by(m.c.expires_at)  # the partial expiry index's order
            .limit(bindparam("n"))
        )
        self._s_reap_pending = (
            delete(p)
            .where(p.c.grp == grp, in_(p.c.msg_id, "ids"))
            .returning(p.c.sub_id, p.c.msg_id)
        )
        self._s_reap_messages = (
            delete(m)
            .where(m.c.grp == grp, in_(m.c.id, "ids"))
            .returning(m.c.id, m.c.destination_id)
        )
        oldest = (
            select(dd.c.dedup_key)
            .where(dd.c.grp == grp, dd.c.created_at < bindparam("before"))
            .order_by(dd.c.created_at)
            .limit(bindparam("n"))
        )
        self._s_prune = delete(dd).where(dd.c.grp == grp, dd.c.dedup_key.in_(oldest))

    # -- lifecycle ---------------------------------------------------------
    def open(self) -> None:
        if self._engine is not None:
            return
        self._engine = _make_engine(self._parsed, self._opts)
        try:
            _retry_while_locked(self._engine, self._sqlite, self._ensure_schema)
        except BaseException as e:
            self._engine.dispose()
            self._engine = None
            if isinstance(e, StoreError) and not isinstance(e, StoreUnusable) \
                    and _is_permanent(e):
                raise StoreUnusable(str(e)) from e
            raise

    def server_fsync(self) -> bool | None:
        """PostgreSQL's ``fsync`` setting (False: a server crash may lose what a
        RECEIPT confirmed); None for SQLite, which syncs itself (synchronous=FULL)."""
        if self._sqlite:
            return None
        with self._tx("reading the server's fsync setting", write=False) as conn:
            return str(conn.scalar(text("SHOW fsync"))).lower() == "on"

    def close(self) -> None:
        self._discard_writer()
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None

    @property
    def engine(self) -> Engine:
        """The SQLAlchemy engine, for read-only tools (audit, CLI) and tests."""
        if self._engine is None:
            raise StoreError(f"{self.description}: store is not open")
        return self._engine

    @contextlib.contextmanager
    def _tx(self, what: str, write: bool = True) -> Iterator[Connection]:
        """One transaction; any database error becomes ``StoreError`` after rollback."""
        if self._engine is None:
            raise StoreError(f"{self.description}: store is not open")
        try:
            with self._engine.connect() as conn:
                if write and self._sqlite:
                    conn.execution_options(amq_write=True)
                with conn.begin():
                    yield conn
        except (SQLAlchemyError, OverflowError, ValueError) as e:
            # The transaction was rolled back by conn.begin(); the store is usable.
            raise _store_error(self.description, what, e) from e

    def _ensure_schema(self) -> None:
        """Create or upgrade the schema under a lock so that racing brokers agree."""
        with self._tx("schema creation") as conn:
            if not self._sqlite:
                conn.execute(
                    text("SELECT pg_advisory_xact_lock(:a, :b)"),
                    {"a": SCHEMA_LOCK_KEY[0], "b": SCHEMA_LOCK_KEY[1]},
                )
            found = self._schema_version(conn)
            if found is not None and found > schema.SCHEMA_VERSION:
                raise StoreUnusable(
                    f"{self.description}: store schema v{found} is newer than this "
                    f"amqlite (v{schema.SCHEMA_VERSION}): upgrade amqlite"
                )
            schema.metadata.create_all(conn)
            meta = schema.meta
            if found is None:
                conn.execute(
                    insert(meta).values(key="schema_version", value=str(schema.SCHEMA_VERSION))
                )
                log.info("%s: created schema v%d", self.description, schema.SCHEMA_VERSION)
                return
            for version in range(found, schema.SCHEMA_VERSION):
                log.info("%s: upgrading schema v%d -> v%d", self.description, version, version + 1)
                UPGRADES[version](conn)
            if found != schema.SCHEMA_VERSION:
                conn.execute(
                    update(meta)
                    .where(meta.c.key == "schema_version")
                    .values(value=str(schema.SCHEMA_VERSION))
                )

    @staticmethod
    def _schema_version(conn: Connection) -> int | None:
        if not inspect(conn).has_table(schema.meta.name):
            return None
        value = conn.scalar(
            select(schema.meta.c.value).where(schema.meta.c.key == "schema_version")
        )
        return int(value) if value is not None else None

    # -- epoch -------------------------------------------------------------
    def claim_epoch(self, node: str, token: int | None = None, dedup_window_ms: int = 0) -> int:
        """Call only while holding the group's lock. On PostgreSQL a deposed master
        paused inside a batch keeps the group row locked: being the lock holder,
        we may end its session (PostgreSQL rolls its batch back), and we do."""
        for attempt in range(1, CLAIM_ATTEMPTS + 1):
            try:
                return self._claim_epoch_once(node, token, dedup_window_ms)
            except StoreError as exc:
                if self._sqlite or attempt == CLAIM_ATTEMPTS or not _is_lock_timeout(exc):
                    raise
                self._terminate_stale_writers(node)
        raise AssertionError("unreachable")

    def _terminate_stale_writers(self, node: str) -> None:
        """End this group's other store sessions that hold the group row's table."""
        app = self._opts["application_name"]
        with self._tx("terminate stale writers") as conn:
            ended = conn.execute(text(
                "SELECT a.pid, a.client_addr::text, a.state, pg_terminate_backend(a.pid) "
                "FROM pg_stat_activity a WHERE a.pid <> pg_backend_pid() "
                "AND a.application_name = :app AND a.pid IN ("
                "  SELECT l.pid FROM pg_locks l WHERE l.granted "
                "  AND l.relation = 'amq_groups'::regclass "
                "  AND l.mode IN ('RowExclusiveLock', 'RowShareLock'))"), {"app": app}).all()
        for pid, addr, state, _ in ended:
            log.warning("%s: %s claiming group %r ended a deposed master's session "
                        "(backend pid %s from %s, %s) that held the group row",
                        self.description, node, self.group, pid, addr, state)

    def _claim_epoch_once(self, node: str, token: int | None, dedup_window_ms: int) -> int:
        g = schema.groups
        now = _now_ms()
        with self._tx("claim_epoch") as conn:
            if not self._sqlite:
                conn.execute(text(f"SET LOCAL lock_timeout = {CLAIM_LOCK_TIMEOUT_MS}"))
            conn.execute(
                self._dinsert(g)
                .values(grp=self.group, epoch=0, msg_count=0, max_msg_id=0, dedup_window_ms=0)
                .on_conflict_do_nothing(index_elements=[g.c.grp])
            )
            # Blocks behind a running batch's fence, then sees its commit.
            row = conn.execute(
                update(g)
                .where(g.c.grp == self.group)
                .values(
                    epoch=_greatest(g.c.epoch + 1, token or 0),
                    master=node,
                    epoch_started_at=now,
                    dedup_window_ms=dedup_window_ms,
                )
                .returning(g.c.epoch, g.c.msg_count, g.c.max_msg_id)
            ).one()
            conn.execute(
                insert(schema.activations).values(
                    grp=self.group,
                    epoch=row.epoch,
                    node=node,
                    activated_at=now,
                    expected_count=row.msg_count,
                    expected_max_id=row.max_msg_id,
                )
            )
        log.info("%s: group %r epoch %d claimed by %s", self.description, self.group,
                 row.epoch, node)
        return int(row.epoch)

    def _fence(
        self, conn: Connection, epoch: int, delta: int = 0, max_id: int = 0, now: int = 0
    ) -> None:
        params = {"g": self.group, "e": epoch, "delta": delta, "max_id": max_id,
                  "now": now or _now_ms()}
        if conn.execute(self._s_fence, params).rowcount != 1:
            raise Fenced(f"{self.description}: group {self.group!r} is no longer at epoch {epoch}")

    def _current_epoch(self, conn: Connection) -> tuple[int, int] | None:
        g = schema.groups
        row = conn.execute(
            select(g.c.epoch, g.c.max_msg_id).where(g.c.grp == self.group)
        ).first()
        return None if row is None else (int(row.epoch), int(row.max_msg_id))

    # -- activation --------------------------------------------------------
    def recover(self, epoch: int) -> Recovery:
        d, s, m = schema.destinations, schema.subscriptions, schema.messages
        with self._tx("recover", write=False) as conn:
            current = self._current_epoch(conn)
            if current is None or current[0] != epoch:
                raise Fenced(f"{self.description}: group {self.group!r} is not at epoch {epoch}")
            dests = [
                DestinationRow(r.id, r.name, r.kind, r.depth)
                for r in conn.execute(
                    select(d.c.id, d.c.name, d.c.kind, d.c.depth)
                    .where(d.c.grp == self.group)
                    .order_by(d.c.id)
                )
            ]
            subs = [
                SubscriptionRow(r.id, r.client_id, r.name, r.destination_id, r.selector, r.pending,
                                r.owner)
                for r in conn.execute(
                    select(s.c.id, s.c.client_id, s.c.name, s.c.destination_id, s.c.selector,
                           s.c.pending, s.c.owner)
                    .where(s.c.grp == self.group)
                    .order_by(s.c.id)
                )
            ]
            # Newest id by the primary key index (one descent, O(log n)).
            top = conn.scalar(
                select(m.c.id).where(m.c.grp == self.group).order_by(m.c.id.desc()).limit(1)
            )
        # max_msg_id is the highest id ever committed: acking the newest
        # message must not hand its id out again (the dedup rows refer to it).
        next_msg = max(top or 0, current[1]) + 1
        return Recovery(
            epoch=epoch,
            destinations=dests,
            subscriptions=subs,
            next_message_id=next_msg,
            next_destination_id=max((x.id for x in dests), default=0) + 1,
            next_subscription_id=max((x.id for x in subs), default=0) + 1,
        )

    def check_integrity(self, epoch: int) -> Integrity:
        g, m, a = schema.groups, schema.messages, schema.activations
        if self._engine is None:
            raise StoreError(f"{self.description}: store is not open")
        try:
            with self._engine.connect() as conn:
                if not self._sqlite:
                    # One snapshot for the counters and the count: commits of
                    # the running master must not fall in between.
                    conn.execution_options(isolation_level="REPEATABLE READ")
                with conn.begin():
                    if not self._sqlite:
                        conn.execute(
                            text(f"SET LOCAL statement_timeout = {INTEGRITY_STATEMENT_TIMEOUT_MS}")
                        )
                    counters = conn.execute(
                        select(g.c.msg_count, g.c.max_msg_id).where(g.c.grp == self.group)
                    ).one()
                    actual = conn.execute(
                        select(func.count(), func.max(m.c.id)).where(m.c.grp == self.group)
                    ).one()
                    activation_count = conn.scalar(
                        select(a.c.expected_count).where(a.c.grp == self.group, a.c.epoch == epoch)
                    )
        except SQLAlchemyError as e:
            raise StoreError(f"{self.description}: integrity check failed: {one_line(e)}") from e
        result = Integrity(
            expected_count=int(counters.msg_count),
            expected_max_id=int(counters.max_msg_id),
            actual_count=int(actual[0]),
            actual_max_id=int(actual[1] or 0),
        )
        if activation_count is not None:
            # The activation row holds the counters as of activation; the
            # running master has changed them since by exactly
            # (msg_count - expected_count), so shift the count back.
            at_activation = result.actual_count - (result.expected_count - activation_count)
            # Through the fence like every write: a deposed master's late check
            # must not overwrite its successor's view.
            if not self._update_activation(epoch, "integrity record",
                                           actual_count=at_activation,
                                           actual_max_id=result.actual_max_id,
                                           mismatch=result.mismatch):
                log.warning("%s: group %r is no longer at epoch %d: integrity result not "
                            "recorded", self.description, self.group, epoch)
        if result.mismatch:
            log.error(
                "%s: group %r integrity MISMATCH at epoch %d: counters say %d rows (max id %d), "
                "store holds %d rows (max id %d)", self.description, self.group, epoch,
                result.expected_count, result.expected_max_id, result.actual_count,
                result.actual_max_id,
            )
        return result

    def end_activation(self, epoch: int) -> None:
        self._update_activation(epoch, "end_activation", ended_at=_now_ms())

    def _update_activation(self, epoch: int, what: str, **values: Any) -> bool:
        """Set ``values`` on the activation row of ``epoch``, through the fence;
        False (nothing written) when the group has moved on to another epoch."""
        a = schema.activations
        try:
            with self._tx(what) as conn:
                self._fence(conn, epoch)
                conn.execute(
                    update(a).where(a.c.grp == self.group, a.c.epoch == epoch).values(**values)
                )
        except Fenced:
            return False
        return True

    # -- the batch ---------------------------------------------------------
    def commit_batch(self, epoch: int, batch: Batch) -> BatchResult:
        if not self._sqlite and self.after_fence is None and pg_batch.fits(batch):
            result = self._commit_pipelined(epoch, batch)
        else:
            result = self._commit_stepwise(epoch, batch)
        if self._analyze_pending:
            self._inserted_since_open += len(batch.inserts)
            if self._inserted_since_open >= ANALYZE_AFTER_ROWS:
                self._analyze_once()
        return result

    def _commit_pipelined(self, epoch: int, batch: Batch) -> BatchResult:
        """The hot shapes in one round trip (see ``store.pg_batch``)."""
        try:
            if self._writer is None:
                proxy = self.engine.raw_connection()
                writer = proxy.driver_connection
                proxy.detach()  # ours for good: no pool reset between batches
                self._writer = writer
            result = pg_batch.commit(self._writer, self.group, epoch, batch, _now_ms(),
                                     _encode_headers)
        except Exception as e:  # a database error, or e.g. a value it cannot encode
            # Whatever failed, the connection's state is unknown (the fence may
            # hold the group row): close it, and start afresh next time.
            self._discard_writer()
            if getattr(e, "sqlstate", None) == pg_batch.FENCED_SQLSTATE:
                raise Fenced(f"{self.description}: group {self.group!r} is no longer at "
                             f"epoch {epoch}") from None
            raise _store_error(self.description, "commit", e) from e
        self.pipelined_commits += 1
        return result

    def _discard_writer(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            with contextlib.suppress(Exception):
                writer.close()  # an open transaction is rolled back by the server

    def _commit_stepwise(self, epoch: int, batch: Batch) -> BatchResult:
        """Any batch, one statement at a time (SQLite; rare shapes on PostgreSQL)."""
        now = _now_ms()
        inserts = batch.inserts
        # The fence carries the expected change of msg_count; what really
        # happened (dedup drops, topic rows, missing rows) is corrected at the
        # end in the same transaction, only when it differs.
        queue_acks = [mid for sid, mid in batch.acks if sid is None]
        predicted = len(inserts) - len(queue_acks)
        # max_msg_id is a high-water mark of allocated ids (it may name an
        # insert dropped as a duplicate): recover() never hands one out twice.
        max_id = max((x.id for x in inserts), default=0)
        result = BatchResult()
        ch = _Changes()
        with self._tx("commit") as conn:
            self._fence(conn, epoch, predicted, max_id, now)
            if self.after_fence is not None:
                self.after_fence()
            if batch.destinations:
                self._create_destinations(conn, batch.destinations, now)
            if batch.subscriptions:
                self._create_subscriptions(conn, batch.subscriptions, now)
            if batch.claimed_subscriptions:
                self._claim_subscriptions(conn, batch.claimed_subscriptions)
            if inserts or batch.identities:
                self._insert(conn, epoch, inserts, batch.identities, now, result, ch)
            for chunk in _chunks(batch.undeliveries, self._chunk):
                conn.execute(self._s_undeliver_q, {"g": self.group, "ids": chunk})
            if batch.deliveries:
                self._deliver(conn, epoch, batch, ch)
            if batch.releases:
                self._release(conn, batch.releases)
            if batch.moves:
                self._move(conn, batch.moves, ch)
            if queue_acks:
                self._ack_queue(conn, queue_acks, ch)
            if len(queue_acks) != len(batch.acks):
                self._ack_subscriptions(conn, batch.acks, ch)
            if batch.removed_subscriptions:
                self._remove_subscriptions(conn, batch.removed_subscriptions, ch)
            self._write_counters(conn, ch, predicted, batch.removed_subscriptions)
        return result

    def _analyze_once(self) -> None:
        """See ANALYZE_AFTER_ROWS. Best effort: plans, not correctness, depend on it."""
        self._analyze_pending = False
        try:
            with self._tx("analyze") as conn:
                never = conn.scalars(
                    text("SELECT relname FROM pg_stat_user_tables WHERE relname = ANY(:t) "
                         "AND last_analyze IS NULL AND last_autoanalyze IS NULL"),
                    {"t": list(HOT_TABLES)},
                ).all()
                if never:
                    conn.execute(text(f"ANALYZE {', '.join(sorted(never))}"))
        except StoreError as exc:
            log.warning("%s: could not ANALYZE the store tables: %s", self.description, exc)

    def _create_destinations(
        self, conn: Connection, rows: Sequence[DestinationRow], now: int
    ) -> None:
        """Idempotent: the broker stages a destination's row with every write
        that needs it until one of them committed (another one may be refused
        by the store), so a row may come twice in a batch or be there already."""
        unique = {r.id: r for r in rows}
        conn.execute(
            self._dinsert(schema.destinations).on_conflict_do_nothing(),
            [
                {"grp": self.group, "id": r.id, "name": r.name, "kind": r.kind,
                 "created_at": now, "depth": 0}
                for r in unique.values()
            ],
        )

    def _create_subscriptions(
        self, conn: Connection, rows: Sequence[SubscriptionRow], now: int
    ) -> None:
        conn.execute(
            insert(schema.subscriptions),
            [
                {"grp": self.group, "id": r.id, "client_id": r.client_id, "name": r.name,
                 "destination_id": r.destination_id, "selector": r.selector,
                 "created_at": now, "pending": 0, "owner": r.owner}
                for r in rows
            ],
        )

    def _claim_subscriptions(self, conn: Connection, claims: Sequence[tuple[int, str]]) -> None:
        conn.execute(self._s_claim_sub, [{"g": self.group, "i": i, "o": o} for i, o in claims])

    def _insert(
        self,
        conn: Connection,
        epoch: int,
        inserts: Sequence[NewMessage],
        identities: Sequence[NewMessage],
        now: int,
        result: BatchResult,
        ch: _Changes,
    ) -> None:
        g = self.group
        dedup_rows = []
        keys = {x.dedup_key for x in (*inserts, *identities) if x.dedup_key is not None}
        if keys:
            stored: set[str] = set()
            for chunk in _chunks(list(keys), self._chunk):
                stored.update(conn.scalars(self._s_dedup_lookup, {"g": g, "keys": chunk}))
            seen: set[str] = set()

            def fresh(x: NewMessage) -> bool:
                k = x.dedup_key
                if k is None:
                    return True
                if k in stored or k in seen:
                    result.duplicates.add(k)
                    result.duplicate_ids.add(x.id)
                    return False
                seen.add(k)
                return True

            inserts = [x for x in inserts if fresh(x)]
            # An identity without a message: msg_id NULL in the dedup window.
            dedup_rows = [(g, x.dedup_key, x.producer_id, x.producer_seq, None, now)
                          for x in identities if x.dedup_key is not None and fresh(x)]
        if not inserts:
            if dedup_rows:
                conn.exec_driver_sql(self._sql_ins_dedup, dedup_rows)
            return
        encode = _encode_headers
        rows = []
        pending_rows = []
        depth = ch.depth
        pending = ch.pending
        for x in inserts:
            rows.append((
                g, x.id, x.destination_id, x.message_id, x.producer_id, x.producer_seq,
                x.dedup_key, x.priority, x.expires_at, x.enqueued_at or now, x.delivery_count,
                epoch if x.delivery_count else None, encode(x.headers), x.body,
            ))
            depth[x.destination_id] += 1
            if x.dedup_key is not None:
                dedup_rows.append((g, x.dedup_key, x.producer_id, x.producer_seq, x.id, now))
            for sub in x.subscriber_ids:
                pending_rows.append((g, sub, x.id))
                pending[sub] += 1
        ch.msgs += len(rows)
        conn.exec_driver_sql(self._sql_ins_msg, rows)
        if dedup_rows:
            conn.exec_driver_sql(self._sql_ins_dedup, dedup_rows)
        if pending_rows:
            conn.exec_driver_sql(self._sql_ins_pending, pending_rows)

    def _deliver(self, conn: Connection, epoch: int, batch: Batch, ch: _Changes) -> None:
        acked = set(batch.acks)
        counts = Counter(r for r in batch.deliveries if r not in acked)
        # One statement per (subscription, times delivered in this batch).
        groups: defaultdict[tuple[int | None, int], list[int]] = defaultdict(list)
        for (sid, mid), n in counts.items():
            groups[(sid, n)].append(mid)
        for (sid, n), mids in groups.items():
            for chunk in _chunks(mids, self._chunk):
                if sid is None:
                    conn.execute(self._s_deliver_q,
                                 {"g": self.group, "e": epoch, "n": n, "ids": chunk})
                else:
                    conn.execute(self._s_deliver_s,
                                 {"g": self.group, "e": epoch, "n": n, "s": sid, "ids": chunk})

    def _release(self, conn: Connection, refs: Sequence[Ref]) -> None:
        by_sub: defaultdict[int | None, list[int]] = defaultdict(list)
        for sid, mid in refs:
            by_sub[sid].append(mid)
        for sid, mids in by_sub.items():
            for chunk in _chunks(mids, self._chunk):
                if sid is None:
                    conn.execute(self._s_release_q, {"g": self.group, "ids": chunk})
                else:
                    conn.execute(self._s_release_s, {"g": self.group, "s": sid, "ids": chunk})

    def _move(self, conn: Connection, moves: Sequence[tuple[int, int]], ch: _Changes) -> None:
        final: dict[int, int] = {}
        for mid, dest in moves:  # a later move of the same message wins
            final[mid] = dest
        ids = list(final)
        origin: dict[int, int] = {}
        for chunk in _chunks(ids, self._chunk):
            for mid, src in conn.execute(self._s_move_lookup, {"g": self.group, "ids": chunk}):
                origin[mid] = src
        params = []
        for mid, dest in final.items():
            src = origin.get(mid)
            if src is None:  # already gone: nothing to move
                continue
            params.append({"g": self.group, "i": mid, "d": dest})
            ch.depth[src] -= 1
            ch.depth[dest] += 1
        if params:
            conn.execute(self._s_move, params)

    def _ack_queue(self, conn: Connection, mids: Sequence[int], ch: _Changes) -> None:
        for chunk in _chunks(mids, self._chunk):
            ch.deleted_messages(
                conn.scalars(self._s_ack_q, {"g": self.group, "ids": chunk}).all()
            )

    def _ack_subscriptions(self, conn: Connection, acks: Sequence[Ref], ch: _Changes) -> None:
        by_sub: defaultdict[int, list[int]] = defaultdict(list)
        for sid, mid in acks:
            if sid is not None:
                by_sub[sid].append(mid)
        candidates: set[int] = set()
        for sid, mids in by_sub.items():
            for chunk in _chunks(mids, self._chunk):
                n = conn.execute(self._s_ack_s, {"g": self.group, "s": sid, "ids": chunk}).rowcount
                ch.pending[sid] -= n
            candidates.update(mids)
        self._delete_orphans(conn, list(candidates), ch)

    def _delete_orphans(self, conn: Connection, mids: Sequence[int], ch: _Changes) -> None:
        """Delete the message rows among ``mids`` that no subscription is owed."""
        for chunk in _chunks(mids, self._chunk):
            ch.deleted_messages(
                conn.scalars(self._s_delete_orphans, {"g": self.group, "ids": chunk}).all()
            )

    def _remove_subscriptions(self, conn: Connection, sids: Sequence[int], ch: _Changes) -> None:
        for chunk in _chunks(list(dict.fromkeys(sids)), self._chunk):
            params = {"g": self.group, "subs": chunk}
            ch.deleted_messages(conn.scalars(self._s_delete_sub_orphans, params).all())
            conn.execute(self._s_delete_sub_pending, params)
            conn.execute(self._s_delete_subs, params)

    def _write_counters(
        self, conn: Connection, ch: _Changes, predicted: int, removed: Sequence[int] = ()
    ) -> None:
        g = self.group
        depth = [{"g": g, "i": k, "n": v} for k, v in ch.depth.items() if v]
        if depth:
            conn.execute(self._s_depth, depth)
        gone = set(removed)
        pending = [
            {"g": g, "i": k, "n": v} for k, v in ch.pending.items() if v and k not in gone
        ]
        if pending:
            conn.execute(self._s_pending, pending)
        if ch.msgs != predicted:
            conn.execute(self._s_count_fix, {"g": g, "delta": ch.msgs - predicted})

    # -- paging ------------------------------------------------------------
    @staticmethod
    def _stored(rows: Any) -> list[StoredMessage]:
        loads = json.loads
        return [
            StoredMessage(
                r[0], r[1], r[2], loads(r[3]), bytes(r[4]), r[5], r[6], r[7], r[8], r[9], r[10],
                r[11],
            )
            for r in rows
        ]

    def load_page(self, destination_id: int, after_id: int, limit: int) -> list[StoredMessage]:
        params = {"g": self.group, "d": destination_id, "after": after_id, "n": limit}
        with self._tx("load_page", write=False) as conn:
            return self._stored(conn.execute(self._s_page, params))

    def load_subscription_page(
        self, subscription_id: int, after_id: int, limit: int
    ) -> list[StoredMessage]:
        params = {"g": self.group, "s": subscription_id, "after": after_id, "n": limit}
        with self._tx("load_subscription_page", write=False) as conn:
            return self._stored(conn.execute(self._s_sub_page, params))

    # -- housekeeping --------------------------------------------------------
    def reap_expired(self, epoch: int, now_ms: int, limit: int) -> list[Ref]:
        """Expired messages go whether in flight or not; a later ACK of one is a no-op."""
        ch = _Changes()
        refs: list[Ref] = []
        with self._tx("reap_expired") as conn:
            self._fence(conn, epoch)
            ids = conn.scalars(self._s_expired, {"g": self.group, "now": now_ms, "n": limit}).all()
            owed: defaultdict[int, list[int]] = defaultdict(list)
            for chunk in _chunks(ids, self._chunk):
                for sid, mid in conn.execute(self._s_reap_pending, {"g": self.group, "ids": chunk}):
                    owed[mid].append(sid)
                    ch.pending[sid] -= 1
                for mid, dest in conn.execute(
                    self._s_reap_messages, {"g": self.group, "ids": chunk}
                ):
                    ch.deleted_messages((dest,))
                    subs = owed.get(mid)
                    if subs:
                        refs.extend((sid, mid) for sid in subs)
                    else:
                        refs.append((None, mid))
            self._write_counters(conn, ch, 0)
        return refs

    def delete_destination(self, epoch: int, destination_id: int) -> DeletedDestination:
        """One statement per table (the destination index finds the messages); the
        management action purges a big queue in chunks first, so what is left here
        is what arrived meanwhile (see ``amqlite.management.actions``)."""
        params = {"g": self.group, "d": destination_id}
        with self._tx("delete_destination") as conn:
            self._fence(conn, epoch)
            if conn.execute(self._s_delete_destination, params).rowcount == 0:
                return DeletedDestination(existed=False)
            sids = conn.scalars(self._s_destination_subs, params).all()
            for chunk in _chunks(sids, self._chunk):
                subs = {"g": self.group, "subs": list(chunk)}
                conn.execute(self._s_delete_sub_pending, subs)
                conn.execute(self._s_delete_subs, subs)
            gone = int(conn.execute(self._s_delete_destination_messages, params).rowcount)
            if gone:
                conn.execute(self._s_count_fix, {"g": self.group, "delta": -gone})
        return DeletedDestination(existed=True, messages=gone, subscriptions=len(sids))

    def prune_dedup(self, epoch: int, older_than_ms: int, limit: int) -> int:
        with self._tx("prune_dedup") as conn:
            self._fence(conn, epoch)
            params = {"g": self.group, "before": older_than_ms, "n": limit}
            return int(conn.execute(self._s_prune, params).rowcount)

    # -- registry ------------------------------------------------------------
    def register(
        self,
        name: str,
        role: str,
        services: str | list[str] | tuple[str, ...],
        host: str | None,
        pid: int | None,
        epoch: int | None,
    ) -> None:
        r = schema.registry
        now = _now_ms()
        if not isinstance(services, str):
            services = ",".join(services)
        stmt = self._dinsert(r)
        stmt = stmt.on_conflict_do_update(
            index_elements=[r.c.grp, r.c.name],
            set_={
                "role": stmt.excluded.role,
                "services": stmt.excluded.services,
                "host": stmt.excluded.host,
                "pid": stmt.excluded.pid,
                "epoch": stmt.excluded.epoch,
                "heartbeat_at": stmt.excluded.heartbeat_at,
                # A new process under the same name is a new start.
                "started_at": case(
                    (r.c.pid == stmt.excluded.pid, r.c.started_at),
                    else_=stmt.excluded.started_at,
                ),
            },
        )
        with self._tx("register") as conn:
            conn.execute(
                stmt,
                {"grp": self.group, "name": name, "role": role, "services": services,
                 "host": host, "pid": pid, "epoch": epoch, "started_at": now,
                 "heartbeat_at": now},
            )

    def unregister(self, name: str) -> None:
        r = schema.registry
        with self._tx("unregister") as conn:
            conn.execute(delete(r).where(r.c.grp == self.group, r.c.name == name))


def read_registry(
    url: str, group: str | None = None, max_age_ms: int | None = REGISTRY_MAX_AGE_MS
) -> list[dict[str, Any]]:
    """Registry rows (one dict per node, columns as keys), freshest heartbeats
    only unless ``max_age_ms`` is None. For the CLI: needs no lock and creates
    nothing; a store that does not exist yet has no rows."""
    parsed = parse_store_url(url)
    if parsed.path is not None and not parsed.path.exists():
        return []
    engine = _make_engine(parsed, {"pool_size": 1, "max_overflow": 0})
    r = schema.registry
    query = select(r).order_by(r.c.grp, r.c.name)
    if group is not None:
        query = query.where(r.c.grp == group)
    if max_age_ms is not None:
        query = query.where(r.c.heartbeat_at >= _now_ms() - max_age_ms)

    def read() -> list[dict[str, Any]]:
        try:
            with engine.connect() as conn:
                if not inspect(conn).has_table(r.name):
                    return []
                return [dict(row._mapping) for row in conn.execute(query)]
        except SQLAlchemyError as e:
            raise StoreError(f"{parsed.description}: reading the registry failed: "
                             f"{one_line(e)}") from e

    try:
        return _retry_while_locked(engine, parsed.dialect == "sqlite", read)
    finally:
        engine.dispose()
