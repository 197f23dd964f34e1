"""A master paused inside a batch keeps the group row locked; the next master,
holding the lock, ends that session instead of waiting for a timeout that may
never fire."""

from __future__ import annotations

import time

import psycopg
import pytest

from store import Batch, NewMessage, open_store
from store.engine import store_application_name
from store.fencing import CLAIM_LOCK_TIMEOUT_MS
from store.sql import SqlStore

pytestmark = pytest.mark.integration


def test_claim_ends_a_deposed_masters_session_that_holds_the_group_row(pg_url: str) -> None:
    old = open_store(pg_url, "g1")
    assert isinstance(old, SqlStore)
    old.open()
    epoch = old.claim_epoch("old")
    # The deposed master, frozen half-way through a batch: its fence took the row lock.
    zombie = psycopg.connect(pg_url, application_name=store_application_name("g1"))
    zombie.execute("UPDATE amq_groups SET msg_count = msg_count + 1 WHERE grp = 'g1' "
                   "AND epoch = %s", (epoch,))
    zombie.execute("INSERT INTO amq_destinations (grp, id, name, kind, created_at, depth) "
                   "VALUES ('g1', 99, '/queue/zombie', 'queue', 0, 0)")
    new = open_store(pg_url, "g1")
    new.open()
    started = time.monotonic()
    new_epoch = new.claim_epoch("new")
    took = time.monotonic() - started
    assert new_epoch == epoch + 1
    assert took < 3 * CLAIM_LOCK_TIMEOUT_MS / 1000 + 2, f"claim took {took:.1f}s"
    with pytest.raises(psycopg.OperationalError):
        zombie.execute("COMMIT")  # its session was ended: nothing of it commits
    # ... and what it wrote was rolled back.
    assert new.recover(new_epoch).destinations == []
    with pytest.raises(Exception, match="epoch"):
        old.commit_batch(epoch, Batch(inserts=[NewMessage(1, 1, "m", {}, b"")]))
    for s in (old, new):
        s.close()


def test_other_groups_sessions_are_left_alone(pg_url: str) -> None:
    other = open_store(pg_url, "g2")
    other.open()
    other_epoch = other.claim_epoch("n")
    busy = psycopg.connect(pg_url, application_name=store_application_name("g2"))
    busy.execute("UPDATE amq_groups SET msg_count = msg_count WHERE grp = 'g2'")
    mine = open_store(pg_url, "g1")
    mine.open()
    assert mine.claim_epoch("me") == 1
    zombie = psycopg.connect(pg_url, application_name=store_application_name("g1"))
    zombie.execute("UPDATE amq_groups SET msg_count = msg_count WHERE grp = 'g1'")
    assert mine.claim_epoch("me-again") == 2  # ends g1's zombie ...
    with pytest.raises(psycopg.OperationalError):
        zombie.execute("COMMIT")
    busy.execute("COMMIT")  # ... but not g2's session, though it holds the same table
    assert other.claim_epoch("n2") == other_epoch + 1
    busy.close()
    for s in (other, mine):
        s.close()


def test_long_group_names_get_distinct_application_names() -> None:
    a = store_application_name("x" * 80 + "a")
    b = store_application_name("x" * 80 + "b")
    assert a != b and len(a.encode()) <= 63 and len(b.encode()) <= 63
