"""``FencedStore``: what every part of ``SqlStore`` stands on — its engine's lifecycle,
one transaction at a time, the group's epoch and the fence, and the counters a fenced
transaction corrects.

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

The claim itself is a compare-and-set when the node passes the epoch it read
on acquiring the lock (``read_epoch``): a node that lost the lock before its
claim landed finds a newer epoch there and is refused (``StaleClaim``), so it
can neither go backwards nor fence out the master that took the lock from it.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import psycopg
from sqlalchemy import Connection, Engine, insert, select, text, update
from sqlalchemy.dialects import postgresql as pg_dialect
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.exc import SQLAlchemyError

from store import schema
from store.api import Fenced, StaleClaim, Store, StoreError, StoreUnusable
from store.engine import make_engine, retry_while_locked, store_application_name
from store.errors import is_lock_timeout, is_permanent, store_error
from store.migrations import ensure_schema
from store.pg_pipeline import Pipeline
from store.statements import ARRAY_CHUNK, IN_CHUNK, Statements, greatest, now_ms
from store.url import parse_store_url

#: The store's log lines keep the logger name they always had (``store.sql``),
#: whichever of its modules writes them.
log = logging.getLogger("store.sql")

#: How long a claim waits for the group row before it looks for a deposed
#: master's session holding it (a paused process can hold it indefinitely:
#: idle_in_transaction_session_timeout does not fire while a message is half
#: read). A healthy batch holds the row for milliseconds.
CLAIM_LOCK_TIMEOUT_MS = 1_000
#: Claims attempted (terminating stale sessions in between) before giving up.
CLAIM_ATTEMPTS = 5


class Changes:
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


class FencedStore(Store):
    """The core of ``SqlStore`` (``store.sql``): the engine, transactions, the epoch
    claim and the fence. Its parts (``store.batch_commit``, ``store.recovery``,
    ``store.housekeeping``, ``store.registry_sql``) build on it; ``SqlStore`` joins them."""

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
        #: What drives it (libpq's pipeline mode, its prepared statements).
        self._pipeline: Pipeline | None = None
        #: SQLite: the committer thread's own connection (``store.sqlite_batch``).
        self._sqlite_writer: sqlite3.Connection | None = None
        #: Batches committed by the hot shapes' fast path: in one round trip on PostgreSQL,
        #: on the DB-API connection itself on SQLite (for tests and metrics).
        self.fast_commits = 0
        #: Of those, the ones sent again with the careful INSERT because the plain one
        #: met a dedup key the store held (``store.pg_batch.held_key``).
        self.careful_retries = 0
        self._sqlite = self.dialect == "sqlite"
        self._dinsert = sqlite_dialect.insert if self._sqlite else pg_dialect.insert
        self._chunk = IN_CHUNK if self._sqlite else ARRAY_CHUNK
        self._inserted_since_open = 0
        self._analyze_pending = not self._sqlite
        self.loop_commits = not self._sqlite  # PostgreSQL's pipeline (store.batch_commit)
        #: Batches that acknowledged or moved messages (deleted rows), and how many there
        #: were at the last ``vacuum_messages``: a store with none since has nothing to
        #: vacuum. Written on the committer's thread, read on the vacuum's (an int).
        self.deleting_commits = 0
        self._deleting_commits_vacuumed = 0
        #: Whether this role's VACUUM of amq_messages does anything (None: not asked yet).
        self.may_vacuum: bool | None = None
        #: Test seam: called inside ``commit_batch`` right after the fence, while
        #: the transaction holds the group row lock.
        self.after_fence: Callable[[], None] | None = None
        #: The statements, built once (SQLAlchemy caches their compiled form).
        self._st = Statements(self._sqlite)

    # -- lifecycle ---------------------------------------------------------
    def open(self) -> None:
        if self._engine is not None:
            return
        self._engine = make_engine(self._parsed, self._opts)
        try:
            retry_while_locked(self._engine, self._sqlite, self._ensure_schema)
        except BaseException as e:
            self._engine.dispose()
            self._engine = None
            if isinstance(e, StoreError) and not isinstance(e, StoreUnusable) \
                    and is_permanent(e):
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
            raise store_error(self.description, what, e) from e

    def _ensure_schema(self) -> None:
        """Create or upgrade the schema under a lock so that racing brokers agree."""
        with self._tx("schema creation") as conn:
            ensure_schema(conn, self._sqlite, self.description)

    def _discard_writer(self) -> None:
        writer, self._writer = self._writer, None
        self._pipeline = None
        if writer is not None:
            with contextlib.suppress(Exception):
                writer.close()  # an open transaction is rolled back by the server
        lite, self._sqlite_writer = self._sqlite_writer, None
        if lite is not None:
            with contextlib.suppress(Exception):
                lite.close()

    # -- epoch -------------------------------------------------------------
    def read_epoch(self) -> int:
        """The group's epoch now (0: never claimed). Read right after the lock is
        acquired, it is what ``claim_epoch(expected=...)`` must still find."""
        with self._tx("reading the group's epoch", write=False) as conn:
            current = self._current_epoch(conn)
        return 0 if current is None else current[0]

    def claim_epoch(self, node: str, token: int | None = None, dedup_window_ms: int = 0,
                    *, expected: int | None = None) -> int:
        """Call only while holding the group's lock. On PostgreSQL a deposed master
        paused inside a batch keeps the group row locked: being the lock holder,
        we may end its session (PostgreSQL rolls its batch back), and we do.

        ``expected``: the epoch this node read when it acquired the lock. The claim
        is then a compare-and-set: a group that moved past it (another node took
        the lock from us and claimed) raises ``StaleClaim`` and nothing changes,
        so a late claim never goes backwards or over a newer master's epoch."""
        for attempt in range(1, CLAIM_ATTEMPTS + 1):
            try:
                return self._claim_epoch_once(node, token, dedup_window_ms, expected)
            except StoreError as exc:
                if self._sqlite or attempt == CLAIM_ATTEMPTS or not is_lock_timeout(exc):
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

    def _claim_epoch_once(self, node: str, token: int | None, dedup_window_ms: int,
                          expected: int | None) -> int:
        g = schema.groups
        now = now_ms()
        with self._tx("claim_epoch") as conn:
            if not self._sqlite:
                conn.execute(text(f"SET LOCAL lock_timeout = {CLAIM_LOCK_TIMEOUT_MS}"))
            conn.execute(
                self._dinsert(g)
                .values(grp=self.group, epoch=0, msg_count=0, max_msg_id=0, dedup_window_ms=0)
                .on_conflict_do_nothing(index_elements=[g.c.grp])
            )
            # Blocks behind a running batch's fence, then sees its commit (and, on
            # PostgreSQL, re-checks ``epoch = expected`` on the row it committed).
            claim = update(g).where(g.c.grp == self.group)
            if expected is not None:
                claim = claim.where(g.c.epoch == expected)
            row = conn.execute(
                claim.values(
                    epoch=greatest(g.c.epoch + 1, token or 0),
                    master=node,
                    epoch_started_at=now,
                    dedup_window_ms=dedup_window_ms,
                )
                .returning(g.c.epoch, g.c.msg_count, g.c.max_msg_id)
            ).first()
            if row is None:
                current = self._current_epoch(conn)
                raise StaleClaim(
                    f"{self.description}: {node} may not claim group {self.group!r}: it is at "
                    f"epoch {current[0] if current else 0}, not at epoch {expected} as when "
                    "this node took the lock (another node claimed it meanwhile)")
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
                  "now": now or now_ms()}
        if conn.execute(self._st.fence, params).rowcount != 1:
            raise Fenced(f"{self.description}: group {self.group!r} is no longer at epoch {epoch}")

    def _current_epoch(self, conn: Connection) -> tuple[int, int] | None:
        g = schema.groups
        row = conn.execute(
            select(g.c.epoch, g.c.max_msg_id).where(g.c.grp == self.group)
        ).first()
        return None if row is None else (int(row.epoch), int(row.max_msg_id))

    # -- counters ----------------------------------------------------------
    def _write_counters(
        self, conn: Connection, ch: Changes, predicted: int, removed: Sequence[int] = ()
    ) -> None:
        g = self.group
        depth = [{"g": g, "i": k, "n": v} for k, v in ch.depth.items() if v]
        if depth:
            conn.execute(self._st.depth, depth)
        gone = set(removed)
        pending = [
            {"g": g, "i": k, "n": v} for k, v in ch.pending.items() if v and k not in gone
        ]
        if pending:
            conn.execute(self._st.pending, pending)
        if ch.msgs != predicted:
            conn.execute(self._st.count_fix, {"g": g, "delta": ch.msgs - predicted})
