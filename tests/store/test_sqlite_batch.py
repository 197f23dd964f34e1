"""SQLite's path for the hot shapes of ``SqlStore.commit_batch`` (``store.sqlite_batch``):
the batches PostgreSQL pipelines take it, the others go step by step; it writes
exactly what the step-by-step path writes (the same batches as PostgreSQL's
differential test); a fenced or failed commit writes nothing and leaves the store
usable; a big batch's IN lists go in chunks."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from store import Batch, BatchResult, Fenced, StoreError, StoreRejected
from store.statements import IN_CHUNK
from tests.helpers.store import DLQ, QUEUE, MakeStore, assert_counters, master, msg, one, sql
from tests.store.test_pg_batch import (
    COLD,
    HOT,
    assert_usable,
    commit_fast,
    message_ids,
    rows,
    seeded,
    sequence,
    stepwise,
    written,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    """SQLite only (overrides the conftest's SQLite/PostgreSQL pair)."""
    return f"sqlite:///{tmp_path / 'data' / 'amqlite.db'}"


@pytest.mark.parametrize("batch", HOT.values(), ids=list(HOT))
def test_hot_shapes_take_the_fast_path(make_store: MakeStore, batch: Batch) -> None:
    s, e = seeded(make_store)
    commit_fast(s, e, batch)
    assert_counters(s)


@pytest.mark.parametrize("batch", COLD.values(), ids=list(COLD))
def test_other_shapes_go_step_by_step(make_store: MakeStore, batch: Batch) -> None:
    s, e = seeded(make_store)
    before = s.pipelined_commits
    s.commit_batch(e, batch)
    assert s.pipelined_commits == before
    assert_counters(s)


def test_fast_and_step_by_step_paths_write_the_same(make_store: MakeStore) -> None:
    fast, ef = master(make_store, "fast")
    slow, es = master(make_store, "slow")
    stepwise(slow)
    for step, (batch, expected) in enumerate(sequence()):
        got_fast = commit_fast(fast, ef, batch)
        got_slow = slow.commit_batch(es, batch)
        assert got_fast == got_slow == expected, f"batch {step}"
        assert rows(fast) == rows(slow), f"after batch {step}"
    assert slow.pipelined_commits == 0
    assert message_ids(fast) == [6, 13, 17, 23, 25]
    for s, e in ((fast, ef), (slow, es)):
        assert_counters(s)
        assert not s.check_integrity(e).mismatch


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
    """Message id 1 exists: the INSERT fails after the fence, the dedup lookup and
    nothing else; it is the data's fault (StoreRejected), and nothing is written."""
    s, e = seeded(make_store)
    before = written(s)
    with pytest.raises(StoreRejected) as info:
        s.commit_batch(e, Batch(inserts=[msg(10, key="p:10"), msg(1)], acks=[(None, 2)]))
    assert isinstance(info.value.__cause__, sqlite3.IntegrityError)
    assert written(s) == before
    assert_usable(s, e, 10)


def test_a_commit_behind_another_writer_past_the_busy_timeout_fails_cleanly(
    make_store: MakeStore, tmp_path: Path
) -> None:
    """Another process's write transaction holds the file's write lock past the
    store's busy timeout: the commit fails as StoreError (not fenced, not refused),
    writes nothing, and the next one, once the lock is free, commits."""
    s, e = seeded(make_store)
    s.close()
    short = make_store("g1", busy_timeout_ms=50)
    commit_fast(short, e, Batch(inserts=[msg(9)]))  # the store thread's connection is open
    other = sqlite3.connect(tmp_path / "data" / "amqlite.db", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        before = written(short)
        with pytest.raises(StoreError) as info:
            short.commit_batch(e, Batch(inserts=[msg(11)]))
        assert not isinstance(info.value, (Fenced, StoreRejected))
        assert isinstance(info.value.__cause__, sqlite3.OperationalError)
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert written(short) == before
    assert_usable(short, e, 11)


def test_big_fast_batch_goes_in_chunks(make_store: MakeStore) -> None:
    """More keys and ids than one IN list holds (``IN_CHUNK``), over two queues."""
    s, e = master(make_store)
    n = 3 * IN_CHUNK + 7

    def dest(i: int) -> int:
        return QUEUE.id if i % 2 else DLQ.id

    commit_fast(s, e, Batch(inserts=[msg(i, dest(i), key=f"p:{i}") for i in range(1, n + 1)]))
    result = commit_fast(s, e, Batch(
        inserts=[msg(n + i, dest(i), key=f"p:{i}") for i in range(1, n + 1)],
        deliveries=[(None, i) for i in range(1, n + 1, 3)],
        acks=[(None, i) for i in range(2, n + 1, 2)]))
    assert result == BatchResult({f"p:{i}" for i in range(1, n + 1)},
                                 set(range(n + 1, 2 * n + 1)))
    left = list(range(1, n + 1, 2))
    assert message_ids(s) == left
    assert one(s, "SELECT count(*) FROM amq_messages WHERE delivery_count = 1") \
        == len([i for i in left if i % 3 == 1])
    assert sql(s, "SELECT msg_count FROM amq_groups") == [(len(left),)]
    assert one(s, "SELECT count(*) FROM amq_dedup") == n
    assert_counters(s)
    assert not s.check_integrity(e).mismatch
