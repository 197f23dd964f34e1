"""What the tests of the store's hot-shape paths share (``store.pg_batch`` on
PostgreSQL, ``store.sqlite_batch`` on SQLite): which batches take them, a sequence of
batches covering every case with what each must report, and the rows to compare with
the step-by-step path's."""

from __future__ import annotations

import dataclasses
from typing import Any

from store import Batch, BatchResult, DestinationRow, NewMessage, SqlStore, SubscriptionRow
from store.schema import COUNTER_KINDS
from tests.helpers.store import (
    DLQ,
    SUB1,
    SUB2,
    TOPIC,
    MakeStore,
    assert_counters,
    master,
    msg,
    one,
    sql,
)

Rows = dict[str, list[tuple[Any, ...]]]


#: Header values that a text-format array would have to quote or escape.
ODD_HEADERS = {"quote": 'a"b', "brace": "{x,y}", "back": "c:\\d", "null": "NULL",
               "uni": "ü✓", "empty": ""}


def totals(*per_destination: tuple[int, int, int]) -> dict[int, list[int]]:
    """``Batch.counters`` of (destination id, enqueued, dequeued) deltas."""
    out = {}
    for did, enqueued, dequeued in per_destination:
        deltas = [0] * len(COUNTER_KINDS)
        deltas[0], deltas[1] = enqueued, dequeued
        out[did] = deltas
    return out


def delivered(mid: int, **kw: Any) -> NewMessage:
    """A queue message stored as already handed to a waiting consumer."""
    return dataclasses.replace(msg(mid, **kw), delivery_count=1)


def stepwise(store: SqlStore) -> SqlStore:
    """Force the step-by-step path: the fast path never runs with the
    ``after_fence`` test seam set."""
    store.after_fence = lambda: None
    return store


def rows(store: SqlStore) -> Rows:
    """Everything a batch writes for the store's group, minus timestamps and
    the epoch columns (two groups compared side by side differ only there)."""
    queries = {
        "messages": "SELECT id, destination_id, message_id, producer_id, producer_seq, "
                    "dedup_key, priority, expires_at, enqueued_at, delivery_count, "
                    "inflight_epoch, headers, body FROM amq_messages WHERE grp = :g ORDER BY id",
        "dedup": "SELECT dedup_key, producer_id, producer_seq, msg_id FROM amq_dedup "
                 "WHERE grp = :g ORDER BY dedup_key",
        "group": "SELECT msg_count, max_msg_id FROM amq_groups WHERE grp = :g",
        "depth": "SELECT id, depth FROM amq_destinations WHERE grp = :g ORDER BY id",
        "pending": "SELECT sub_id, msg_id, delivery_count, inflight_epoch FROM amq_sub_pending "
                   "WHERE grp = :g ORDER BY sub_id, msg_id",
        "totals": f"SELECT destination_id, {', '.join(COUNTER_KINDS)} FROM amq_counters "
                  "WHERE grp = :g ORDER BY destination_id",
    }
    return {name: sql(store, q, g=store.group) for name, q in queries.items()}


def written(store: SqlStore) -> tuple[Rows, Any]:
    """``rows`` plus the group's checkpoint: what a fenced batch must not change."""
    return rows(store), one(store, "SELECT checkpoint_at FROM amq_groups WHERE grp = :g",
                            g=store.group)


def message_ids(store: SqlStore) -> list[int]:
    return [r[0] for r in sql(store, "SELECT id FROM amq_messages WHERE grp = :g ORDER BY id",
                              g=store.group)]


def commit_fast(store: SqlStore, epoch: int, batch: Batch) -> BatchResult:
    """Commit ``batch`` and check that it took the fast path."""
    before = store.fast_commits
    result = store.commit_batch(epoch, batch)
    assert store.fast_commits == before + 1, "the batch did not take the fast path"
    return result


def assert_usable(store: SqlStore, epoch: int, mid: int) -> None:
    """A failed commit left the store able to commit again on the fast path."""
    commit_fast(store, epoch, Batch(inserts=[msg(mid, key=f"again:{mid}")]))
    assert mid in message_ids(store)
    assert_counters(store)


HOT = {
    "inserts": Batch(inserts=[msg(10), msg(11, key="p:11")]),
    "delivered insert": Batch(inserts=[delivered(10)]),
    "identities": Batch(identities=[msg(10, key="p:10")]),
    "deliveries": Batch(deliveries=[(None, 1), (None, 1)]),
    "releases": Batch(releases=[(None, 1)]),
    "undeliveries": Batch(undeliveries=[1]),
    "acks": Batch(acks=[(None, 2)]),
    "topic insert for nobody": Batch(inserts=[msg(10, TOPIC.id)]),
    "empty": Batch(),
    "all hot shapes": Batch(inserts=[msg(10, key="p:10")], identities=[msg(11, key="p:11")],
                            undeliveries=[1], deliveries=[(None, 1)], releases=[(None, 2)],
                            acks=[(None, 3)]),
    "inserts, acks and totals": Batch(inserts=[msg(10, key="p:10"), msg(11, DLQ.id)],
                                      acks=[(None, 2), (None, 3)],
                                      counters=totals((1, 1, 2), (DLQ.id, 1, 0))),
}


COLD = {
    "destination": Batch(destinations=[DestinationRow(9, "/queue/new", "queue")],
                         inserts=[msg(10, 9)]),
    "subscription": Batch(subscriptions=[SubscriptionRow(9, "c9", "s9", TOPIC.id)]),
    "durable insert": Batch(inserts=[msg(10), msg(11, TOPIC.id, subs=(SUB1.id,))]),
    "durable delivery": Batch(deliveries=[(None, 1), (SUB1.id, 4)]),
    "durable release": Batch(releases=[(SUB1.id, 4)]),
    "durable ack": Batch(acks=[(None, 1), (SUB2.id, 4)]),
    "move": Batch(moves=[(1, DLQ.id)]),
    "removed subscription": Batch(removed_subscriptions=[SUB2.id]),
    "claimed subscription": Batch(claimed_subscriptions=[(SUB2.id, "alice")]),
}


def seeded(make_store: MakeStore) -> tuple[SqlStore, int]:
    """The standard master with queue messages 1-3 and a durable topic message 4."""
    s, e = master(make_store)
    s.commit_batch(e, Batch(inserts=[msg(1), msg(2), msg(3), msg(4, TOPIC.id, subs=(1, 2))]))
    return s, e


def sequence() -> list[tuple[Batch, BatchResult]]:
    """Batches covering every case of the fast path, with what each must report."""
    return [
        (Batch(  # keys and no keys, odd headers and bodies, repeats inside the batch
            inserts=[msg(1, key="p:1"), msg(2), msg(3, key="p:2", headers=ODD_HEADERS,
                                                    body=bytes(range(256))),
                     msg(4, key="p:1"), msg(5, DLQ.id), msg(6, headers={}, body=b"")],
            identities=[msg(7, key="p:3"), msg(8), msg(9, key="p:2")],
            deliveries=[(None, 1)]),
         BatchResult({"p:1", "p:2"}, {4, 9})),
        (Batch(  # repeats of earlier inserts and identities; deliveries and acks
            inserts=[msg(10, key="p:2"), msg(11, key="p:3"), msg(12, key="p:4"), msg(13)],
            identities=[msg(14, key="p:4"), msg(15, key="p:1")],
            deliveries=[(None, 2), (None, 2), (None, 3), (None, 12), (None, 5), (None, 999)],
            acks=[(None, 3), (None, 999), (None, 4)], counters=totals((1, 2, 3))),
         BatchResult({"p:1", "p:2", "p:3", "p:4"}, {10, 11, 14, 15})),
        (Batch(  # stored as delivered; releases, also twice and of nothing
            inserts=[delivered(16), delivered(17, key="p:5"), delivered(18, key="p:4")],
            deliveries=[(None, 6)],
            releases=[(None, 1), (None, 2), (None, 2), (None, 998)],
            acks=[(None, 5), (None, 12)], counters=totals((1, 3, 1), (DLQ.id, 0, 1))),
         BatchResult({"p:4"}, {18})),
        (Batch(  # handed over, then not: also twice, of nothing, and delivered again
            inserts=[delivered(25, key="p:7")], undeliveries=[16, 16, 17, 25, 997],
            deliveries=[(None, 17)]),
         BatchResult()),
        (Batch(), BatchResult()),
        (Batch(identities=[msg(19, key="p:6"), msg(20, key="p:6"), msg(21, key="p:5")]),
         BatchResult({"p:5", "p:6"}, {20, 21})),
        (Batch(acks=[(None, 1), (None, 2), (None, 16), (None, 1)]), BatchResult()),
        (Batch(inserts=[msg(22), msg(23, DLQ.id)], deliveries=[(None, 22)],
               releases=[(None, 22)]),
         BatchResult()),
        (Batch(inserts=[msg(24, key="p:1")], deliveries=[(None, 22), (None, 23)],
               acks=[(None, 22)], counters=totals((1, 1, 1))),
         BatchResult({"p:1"}, {24})),
        (Batch(  # as many inserted as acked, on two queues: depths unchanged
            inserts=[msg(26, key="p:8"), msg(27, DLQ.id)], acks=[(None, 17), (None, 23)],
            counters=totals((1, 1, 1), (DLQ.id, 1, 1))),
         BatchResult()),
        (Batch(  # acks a message it inserts (not in one statement: the DELETE would miss it)
            inserts=[msg(28), msg(29, key="p:9")], acks=[(None, 28), (None, 26)],
            counters=totals((1, 2, 2))),
         BatchResult()),
    ]

