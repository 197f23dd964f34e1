"""The per-destination totals in the store (``amq_counters``, schema v4): added by the
same fenced commit as the writes they count (both of PostgreSQL's paths, the pipelined
one and the step-by-step one, and SQLite's), read back by ``recover``, grown by the
reaper, gone with their destination, and a v3 store upgraded to them."""

from __future__ import annotations

import pytest

from store import Batch, Fenced
from store.schema import COUNTER_KINDS, SCHEMA_VERSION
from tests.helpers.store import (
    DLQ,
    QUEUE,
    TOPIC,
    MakeStore,
    make_v3_store,
    make_v4_store,
    master,
    msg,
    one,
    sql,
)


def deltas(**kinds: int) -> list[int]:
    return [kinds.get(k, 0) for k in COUNTER_KINDS]


def totals(**kinds: int) -> tuple[int, ...]:
    return tuple(deltas(**kinds))


def test_counts_commit_with_their_writes_and_are_recovered(make_store: MakeStore) -> None:
    s, e = master(make_store)
    # The hot shape (pipelined on PostgreSQL): inserts and their counts.
    s.commit_batch(e, Batch(inserts=[msg(1), msg(2), msg(3)],
                            counters={QUEUE.id: deltas(enqueued=3)}))
    s.commit_batch(e, Batch(acks=[(None, 1)], counters={QUEUE.id: deltas(dequeued=1)}))
    # A step-by-step shape: a move to the DLQ, counted on both sides.
    s.commit_batch(e, Batch(inserts=[msg(9, DLQ.id)], acks=[(None, 2)],
                            destinations=[DLQ],
                            counters={QUEUE.id: deltas(dead_lettered=1),
                                      DLQ.id: deltas(enqueued=1)}))
    assert s.recover(e).counters == {
        QUEUE.id: totals(enqueued=3, dequeued=1, dead_lettered=1),
        DLQ.id: totals(enqueued=1)}
    # One row per destination, however many commits touched it.
    assert one(s, "SELECT count(*) FROM amq_counters") == 2
    # A new master reads what the last one committed.
    e2 = s.claim_epoch("node-b")
    assert s.recover(e2).counters[QUEUE.id] == totals(enqueued=3, dequeued=1, dead_lettered=1)
    # A deposed master's counts are not added (the fence refuses the whole commit).
    with pytest.raises(Fenced):
        s.commit_batch(e, Batch(inserts=[msg(20)], counters={QUEUE.id: deltas(enqueued=1)}))
    assert s.recover(e2).counters[QUEUE.id][0] == 3


def test_reaped_messages_are_counted_expired_in_the_same_transaction(
        make_store: MakeStore) -> None:
    s, e = master(make_store)
    s.commit_batch(e, Batch(inserts=[
        msg(1, expires_at=100), msg(2, expires_at=100), msg(3),
        msg(4, TOPIC.id, subs=(1, 2), expires_at=100)]))
    reaped = s.reap_expired_counted(e, now_ms=1_000, limit=10)
    assert {d: sorted(r, key=lambda x: (x[1], x[0] or 0)) for d, r in reaped.items()} == {
        QUEUE.id: [(None, 1), (None, 2)], TOPIC.id: [(1, 4), (2, 4)]}
    counts = s.recover(e).counters
    assert counts[QUEUE.id] == totals(expired=2)
    assert counts[TOPIC.id] == totals(expired=1)  # one message, owed to two subscriptions


def test_a_deleted_destination_takes_its_counts_along(make_store: MakeStore) -> None:
    s, e = master(make_store)
    s.commit_batch(e, Batch(inserts=[msg(1)], counters={QUEUE.id: deltas(enqueued=1)}))
    s.delete_destination(e, QUEUE.id)
    assert one(s, "SELECT count(*) FROM amq_counters") == 0
    assert QUEUE.id not in s.recover(e).counters


def test_an_orphan_counts_row_keeps_its_id_from_being_handed_out(
        make_store: MakeStore) -> None:
    """Counts of a destination whose row a refused unit never created: the next
    destination id allocated at activation is past it."""
    s, e = master(make_store)
    s.commit_batch(e, Batch(counters={77: deltas(enqueued=1)}))
    rec = s.recover(e)
    assert rec.next_destination_id == 78


def test_a_v3_store_is_upgraded_to_counters(store_url: str, make_store: MakeStore) -> None:
    make_v3_store(store_url, "g1", QUEUE, [msg(1), msg(2)])
    s = make_store("g1")
    assert one(s, "SELECT value FROM amq_meta WHERE key = 'schema_version'") \
        == str(SCHEMA_VERSION)
    e = s.claim_epoch("new-node")
    rec = s.recover(e)
    assert rec.counters == {}  # what went before was never counted
    assert [d.depth for d in rec.destinations] == [2]
    s.commit_batch(e, Batch(acks=[(None, 1)], counters={QUEUE.id: deltas(dequeued=1)}))
    assert sql(s, "SELECT destination_id, dequeued FROM amq_counters") == [(QUEUE.id, 1)]


def test_a_v4_store_is_upgraded_to_count_overflow_drops(store_url: str,
                                                       make_store: MakeStore) -> None:
    """v5 adds ``amq_counters.overflow_dropped``: a v4 store's totals stay as they were."""
    make_v4_store(store_url, "g1", QUEUE, [msg(1)], deltas(enqueued=1))
    s = make_store("g1")
    assert SCHEMA_VERSION == 5
    e = s.claim_epoch("new-node")
    assert s.recover(e).counters == {QUEUE.id: totals(enqueued=1)}
    s.commit_batch(e, Batch(acks=[(None, 1)],
                            counters={QUEUE.id: deltas(overflow_dropped=1)}))
    assert s.recover(e).counters == {QUEUE.id: totals(enqueued=1, overflow_dropped=1)}
