"""``Store.delete_destination`` on a real SQLite file and a real PostgreSQL: a queue goes
with its messages (in flight or not), a topic with its durable subscriptions and what they
were owed, in one fenced transaction; a deposed master removes nothing; a new master does
not recover what was deleted."""

from __future__ import annotations

import pytest

from store import Batch, DeletedDestination, DestinationRow, Fenced, SubscriptionRow
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
    sql,
)


def test_a_queue_goes_with_its_messages_and_the_others_stay(make_store: MakeStore) -> None:
    s, e = master(make_store)
    s.commit_batch(e, Batch(inserts=[msg(1), msg(2), msg(3), msg(4, DLQ.id)]))
    s.commit_batch(e, Batch(deliveries=[(None, 2)]))  # in flight: goes too
    assert s.delete_destination(e, QUEUE.id) == DeletedDestination(True, 3, 0)
    assert sql(s, "SELECT id FROM amq_messages ORDER BY id") == [(4,)]
    assert one(s, "SELECT count(*) FROM amq_destinations WHERE id = :d", d=QUEUE.id) == 0
    assert [d.name for d in s.recover(e).destinations] == [DLQ.name, TOPIC.name]
    assert_counters(s)
    # Gone already: nothing to do, and it says so.
    assert s.delete_destination(e, QUEUE.id) == DeletedDestination(False)


def test_a_topic_goes_with_its_durable_subscriptions(make_store: MakeStore) -> None:
    s, e = master(make_store)
    other = SubscriptionRow(3, "c3", "s3", DLQ.id)  # another destination's: stays
    s.commit_batch(e, Batch(subscriptions=[other]))
    s.commit_batch(e, Batch(inserts=[msg(1, TOPIC.id, subs=(SUB1.id, SUB2.id)),
                                     msg(2, TOPIC.id, subs=(SUB2.id,)), msg(3)]))
    assert s.delete_destination(e, TOPIC.id) == DeletedDestination(True, 2, 2)
    assert sql(s, "SELECT id FROM amq_messages") == [(3,)]
    assert one(s, "SELECT count(*) FROM amq_sub_pending") == 0
    assert sql(s, "SELECT id FROM amq_subscriptions") == [(other.id,)]
    recovery = s.recover(e)
    assert [x.id for x in recovery.subscriptions] == [other.id]
    assert TOPIC.name not in [d.name for d in recovery.destinations]
    assert_counters(s)


def test_the_name_can_be_used_again_with_a_new_id(make_store: MakeStore) -> None:
    """A SEND after the delete creates the destination again (a new row, same name)."""
    s, e = master(make_store)
    s.commit_batch(e, Batch(inserts=[msg(1)]))
    s.delete_destination(e, QUEUE.id)
    again = DestinationRow(10, QUEUE.name, "queue")
    s.commit_batch(e, Batch(destinations=[again], inserts=[msg(2, again.id)]))
    assert [m.id for m in s.load_page(again.id, 0, 10)] == [2]
    assert_counters(s)


def test_a_deposed_master_deletes_nothing(make_store: MakeStore) -> None:
    a, ea = master(make_store)
    a.commit_batch(ea, Batch(inserts=[msg(1), msg(2, TOPIC.id, subs=(SUB1.id,))]))
    b = make_store()
    b.claim_epoch("node-b")
    before = [sql(a, f"SELECT * FROM {t} ORDER BY 1, 2") for t in
              ("amq_destinations", "amq_messages", "amq_subscriptions", "amq_sub_pending",
               "amq_groups")]
    for did in (QUEUE.id, TOPIC.id):
        with pytest.raises(Fenced):
            a.delete_destination(ea, did)
    after = [sql(a, f"SELECT * FROM {t} ORDER BY 1, 2") for t in
             ("amq_destinations", "amq_messages", "amq_subscriptions", "amq_sub_pending",
              "amq_groups")]
    assert after == before
    assert_counters(a)
