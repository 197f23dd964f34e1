"""Creating and upgrading the store's schema (``store.schema``), so that brokers
opening one store at once agree: one creates or upgrades, the others find it done.

``UPGRADES[v](conn)`` turns a version-v store into v+1; ``ensure_schema`` runs
the ones a store needs inside the schema lock's transaction.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from sqlalchemy import Connection, insert, inspect, select, text, update

from store import schema
from store.api import StoreUnusable

#: The store's log lines keep the logger name they always had (``store.sql``),
#: whichever of its modules writes them.
log = logging.getLogger("store.sql")

#: How long a schema upgrade's ALTER TABLE waits for its table lock on PostgreSQL
#: (ms): a healthy master holds it for a commit's milliseconds; the ALTER blocks
#: the table for everyone while it waits, so it should not wait 15 s.
UPGRADE_LOCK_TIMEOUT_MS = 2_000
#: The two-int advisory lock key serialising schema creation: "amql", 1. The
#: two-int key space is separate from pg_advisory_lock(bigint) used by lockers.
SCHEMA_LOCK_KEY = (0x616D716C, 1)


def _add_subscription_owner(conn: Connection) -> None:
    """v1 -> v2: ``amq_subscriptions.owner``. Existing rows keep NULL (no owner
    known): the first login that uses such a subscription becomes its owner."""
    _add_column(conn, schema.subscriptions.c.owner)


def _add_scheduling(conn: Connection) -> None:
    """v2 -> v3: scheduled delivery, ``amq_messages.deliver_at`` and ``schedule`` and
    the partial index on due times. Existing rows keep NULL: ordinary messages."""
    _add_column(conn, schema.messages.c.deliver_at)
    _add_column(conn, schema.messages.c.schedule)
    if conn.dialect.name == "postgresql":  # CREATE INDEX waits for its lock like ALTER
        conn.execute(text(f"SET LOCAL lock_timeout = {UPGRADE_LOCK_TIMEOUT_MS}"))
    # Partial: only rows with deliver_at > 0 (none yet) are indexed, so the build reads
    # the table once and writes nothing, and ordinary inserts never update it.
    schema.DUE_INDEX.create(conn, checkfirst=True)


def _add_counters(conn: Connection) -> None:
    """v3 -> v4: ``amq_counters``. ``create_all`` has made the table; existing
    destinations start at zero (what went before was never counted in the store)."""


def _add_overflow_dropped(conn: Connection) -> None:
    """v4 -> v5: ``amq_counters.overflow_dropped``; existing rows start at zero (the
    column is added nullable, and the totals add to it: NULL would stay NULL). The
    table has a row per destination, not per message: the UPDATE is small."""
    column = schema.counters.c.overflow_dropped
    _add_column(conn, column)
    conn.execute(update(schema.counters).where(column.is_(None)).values({column: 0}))


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
UPGRADES: dict[int, Callable[[Connection], None]] = {
    1: _add_subscription_owner,
    2: _add_scheduling,
    3: _add_counters,
    4: _add_overflow_dropped,
}


def ensure_schema(conn: Connection, sqlite: bool, description: str) -> None:
    """Create or upgrade the schema in ``conn``'s write transaction, under a lock
    so that racing brokers agree (on SQLite the transaction's BEGIN IMMEDIATE is
    the lock). ``description`` names the store in log lines and errors."""
    if not sqlite:
        conn.execute(
            text("SELECT pg_advisory_xact_lock(:a, :b)"),
            {"a": SCHEMA_LOCK_KEY[0], "b": SCHEMA_LOCK_KEY[1]},
        )
    found = schema_version(conn)
    if found is not None and found > schema.SCHEMA_VERSION:
        raise StoreUnusable(
            f"{description}: store schema v{found} is newer than this "
            f"amqlite (v{schema.SCHEMA_VERSION}): upgrade amqlite"
        )
    schema.metadata.create_all(conn)
    meta = schema.meta
    if found is None:
        conn.execute(
            insert(meta).values(key="schema_version", value=str(schema.SCHEMA_VERSION))
        )
        log.info("%s: created schema v%d", description, schema.SCHEMA_VERSION)
        return
    for version in range(found, schema.SCHEMA_VERSION):
        log.info("%s: upgrading schema v%d -> v%d", description, version, version + 1)
        UPGRADES[version](conn)
    if found != schema.SCHEMA_VERSION:
        conn.execute(
            update(meta)
            .where(meta.c.key == "schema_version")
            .values(value=str(schema.SCHEMA_VERSION))
        )


def schema_version(conn: Connection) -> int | None:
    """The store's schema version; None when it has no schema yet."""
    if not inspect(conn).has_table(schema.meta.name):
        return None
    value = conn.scalar(
        select(schema.meta.c.value).where(schema.meta.c.key == "schema_version")
    )
    return int(value) if value is not None else None
