"""A write the store refuses is not a lost store (issue 12).

Values that bypassed the broker's validation reach a real SQLite and a real
PostgreSQL store: the store raises ``StoreRejected`` (a ``StoreError`` that is
not a reason to demote), writes nothing and stays usable; the group committer,
given a merged commit with one such batch among good ones, commits the good
ones, fails only the bad one, does not stop and does not call on_failure; the
same through PostgreSQL's one-round-trip path (``store.pg_batch``)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from store import (
    Batch,
    DestinationRow,
    GroupCommitter,
    NewMessage,
    SqlStore,
    StoreError,
    StoreRejected,
)
from tests.helpers.hot_path import totals
from tests.helpers.store import QUEUE, assert_counters, master, msg, one, store_opener

pytestmark = pytest.mark.integration

#: Upper bound for any single wait in these tests; they end as soon as done.
DEADLINE_S = 30.0
#: Past the 200 characters of amq_messages.producer_id.
LONG_PRODUCER_ID = "p" * 300
#: Past the 512 characters of amq_destinations.name.
LONG_DESTINATION = "/queue/" + "d" * 600


def _row(mid: int, **fields: Any) -> NewMessage:
    """A queue message like ``msg(mid)`` with some fields overridden."""
    row = msg(mid)
    for name, value in fields.items():
        setattr(row, name, value)
    return row


@dataclass(frozen=True)
class Case:
    name: str
    backend: str  # "sqlite" | "postgresql"
    bad: Callable[[int], Batch]  # a batch carrying message id ``mid`` the store refuses
    pipelined: bool = False  # PostgreSQL takes the one-round-trip path for it

    def __str__(self) -> str:
        return f"{self.backend}-{self.name}"


CASES = [
    Case("seq-past-2**63", "sqlite", lambda m: Batch(inserts=[_row(
        m, producer_id="p", producer_seq=2**63, dedup_key=f"p:{2**63}")])),
    Case("expires-past-2**63", "sqlite", lambda m: Batch(inserts=[_row(m, expires_at=2**63)])),
    Case("lone-surrogate-header", "sqlite",
         lambda m: Batch(inserts=[_row(m, headers={"h": "\ud800"})])),
    Case("producer-id-300-chars", "postgresql", lambda m: Batch(inserts=[_row(
        m, producer_id=LONG_PRODUCER_ID, producer_seq=1, dedup_key=f"{LONG_PRODUCER_ID}:1")]),
        pipelined=True),
    Case("nul-in-producer-id", "postgresql", lambda m: Batch(inserts=[_row(
        m, producer_id="p\x00q", producer_seq=1, dedup_key="p\x00q:1")]), pipelined=True),
    Case("nul-in-message-id", "postgresql",
         lambda m: Batch(inserts=[_row(m, message_id="ID:\x00")]), pipelined=True),
    Case("expires-past-2**63", "postgresql",
         lambda m: Batch(inserts=[_row(m, expires_at=2**63)]), pipelined=True),
    Case("lone-surrogate-header", "postgresql",
         lambda m: Batch(inserts=[_row(m, headers={"h": "\ud800"})]), pipelined=True),
    # A new destination row: the step-by-step path on PostgreSQL.
    Case("destination-name-too-long", "postgresql", lambda m: Batch(
        destinations=[DestinationRow(50, LONG_DESTINATION, "queue")],
        inserts=[_row(m, destination_id=50)])),
    Case("nul-in-producer-id-stepwise", "postgresql", lambda m: Batch(
        destinations=[DestinationRow(51, "/queue/fine", "queue")],
        inserts=[_row(m, producer_id="p\x00q", producer_seq=1, dedup_key="p\x00q:1")])),
]


@pytest.fixture(params=CASES, ids=str)
def case(request: pytest.FixtureRequest) -> Case:
    return request.param


@pytest.fixture
def make_store(case: Case, request: pytest.FixtureRequest, tmp_path) -> Iterator[
        Callable[..., SqlStore]]:
    """Stores on the case's backend (overrides the conftest's pair)."""
    if case.backend == "sqlite":
        url = f"sqlite:///{tmp_path / 'data' / 'amqlite.db'}"
    else:
        url = request.getfixturevalue("pg_url")
    with store_opener(url) as make:
        yield make


def _ids(s: SqlStore) -> list[int]:
    return [m.id for m in s.load_page(QUEUE.id, 0, 100)]


def test_the_store_refuses_the_value_and_stays_usable(
    case: Case, make_store: Callable[..., SqlStore]
) -> None:
    s, e = master(make_store)
    s.commit_batch(e, Batch(inserts=[msg(1)]))
    with pytest.raises(StoreRejected) as info:
        s.commit_batch(e, case.bad(2))
    assert isinstance(info.value, StoreError)  # callers that do not know it stay safe
    assert "\n" not in str(info.value)
    # Rolled back whole (a destination row too), and the next commit goes through.
    s.commit_batch(e, Batch(inserts=[msg(3)]))
    assert _ids(s) == [1, 3]
    assert one(s, "SELECT count(*) FROM amq_destinations WHERE grp='g1'") == 3
    assert_counters(s)


def test_the_committer_commits_the_others_and_goes_on(
    case: Case, make_store: Callable[..., SqlStore]
) -> None:
    """Three batches merged into one commit, the middle one refused: the first
    and the third commit, only the middle one's future fails, the committer
    does not stop, on_failure is not called, later commits go through."""
    s, e = master(make_store)
    failures: list[BaseException] = []
    fast_before = s.fast_commits

    async def scenario() -> None:
        gate = threading.Event()
        gc = GroupCommitter(s, e, asyncio.get_running_loop(), failures.append)
        busy = gc.call(gate.wait, DEADLINE_S)  # hold the store thread...
        good1 = gc.submit(Batch(inserts=[msg(1)]))
        bad = gc.submit(case.bad(2))
        good3 = gc.submit(Batch(inserts=[msg(3, key="p:3")]))
        gate.set()  # ...so that the three merge into one commit
        assert await busy
        results = await asyncio.gather(good1, bad, good3, return_exceptions=True)
        assert not isinstance(results[0], BaseException), results[0]
        assert isinstance(results[1], StoreRejected), results[1]
        assert not isinstance(results[2], BaseException), results[2]
        assert gc.splits >= 1  # it was merged, and split
        assert gc.rejected == 1
        assert gc.failure is None
        await gc.submit(Batch(inserts=[msg(4)]))
        assert await gc.call(_ids, s) == [1, 3, 4]
        await gc.drain()
        gc.close()
        await gc.wait_closed()

    asyncio.run(asyncio.wait_for(scenario(), DEADLINE_S))
    assert failures == []
    if case.pipelined:  # the good halves went the one-round-trip way too
        assert s.fast_commits > fast_before
    assert_counters(s)


def test_refused_batches_keep_submission_order_and_dedup(
    case: Case, make_store: Callable[..., SqlStore]
) -> None:
    """Many batches around two refused ones: every good one commits once, in
    order; a key repeated across the split is still a duplicate."""
    s, e = master(make_store)

    async def scenario() -> None:
        gate = threading.Event()
        gc = GroupCommitter(s, e, asyncio.get_running_loop(), lambda exc: None)
        busy = gc.call(gate.wait, DEADLINE_S)
        futures = []
        for i in range(1, 11):
            batch = case.bad(i) if i in (3, 8) else Batch(inserts=[msg(i, key=f"k:{i}")])
            futures.append(gc.submit(batch))
        again = gc.submit(Batch(inserts=[msg(11, key="k:5")]))  # k:5 is in this commit
        gate.set()
        assert await busy
        results = await asyncio.gather(*futures, return_exceptions=True)
        for i, r in enumerate(results, start=1):
            assert isinstance(r, StoreRejected) == (i in (3, 8)), (i, r)
        assert (await again).duplicate_ids == {11}
        assert gc.failure is None and gc.rejected == 2
        gc.close()
        await gc.wait_closed()

    asyncio.run(asyncio.wait_for(scenario(), DEADLINE_S))
    assert _ids(s) == [1, 2, 4, 5, 6, 7, 9, 10]
    assert_counters(s)


def test_a_batch_with_units_is_split_along_them(
    case: Case, make_store: Callable[..., SqlStore]
) -> None:
    """The broker's shape: one batch per flush, a span per client frame, and
    bookkeeping outside the spans (here an ack). Refused whole, it is split:
    the part outside the units and the good units commit, the refused unit is
    reported by its index, the committer goes on."""
    s, e = master(make_store)
    s.commit_batch(e, Batch(inserts=[msg(1)]))
    failures: list[BaseException] = []
    bad = case.bad(3)
    # With the totals too: on PostgreSQL the inserts, the ack and the totals are then one
    # statement (pg_batch.INSERT_ACK_COUNT) when the case needs no new destination.
    batch = Batch(destinations=list(bad.destinations), inserts=[msg(2), *bad.inserts, msg(4)],
                  acks=[(None, 1)], counters=totals((QUEUE.id, 3, 1)))
    nd = len(bad.destinations)
    spans = [(0, 0, 0, 0, 0, 1, 0, 0), (0, nd, 0, 0, 1, 2, 0, 0), (nd, nd, 0, 0, 2, 3, 0, 0)]

    async def scenario() -> None:
        gc = GroupCommitter(s, e, asyncio.get_running_loop(), failures.append)
        result = await gc.submit(batch, spans)
        assert list(result.rejected) == [1]
        assert isinstance(result.rejected[1], StoreRejected)
        assert gc.failure is None and gc.rejected == 1
        await gc.submit(Batch(inserts=[msg(5)]))
        assert await gc.call(_ids, s) == [2, 4, 5]  # 1 acked, 3 refused
        gc.close()
        await gc.wait_closed()

    asyncio.run(asyncio.wait_for(scenario(), DEADLINE_S))
    assert failures == []
    assert_counters(s)


def test_a_commit_unit_takes_its_acks_with_it(
    case: Case, make_store: Callable[..., SqlStore]
) -> None:
    """A COMMIT's span covers ack rows too (10 numbers): refused, its ack is not
    applied with the rest; the ack outside every unit and the good unit are."""
    s, e = master(make_store)
    s.commit_batch(e, Batch(inserts=[msg(1), msg(2)]))
    failures: list[BaseException] = []
    bad = case.bad(3)
    nd = len(bad.destinations)
    batch = Batch(destinations=list(bad.destinations), inserts=[*bad.inserts, msg(4)],
                  acks=[(None, 1), (None, 2)])
    spans = [(0, nd, 0, 0, 0, 1, 0, 0, 1, 2), (nd, nd, 0, 0, 1, 2, 0, 0)]

    async def scenario() -> None:
        gc = GroupCommitter(s, e, asyncio.get_running_loop(), failures.append)
        result = await gc.submit(batch, spans)
        assert list(result.rejected) == [0]
        assert await gc.call(_ids, s) == [2, 4]  # 1 acked outside; 2's ack refused with 3
        gc.close()
        await gc.wait_closed()

    asyncio.run(asyncio.wait_for(scenario(), DEADLINE_S))
    assert failures == []
    assert_counters(s)
