"""The PostgreSQL fast path of ``SqlStore.commit_batch`` (``store.pg_batch``):
which batches take it, that it writes exactly what the step-by-step path
writes, and that its self-aborting fence keeps the fencing guarantees (claim
first: the batch is fenced and writes nothing; batch first: the claim waits
and counts it). A failed fast commit must surface as ``StoreError`` and leave
the store usable with a fresh writer connection."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from store import (
    Batch,
    BatchResult,
    DestinationRow,
    Fenced,
    NewMessage,
    SqlStore,
    StoreError,
    SubscriptionRow,
    pg_batch,
)
from store import fencing as store_fencing
from store.engine import store_application_name
from store.pg_pipeline import Statement
from tests.helpers.poll import poll
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
from tests.store.test_fencing_race import DEADLINE_S, Runner, wait_until

pytestmark = pytest.mark.integration
Rows = dict[str, list[tuple[Any, ...]]]

#: Header values that a text-format array would have to quote or escape.
ODD_HEADERS = {"quote": 'a"b', "brace": "{x,y}", "back": "c:\\d", "null": "NULL",
               "uni": "ü✓", "empty": ""}


@pytest.fixture
def store_url(pg_url: str) -> str:
    """PostgreSQL only (overrides the conftest's SQLite/PostgreSQL pair): the
    fast path does not exist on SQLite."""
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
    }
    return {name: sql(store, q, g=store.group) for name, q in queries.items()}


def written(store: SqlStore) -> tuple[Rows, Any]:
    """``rows`` plus the group's checkpoint: what a fenced batch must not change."""
    return rows(store), one(store, "SELECT checkpoint_at FROM amq_groups WHERE grp = :g",
                            g=store.group)


def message_ids(store: SqlStore) -> list[int]:
    return [r[0] for r in sql(store, "SELECT id FROM amq_messages WHERE grp = :g ORDER BY id",
                              g=store.group)]


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


def commit_fast(store: SqlStore, epoch: int, batch: Batch) -> BatchResult:
    """Commit ``batch`` and check that it took the pipelined path."""
    before = store.pipelined_commits
    result = store.commit_batch(epoch, batch)
    assert store.pipelined_commits == before + 1, "the batch did not take the fast path"
    return result


def assert_usable(store: SqlStore, epoch: int, mid: int) -> None:
    """A failed commit left the store able to commit again on the fast path."""
    commit_fast(store, epoch, Batch(inserts=[msg(mid, key=f"again:{mid}")]))
    assert mid in message_ids(store)
    assert_counters(store)


# -- which batches take the fast path -----------------------------------------

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


@pytest.mark.parametrize("batch", HOT.values(), ids=list(HOT))
def test_hot_shapes_take_the_pipelined_path(make_store: MakeStore, batch: Batch) -> None:
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


def test_the_test_seam_forces_the_step_by_step_path(make_store: MakeStore) -> None:
    """The differential test below relies on it."""
    s, e = seeded(make_store)
    stepwise(s).commit_batch(e, HOT["all hot shapes"])
    assert s.pipelined_commits == 0
    assert 10 in message_ids(s)


def test_a_batch_of_big_bodies_goes_step_by_step(
    make_store: MakeStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """All bodies travel in one parameter, which PostgreSQL caps at 1 GB: past
    MAX_PIPELINED_BODY_BYTES a batch is written statement by statement."""
    monkeypatch.setattr(pg_batch, "MAX_PIPELINED_BODY_BYTES", 1000)
    s, e = master(make_store)
    before = s.pipelined_commits
    s.commit_batch(e, Batch(inserts=[msg(1, body=b"x" * 600), msg(2, body=b"y" * 600)]))
    assert s.pipelined_commits == before
    assert one(s, "SELECT count(*) FROM amq_messages") == 2
    s.commit_batch(e, Batch(inserts=[msg(3, body=b"z" * 600)]))
    assert s.pipelined_commits == before + 1


# -- same writes as the step-by-step path --------------------------------------


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
            acks=[(None, 3), (None, 999), (None, 4)]),
         BatchResult({"p:1", "p:2", "p:3", "p:4"}, {10, 11, 14, 15})),
        (Batch(  # stored as delivered; releases, also twice and of nothing
            inserts=[delivered(16), delivered(17, key="p:5"), delivered(18, key="p:4")],
            deliveries=[(None, 6)],
            releases=[(None, 1), (None, 2), (None, 2), (None, 998)],
            acks=[(None, 5), (None, 12)]),
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
               acks=[(None, 22)]),
         BatchResult({"p:1"}, {24})),
    ]


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
    assert slow.pipelined_commits == 0
    assert message_ids(fast) == [6, 13, 17, 23, 25]
    for s, e in ((fast, ef), (slow, es)):
        assert_counters(s)
        assert not s.check_integrity(e).mismatch


def test_delivered_insert_is_stored_in_flight(make_store: MakeStore) -> None:
    s, e = master(make_store)
    commit_fast(s, e, Batch(inserts=[delivered(1), msg(2)]))
    assert sql(s, "SELECT id, delivery_count, inflight_epoch FROM amq_messages ORDER BY id") \
        == [(1, 1, e), (2, 0, None)]
    assert [(m.id, m.delivery_count) for m in s.load_page(QUEUE.id, 0, 10)] == [(1, 1), (2, 0)]


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
        assert a.pipelined_commits == 0
        commit_fast(b, ea + 1, Batch(inserts=[msg(10)]))  # the new master is unharmed
    else:
        blocker.commit()  # the claim's activation row now collides: it rolls back
        with pytest.raises(StoreError):
            claim.outcome()
        batch.outcome()
        assert a.pipelined_commits == 1
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
    assert a.pipelined_commits == 1
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


def test_after_a_fenced_fast_commit_a_new_epoch_commits(make_store: MakeStore) -> None:
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


def test_failed_fast_commit_rolls_back_and_the_store_recovers(make_store: MakeStore) -> None:
    s, e = seeded(make_store)
    before = written(s)
    # id 1 exists: the INSERT fails after the fence and the dedup row.
    with pytest.raises(StoreError) as info:
        s.commit_batch(e, Batch(inserts=[msg(10, key="p:10"), msg(1)], acks=[(None, 2)]))
    assert not isinstance(info.value, Fenced)
    assert isinstance(info.value.__cause__, psycopg.errors.UniqueViolation)
    assert written(s) == before
    assert_usable(s, e, 10)


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
    assert one(s, "SELECT count(*) FROM amq_messages") == 0
    assert_counters(s)
    assert not s.check_integrity(e).mismatch


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
    pipeline = s._pipeline
    assert pipeline is not None
    probe = Statement("probe", "SELECT name FROM pg_prepared_statements "
                                "WHERE name LIKE 'amqlite%' ORDER BY name", {})
    names = pipeline.texts(pipeline.transaction([(probe, {})])[0])
    assert names == ["amqlite_ack", "amqlite_fence", "amqlite_insert"]
