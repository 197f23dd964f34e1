"""The hot shapes' path of ``SqlStore.commit_batch`` on both stores (PostgreSQL's
pipelined ``store.pg_batch``, SQLite's ``store.sqlite_batch``): which batches take it,
that it writes exactly what the step-by-step path writes, and that a fenced or refused
commit writes nothing. What is particular to each store is in test_pg_batch.py and
test_sqlite_batch.py."""

from __future__ import annotations

import sqlite3

import psycopg
import pytest

from store import Batch, Fenced, StoreRejected
from tests.helpers.hot_path import (
    COLD,
    HOT,
    assert_usable,
    commit_fast,
    delivered,
    message_ids,
    rows,
    seeded,
    sequence,
    stepwise,
    written,
)
from tests.helpers.store import QUEUE, MakeStore, assert_counters, master, msg, sql

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("batch", HOT.values(), ids=list(HOT))
def test_hot_shapes_take_the_fast_path(make_store: MakeStore, batch: Batch) -> None:
    s, e = seeded(make_store)
    commit_fast(s, e, batch)
    assert_counters(s)


@pytest.mark.parametrize("batch", COLD.values(), ids=list(COLD))
def test_other_shapes_go_step_by_step(make_store: MakeStore, batch: Batch) -> None:
    s, e = seeded(make_store)
    before = s.fast_commits
    s.commit_batch(e, batch)
    assert s.fast_commits == before
    assert_counters(s)


def test_the_test_seam_forces_the_step_by_step_path(make_store: MakeStore) -> None:
    """The differential test below relies on it."""
    s, e = seeded(make_store)
    stepwise(s).commit_batch(e, HOT["all hot shapes"])
    assert s.fast_commits == 0
    assert 10 in message_ids(s)


def test_fast_and_step_by_step_paths_write_the_same(make_store: MakeStore) -> None:
    fast, ef = master(make_store, "fast")
    slow, es = master(make_store, "slow")
    stepwise(slow)
    assert ef == es  # inflight_epoch is compared too
    for step, (batch, expected) in enumerate(sequence()):
        got_fast = commit_fast(fast, ef, batch)
        got_slow = slow.commit_batch(es, batch)
        assert got_fast == got_slow == expected, f"batch {step}"
        assert rows(fast) == rows(slow), f"after batch {step}"
    assert slow.fast_commits == 0
    assert message_ids(fast) == [6, 13, 25, 27, 29]
    for s, e in ((fast, ef), (slow, es)):
        assert_counters(s)
        assert not s.check_integrity(e).mismatch


def test_delivered_insert_is_stored_in_flight(make_store: MakeStore) -> None:
    s, e = master(make_store)
    commit_fast(s, e, Batch(inserts=[delivered(1), msg(2)]))
    assert sql(s, "SELECT id, delivery_count, inflight_epoch FROM amq_messages ORDER BY id") \
        == [(1, 1, e), (2, 0, None)]
    assert [(m.id, m.delivery_count) for m in s.load_page(QUEUE.id, 0, 10)] == [(1, 1), (2, 0)]


def test_a_fenced_fast_commit_writes_nothing(make_store: MakeStore) -> None:
    a, ea = seeded(make_store)
    commit_fast(a, ea, Batch(inserts=[msg(10)]))
    eb = make_store().claim_epoch("node-b")
    before = written(a)
    with pytest.raises(Fenced):
        a.commit_batch(ea, Batch(inserts=[msg(11, key="p:11")], acks=[(None, 1)]))
    assert written(a) == before
    ec = a.claim_epoch("node-a")  # a takes the group back
    assert ec == eb + 1
    assert_usable(a, ec, 12)


def test_a_refused_fast_commit_rolls_back_and_the_store_goes_on(make_store: MakeStore) -> None:
    """Message id 1 exists: the INSERT fails after the fence and the dedup rows; it is
    the data's fault (StoreRejected), nothing is written, and the store commits again."""
    s, e = seeded(make_store)
    before = written(s)
    with pytest.raises(StoreRejected) as info:
        s.commit_batch(e, Batch(inserts=[msg(10, key="p:10"), msg(1)], acks=[(None, 2)]))
    assert isinstance(info.value.__cause__,
                      (psycopg.errors.UniqueViolation, sqlite3.IntegrityError))
    assert written(s) == before
    assert_usable(s, e, 10)
