"""Scheduled delivery in the store (schema v3), on a real SQLite file and a real
PostgreSQL: a scheduled row is stored and counted but never paged nor in a queue's
depth; the due index finds the earliest and the due rows; a step inserts the copy and
moves the row on (or removes it) in one fenced batch; a cancel removes only a scheduled
row; a v2 store is upgraded in place."""

from __future__ import annotations

import pytest
from sqlalchemy import inspect

from store import Batch, Fenced, NewMessage, ScheduleStep
from store.schema import SCHEMA_VERSION
from tests.helpers.store import (
    QUEUE,
    SUB1,
    TOPIC,
    MakeStore,
    assert_counters,
    make_v2_store,
    master,
    msg,
    one,
    sql,
)


def scheduled(mid: int, due: int, dest: int = QUEUE.id, key: str | None = None) -> NewMessage:
    row = msg(mid, dest, key=key)
    row.deliver_at, row.schedule = due, f'{{"plan":{mid}}}'
    return row


def test_scheduled_rows_are_stored_not_paged_and_found_by_due_time(
        make_store: MakeStore) -> None:
    s, epoch = master(make_store)
    s.commit_batch(epoch, Batch(inserts=[msg(1), scheduled(2, 9_000), scheduled(3, 5_000),
                                         scheduled(4, 7_000, TOPIC.id)]))
    assert [m.id for m in s.load_page(QUEUE.id, 0, 10)] == [1]
    assert [m.id for m in s.load_page_matching(QUEUE.id, 0, 10, ())] == [1]
    assert s.next_scheduled() == 5_000
    assert [r.id for r in s.due_scheduled(4_999, 10)] == []
    due = s.due_scheduled(7_000, 10)
    assert [(r.id, r.destination, r.kind, r.deliver_at) for r in due] == [
        (3, QUEUE.name, "queue", 5_000), (4, TOPIC.name, "topic", 7_000)]
    assert due[0].schedule == '{"plan":3}' and due[0].headers == {"h": "3"}
    assert [r.id for r in s.due_scheduled(9_000, 1)] == [3]  # earliest first, limited
    assert one(s, "SELECT depth FROM amq_destinations WHERE id = :i", i=QUEUE.id) == 1
    assert_counters(s)
    assert not s.check_integrity(epoch).mismatch


def test_a_step_inserts_the_copy_and_moves_or_removes_the_row(make_store: MakeStore) -> None:
    s, epoch = master(make_store)
    s.commit_batch(epoch, Batch(inserts=[scheduled(1, 1_000), scheduled(2, 2_000, TOPIC.id)]))
    copy, topic_copy = msg(10), msg(11, TOPIC.id, subs=(SUB1.id,))
    s.commit_batch(epoch, Batch(inserts=[copy, topic_copy], schedule_steps=[
        ScheduleStep(1, 3_000, '{"next":1}'), ScheduleStep(2)]))
    assert [m.id for m in s.load_page(QUEUE.id, 0, 10)] == [10]
    assert [m.id for m in s.load_subscription_page(SUB1.id, 0, 10)] == [11]
    assert sql(s, "SELECT id, deliver_at, schedule FROM amq_messages WHERE deliver_at > 0") \
        == [(1, 3_000, '{"next":1}')]
    assert s.next_scheduled() == 3_000
    assert_counters(s)
    assert not s.check_integrity(epoch).mismatch
    # A deposed master's step changes nothing.
    newer = make_store("g1")
    newer.claim_epoch("node-b")
    with pytest.raises(Fenced):
        s.commit_batch(epoch, Batch(inserts=[msg(12)], schedule_steps=[ScheduleStep(1)]))
    assert s.next_scheduled() == 3_000


def test_cancel_removes_only_a_scheduled_row(make_store: MakeStore) -> None:
    s, epoch = master(make_store)
    s.commit_batch(epoch, Batch(inserts=[msg(1), scheduled(2, 1_000, key="p:1")]))
    assert not s.cancel_scheduled(epoch, 1)  # an ordinary message is not touched
    assert s.cancel_scheduled(epoch, 2)
    assert not s.cancel_scheduled(epoch, 2)
    assert s.next_scheduled() is None
    assert [m.id for m in s.load_page(QUEUE.id, 0, 10)] == [1]
    assert_counters(s)
    assert not s.check_integrity(epoch).mismatch
    # The producer's identity stays in the dedup window: a re-send is still a duplicate.
    result = s.commit_batch(epoch, Batch(inserts=[scheduled(3, 1_000, key="p:1")]))
    assert result.duplicate_ids == {3}


def test_the_next_due_time_is_one_index_probe(make_store: MakeStore) -> None:
    """Activation asks for MIN(deliver_at): the plan reads the partial due index only."""
    s, epoch = master(make_store)
    s.commit_batch(epoch, Batch(inserts=[scheduled(i, 10_000 + i) for i in range(1, 50)]))
    query = s._st.next_due.params(g=s.group)  # the store's own statement, as it runs
    with s.engine.connect() as conn:
        if conn.dialect.name == "sqlite":
            compiled = query.compile(conn, compile_kwargs={"literal_binds": True})
            plan = " ".join(str(r[-1]) for r in conn.exec_driver_sql(
                f"EXPLAIN QUERY PLAN {compiled}"))
            assert "ix_amq_messages_due" in plan, plan
        else:
            conn.exec_driver_sql("SET enable_seqscan = off")  # a tiny table: force the choice
            compiled = query.compile(conn, compile_kwargs={"literal_binds": True})
            plan = " ".join(r[0] for r in conn.exec_driver_sql(f"EXPLAIN {compiled}"))
            assert "ix_amq_messages_due" in plan, plan


def test_a_v2_store_is_upgraded_to_v3(store_url: str, make_store: MakeStore) -> None:
    make_v2_store(store_url, "g1", QUEUE, [msg(1), msg(2)])
    s = make_store("g1")
    assert one(s, "SELECT value FROM amq_meta WHERE key = 'schema_version'") \
        == str(SCHEMA_VERSION)
    columns = {c["name"] for c in inspect(s.engine).get_columns("amq_messages")}
    assert {"deliver_at", "schedule"} <= columns
    indexes = {i["name"] for i in inspect(s.engine).get_indexes("amq_messages")}
    assert "ix_amq_messages_due" in indexes
    epoch = s.claim_epoch("new-node")
    assert [m.id for m in s.load_page(QUEUE.id, 0, 10)] == [1, 2]  # old rows: NULL, ordinary
    s.commit_batch(epoch, Batch(inserts=[scheduled(3, 4_000)]))
    assert s.next_scheduled() == 4_000
    assert [m.id for m in s.load_page(QUEUE.id, 0, 10)] == [1, 2]
    assert_counters(s)
    make_store("g1")  # opening it again changes nothing
    assert one(s, "SELECT count(*) FROM amq_meta") == 1


def test_a_delayed_redelivery_waits_in_place_and_comes_back_with_its_count(
        make_store: MakeStore) -> None:
    """``Batch.delays`` takes a delivered row out of flight with a due time (not paged,
    still in the queue's depth); ``Batch.redeliveries`` makes the same row deliverable
    again, its delivery count kept (amqlite.broker.redelivery)."""
    s, epoch = master(make_store)
    s.commit_batch(epoch, Batch(inserts=[msg(1), msg(2)]))
    s.commit_batch(epoch, Batch(deliveries=[(None, 1)]))
    s.commit_batch(epoch, Batch(delays=[(1, 4_000, '{"redelivery": 1, "delay": 1000}')]))
    assert [m.id for m in s.load_page(QUEUE.id, 0, 10)] == [2]
    assert s.queue_members(QUEUE.id) == [(2, len(msg(2).body))]
    assert s.next_scheduled() == 4_000
    [row] = s.due_scheduled(4_000, 10)
    assert (row.id, row.delivery_count, row.schedule) == (1, 1, '{"redelivery": 1, "delay": 1000}')
    assert one(s, "SELECT depth FROM amq_destinations WHERE id = :i", i=QUEUE.id) == 2
    assert one(s, "SELECT inflight_epoch FROM amq_messages WHERE id = 1") is None
    s.commit_batch(epoch, Batch(redeliveries=[1]))
    page = s.load_page(QUEUE.id, 0, 10)
    assert [(m.id, m.delivery_count) for m in page] == [(1, 1), (2, 0)]
    assert s.next_scheduled() is None
    assert one(s, "SELECT depth FROM amq_destinations WHERE id = :i", i=QUEUE.id) == 2
    assert_counters(s)
    assert not s.check_integrity(epoch).mismatch
    # Cancelled while it waits (an operator's DELETE /api/v1/scheduled/ID): out of the
    # queue's depth too, which a scheduled SEND's row never was in.
    s.commit_batch(epoch, Batch(deliveries=[(None, 2)]))
    s.commit_batch(epoch, Batch(delays=[(2, 9_000, '{"redelivery": 1, "delay": 5000}')]))
    assert s.cancel_scheduled(epoch, 2)
    assert one(s, "SELECT depth FROM amq_destinations WHERE id = :i", i=QUEUE.id) == 1
    assert_counters(s)
