"""The PostgreSQL fast path of ``SqlStore.commit_batch`` (``store.pg_batch``), what is
its own: a batch of big bodies goes step by step, its self-aborting fence keeps the
fencing guarantees (claim first: the batch is fenced and writes nothing; batch first:
the claim waits and counts it), and a failed fast commit surfaces as ``StoreError``
and leaves the store usable with a fresh writer connection. Which batches take it and
that it writes what the step-by-step path writes: test_hot_path.py, on both stores."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from store import (
    Batch,
    BatchResult,
    Fenced,
    SqlStore,
    StoreError,
    StoreRejected,
    pg_batch,
)
from store import fencing as store_fencing
from store.engine import store_application_name
from store.pg_arrays import INT8_OID, TEXT_OID
from store.pg_pipeline import Statement, int8
from tests.helpers.hot_path import (
    assert_usable,
    commit_fast,
    message_ids,
    seeded,
    totals,
    written,
)
from tests.helpers.poll import poll
from tests.helpers.store import (
    DLQ,
    QUEUE,
    MakeStore,
    assert_counters,
    master,
    msg,
    one,
    sql,
)
from tests.store.test_fencing_race import DEADLINE_S, Runner, wait_until

pytestmark = pytest.mark.integration



@pytest.fixture
def store_url(pg_url: str) -> str:
    """PostgreSQL only (overrides the conftest's SQLite/PostgreSQL pair): SQLite's
    own are in test_sqlite_batch.py."""
    return pg_url


@pytest.fixture
def observer(pg_url: str) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit session that watches locks and sessions from outside."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        yield conn


@pytest.fixture
def blocker(pg_url: str) -> Iterator[psycopg.Connection[Any]]:
    """A session whose open transaction holds the locks a test needs held."""
    with psycopg.connect(pg_url) as conn:
        yield conn


@pytest.fixture
def patient_claims(monkeypatch: pytest.MonkeyPatch) -> None:
    """A claim that waits on the group row more than CLAIM_LOCK_TIMEOUT_MS
    (1 s) ends the store sessions holding it, our blocked batch included. The
    tests below hold it on purpose while they poll: give them the deadline."""
    monkeypatch.setattr(store_fencing, "CLAIM_LOCK_TIMEOUT_MS", int(DEADLINE_S * 1000))


# -- helpers -------------------------------------------------------------------












def waiters_on(observer: psycopg.Connection[Any], holder: int) -> list[int]:
    """Backends waiting for a lock that backend ``holder`` holds."""
    cur = observer.execute(
        "SELECT pid FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))", (holder,))
    return [r[0] for r in cur]


def wait_for_waiter(observer: psycopg.Connection[Any], holder: int, what: str) -> int:
    """Poll until exactly one backend waits on ``holder``; return its pid."""
    found: list[int] = []

    def one_waits() -> bool:
        found[:] = waiters_on(observer, holder)
        return len(found) == 1

    wait_until(one_waits, what)
    return found[0]


def store_pids(observer: psycopg.Connection[Any], group: str) -> list[int]:
    cur = observer.execute("SELECT pid FROM pg_stat_activity WHERE application_name = %s",
                           (store_application_name(group),))
    return [r[0] for r in cur]


def writer_pid(store: SqlStore, observer: psycopg.Connection[Any]) -> int:
    """The backend of the store's pipelined writer. The writer is detached
    from the pool, so once the pool's sessions are closed it is the only
    session of the group left (the store must be the group's only one)."""
    store.engine.dispose()
    pids: list[int] = []

    def only_the_writer() -> bool:
        pids[:] = store_pids(observer, store.group)
        return len(pids) == 1

    wait_until(only_the_writer, "the pool's sessions to end")
    return pids[0]


def terminate(observer: psycopg.Connection[Any], pid: int) -> None:
    """End backend ``pid`` and wait until it is gone."""
    assert observer.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone() == (True,)
    wait_until(lambda: not observer.execute(
        "SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchall(),
        f"backend {pid} to exit")


def lock_message(blocker: psycopg.Connection[Any], group: str, mid: int) -> int:
    """Row-lock message ``mid`` in ``blocker``'s open transaction; its pid."""
    got = blocker.execute("SELECT id FROM amq_messages WHERE grp = %s AND id = %s FOR UPDATE",
                          (group, mid)).fetchall()
    assert got == [(mid,)]
    return blocker.info.backend_pid






# -- which batches take the fast path -----------------------------------------











def test_a_batch_of_big_bodies_goes_step_by_step(
    make_store: MakeStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """All bodies travel in one parameter, which PostgreSQL caps at 1 GB: past
    MAX_PIPELINED_BODY_BYTES a batch is written statement by statement."""
    monkeypatch.setattr(pg_batch, "MAX_PIPELINED_BODY_BYTES", 1000)
    s, e = master(make_store)
    before = s.fast_commits
    s.commit_batch(e, Batch(inserts=[msg(1, body=b"x" * 600), msg(2, body=b"y" * 600)]))
    assert s.fast_commits == before
    assert one(s, "SELECT count(*) FROM amq_messages") == 2
    s.commit_batch(e, Batch(inserts=[msg(3, body=b"z" * 600)]))
    assert s.fast_commits == before + 1


# -- same writes as the step-by-step path --------------------------------------








# -- fencing -------------------------------------------------------------------


@pytest.mark.usefixtures("patient_claims")
@pytest.mark.parametrize("claim_commits", [True, False], ids=["claim commits", "claim fails"])
def test_fast_batch_waits_for_a_running_claim(
    make_store: MakeStore, observer: psycopg.Connection[Any],
    blocker: psycopg.Connection[Any], claim_commits: bool,
) -> None:
    """Claim first: the fence waits for the claim's row lock, re-reads the
    row and aborts the whole pipeline when the epoch moved; when the claim
    rolls back instead, the batch goes through."""
    a, ea = seeded(make_store)
    b = make_store()
    # Hold the claim half-way: its activation row waits for ours.
    blocker.execute("INSERT INTO amq_activations (grp, epoch, node, activated_at) "
                    "VALUES ('g1', %s, 'blocker', 0)", (ea + 1,))
    claim = Runner(lambda: b.claim_epoch("node-b"))
    claim.start()
    claim_pid = wait_for_waiter(observer, blocker.info.backend_pid, "the claim to block")
    before = written(a)
    batch = Runner(lambda: a.commit_batch(ea, Batch(
        inserts=[msg(10, key="p:10")], identities=[msg(11, key="p:11")],
        deliveries=[(None, 1)], releases=[(None, 2)], acks=[(None, 3)])))
    batch.start()
    wait_for_waiter(observer, claim_pid, "the batch to wait for the group row")
    if claim_commits:
        blocker.rollback()
        assert claim.outcome() == ea + 1
        with pytest.raises(Fenced):
            batch.outcome()
        assert written(a) == before
        assert a.fast_commits == 0
        commit_fast(b, ea + 1, Batch(inserts=[msg(10)]))  # the new master is unharmed
    else:
        blocker.commit()  # the claim's activation row now collides: it rolls back
        with pytest.raises(StoreError):
            claim.outcome()
        batch.outcome()
        assert a.fast_commits == 1
        assert message_ids(a) == [1, 2, 4, 10]
    assert_counters(a)


@pytest.mark.usefixtures("patient_claims")
def test_claim_waits_for_a_fast_batch_blocked_after_its_fence(
    make_store: MakeStore, observer: psycopg.Connection[Any],
    blocker: psycopg.Connection[Any],
) -> None:
    """Batch first: the fence's row lock is taken before any write and held
    until the whole pipeline commits, so a claim waits and then counts the
    batch. (No inserts: their statement locks the group row too, which would
    hide a fence that is not first.)"""
    a, ea = seeded(make_store)
    b = make_store()
    blocker_pid = lock_message(blocker, "g1", 2)
    batch = Runner(lambda: a.commit_batch(ea, Batch(
        deliveries=[(None, 1)], releases=[(None, 3)], acks=[(None, 2)])))
    batch.start()
    batch_pid = wait_for_waiter(observer, blocker_pid, "the batch to block on the ack")
    claim = Runner(lambda: b.claim_epoch("node-b"))
    claim.start()
    wait_for_waiter(observer, batch_pid, "the claim to wait for the batch")
    assert claim.is_alive()
    blocker.rollback()
    batch.outcome()
    assert a.fast_commits == 1
    eb = claim.outcome()
    assert eb == ea + 1
    # The claim re-read the group row after the batch committed: 1, 3 and 4.
    assert sql(b, "SELECT expected_count, expected_max_id FROM amq_activations "
                  "WHERE epoch = :e", e=eb) == [(3, 4)]
    assert [(m.id, m.delivery_count) for m in b.load_page(QUEUE.id, 0, 10)] \
        == [(1, 1), (3, 0)]
    with pytest.raises(Fenced):
        a.commit_batch(ea, Batch(inserts=[msg(11)]))
    assert_counters(b)


# -- failures -------------------------------------------------------------------


def test_idle_writer_killed_between_batches(
    make_store: MakeStore, observer: psycopg.Connection[Any]
) -> None:
    """A writer session that died while idle fails one commit, as StoreError,
    and the next commit opens a new one."""
    s, e = seeded(make_store)
    commit_fast(s, e, Batch(inserts=[msg(10)]))
    old = writer_pid(s, observer)
    terminate(observer, old)
    before = written(s)
    with pytest.raises(StoreError) as info:
        s.commit_batch(e, Batch(inserts=[msg(11)]))
    assert not isinstance(info.value, Fenced)
    assert isinstance(info.value.__cause__, psycopg.OperationalError)
    assert written(s) == before
    assert_usable(s, e, 11)
    assert writer_pid(s, observer) != old


def test_writer_killed_inside_a_fast_batch(
    make_store: MakeStore, observer: psycopg.Connection[Any],
    blocker: psycopg.Connection[Any],
) -> None:
    s, e = seeded(make_store)
    blocker_pid = lock_message(blocker, "g1", 2)
    before = written(s)
    batch = Runner(lambda: s.commit_batch(e, Batch(inserts=[msg(10)], acks=[(None, 2)])))
    batch.start()
    terminate(observer, wait_for_waiter(observer, blocker_pid, "the batch to block"))
    with pytest.raises(StoreError) as info:
        batch.outcome()
    assert not isinstance(info.value, Fenced)
    assert isinstance(info.value.__cause__, psycopg.OperationalError)
    blocker.rollback()
    assert written(s) == before
    assert_usable(s, e, 10)


# -- size ------------------------------------------------------------------------


def test_big_fast_batch(make_store: MakeStore) -> None:
    """3000 inserts and 3000 acks in one pipelined transaction, over two queues."""
    s, e = master(make_store)
    n = 3000

    def dest(i: int) -> int:
        return QUEUE.id if i % 2 else DLQ.id

    commit_fast(s, e, Batch(inserts=[msg(i, dest(i)) for i in range(1, n + 1)]))
    result = commit_fast(s, e, Batch(
        inserts=[msg(n + i, dest(i), key=f"p:{i}") for i in range(1, n + 1)],
        deliveries=[(None, n + i) for i in range(1, n + 1, 3)],
        acks=[(None, i) for i in range(1, n + 1)]))
    assert result == BatchResult()
    assert one(s, "SELECT count(*) FROM amq_messages") == n
    assert sql(s, "SELECT min(id), max(id) FROM amq_messages") == [(n + 1, 2 * n)]
    assert sql(s, "SELECT msg_count, max_msg_id FROM amq_groups") == [(n, 2 * n)]
    assert sql(s, "SELECT id, depth FROM amq_destinations WHERE id IN (1, 2) ORDER BY id") \
        == [(QUEUE.id, n // 2), (DLQ.id, n // 2)]
    assert one(s, "SELECT count(*) FROM amq_dedup") == n
    assert one(s, "SELECT count(*) FROM amq_messages WHERE delivery_count = 1") == n // 3
    # The same keys again, and every message acked: all duplicates, nothing left.
    result = commit_fast(s, e, Batch(
        inserts=[msg(2 * n + i, dest(i), key=f"p:{i}") for i in range(1, n + 1)],
        acks=[(None, n + i) for i in range(1, n + 1)]))
    assert result.duplicate_ids == set(range(2 * n + 1, 3 * n + 1))
    assert len(result.duplicates) == n
    assert s.careful_retries == 1
    assert one(s, "SELECT count(*) FROM amq_messages") == 0
    assert_counters(s)
    assert not s.check_integrity(e).mismatch


# -- a key the store already holds -------------------------------------------------


def prepared_names(s: SqlStore) -> list[str]:
    """The writer session's prepared statements (``store.pg_pipeline``)."""
    pipeline = s._pipeline
    assert pipeline is not None
    probe = Statement("probe", "SELECT name FROM pg_prepared_statements "
                                "WHERE name LIKE 'amqlite%' ORDER BY name", {})
    return pipeline.texts(pipeline.transaction([(probe, {})])[0])


def test_a_held_key_sends_the_commit_again_carefully_on_the_same_connection(
        make_store: MakeStore) -> None:
    """The plain INSERT fails on a dedup key the store holds (a failover re-send): the
    commit is sent once more with the careful statement, which stores the rest and
    reports the duplicate, on the same connection; the next commit is plain again."""
    s, e = seeded(make_store)
    commit_fast(s, e, Batch(inserts=[msg(10, key="p:10")]))
    writer = s._writer
    result = commit_fast(s, e, Batch(inserts=[msg(11, key="p:10"), msg(12, key="p:12")],
                                     acks=[(None, 1)], counters=totals((QUEUE.id, 2, 1))))
    assert (result.duplicates, result.duplicate_ids) == ({"p:10"}, {11})
    assert s.careful_retries == 1
    assert s._writer is writer  # a refused key is not a broken connection
    assert message_ids(s) == [2, 3, 4, 10, 12]
    assert one(s, "SELECT count(*) FROM amq_dedup") == 2
    commit_fast(s, e, Batch(inserts=[msg(13, key="p:13")]))
    assert s.careful_retries == 1
    assert prepared_names(s) == ["amqlite_careful_insert_ack_count", "amqlite_fence",
                                 "amqlite_insert", "amqlite_insert_ack_count"]
    assert_counters(s)
    assert not s.check_integrity(e).mismatch


def test_a_held_key_in_a_connections_first_commit_keeps_what_it_prepared(
        make_store: MakeStore) -> None:
    """The refused transaction prepared the fence and the INSERT before the INSERT
    failed; they stay prepared (the session's, not the transaction's), so the careful
    commit sent next on that connection must not prepare the fence again (PostgreSQL
    would refuse it: it exists)."""
    s, e = master(make_store)
    commit_fast(s, e, Batch(inserts=[msg(1, key="p:1")]))
    s._discard_writer()  # as after a lost connection: the next commit opens another
    commit_fast(s, e, Batch(inserts=[msg(2)]))  # opens it: only the fence, the INSERT
    s._discard_writer()
    result = commit_fast(s, e, Batch(inserts=[msg(3, key="p:1"), msg(4, key="p:4")]))
    assert (result.duplicates, result.duplicate_ids) == ({"p:1"}, {3})
    assert s.careful_retries == 1
    assert message_ids(s) == [1, 2, 4]
    assert prepared_names(s) == ["amqlite_careful_insert", "amqlite_fence", "amqlite_insert"]
    assert_usable(s, e, 5)


def test_another_unique_violation_fails_the_careful_commit_too(make_store: MakeStore) -> None:
    """A held key is told apart by its SQLSTATE only (unique_violation), so any other
    unique violation (here a message id the store holds, which only a bug would reuse)
    is sent again careful once, refused again, and ends as a refused batch always did:
    nothing written, the store usable."""
    s, e = seeded(make_store)
    before = written(s)
    with pytest.raises(StoreRejected):
        s.commit_batch(e, Batch(inserts=[msg(2, key="p:99")]))
    assert s.careful_retries == 1
    assert written(s) == before
    assert_usable(s, e, 10)


# -- a value the driver cannot encode ---------------------------------------------


#: How soon the server must have rolled back the transaction of a closed writer
#: socket: far below a new master's lock wait (lockers/connections/postgres.py), far above a
#: loaded machine's scheduling delay.
ROLLED_BACK_WITHIN_S = 2.0


def group_row_free(observer: psycopg.Connection[Any], group: str) -> bool:
    """Nobody holds the group row: a claim would not have to wait."""
    try:
        observer.execute("SELECT 1 FROM amq_groups WHERE grp = %s FOR UPDATE NOWAIT", (group,))
    except psycopg.errors.LockNotAvailable:
        return False
    return True


def test_a_value_the_driver_cannot_encode_fails_cleanly(
    make_store: MakeStore, observer: psycopg.Connection[Any]
) -> None:
    """A header with a lone surrogate fails in psycopg's dumper, a Python
    error, after the fence was sent: the fence's transaction must not stay
    open holding the group row (a new master's claim would wait for it, then
    end the session), and the commit fails as StoreError like any other."""
    s, e = seeded(make_store)
    before = written(s)
    with pytest.raises(StoreError) as info:
        s.commit_batch(e, Batch(inserts=[msg(10, headers={"h": "\ud800"})], acks=[(None, 1)]))
    assert isinstance(info.value.__cause__, UnicodeEncodeError)
    # The writer's socket was closed; the server rolls back as soon as it reads the
    # close, not before close() returns: a moment, never the claim's lock wait.
    poll(lambda: group_row_free(observer, s.group), timeout=ROLLED_BACK_WITHIN_S,
         what="the failed commit's transaction rolled back (group row free)")
    assert written(s) == before
    assert_usable(s, e, 10)


def test_the_writer_prepares_its_statements_once(make_store: MakeStore) -> None:
    """store.pg_pipeline: each statement is parsed once per writer session, and later
    commits only bind and execute it (preparing it again would be an error)."""
    s, e = seeded(make_store)
    for i in range(3):
        commit_fast(s, e, Batch(inserts=[msg(10 + i)], acks=[(None, 1 + i)]))
    assert prepared_names(s) == ["amqlite_ack", "amqlite_fence", "amqlite_insert"]


def test_a_pipeline_transaction_is_one_transaction_up_to_its_sync(
        make_store: MakeStore, pg_url: str) -> None:
    """store.pg_pipeline sends no BEGIN and no COMMIT: what comes before the Sync is
    one transaction, committed there when every statement succeeded (another session
    sees it as soon as the call returns), rolled back whole when one failed, also when
    the failure comes after statements that wrote."""
    s, e = seeded(make_store)
    commit_fast(s, e, Batch(inserts=[msg(10)]))
    pipeline = s._pipeline
    assert pipeline is not None
    mark = Statement("t_mark", "UPDATE amq_groups SET checkpoint_at = %(at)s "
                               "WHERE grp = %(g)s", {"at": INT8_OID, "g": TEXT_OID})
    fail = Statement("t_fail", "SELECT 1 / (SELECT count(*) FROM amq_groups "
                               "WHERE grp = %(g)s AND checkpoint_at < 0)", {"g": TEXT_OID})

    def checkpoint() -> int:
        with psycopg.connect(pg_url, autocommit=True) as other:
            row = other.execute("SELECT checkpoint_at FROM amq_groups WHERE grp = %s",
                                (s.group,)).fetchone()
        assert row is not None
        return int(row[0])

    g = s.group.encode()
    pipeline.transaction([(mark, {"at": int8(111), "g": g})])
    assert checkpoint() == 111
    with pytest.raises(psycopg.errors.DivisionByZero):
        pipeline.transaction([(mark, {"at": int8(222), "g": g}), (mark, {"at": int8(333), "g": g}),
                              (fail, {"g": g})])
    assert checkpoint() == 111
    pipeline.transaction([(mark, {"at": int8(444), "g": g})])  # the session is usable
    assert checkpoint() == 444
