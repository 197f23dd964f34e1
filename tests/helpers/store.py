"""Store test helpers shared by the store and broker tests: raw SQL behind the store's
back, message rows, the usual destinations, and opening stores that are closed after."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

from sqlalchemy import Engine, create_engine, text

from store import Batch, DestinationRow, NewMessage, SqlStore, SubscriptionRow, open_store

#: The ``make_store`` fixture: opens a store on the test's URL (``store_opener``).
MakeStore = Callable[..., SqlStore]


@contextlib.contextmanager
def dml_only_role(pg_url: str, role: str) -> Iterator[tuple[str, Engine]]:
    """A login role with SELECT, INSERT, UPDATE, DELETE on the tables of ``pg_url``'s
    database and USAGE on its sequences, owning nothing (an application role a DBA
    made): yields its URL and an engine of the database's owner; dropped after."""
    admin = create_engine(pg_url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with admin.connect() as conn, conn.begin():
            conn.execute(text(f"CREATE ROLE {role} LOGIN"))
            conn.execute(text(f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN "
                              f"SCHEMA public TO {role}"))
            conn.execute(text(f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO {role}"))
        scheme, rest = pg_url.split("://", 1)
        yield f"{scheme}://{role}@{rest.split('@', 1)[-1]}", admin
    finally:
        with admin.connect() as conn, conn.begin():
            conn.execute(text(f"DROP OWNED BY {role}"))
            conn.execute(text(f"DROP ROLE {role}"))
        admin.dispose()


@contextlib.contextmanager
def store_opener(url: str) -> Iterator[MakeStore]:
    """Open stores on ``url`` (several = several brokers); all closed at the end."""
    opened: list[SqlStore] = []

    def make(group: str = "g1", **opts: Any) -> SqlStore:
        s = open_store(url, group, **opts)
        assert isinstance(s, SqlStore)
        opened.append(s)
        s.open()
        return s

    try:
        yield make
    finally:
        for s in opened:
            s.close()


def sql(store: SqlStore, query: str, **params: Any) -> list[tuple[Any, ...]]:
    """Raw SQL on the store's database (checks behind the store's back)."""
    with store.engine.begin() as conn:
        result = conn.execute(text(query), params)
        return [tuple(r) for r in result] if result.returns_rows else []


def one(store: SqlStore, query: str, **params: Any) -> Any:
    return sql(store, query, **params)[0][0]


def msg(
    mid: int,
    dest: int = 1,
    key: str | None = None,
    subs: tuple[int, ...] = (),
    body: bytes | None = None,
    expires_at: int = 0,
    headers: dict[str, str] | None = None,
) -> NewMessage:
    return NewMessage(
        id=mid,
        destination_id=dest,
        message_id=f"ID:m-{mid}",
        headers=headers if headers is not None else {"h": str(mid)},
        body=body if body is not None else b"body-%d" % mid,
        expires_at=expires_at,
        enqueued_at=1_000 + mid,
        dedup_key=key,
        producer_id=key.split(":")[0] if key else None,
        producer_seq=int(key.split(":")[1]) if key and ":" in key else None,
        subscriber_ids=subs,
    )


QUEUE = DestinationRow(1, "/queue/a", "queue")
DLQ = DestinationRow(2, "/queue/DLQ", "queue")
TOPIC = DestinationRow(3, "/topic/t", "topic")
SUB1 = SubscriptionRow(1, "c1", "s1", TOPIC.id)
SUB2 = SubscriptionRow(2, "c2", "s2", TOPIC.id)


def master(make_store: MakeStore, group: str = "g1") -> tuple[SqlStore, int]:
    """An opened store that claimed the group, with the standard destinations
    and two durable subscriptions on the topic."""
    s = make_store(group)
    epoch = s.claim_epoch("node-a")
    s.commit_batch(epoch, Batch(destinations=[QUEUE, DLQ, TOPIC], subscriptions=[SUB1, SUB2]))
    return s, epoch


def assert_counters(store: SqlStore) -> None:
    """depth, pending and msg_count agree with the rows they count."""
    g = store.group
    for dest_id, depth in sql(store, "SELECT id, depth FROM amq_destinations WHERE grp=:g", g=g):
        # scheduled rows (deliver_at > 0) are in no depth until a copy is due
        rows = one(store, "SELECT count(*) FROM amq_messages WHERE grp=:g AND destination_id=:d"
                   " AND coalesce(deliver_at, 0) = 0", g=g, d=dest_id)
        assert depth == rows, f"destination {dest_id}: depth {depth}, rows {rows}"
    for sub_id, pending in sql(store, "SELECT id, pending FROM amq_subscriptions WHERE grp=:g",
                               g=g):
        rows = one(store, "SELECT count(*) FROM amq_sub_pending WHERE grp=:g AND sub_id=:s",
                   g=g, s=sub_id)
        assert pending == rows, f"subscription {sub_id}: pending {pending}, rows {rows}"
    count = one(store, "SELECT msg_count FROM amq_groups WHERE grp=:g", g=g)
    assert count == one(store, "SELECT count(*) FROM amq_messages WHERE grp=:g", g=g)


def make_v1_store(url: str, group: str, subscriptions: list[SubscriptionRow],
                  topic: DestinationRow, messages: list[NewMessage]) -> None:
    """A store as schema v1 left it (before durable subscriptions had an owner), with
    ``subscriptions`` on ``topic`` owed ``messages``: written by today's code, then
    the later columns dropped and the version put back, which leaves exactly v1's
    tables (v2 added only ``amq_subscriptions.owner``, v3 ``amq_messages.deliver_at``
    and ``schedule`` with their index; SQLite >= 3.35 and PostgreSQL drop a column in
    place)."""
    s = open_store(url, group)
    assert isinstance(s, SqlStore)
    s.open()
    try:
        epoch = s.claim_epoch("old-node")
        s.commit_batch(epoch, Batch(destinations=[topic], subscriptions=subscriptions))
        if messages:
            s.commit_batch(epoch, Batch(inserts=messages))
        s.end_activation(epoch)
        sql(s, "ALTER TABLE amq_subscriptions DROP COLUMN owner")
        drop_v4(s)
        drop_v3(s)
        sql(s, "UPDATE amq_meta SET value = '1' WHERE key = 'schema_version'")
    finally:
        s.close()


def drop_v3(s: SqlStore) -> None:
    """What schema v3 added (scheduled delivery), dropped: the index first (SQLite
    refuses to drop an indexed column)."""
    sql(s, "DROP INDEX ix_amq_messages_due")
    sql(s, "ALTER TABLE amq_messages DROP COLUMN deliver_at")
    sql(s, "ALTER TABLE amq_messages DROP COLUMN schedule")


def drop_v4(s: SqlStore) -> None:
    """What schema v4 added: the per-destination totals."""
    sql(s, "DROP TABLE amq_counters")


def make_v4_store(url: str, group: str, queue: DestinationRow, messages: list[NewMessage],
                  counts: list[int]) -> None:
    """A store as schema v4 left it (``amq_counters`` without ``overflow_dropped``),
    ``messages`` in ``queue`` counted ``counts`` (one per ``COUNTER_KINDS``; the last, 0)."""
    s = open_store(url, group)
    assert isinstance(s, SqlStore)
    s.open()
    try:
        epoch = s.claim_epoch("old-node")
        s.commit_batch(epoch, Batch(destinations=[queue], inserts=messages,
                                    counters={queue.id: counts}))
        s.end_activation(epoch)
        sql(s, "ALTER TABLE amq_counters DROP COLUMN overflow_dropped")
        sql(s, "UPDATE amq_meta SET value = '4' WHERE key = 'schema_version'")
    finally:
        s.close()


def make_v3_store(url: str, group: str, queue: DestinationRow,
                  messages: list[NewMessage]) -> None:
    """A store as schema v3 left it (before ``amq_counters``), ``messages`` in ``queue``."""
    _make_old_store(url, group, queue, messages, 3)


def make_v2_store(url: str, group: str, queue: DestinationRow,
                  messages: list[NewMessage]) -> None:
    """A store as schema v2 left it (before scheduled delivery), ``messages`` in
    ``queue``: written by today's code, then v3's columns and index dropped."""
    _make_old_store(url, group, queue, messages, 2)


def _make_old_store(url: str, group: str, queue: DestinationRow, messages: list[NewMessage],
                    version: int) -> None:
    """``messages`` in ``queue`` written by today's code, then what every schema version
    after ``version`` (2 or 3) added dropped, newest first."""
    s = open_store(url, group)
    assert isinstance(s, SqlStore)
    s.open()
    try:
        epoch = s.claim_epoch("old-node")
        s.commit_batch(epoch, Batch(destinations=[queue], inserts=messages))
        s.end_activation(epoch)
        drop_v4(s)
        if version < 3:
            drop_v3(s)
        sql(s, "UPDATE amq_meta SET value = :v WHERE key = 'schema_version'", v=str(version))
    finally:
        s.close()


def open_at_once(url: str, groups: list[str],
                 then: Callable[[SqlStore], Any] | None = None,
                 ) -> tuple[list[SqlStore], list[BaseException]]:
    """Open one store per group from as many threads released together (brokers
    starting at once), each then running ``then``; every store (close them) and every
    failure, not just the first."""
    barrier = threading.Barrier(len(groups))
    errors: list[BaseException] = []
    stores: list[SqlStore] = []
    lock = threading.Lock()

    def start(group: str) -> None:
        s = SqlStore(url, group)
        with lock:
            stores.append(s)
        barrier.wait()
        try:
            s.open()
            if then is not None:
                then(s)
        except BaseException as e:
            with lock:
                errors.append(e)

    threads = [threading.Thread(target=start, args=(g,)) for g in groups]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return stores, errors
