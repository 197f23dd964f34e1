"""The group committer over a real store: merging, order, reads after writes,
per-caller dedup results, fail-stop on Fenced, drain and close."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import pytest

from store import Batch, Fenced, GroupCommitter, StoreError
from tests.helpers.store import QUEUE, MakeStore, assert_counters, master, msg, one, sql

#: Upper bound for any single wait in these tests; they end as soon as done.
DEADLINE_S = 30.0


def run(coro_fn: Callable[[], object]) -> None:
    asyncio.run(asyncio.wait_for(coro_fn(), DEADLINE_S))  # type: ignore[arg-type]


def test_concurrent_submits_merge_into_one_commit(make_store: MakeStore) -> None:
    s, e = master(make_store)

    async def scenario() -> None:
        gate = threading.Event()
        gc = GroupCommitter(s, e, asyncio.get_running_loop(), lambda exc: None)
        busy = gc.call(gate.wait, DEADLINE_S)  # the store thread is busy...
        futures = [gc.submit(Batch(inserts=[msg(i)])) for i in range(1, 21)]
        gate.set()  # ...while 20 callers submit
        assert await busy
        results = await asyncio.gather(*futures)
        assert all(r.duplicate_ids == set() for r in results)
        assert (gc.commits, gc.batches) == (1, 20)
        page = await gc.call(s.load_page, QUEUE.id, 0, 100)
        assert [m.id for m in page] == list(range(1, 21))
        gc.close()
        await gc.wait_closed()

    run(scenario)
    assert_counters(s)


def test_batches_commit_in_submission_order(make_store: MakeStore) -> None:
    s, e = master(make_store)

    async def scenario() -> None:
        gc = GroupCommitter(s, e, asyncio.get_running_loop(), lambda exc: None, max_batch_ops=1)
        inserts = [gc.submit(Batch(inserts=[msg(i)])) for i in range(1, 6)]
        acks = [gc.submit(Batch(acks=[(None, i)])) for i in range(1, 6)]
        # Had any ack overtaken its insert, that message would still be there.
        await asyncio.gather(*inserts, *acks)
        assert gc.commits == 10
        assert await gc.call(s.load_page, QUEUE.id, 0, 100) == []
        gc.close()

    run(scenario)
    assert_counters(s)


def test_a_read_sees_the_writes_submitted_before_it(make_store: MakeStore) -> None:
    s, e = master(make_store)

    async def scenario() -> None:
        gc = GroupCommitter(s, e, asyncio.get_running_loop(), lambda exc: None)
        gc.submit(Batch(inserts=[msg(1), msg(2)]))  # not awaited
        page = await gc.call(s.load_page, QUEUE.id, 0, 10)
        assert [m.id for m in page] == [1, 2]
        with pytest.raises(ZeroDivisionError):  # a caller's bug fails only its own call
            await gc.call(lambda: 1 / 0)
        await gc.submit(Batch(inserts=[msg(3)]))
        assert gc.failure is None
        gc.close()

    run(scenario)


def test_release_then_redelivery_is_not_merged_out_of_order(make_store: MakeStore) -> None:
    s, e = master(make_store)
    s.commit_batch(e, Batch(inserts=[msg(1)]))

    async def scenario() -> None:
        gate = threading.Event()
        gc = GroupCommitter(s, e, asyncio.get_running_loop(), lambda exc: None)
        busy = gc.call(gate.wait, DEADLINE_S)
        futures = [
            gc.submit(Batch(deliveries=[(None, 1)])),
            gc.submit(Batch(releases=[(None, 1)])),  # NACK
            gc.submit(Batch(deliveries=[(None, 1)])),  # redelivered
        ]
        gate.set()
        await busy
        await asyncio.gather(*futures)
        assert gc.commits == 2  # cut before the redelivery
        gc.close()

    run(scenario)
    assert sql(s, "SELECT delivery_count, inflight_epoch FROM amq_messages") == [(2, e)]


def test_merged_callers_learn_only_their_own_duplicates(make_store: MakeStore) -> None:
    s, e = master(make_store)

    async def scenario() -> None:
        gate = threading.Event()
        gc = GroupCommitter(s, e, asyncio.get_running_loop(), lambda exc: None)
        busy = gc.call(gate.wait, DEADLINE_S)
        first = gc.submit(Batch(inserts=[msg(1, key="p:1")]))
        resend = gc.submit(Batch(inserts=[msg(2, key="p:1"), msg(3, key="p:2")]))
        gate.set()
        await busy
        r1, r2 = await first, await resend
        assert gc.commits == 1
        assert (r1.duplicates, r1.duplicate_ids) == (set(), set())
        assert (r2.duplicates, r2.duplicate_ids) == ({"p:1"}, {2})
        gc.close()

    run(scenario)
    assert sql(s, "SELECT id FROM amq_messages ORDER BY id") == [(1,), (3,)]


def test_a_batch_larger_than_the_limit_commits_alone(make_store: MakeStore) -> None:
    s, e = master(make_store)

    async def scenario() -> None:
        gate = threading.Event()
        gc = GroupCommitter(s, e, asyncio.get_running_loop(), lambda exc: None, max_batch_ops=3)
        busy = gc.call(gate.wait, DEADLINE_S)
        big = gc.submit(Batch(inserts=[msg(i) for i in range(1, 6)]))  # never split
        small = [gc.submit(Batch(inserts=[msg(i)])) for i in (6, 7)]
        gate.set()
        await busy
        await asyncio.gather(big, *small)
        assert (gc.commits, gc.batches) == (2, 3)
        gc.close()

    run(scenario)
    assert one(s, "SELECT count(*) FROM amq_messages") == 7


def test_merging_stops_at_the_bodies_byte_limit(make_store: MakeStore) -> None:
    """A burst of pipelined SENDs merges into commits of at most ``max_batch_bytes`` of
    bodies (W5's preload left 5 MiB arrays resident otherwise); one bigger write still
    commits, alone."""
    s, e = master(make_store)

    async def scenario() -> None:
        gate = threading.Event()
        gc = GroupCommitter(s, e, asyncio.get_running_loop(), lambda exc: None,
                            max_batch_bytes=250)
        busy = gc.call(gate.wait, DEADLINE_S)
        # 100-byte bodies: two fit in 250 bytes, a third does not; then one of 300 bytes.
        futures = [gc.submit(Batch(inserts=[msg(i, body=b"x" * 100)])) for i in range(1, 6)]
        futures.append(gc.submit(Batch(inserts=[msg(6, body=b"y" * 300)])))
        gate.set()
        await busy
        await asyncio.gather(*futures)
        assert (gc.commits, gc.batches) == (4, 6)  # [1, 2], [3, 4], [5], [6]
        gc.close()

    run(scenario)
    assert one(s, "SELECT count(*) FROM amq_messages") == 6


def test_fenced_fails_the_commit_and_everything_after_once(make_store: MakeStore) -> None:
    s, e = master(make_store)
    make_store().claim_epoch("node-b")  # a new master took over
    calls: list[tuple[BaseException, int]] = []

    async def scenario() -> None:
        gate = threading.Event()
        loop_thread = threading.get_ident()
        gc = GroupCommitter(s, e, asyncio.get_running_loop(),
                            lambda exc: calls.append((exc, threading.get_ident())))
        busy = gc.call(gate.wait, DEADLINE_S)
        futures = [gc.submit(Batch(inserts=[msg(i)])) for i in range(1, 4)]
        gate.set()
        await busy
        for f in futures:
            with pytest.raises(Fenced):
                await f
        await gc.drain()
        later = gc.submit(Batch(inserts=[msg(9)]))
        assert later.done()  # failed at once, never queued
        with pytest.raises(Fenced):
            await later
        with pytest.raises(Fenced):
            await gc.call(s.load_page, QUEUE.id, 0, 10)
        await gc.drain()
        assert len(calls) == 1
        assert isinstance(calls[0][0], Fenced) and calls[0][1] == loop_thread
        assert isinstance(gc.failure, Fenced)
        gc.close()
        await gc.wait_closed()

    run(scenario)
    assert one(s, "SELECT count(*) FROM amq_messages") == 0


def test_drain_then_close(make_store: MakeStore) -> None:
    s, e = master(make_store)

    async def scenario() -> None:
        gc = GroupCommitter(s, e, asyncio.get_running_loop(), lambda exc: None)
        futures = [gc.submit(Batch(inserts=[msg(i)])) for i in range(1, 50)]
        await gc.drain()
        assert all(f.done() and f.exception() is None for f in futures)
        gc.close()
        await gc.wait_closed()
        assert gc.join(DEADLINE_S)
        with pytest.raises(StoreError, match="closed"):
            await gc.submit(Batch(inserts=[msg(99)]))
        await gc.drain()  # returns at once after close

    run(scenario)
    assert one(s, "SELECT count(*) FROM amq_messages") == 49


def test_commit_delay_waits_for_more_work_until_the_batch_is_full(make_store: MakeStore) -> None:
    s, e = master(make_store)

    async def scenario() -> None:
        # A delay far beyond DEADLINE_S: only a full batch can end the wait.
        gc = GroupCommitter(s, e, asyncio.get_running_loop(), lambda exc: None,
                            max_batch_ops=2, commit_delay_ms=3_600_000)
        first = gc.submit(Batch(inserts=[msg(1)]))
        second = gc.submit(Batch(inserts=[msg(2)]))
        await asyncio.gather(first, second)
        assert (gc.commits, gc.batches) == (1, 2)
        gc.close()

    run(scenario)
