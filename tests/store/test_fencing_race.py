"""Fencing under a real race on PostgreSQL (READ COMMITTED): a batch that holds
the group row lock while a new master claims, and a claim that holds it while
the old master commits. Either the new master sees the batch or the batch is
fenced; never a batch committed behind the new master's back."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from sqlalchemy.engine import make_url

from store import Batch, Fenced, SqlStore, open_store
from tests.helpers.poll import poll
from tests.helpers.servers import PostgresServer
from tests.helpers.store import QUEUE, msg, one, sql

#: Generous: the waits below end as soon as the condition holds.
DEADLINE_S = 30.0


def wait_until(predicate: Callable[[], bool], what: str) -> None:
    """Poll ``predicate`` until it holds; fail the test after DEADLINE_S."""
    poll(predicate, timeout=DEADLINE_S, what=what, interval=0.02)


class Runner(threading.Thread):
    """Runs ``fn`` on its own thread and keeps its result or exception."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        super().__init__(daemon=True)
        self.fn = fn
        self.result: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self.fn()
        except BaseException as e:  # handed to the test thread
            self.error = e

    def outcome(self) -> Any:
        self.join(DEADLINE_S)
        assert not self.is_alive(), "still blocked"
        if self.error is not None:
            raise self.error
        return self.result


def lock_waiters(server: PostgresServer, url: str) -> int:
    db = make_url(url).database
    return int(server.psql(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
        "AND datname = current_database()", dbname=db))


def open_master(url: str) -> tuple[SqlStore, int]:
    s = open_store(url, "g1")
    assert isinstance(s, SqlStore)
    s.open()
    epoch = s.claim_epoch("node-a")
    s.commit_batch(epoch, Batch(destinations=[QUEUE]))
    return s, epoch


def test_claim_waits_for_a_running_batch_and_sees_it(
    postgres_server: PostgresServer, pg_url: str
) -> None:
    a, ea = open_master(pg_url)
    b = open_store(pg_url, "g1")
    assert isinstance(b, SqlStore)
    b.open()
    try:
        fenced_in, go = threading.Event(), threading.Event()

        def hold_the_row_lock() -> None:
            fenced_in.set()
            assert go.wait(DEADLINE_S)

        a.after_fence = hold_the_row_lock
        batch = Runner(lambda: a.commit_batch(ea, Batch(inserts=[msg(1), msg(2)])))
        batch.start()
        assert fenced_in.wait(DEADLINE_S)
        claim = Runner(lambda: b.claim_epoch("node-b"))
        claim.start()
        wait_until(lambda: lock_waiters(postgres_server, pg_url) == 1, "the claim to block")
        assert claim.is_alive()
        go.set()
        batch.outcome()
        eb = claim.outcome()
        assert eb == ea + 1
        # The claim re-read the row after our commit: it counted the batch.
        assert sql(b, "SELECT expected_count, expected_max_id FROM amq_activations "
                      "WHERE epoch = :e", e=eb) == [(2, 2)]
        assert b.recover(eb).next_message_id == 3
        assert [m.id for m in b.load_page(QUEUE.id, 0, 10)] == [1, 2]
        a.after_fence = None
        with pytest.raises(Fenced):
            a.commit_batch(ea, Batch(inserts=[msg(3)]))
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("claim_commits", [True, False])
def test_batch_waits_for_a_running_claim(
    postgres_server: PostgresServer, pg_url: str, claim_commits: bool
) -> None:
    a, ea = open_master(pg_url)
    try:
        with psycopg.connect(pg_url) as other:
            # What claim_epoch does first, held open: the row lock is taken.
            other.execute("UPDATE amq_groups SET epoch = epoch + 1 WHERE grp = 'g1'")
            batch = Runner(lambda: a.commit_batch(ea, Batch(inserts=[msg(1)])))
            batch.start()
            wait_until(lambda: lock_waiters(postgres_server, pg_url) == 1, "the batch to block")
            assert batch.is_alive()
            if claim_commits:
                other.commit()
            else:
                other.rollback()
        if claim_commits:
            with pytest.raises(Fenced):
                batch.outcome()
            assert one(a, "SELECT count(*) FROM amq_messages") == 0
            assert one(a, "SELECT msg_count FROM amq_groups") == 0
        else:
            batch.outcome()
            assert [m.id for m in a.load_page(QUEUE.id, 0, 10)] == [1]
    finally:
        a.close()


def test_sqlite_claim_serialises_behind_a_running_batch(tmp_path) -> None:
    """SQLite's BEGIN IMMEDIATE gives the same guarantee with a file lock."""
    url = f"sqlite:///{tmp_path / 'amqlite.db'}"
    a, ea = open_master(url)
    b = open_store(url, "g1")
    assert isinstance(b, SqlStore)
    b.open()
    try:
        fenced_in, go = threading.Event(), threading.Event()

        def hold_the_write_lock() -> None:
            fenced_in.set()
            assert go.wait(DEADLINE_S)

        a.after_fence = hold_the_write_lock
        batch = Runner(lambda: a.commit_batch(ea, Batch(inserts=[msg(1), msg(2)])))
        batch.start()
        assert fenced_in.wait(DEADLINE_S)
        claim = Runner(lambda: b.claim_epoch("node-b"))
        claim.start()
        go.set()
        batch.outcome()  # the claim cannot have gone first: we held the write lock
        eb = claim.outcome()
        assert sql(b, "SELECT expected_count FROM amq_activations WHERE epoch = :e",
                   e=eb) == [(2,)]
        a.after_fence = None
        with pytest.raises(Fenced):
            a.commit_batch(ea, Batch(inserts=[msg(3)]))
    finally:
        a.close()
        b.close()
