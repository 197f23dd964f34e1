"""The store's SQLAlchemy engine: its pool, PostgreSQL's session settings, SQLite's
pragmas and ``BEGIN IMMEDIATE``, the sessions' ``application_name``, and the retry of a
SQLite file that another broker is busy creating.

Used by ``SqlStore`` (``store.fencing``) and by ``read_registry`` (``store.registry_sql``),
which opens an engine of its own for the CLI.
"""

from __future__ import annotations

import hashlib
import sqlite3
import time
from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.pool import QueuePool

from lockers.connections.postgres import (
    STORE_IDLE_IN_TRANSACTION_TIMEOUT_MS,
    STORE_POOL_TUNING,
    STORE_STATEMENT_TIMEOUT_MS,
    server_options,
)
from store.api import StoreError, StoreUnusable
from store.url import StoreURL

T = TypeVar("T")

#: Connections per store: the committer thread, plus the background integrity
#: check and registry heartbeats, which may run on other threads.
POOL_SIZE = 2
POOL_OVERFLOW = 2
#: How long a thread waits for a pooled connection before giving up (s).
POOL_TIMEOUT_S = 10.0
#: The pool's libpq keepalives, connect timeout and server-side statement and
#: idle-in-transaction timeouts (STORE_*) live in lockers.connections.postgres, beside the
#: lock session's, with the reason they differ.
#: SQLite: how long a writer waits for another process's write lock (ms).
#: Writes are short; 10 s is far beyond a healthy wait.
SQLITE_BUSY_TIMEOUT_MS = 10_000
#: How long open() retries a SQLite file that is busy being created by another
#: broker, and how long it pauses between tries (s).
SQLITE_OPEN_RETRY_S = 10.0
SQLITE_OPEN_RETRY_PAUSE_S = 0.05
#: UPDATE/DELETE ... RETURNING appeared in SQLite 3.35 (2021).
SQLITE_MIN_VERSION = (3, 35, 0)
APPLICATION_NAME = "amqlite-store"
#: PostgreSQL truncates application_name to NAMEDATALEN - 1 bytes.
APPLICATION_NAME_MAX = 63


def store_application_name(group: str) -> str:
    """``application_name`` of a group's store sessions, so a new master can find
    the sessions of a deposed one. PostgreSQL keeps 63 bytes: a long group name
    is shortened with a hash so two groups never share a name."""
    name = f"{APPLICATION_NAME}:{group}"
    if len(name.encode()) <= APPLICATION_NAME_MAX:
        return name
    digest = hashlib.blake2b(group.encode(), digest_size=6).hexdigest()
    return f"{APPLICATION_NAME}:{group[:30]}~{digest}"


def retry_while_locked(engine: Engine, sqlite: bool, fn: Callable[[], T]) -> T:
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


def make_engine(parsed: StoreURL, opts: dict[str, Any]) -> Engine:
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
