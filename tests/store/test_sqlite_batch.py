"""SQLite's path for the hot shapes of ``SqlStore.commit_batch`` (``store.sqlite_batch``):
a fenced, refused or lock-timed-out commit writes nothing and leaves the store usable;
a big batch's IN lists go in chunks. Which batches take it, and that it writes what
the step-by-step path writes: test_hot_path.py, on both stores."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from store import Batch, BatchResult, Fenced, StoreError, StoreRejected
from store.statements import IN_CHUNK
from tests.helpers.hot_path import (
    assert_usable,
    commit_fast,
    message_ids,
    seeded,
    written,
)
from tests.helpers.store import DLQ, QUEUE, MakeStore, assert_counters, master, msg, one, sql

pytestmark = pytest.mark.integration


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    """SQLite only (overrides the conftest's SQLite/PostgreSQL pair)."""
    return f"sqlite:///{tmp_path / 'data' / 'amqlite.db'}"


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
