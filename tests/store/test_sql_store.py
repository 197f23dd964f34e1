"""The store on real SQLite files and a real PostgreSQL: schema, epochs,
fencing, batches, dedup, paging, counters, activation and housekeeping."""

from __future__ import annotations

from pathlib import Path

import pytest

from store import (
    Batch,
    Fenced,
    SqlStore,
    StoreError,
    SubscriptionRow,
    open_store,
    parse_store_url,
    read_registry,
)
from store import migrations as store_migrations
from store.schema import SCHEMA_VERSION
from tests.helpers.servers import free_port
from tests.helpers.store import (
    DLQ,
    QUEUE,
    SUB1,
    SUB2,
    TOPIC,
    MakeStore,
    assert_counters,
    master,
    msg,
    one,
    open_at_once,
    sql,
)

# -- URLs --------------------------------------------------------------------


@pytest.mark.parametrize(
    "url, fragment",
    [
        ("mysql://u:secret@h/db", "unsupported store URL scheme 'mysql'"),
        ("not a url", "cannot parse store URL"),
        ("sqlite://", "needs a database file"),
        ("sqlite:///:memory:", "needs a database file"),
        ("postgresql://u:secret@h:5432", "names no database"),
    ],
)
def test_bad_url_is_one_clear_line(url: str, fragment: str) -> None:
    with pytest.raises(StoreError) as info:
        open_store(url, "g")
    message = str(info.value)
    assert fragment in message
    assert "\n" not in message
    assert "secret" not in message


def test_urls_map_to_psycopg_and_hide_passwords(tmp_path: Path) -> None:
    for raw in ("postgresql://u:pw@h:5/db", "postgres://u:pw@h:5/db",
                "postgresql+psycopg://u:pw@h:5/db"):
        parsed = parse_store_url(raw)
        assert parsed.url.drivername == "postgresql+psycopg"
        assert "pw" not in parsed.description and "***" in parsed.description
    q = parse_store_url("postgresql://u@h/db?password=pw2")
    assert "pw2" not in q.description
    lite = parse_store_url(f"sqlite:///{tmp_path}/x/a.db")
    assert lite.dialect == "sqlite" and lite.path == tmp_path / "x" / "a.db"


# -- schema ------------------------------------------------------------------


def test_schema_create_is_idempotent(make_store: MakeStore) -> None:
    a = make_store()
    b = make_store()
    b.close()
    b.open()
    assert sql(a, "SELECT key, value FROM amq_meta") == [("schema_version", str(SCHEMA_VERSION))]


def test_concurrent_schema_creation_from_three_brokers(store_url: str) -> None:
    stores, errors = open_at_once(store_url, [f"g{i}" for i in range(3)],
                                  lambda s: s.claim_epoch(f"node-{s.group}"))
    try:
        assert errors == []
        assert one(stores[0], "SELECT count(*) FROM amq_meta") == 1
        assert one(stores[0], "SELECT count(*) FROM amq_groups") == 3
    finally:
        for s in stores:
            s.close()


def test_newer_schema_is_refused(make_store: MakeStore, store_url: str) -> None:
    a = make_store()
    sql(a, "UPDATE amq_meta SET value = '99' WHERE key = 'schema_version'")
    late = open_store(store_url, "g1")
    with pytest.raises(StoreError, match="v99 is newer"):
        late.open()


def test_older_schema_runs_the_upgrade_hooks(
    make_store: MakeStore, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = make_store()
    sql(a, "UPDATE amq_meta SET value = '0' WHERE key = 'schema_version'")
    ran: list[int] = []
    monkeypatch.setitem(store_migrations.UPGRADES, 0, lambda conn: ran.append(0))
    make_store()
    assert ran == [0]
    assert one(a, "SELECT value FROM amq_meta") == str(SCHEMA_VERSION)


def test_sqlite_is_wal_with_full_sync(tmp_path: Path) -> None:
    s = open_store(f"sqlite:///{tmp_path}/deep/dir/amq.db", "g")
    assert isinstance(s, SqlStore)
    s.open()
    try:
        assert (tmp_path / "deep" / "dir" / "amq.db").exists()
        assert one(s, "PRAGMA journal_mode") == "wal"
        assert one(s, "PRAGMA synchronous") == 2  # FULL
    finally:
        s.close()


# -- epochs and fencing --------------------------------------------------------


def test_claim_epoch_increments_and_honours_token(make_store: MakeStore) -> None:
    s = make_store()
    assert s.claim_epoch("a") == 1
    assert s.claim_epoch("b") == 2
    assert s.claim_epoch("c", token=100) == 100
    assert s.claim_epoch("d", token=50) == 101  # a token never moves the epoch back
    assert sql(s, "SELECT master, epoch FROM amq_groups") == [("d", 101)]
    rows = sql(s, "SELECT epoch, node, expected_count, expected_max_id FROM amq_activations "
                  "ORDER BY epoch")
    assert rows == [(1, "a", 0, 0), (2, "b", 0, 0), (100, "c", 0, 0), (101, "d", 0, 0)]


def test_groups_are_independent(make_store: MakeStore) -> None:
    a = make_store("ga")
    b = make_store("gb")
    ea = a.claim_epoch("a")
    b.claim_epoch("b")
    b.claim_epoch("b2")
    a.commit_batch(ea, Batch(destinations=[QUEUE], inserts=[msg(1)]))  # not fenced by gb
    assert a.load_page(QUEUE.id, 0, 10)[0].id == 1
    assert b.load_page(QUEUE.id, 0, 10) == []


def test_deposed_master_is_fenced_and_writes_nothing(make_store: MakeStore) -> None:
    a, ea = master(make_store)
    a.commit_batch(ea, Batch(inserts=[msg(1)]))
    b = make_store()
    eb = b.claim_epoch("node-b")
    assert eb == ea + 1
    before = sql(a, "SELECT msg_count, max_msg_id, checkpoint_at FROM amq_groups")
    with pytest.raises(Fenced):
        a.commit_batch(ea, Batch(inserts=[msg(2, key="p:1")], acks=[(None, 1)]))
    with pytest.raises(Fenced):
        a.reap_expired(ea, 10**15, 10)
    with pytest.raises(Fenced):
        a.prune_dedup(ea, 10**15, 10)
    with pytest.raises(Fenced):
        a.recover(ea)
    a.end_activation(ea)  # a no-op when fenced
    assert sql(a, "SELECT id FROM amq_messages") == [(1,)]
    assert one(a, "SELECT count(*) FROM amq_dedup") == 0
    assert sql(a, "SELECT msg_count, max_msg_id, checkpoint_at FROM amq_groups") == before
    assert one(a, "SELECT ended_at FROM amq_activations WHERE epoch = :e", e=ea) is None
    # The new master is not disturbed.
    b.commit_batch(eb, Batch(inserts=[msg(2)]))
    assert [m.id for m in b.load_page(QUEUE.id, 0, 10)] == [1, 2]


def test_commit_failure_rolls_back_everything(make_store: MakeStore) -> None:
    s, e = master(make_store)
    s.commit_batch(e, Batch(inserts=[msg(1)]))
    before = sql(s, "SELECT msg_count, max_msg_id FROM amq_groups")
    # id 1 exists: the second insert violates the primary key after the
    # fence, the dedup row and the first insert were written.
    with pytest.raises(StoreError) as info:
        s.commit_batch(e, Batch(inserts=[msg(2, key="p:9"), msg(1)]))
    assert not isinstance(info.value, Fenced)
    assert info.value.__cause__ is not None
    assert sql(s, "SELECT id FROM amq_messages") == [(1,)]
    assert one(s, "SELECT count(*) FROM amq_dedup") == 0
    assert sql(s, "SELECT msg_count, max_msg_id FROM amq_groups") == before
    s.commit_batch(e, Batch(inserts=[msg(2, key="p:9")]))  # the store is still usable
    assert_counters(s)


# -- batches -------------------------------------------------------------------


def test_queue_paging_by_id_with_limits(make_store: MakeStore) -> None:
    s, e = master(make_store)
    body = bytes(range(256)) * 4  # not UTF-8: bodies are bytes
    s.commit_batch(e, Batch(inserts=[msg(i, body=body if i == 3 else None) for i in range(1, 8)]
                            + [msg(8, dest=DLQ.id)]))
    page = s.load_page(QUEUE.id, 0, 3)
    assert [m.id for m in page] == [1, 2, 3]
    assert page[2].body == body
    assert page[0].headers == {"h": "1"} and page[0].message_id == "ID:m-1"
    assert page[0].enqueued_at == 1001 and page[0].delivery_count == 0
    assert [m.id for m in s.load_page(QUEUE.id, 3, 3)] == [4, 5, 6]
    assert [m.id for m in s.load_page(QUEUE.id, 6, 3)] == [7]
    assert s.load_page(QUEUE.id, 7, 3) == []
    assert [m.id for m in s.load_page(DLQ.id, 0, 10)] == [8]
    assert_counters(s)


def test_dedup_across_batches_within_a_batch_and_after_ack(make_store: MakeStore) -> None:
    s, e = master(make_store)
    r = s.commit_batch(e, Batch(inserts=[msg(1, key="p:1"), msg(2, key="p:2"),
                                         msg(3, key="p:1")]))
    assert r.duplicates == {"p:1"} and r.duplicate_ids == {3}
    r = s.commit_batch(e, Batch(inserts=[msg(4, key="p:2"), msg(5, key="p:3")]))
    assert r.duplicates == {"p:2"} and r.duplicate_ids == {4}
    s.commit_batch(e, Batch(acks=[(None, 1), (None, 2), (None, 5)]))
    assert s.load_page(QUEUE.id, 0, 10) == []
    # The message rows are gone, the identities are not (ActiveMQ's JDBC gap).
    r = s.commit_batch(e, Batch(inserts=[msg(6, key="p:1"), msg(7, key="p:4")]))
    assert r.duplicates == {"p:1"} and r.duplicate_ids == {6}
    assert [m.id for m in s.load_page(QUEUE.id, 0, 10)] == [7]
    rows = sql(s, "SELECT dedup_key, producer_id, producer_seq, msg_id FROM amq_dedup "
                  "ORDER BY dedup_key")
    assert rows == [("p:1", "p", 1, 1), ("p:2", "p", 2, 2), ("p:3", "p", 3, 5),
                    ("p:4", "p", 4, 7)]
    assert_counters(s)


def test_durable_subscription_pending_semantics(make_store: MakeStore) -> None:
    s, e = master(make_store)
    s.commit_batch(e, Batch(inserts=[msg(1, TOPIC.id, subs=(1, 2)),
                                     msg(2, TOPIC.id, subs=(1, 2)),
                                     msg(3, TOPIC.id, subs=(2,))]))
    assert [m.id for m in s.load_subscription_page(SUB1.id, 0, 10)] == [1, 2]
    assert [m.id for m in s.load_subscription_page(SUB2.id, 0, 2)] == [1, 2]
    assert [m.id for m in s.load_subscription_page(SUB2.id, 2, 2)] == [3]
    assert_counters(s)
    s.commit_batch(e, Batch(acks=[(SUB1.id, 1)]))
    assert sql(s, "SELECT id FROM amq_messages ORDER BY id") == [(1,), (2,), (3,)]
    s.commit_batch(e, Batch(acks=[(SUB2.id, 1), (SUB2.id, 3)]))  # last owner of 1 and 3
    assert sql(s, "SELECT id FROM amq_messages ORDER BY id") == [(2,)]
    assert_counters(s)
    # Removing a subscription takes its pending rows and the rows only it was owed.
    s.commit_batch(e, Batch(inserts=[msg(4, TOPIC.id, subs=(2,))]))
    s.commit_batch(e, Batch(removed_subscriptions=[SUB2.id]))
    assert sql(s, "SELECT id FROM amq_messages ORDER BY id") == [(2,)]  # sub 1 still owes 2
    assert sql(s, "SELECT sub_id, msg_id FROM amq_sub_pending") == [(1, 2)]
    assert sql(s, "SELECT id FROM amq_subscriptions") == [(1,)]
    s.commit_batch(e, Batch(removed_subscriptions=[SUB1.id]))
    assert one(s, "SELECT count(*) FROM amq_messages") == 0
    assert one(s, "SELECT count(*) FROM amq_sub_pending") == 0
    assert_counters(s)


def test_subscription_recreated_in_a_later_batch(make_store: MakeStore) -> None:
    s, e = master(make_store)
    s.commit_batch(e, Batch(removed_subscriptions=[SUB1.id]))
    again = SubscriptionRow(5, SUB1.client_id, SUB1.name, TOPIC.id, selector="x = 1")
    s.commit_batch(e, Batch(subscriptions=[again]))
    assert s.recover(e).subscriptions[-1] == again


def test_deliveries_releases_moves(make_store: MakeStore) -> None:
    s, e = master(make_store)
    s.commit_batch(e, Batch(inserts=[msg(1), msg(2), msg(3), msg(4, TOPIC.id, subs=(1, 2))]))
    # Delivered twice in one batch counts twice; a delivery acked in the same
    # batch is skipped (its row goes anyway).
    s.commit_batch(e, Batch(deliveries=[(None, 1), (None, 2), (None, 2), (None, 3), (1, 4)],
                            acks=[(None, 3)]))
    rows = sql(s, "SELECT id, delivery_count, inflight_epoch FROM amq_messages "
                  "WHERE destination_id = :d ORDER BY id", d=QUEUE.id)
    assert rows == [(1, 1, e), (2, 2, e)]
    assert [m.delivery_count for m in s.load_subscription_page(SUB1.id, 0, 10)] == [1]
    assert [m.delivery_count for m in s.load_subscription_page(SUB2.id, 0, 10)] == [0]
    assert sql(s, "SELECT inflight_epoch FROM amq_sub_pending WHERE sub_id = 1") == [(e,)]
    s.commit_batch(e, Batch(releases=[(None, 1), (1, 4)]))
    assert one(s, "SELECT inflight_epoch FROM amq_messages WHERE id = 1") is None
    assert sql(s, "SELECT inflight_epoch FROM amq_sub_pending WHERE sub_id = 1") == [(None,)]
    assert one(s, "SELECT delivery_count FROM amq_messages WHERE id = 1") == 1
    # To the DLQ: destination changes, not in flight, depths follow.
    s.commit_batch(e, Batch(moves=[(2, DLQ.id)]))
    assert [m.id for m in s.load_page(DLQ.id, 0, 10)] == [2]
    assert [m.id for m in s.load_page(QUEUE.id, 0, 10)] == [1]
    assert one(s, "SELECT inflight_epoch FROM amq_messages WHERE id = 2") is None
    assert one(s, "SELECT delivery_count FROM amq_messages WHERE id = 2") == 2
    assert_counters(s)
    # Move and ack in one batch: the depth leaves the new destination.
    s.commit_batch(e, Batch(moves=[(1, DLQ.id)], acks=[(None, 1)]))
    assert s.load_page(DLQ.id, 0, 10)[0].id == 2
    assert_counters(s)


def test_big_batches_are_chunked(make_store: MakeStore) -> None:
    s, e = master(make_store)
    n = 1234  # more than two IN_CHUNKs
    s.commit_batch(e, Batch(inserts=[msg(i, key=f"p:{i}") for i in range(1, n + 1)]))
    s.commit_batch(e, Batch(deliveries=[(None, i) for i in range(1, n + 1)]))
    r = s.commit_batch(e, Batch(inserts=[msg(n + i, key=f"p:{i}") for i in range(1, n + 1)],
                                acks=[(None, i) for i in range(1, n, 2)]))
    assert len(r.duplicate_ids) == n
    assert one(s, "SELECT count(*) FROM amq_messages") == n // 2
    assert one(s, "SELECT min(delivery_count) FROM amq_messages") == 1
    assert_counters(s)


# -- activation ------------------------------------------------------------------


def test_recover_returns_metadata_and_next_ids(make_store: MakeStore) -> None:
    s, e = master(make_store)
    s.commit_batch(e, Batch(inserts=[msg(1), msg(2), msg(3, TOPIC.id, subs=(1,))]))
    s.commit_batch(e, Batch(acks=[(None, 2)]))
    s.commit_batch(e, Batch(acks=[(1, 3)]))  # the newest id is gone now
    b = make_store()
    eb = b.claim_epoch("node-b")
    rec = b.recover(eb)
    assert rec.epoch == eb
    assert [(d.id, d.name, d.kind, d.depth) for d in rec.destinations] == [
        (1, "/queue/a", "queue", 1), (2, "/queue/DLQ", "queue", 0), (3, "/topic/t", "topic", 0)]
    assert [(x.id, x.client_id, x.name, x.destination_id, x.pending)
            for x in rec.subscriptions] == [(1, "c1", "s1", 3, 0), (2, "c2", "s2", 3, 0)]
    assert rec.next_message_id == 4  # not 2: an acked id is never handed out again
    assert rec.next_destination_id == 4
    assert rec.next_subscription_id == 3


def test_recover_of_an_empty_group(make_store: MakeStore) -> None:
    s = make_store()
    e = s.claim_epoch("a")
    rec = s.recover(e)
    assert (rec.destinations, rec.subscriptions) == ([], [])
    assert (rec.next_message_id, rec.next_destination_id, rec.next_subscription_id) == (1, 1, 1)


def test_activation_records_counters_and_integrity(make_store: MakeStore) -> None:
    a, ea = master(make_store)
    a.commit_batch(ea, Batch(inserts=[msg(i) for i in range(1, 6)]))
    a.commit_batch(ea, Batch(acks=[(None, 5)]))
    a.end_activation(ea)
    assert one(a, "SELECT ended_at FROM amq_activations WHERE epoch = :e", e=ea) is not None
    b = make_store()
    eb = b.claim_epoch("node-b")
    assert sql(b, "SELECT expected_count, expected_max_id FROM amq_activations "
                  "WHERE epoch = :e", e=eb) == [(4, 5)]
    # The new master commits before the background check runs: no false alarm.
    b.commit_batch(eb, Batch(inserts=[msg(6), msg(7)], acks=[(None, 1)]))
    check = b.check_integrity(eb)
    assert not check.mismatch
    assert (check.actual_count, check.expected_count, check.actual_max_id) == (5, 5, 7)
    row = sql(b, "SELECT actual_count, actual_max_id, mismatch FROM amq_activations "
                 "WHERE epoch = :e", e=eb)
    assert row == [(4, 7, False)]


def test_integrity_check_detects_a_row_deleted_behind_our_back(make_store: MakeStore) -> None:
    a, ea = master(make_store)
    a.commit_batch(ea, Batch(inserts=[msg(i) for i in range(1, 4)]))
    sql(a, "DELETE FROM amq_messages WHERE id = 2")
    b = make_store()
    eb = b.claim_epoch("node-b")
    check = b.check_integrity(eb)
    assert check.mismatch
    assert (check.expected_count, check.actual_count) == (3, 2)
    assert sql(b, "SELECT expected_count, actual_count, mismatch FROM amq_activations "
                  "WHERE epoch = :e", e=eb) == [(3, 2, True)]


def test_integrity_check_detects_a_foreign_row(make_store: MakeStore) -> None:
    a, ea = master(make_store)
    a.commit_batch(ea, Batch(inserts=[msg(1)]))
    sql(a, "INSERT INTO amq_messages (grp, id, destination_id, message_id, priority, expires_at,"
           " enqueued_at, delivery_count, headers, body) "
           "VALUES ('g1', 99, 1, 'x', 4, 0, 0, 0, '{}', :b)", b=b"")
    sql(a, "DELETE FROM amq_messages WHERE id = 1")  # the count still matches
    check = a.check_integrity(ea)
    assert check.mismatch and check.actual_max_id == 99 and check.expected_max_id == 1


# -- housekeeping ----------------------------------------------------------------


def test_reap_expired(make_store: MakeStore) -> None:
    s, e = master(make_store)
    s.commit_batch(e, Batch(inserts=[
        msg(1, expires_at=100), msg(2, expires_at=0), msg(3, expires_at=5_000),
        msg(4, TOPIC.id, subs=(1, 2), expires_at=200), msg(5, expires_at=300),
    ]))
    s.commit_batch(e, Batch(acks=[(SUB1.id, 4)]))
    gone = s.reap_expired(e, now_ms=1_000, limit=2)  # oldest expiry first
    assert sorted(gone, key=lambda r: (r[1], r[0] or 0)) == [(None, 1), (SUB2.id, 4)]
    assert s.reap_expired(e, now_ms=1_000, limit=10) == [(None, 5)]
    assert s.reap_expired(e, now_ms=1_000, limit=10) == []
    assert sql(s, "SELECT id FROM amq_messages ORDER BY id") == [(2,), (3,)]
    assert one(s, "SELECT count(*) FROM amq_sub_pending") == 0
    assert_counters(s)


def test_prune_dedup(make_store: MakeStore) -> None:
    s, e = master(make_store)
    s.commit_batch(e, Batch(inserts=[msg(i, key=f"p:{i}") for i in range(1, 6)]))
    sql(s, "UPDATE amq_dedup SET created_at = producer_seq")  # ages 1..5
    assert s.prune_dedup(e, older_than_ms=4, limit=2) == 2
    assert sql(s, "SELECT dedup_key FROM amq_dedup ORDER BY dedup_key") == [
        ("p:3",), ("p:4",), ("p:5",)]
    assert s.prune_dedup(e, older_than_ms=4, limit=10) == 1
    # Out of the window, the identity is accepted again.
    r = s.commit_batch(e, Batch(inserts=[msg(10, key="p:1"), msg(11, key="p:5")]))
    assert r.duplicate_ids == {11}


# -- registry --------------------------------------------------------------------


def test_registry_rows(make_store: MakeStore, store_url: str) -> None:
    s = make_store("g1")
    t = make_store("g2")
    s.register("b1", "slave", [], "h1", 11, None)
    s.register("b1", "master", ["tcp://h1:61613", "tcp://h1:61614"], "h1", 11, 3)
    t.register("b2", "slave", "", "h2", 12, None)
    rows = read_registry(store_url)
    assert [(r["grp"], r["name"], r["role"], r["services"], r["epoch"]) for r in rows] == [
        ("g1", "b1", "master", "tcp://h1:61613,tcp://h1:61614", 3), ("g2", "b2", "slave", "", None)]
    assert [r["name"] for r in read_registry(store_url, group="g2")] == ["b2"]
    sql(s, "UPDATE amq_registry SET heartbeat_at = 0 WHERE name = 'b2'")
    assert [r["name"] for r in read_registry(store_url)] == ["b1"]
    assert len(read_registry(store_url, max_age_ms=None)) == 2
    s.unregister("b1")
    assert read_registry(store_url) == []


def test_read_registry_of_a_missing_store_creates_nothing(tmp_path: Path) -> None:
    path = tmp_path / "none" / "amqlite.db"
    assert read_registry(f"sqlite:///{path}") == []
    assert not path.exists()


def test_unreachable_postgres_is_a_store_error() -> None:
    url = f"postgresql://u:secret@127.0.0.1:{free_port()}/db"
    s = open_store(url, "g")  # parsing only: connecting is open()'s job
    with pytest.raises(StoreError) as info:
        s.open()
    assert "secret" not in str(info.value) and "\n" not in str(info.value)


def test_postgres_sessions_notice_a_dead_peer_and_time_out(pg_url: str) -> None:
    s = open_store(pg_url, "g")
    assert isinstance(s, SqlStore)
    s.open()
    try:
        assert one(s, "SHOW statement_timeout") == "15s"
        assert one(s, "SHOW idle_in_transaction_session_timeout") == "30s"
        with s.engine.connect() as conn:
            params = conn.connection.driver_connection.info.get_parameters()
        assert params["keepalives"] == "1"
        assert params["tcp_user_timeout"] == "10000"
        assert params["connect_timeout"] == "5"
    finally:
        s.close()
