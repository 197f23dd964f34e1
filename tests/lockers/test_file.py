"""The flock locker, against real processes and a real file system."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path

import pytest

from lockers import LockerError, LockLost, LockState, open_locker
from lockers.file import FileLocker
from tests.helpers.lockers import Holder, StateRecorder, eventually, run

#: Takeover target after a release or a crash (the brief: well under a second).
TAKEOVER_LIMIT = 1.0


def _url(path: Path) -> str:
    return f"file://{path}"


def test_second_contender_waits_then_takes_over_on_release(tmp_path: Path) -> None:
    async def main() -> None:
        url = _url(tmp_path / "data" / "amqlite.lock")  # the directory does not exist yet
        a = open_locker(url, "g", node="a")
        b = open_locker(url, "g", node="b")
        assert await a.try_acquire()
        assert not await b.try_acquire()
        waiting = asyncio.create_task(b.acquire())
        start = time.monotonic()
        await a.release()
        await asyncio.wait_for(waiting, TAKEOVER_LIMIT)
        took = time.monotonic() - start
        print(f"\nfile: takeover after release {took * 1000:.0f} ms")
        await b.keepalive()
        with pytest.raises(LockLost):
            await a.keepalive()
        await b.close()
        await a.close()

    run(main())


def test_holder_note_names_the_process(tmp_path: Path) -> None:
    async def main() -> None:
        path = tmp_path / "amqlite.lock"
        a = open_locker(_url(path), "g", node="broker1")
        assert await a.try_acquire()
        note = path.read_text()
        assert f"pid={os.getpid()}" in note and "node=broker1" in note
        await a.close()

    run(main())


def test_try_acquire_twice_does_not_stack(tmp_path: Path) -> None:
    async def main() -> None:
        url = _url(tmp_path / "amqlite.lock")
        a = open_locker(url, "g")
        b = open_locker(url, "g")
        assert await a.try_acquire()
        assert await a.try_acquire()
        await a.release()  # one release is enough
        assert await b.try_acquire()
        await b.close()
        await a.close()

    run(main())


def test_killed_holder_process_is_replaced(tmp_path: Path) -> None:
    async def main() -> None:
        url = _url(tmp_path / "amqlite.lock")
        holder = await Holder.start(url, "g")
        contender = open_locker(url, "g", node="slave")
        try:
            assert not await contender.try_acquire()
            waiting = asyncio.create_task(contender.acquire())
            start = time.monotonic()
            await holder.kill()
            await asyncio.wait_for(waiting, TAKEOVER_LIMIT)
            took = time.monotonic() - start
            print(f"\nfile: takeover after SIGKILL of the holder {took * 1000:.0f} ms")
            await contender.keepalive()
        finally:
            await holder.kill()
            await contender.close()

    run(main())


def test_cancelled_acquire_leaves_nothing_behind(tmp_path: Path) -> None:
    async def main() -> None:
        url = _url(tmp_path / "amqlite.lock")
        a = open_locker(url, "g")
        b = open_locker(url, "g")
        c = open_locker(url, "g")
        assert await a.try_acquire()
        attempts = 0
        try_once = b.try_acquire

        async def counted() -> bool:
            nonlocal attempts
            attempts += 1
            return await try_once()

        b.try_acquire = counted  # type: ignore[method-assign]
        waiting = asyncio.create_task(b.acquire(poll_interval=0.01))
        await eventually(lambda: attempts >= 3, 5.0, "b polled a few times")
        assert not waiting.done()
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await a.release()
        # b's abandoned waiter thread may win the flock for an instant, then drops it
        await eventually(c.try_acquire, 2.0, "c acquires: b kept nothing")
        with pytest.raises(LockLost):
            await b.keepalive()
        for locker in (a, b, c):
            await locker.close()

    run(main())


@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_lock_file_removed_under_the_holder_is_a_lost_lock(tmp_path: Path, how: str) -> None:
    async def main() -> None:
        path = tmp_path / "amqlite.lock"
        a = open_locker(_url(path), "g")
        recorder = StateRecorder()
        a.add_listener(recorder)
        assert await a.try_acquire()
        await a.keepalive()
        if how == "deleted":
            path.unlink()
        else:
            other = tmp_path / "other"
            other.write_text("")
            os.replace(other, path)
        # Without the check a second broker would now lock the new file: two masters.
        b = open_locker(_url(path), "g")
        assert await b.try_acquire()
        with pytest.raises(LockLost):
            await a.keepalive()
        assert recorder.states == [LockState.LOST]
        await b.close()
        await a.close()

    run(main())


def test_unwritable_directory_is_a_locker_error(tmp_path: Path) -> None:
    async def main() -> None:
        blocker = tmp_path / "file"
        blocker.write_text("")
        locker = FileLocker(blocker / "sub" / "amqlite.lock", "g", node="n")
        with pytest.raises(LockerError):
            await locker.try_acquire()

    run(main())


def test_waiting_slave_wakes_when_the_holder_releases_not_at_the_next_poll(
    tmp_path: Path,
) -> None:
    """The slave blocks in flock(): with a poll interval far longer than the test's
    deadline, only the blocking wait can explain a prompt takeover."""

    async def main() -> None:
        url = _url(tmp_path / "amqlite.lock")
        a = open_locker(url, "g")
        b = open_locker(url, "g")
        assert await a.try_acquire()
        waiting = asyncio.create_task(b.acquire(poll_interval=60))
        await eventually(
            lambda: any(t.name == "amqlite-file-wait" for t in threading.enumerate()),
            5.0, "b blocks in flock()")
        assert not waiting.done()
        await a.release()
        await asyncio.wait_for(waiting, 5.0)
        await b.keepalive()
        for locker in (a, b):
            await locker.close()

    run(main())
