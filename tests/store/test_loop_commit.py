"""The group committer's commits on the event loop (PostgreSQL's one round trip,
``Store.start_commit``): taken once the store thread opened the connection, in
submission order with what the thread does, a refused value split by the thread,
a fence or a lost connection failing everything after, as on the thread; and the
write buffer's flushes held while one is underway (``GroupCommitter.defer``)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from store import Batch, Fenced, GroupCommitter, SqlStore, StoreError, StoreRejected
from store.write_buffer import WriteBuffer
from tests.helpers.store import QUEUE, assert_counters, master, msg, one, store_opener

pytestmark = pytest.mark.integration

#: Upper bound for any single wait in these tests; they end as soon as done.
DEADLINE_S = 30.0
#: Past the 200 characters of amq_messages.producer_id: PostgreSQL refuses the row.
LONG_PRODUCER_ID = "p" * 300


@pytest.fixture
def make_store(pg_url: str) -> Iterator[Callable[..., SqlStore]]:
    with store_opener(pg_url) as make:
        yield make


def warm(make_store: Callable[..., SqlStore]) -> tuple[SqlStore, int]:
    """A master's store whose pipeline connection is open, as after its first
    commit on the store thread (the loop never connects: a connect blocks)."""
    s, e = master(make_store)
    s.commit_batch(e, Batch(inserts=[msg(100)]))
    assert s._pipeline is not None
    return s, e


def run(coro_fn: Callable[[], Any]) -> None:
    asyncio.run(asyncio.wait_for(coro_fn(), DEADLINE_S))


def ids(s: SqlStore) -> list[int]:
    return [m.id for m in s.load_page(QUEUE.id, 0, 100)]


async def loop_commits_again(gc: GroupCommitter, first_id: int) -> int:
    """Commit one message at a time until the loop commits one (the thread's mark
    comes back a loop turn or so after its commit); the id after the last used."""
    on_loop = gc.on_loop
    for mid in range(first_id, first_id + 50):
        await gc.submit(Batch(inserts=[msg(mid)]))
        if gc.on_loop > on_loop:
            return mid + 1
    raise AssertionError("the loop never took the commits back from the thread")


def test_the_first_commit_opens_the_connection_on_the_thread_then_the_loop_commits(
        make_store: Callable[..., SqlStore]) -> None:
    s, e = master(make_store)
    assert s._pipeline is None

    async def scenario() -> None:
        gc = GroupCommitter(s, e, asyncio.get_running_loop(), lambda exc: None)
        await gc.submit(Batch(inserts=[msg(1)]))
        assert (gc.commits, gc.on_loop) == (1, 0)  # the thread connected
        # The loop takes over once the thread's mark is back (a loop turn or so later;
        # a submit before that still goes to the thread, in order).
        first = await loop_commits_again(gc, 2)
        commits, on_loop, batches = gc.commits, gc.on_loop, gc.batches
        futures = [gc.submit(Batch(inserts=[msg(i)])) for i in range(first, first + 20)]
        await asyncio.gather(*futures)
        # merged into one commit, on the loop
        assert (gc.commits, gc.on_loop, gc.batches) == (commits + 1, on_loop + 1, batches + 20)
        await gc.submit(Batch(acks=[(None, i) for i in range(1, 11)]))
        assert gc.on_loop == on_loop + 2
        assert await gc.call(ids, s) == list(range(11, first + 20))
        gc.close()
        await gc.wait_closed()

    run(scenario)
    assert_counters(s)


def test_sqlite_commits_on_the_thread_only(tmp_path) -> None:
    with store_opener(f"sqlite:///{tmp_path / 'data' / 'amqlite.db'}") as make:
        s, e = master(make)

        async def scenario() -> None:
            gc = GroupCommitter(s, e, asyncio.get_running_loop(), lambda exc: None)
            for i in range(1, 4):
                await gc.submit(Batch(inserts=[msg(i)]))
            assert (gc.commits, gc.on_loop) == (3, 0)
            gc.close()

        run(scenario)


def test_writes_behind_the_threads_work_wait_for_it(make_store: Callable[..., SqlStore]) -> None:
    """A call on the thread, then writes the loop could commit: the call runs first
    and sees none of them (had the loop committed them meanwhile, it would)."""
    s, e = warm(make_store)

    async def scenario() -> None:
        gate = threading.Event()
        gc = GroupCommitter(s, e, asyncio.get_running_loop(), lambda exc: None)

        def held_read() -> list[int]:
            assert gate.wait(DEADLINE_S)
            return ids(s)

        seen = gc.call(held_read)
        await asyncio.sleep(0)  # a loop turn: the call is handed to the thread
        futures = [gc.submit(Batch(inserts=[msg(i)])) for i in range(1, 4)]
        await asyncio.sleep(0)  # and the writes go behind it, not to the loop
        gate.set()
        assert await seen == [100]
        await asyncio.gather(*futures)
        assert await gc.call(ids, s) == [1, 2, 3, 100]
        await loop_commits_again(gc, 4)  # the thread is done: the loop again
        gc.close()

    run(scenario)


def test_a_value_refused_on_the_loop_is_split_by_the_thread(
        make_store: Callable[..., SqlStore]) -> None:
    """Three batches merged by the loop, the middle one refused: the thread commits
    the others again, in halves; only the middle one fails, nothing stops, and the
    loop commits again afterwards."""
    s, e = warm(make_store)
    failures: list[BaseException] = []

    async def scenario() -> None:
        gc = GroupCommitter(s, e, asyncio.get_running_loop(), failures.append)
        bad_row = msg(2, key=f"{LONG_PRODUCER_ID}:1")
        bad_row.producer_id, bad_row.producer_seq = LONG_PRODUCER_ID, 1
        results = await asyncio.gather(
            gc.submit(Batch(inserts=[msg(1)])), gc.submit(Batch(inserts=[bad_row])),
            gc.submit(Batch(inserts=[msg(3, key="p:3")])), return_exceptions=True)
        assert not isinstance(results[0], BaseException), results[0]
        assert isinstance(results[1], StoreRejected), results[1]
        assert not isinstance(results[2], BaseException), results[2]
        assert gc.splits >= 1 and (gc.rejected, gc.failure) == (1, None)
        end = await loop_commits_again(gc, 4)
        assert await gc.call(ids, s) == [1, 3, *range(4, end), 100]
        gc.close()
        await gc.wait_closed()

    run(scenario)
    assert failures == []
    assert_counters(s)


#: Bodies that together overflow the socket's buffers many times over: a commit the
#: loop cannot send at once (``LoopCommit.sent`` False, sent on as it becomes writable).
BIG_BODY = 8 * 2**20


@pytest.mark.parametrize("body_size", [0, BIG_BODY], ids=["small", "unsent-at-once"])
def test_a_held_key_on_the_loop_is_sent_again_carefully_there(
        make_store: Callable[..., SqlStore], body_size: int) -> None:
    """A failover client's re-send (a key the store holds) merged with a new message on
    the loop: PostgreSQL refuses the plain INSERT, and the loop sends the commit again,
    careful, on the same connection (and sends the rest as the socket takes it, when it
    is big). The re-send is a duplicate, the new one is stored, nothing goes to the
    thread and nothing fails."""
    body = b"b" * body_size if body_size else None
    s, e = warm(make_store)
    s.commit_batch(e, Batch(inserts=[msg(101, key="p:1")]))
    failures: list[BaseException] = []

    async def scenario() -> None:
        gc = GroupCommitter(s, e, asyncio.get_running_loop(), failures.append)
        first = await loop_commits_again(gc, 1)
        on_loop, on_thread, writer = gc.on_loop, gc.commits - gc.on_loop, s._writer
        again, new = await asyncio.gather(
            gc.submit(Batch(inserts=[msg(first, key="p:1", body=body)])),
            gc.submit(Batch(inserts=[msg(first + 1, key="p:2", body=body)])))
        assert (again.duplicates, again.duplicate_ids) == ({"p:1"}, {first})
        assert (new.duplicates, new.duplicate_ids) == (set(), set())
        # on the loop, merged or not (big bodies are not: ``max_bytes``)
        assert gc.on_loop > on_loop and gc.commits - gc.on_loop == on_thread
        assert (s.careful_retries, gc.failure, s._writer) == (1, None, writer)
        assert await gc.call(ids, s) == [*range(1, first), first + 1, 100, 101]
        gc.close()
        await gc.wait_closed()

    run(scenario)
    assert failures == []
    assert_counters(s)


def test_fenced_on_the_loop_fails_the_commit_and_everything_after_once(
        make_store: Callable[..., SqlStore]) -> None:
    s, e = warm(make_store)
    make_store().claim_epoch("node-b")  # a new master took over
    calls: list[tuple[BaseException, int]] = []

    async def scenario() -> None:
        loop_thread = threading.get_ident()
        gc = GroupCommitter(s, e, asyncio.get_running_loop(),
                            lambda exc: calls.append((exc, threading.get_ident())))
        futures = [gc.submit(Batch(inserts=[msg(i)])) for i in range(1, 4)]
        after = gc.call(ids, s)  # behind the fenced commit: fails with it
        for f in [*futures, after]:
            with pytest.raises(Fenced):
                await f
        later = gc.submit(Batch(inserts=[msg(9)]))
        assert later.done()  # failed at once, never queued
        with pytest.raises(Fenced):
            await later
        await gc.drain()
        assert len(calls) == 1
        assert isinstance(calls[0][0], Fenced) and calls[0][1] == loop_thread
        gc.close()
        await gc.wait_closed()

    run(scenario)
    assert one(s, "SELECT count(*) FROM amq_messages") == 1  # msg(100) only


def test_a_connection_lost_on_the_loop_fails_the_commit_and_stops(
        make_store: Callable[..., SqlStore], pg_url: str) -> None:
    """The writer's session ended while the loop awaits nothing: the next commit on
    the loop fails with a StoreError (the outcome of a lost commit is not known, so
    the committer stops; the node demotes), never hangs."""
    s, e = warm(make_store)
    assert s._writer is not None
    pid = s._writer.info.backend_pid
    with psycopg.connect(pg_url, autocommit=True) as admin:
        assert admin.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone() == (True,)
    failures: list[BaseException] = []

    async def scenario() -> None:
        gc = GroupCommitter(s, e, asyncio.get_running_loop(), failures.append)
        with pytest.raises(StoreError) as caught:
            await gc.submit(Batch(inserts=[msg(1)]))
        assert not isinstance(caught.value, StoreRejected)
        await gc.drain()
        assert failures and gc.failure is failures[0]
        gc.close()
        await gc.wait_closed()

    run(scenario)
    assert s._writer is None  # closed; a new term opens another


@contextlib.contextmanager
def group_row_held(pg_url: str, group: str) -> Iterator[psycopg.Connection[Any]]:
    """Another session holding the group's row lock: the fence of a commit sent now
    waits (the commit stays underway) until the transaction ends; the connection, to
    end it (commit or roll back) when the test says."""
    with psycopg.connect(pg_url) as other:
        other.execute("SELECT 1 FROM amq_groups WHERE grp = %s FOR UPDATE", (group,))
        yield other


async def underway(gc: GroupCommitter, mid: int) -> asyncio.Future[Any]:
    """Submit one insert and let the loop send it (one loop turn: the line is kicked)."""
    fut = gc.submit(Batch(inserts=[msg(mid)]))
    await asyncio.sleep(0)
    assert gc.busy_since is not None, "the commit is not underway on the loop"
    return fut


async def committing_on_the_loop(
        s: SqlStore, e: int, on_failure: Callable[[BaseException], None] = lambda exc: None
) -> tuple[GroupCommitter, WriteBuffer[Any], int]:
    """A committer whose commits go on the loop, a write buffer in front of it, and the
    first message id left free."""
    loop = asyncio.get_running_loop()
    gc = GroupCommitter(s, e, loop, on_failure)
    first_free = await loop_commits_again(gc, 1)
    return gc, WriteBuffer(gc, loop), first_free


def stage(writes: WriteBuffer[Any], mid: int) -> asyncio.Future[bool]:
    """Stage one insert; the future says whether it committed."""
    done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    writes.stage(done.set_result).inserts.append(msg(mid))
    return done


def test_flushes_wait_for_the_commit_underway_and_go_as_one_batch(
        make_store: Callable[..., SqlStore], pg_url: str) -> None:
    """Three loop turns of staged writes while a commit is underway: one batch for the
    committer when it is over (one future, one merge), not three."""
    s, e = warm(make_store)

    async def scenario() -> None:
        gc, writes, first_free = await committing_on_the_loop(s, e)
        with group_row_held(pg_url, s.group) as other:
            first = await underway(gc, first_free)
            staged = []
            for mid in range(first_free + 1, first_free + 4):
                staged.append(stage(writes, mid))
                await asyncio.sleep(0)  # a loop turn: its flush comes and is held
            batches = gc.batches
            other.rollback()
        await first
        assert await asyncio.gather(*staged) == [True, True, True]
        assert gc.batches == batches + 2  # the commit underway, then the three as one
        assert set(await gc.call(ids, s)) >= set(range(first_free, first_free + 4))
        gc.close()
        await gc.wait_closed()

    run(scenario)
    assert_counters(s)


def test_a_call_after_held_writes_runs_after_them(
        make_store: Callable[..., SqlStore], pg_url: str) -> None:
    """``call`` runs after the writes staged before it, also when their flush is held."""
    s, e = warm(make_store)

    async def scenario() -> None:
        gc, writes, first_free = await committing_on_the_loop(s, e)
        with group_row_held(pg_url, s.group) as other:
            first = await underway(gc, first_free)
            held = stage(writes, first_free + 1)
            await asyncio.sleep(0)  # its flush is held
            seen = gc.call(ids, s)
            other.rollback()
        await first
        assert await held
        assert first_free + 1 in await seen
        gc.close()
        await gc.wait_closed()

    run(scenario)


def test_held_writes_fail_with_a_fenced_commit_underway(
        make_store: Callable[..., SqlStore], pg_url: str) -> None:
    """The commit underway is fenced (a new master bumped the epoch while it waited on
    the group's row): the held writes are failed too, at once, never left waiting."""
    s, e = warm(make_store)
    failures: list[BaseException] = []

    async def scenario() -> None:
        gc, writes, first_free = await committing_on_the_loop(s, e, failures.append)
        with group_row_held(pg_url, s.group) as other:
            first = await underway(gc, first_free)
            held = stage(writes, first_free + 1)
            await asyncio.sleep(0)
            other.execute("UPDATE amq_groups SET epoch = epoch + 1 WHERE grp = %s",
                          (s.group,))
            other.commit()
        with pytest.raises(Fenced):
            await first
        assert await held is False
        assert len(failures) == 1 and isinstance(failures[0], Fenced)
        gc.close()
        await gc.wait_closed()

    run(scenario)


def test_a_second_buffers_flush_is_not_held_over_the_first(
        make_store: Callable[..., SqlStore], pg_url: str) -> None:
    """One flush is held at a time: a second write buffer's goes at once (into the line
    behind the commit underway), and both buffers' writes commit."""
    s, e = warm(make_store)

    async def scenario() -> None:
        gc, a, first_free = await committing_on_the_loop(s, e)
        b: WriteBuffer[Any] = WriteBuffer(gc, asyncio.get_running_loop())
        with group_row_held(pg_url, s.group) as other:
            first = await underway(gc, first_free)
            held = stage(a, first_free + 1)
            await asyncio.sleep(0)  # a's flush is held
            batches = gc.batches
            other_buffer = stage(b, first_free + 2)
            await asyncio.sleep(0)  # b's is not: submitted behind the commit underway
            other.rollback()
        await first
        assert (await held, await other_buffer) == (True, True)
        assert gc.batches == batches + 3  # the first, b's and a's: none lost
        gc.close()
        await gc.wait_closed()

    run(scenario)
