"""The epoch claim as a compare-and-set (issue 22): a node claims the epoch it read when it
acquired the lock, so a claim that lands after another node's newer claim is refused and
changes nothing, on SQLite and on PostgreSQL; on PostgreSQL also when the two claims race
for the group row."""

from __future__ import annotations

import psycopg
import pytest

from store import Batch, Fenced, SqlStore
from store.api import StaleClaim
from tests.helpers.servers import PostgresServer
from tests.helpers.store import QUEUE, MakeStore, master, msg, sql, store_opener
from tests.store.test_fencing_race import Runner, lock_waiters, wait_until


def test_read_epoch_of_a_new_group_is_zero_and_the_claim_takes_one(make_store: MakeStore) -> None:
    s = make_store()
    assert s.read_epoch() == 0
    assert s.claim_epoch("a", expected=0) == 1
    assert s.read_epoch() == 1
    assert s.claim_epoch("b", token=40, expected=1) == 40  # the token still counts
    assert s.read_epoch() == 40


def test_late_claim_after_a_newer_claim_is_refused_and_changes_nothing(
        make_store: MakeStore) -> None:
    """A read epoch 1 on acquiring the lock, lost it; B took the lock and claimed 2. A's
    claim of 1 comes late: refused, no activation row, B's fence still holds."""
    a, first = master(make_store)
    seen = a.read_epoch()
    assert seen == first
    b = make_store()
    eb = b.claim_epoch("node-b", expected=b.read_epoch())
    assert eb == seen + 1
    before = sql(a, "SELECT epoch, master, epoch_started_at FROM amq_groups")
    with pytest.raises(StaleClaim, match=f"at epoch {eb}, not at epoch {seen}"):
        a.claim_epoch("node-a", expected=seen)
    assert isinstance(StaleClaim("x"), Fenced)  # a node treats it as fenced
    assert sql(a, "SELECT epoch, master, epoch_started_at FROM amq_groups") == before
    assert sql(a, "SELECT epoch, node FROM amq_activations ORDER BY epoch") == [
        (first, "node-a"), (eb, "node-b")]
    b.commit_batch(eb, Batch(inserts=[msg(1)]))  # the newer master was not fenced out
    assert [m.id for m in b.load_page(QUEUE.id, 0, 10)] == [1]


def test_a_claim_never_goes_backwards(make_store: MakeStore) -> None:
    """Neither an older view nor one from the future (a wrong read) moves the epoch."""
    s = make_store()
    s.claim_epoch("a")
    s.claim_epoch("b")
    for wrong in (0, 1, 3, 99):
        with pytest.raises(StaleClaim):
            s.claim_epoch("late", token=200, expected=wrong)
    assert s.read_epoch() == 2
    assert s.claim_epoch("c", expected=2) == 3


def test_unconditional_claim_is_unchanged(make_store: MakeStore) -> None:
    """Without ``expected`` a claim still bumps whatever it finds (tools, old callers)."""
    s = make_store()
    s.claim_epoch("a", expected=0)
    assert s.claim_epoch("b") == 2


def test_claim_blocked_behind_a_newer_claim_is_refused_when_that_commits(
        postgres_server: PostgresServer, pg_url: str) -> None:
    """PostgreSQL: A's claim waits for the group row held by another claim in flight; when
    that commits, A's UPDATE re-checks ``epoch = expected`` on the new row and refuses."""
    with store_opener(pg_url) as make_store:
        a = make_store()
        a.claim_epoch("seed")
        seen = a.read_epoch()
        racing_claim(postgres_server, pg_url, a, seen)
        assert sql(a, "SELECT epoch, master FROM amq_groups") == [(seen + 1, "node-b")]


def racing_claim(server: PostgresServer, url: str, a: SqlStore, seen: int) -> None:
    """Another claim holds the group row while ``a`` claims ``seen``, then commits."""
    with psycopg.connect(url) as other:
        # What another node's claim does first, held open: the row lock is taken.
        other.execute("UPDATE amq_groups SET epoch = epoch + 1, master = 'node-b'"
                      " WHERE grp = 'g1'")
        claim = Runner(lambda: a.claim_epoch("node-a", expected=seen))
        claim.start()
        wait_until(lambda: lock_waiters(server, url) == 1, "the claim to block")
        assert claim.is_alive()
        other.commit()
    with pytest.raises(StaleClaim):
        claim.outcome()
