"""Shared test helpers: run a coroutine, poll with a deadline, real holder processes."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from lockers import Locker, LockState
from tests.helpers.poll import apoll

T = TypeVar("T")

#: Upper bound for one whole test coroutine; a hang fails the test instead of the run.
TEST_TIMEOUT = 120.0

#: The repository root, so a holder subprocess imports the same code.
REPO = Path(__file__).resolve().parents[2]


def run(coro: Coroutine[Any, Any, T], timeout: float = TEST_TIMEOUT) -> T:
    """Run one test coroutine on a fresh loop, bounded."""
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def eventually(
    check: Callable[[], Awaitable[T] | T], timeout: float, what: str, interval: float = 0.02
) -> T:
    """Poll ``check`` until it returns something truthy; fail after ``timeout`` seconds."""
    return (await apoll(check, timeout=timeout, what=what, interval=interval))[0]  # type: ignore[return-value]


class StateRecorder:
    """A lock-state listener that tests can await."""

    def __init__(self) -> None:
        self.states: list[LockState] = []
        self._changed = asyncio.Event()

    def __call__(self, state: LockState) -> None:
        self.states.append(state)
        self._changed.set()

    async def wait_for(self, state: LockState, timeout: float, after: int = 0) -> float:
        """Wait until ``state`` was notified (at index >= ``after``); returns the wait time."""
        start = time.monotonic()
        deadline = start + timeout
        while state not in self.states[after:]:
            self._changed.clear()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no {state} within {timeout}s (saw {self.states})")
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except TimeoutError:
                continue
        return time.monotonic() - start


class Holder:
    """A real broker-like process that takes the lock and keeps it until killed."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    async def start(cls, url: str, group: str, *extra: str, timeout: float = 60.0) -> Holder:
        env = dict(os.environ, PYTHONPATH=str(REPO))
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.lockers.holder", url, group, *extra,
            cwd=REPO, env=env, stdout=asyncio.subprocess.PIPE,
        )
        holder = cls(proc)
        try:
            assert proc.stdout is not None
            line = await asyncio.wait_for(proc.stdout.readline(), timeout)
            assert line.strip() == b"ACQUIRED", f"holder said {line!r}"
        except BaseException:
            await holder.kill()
            raise
        return holder

    async def kill(self) -> None:
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGKILL)
        await self.proc.wait()

    def pause(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGCONT)

    async def said(self, timeout: float) -> bytes:
        """The holder's next line (ACQUIRED is read by start()), b"" at its exit."""
        assert self.proc.stdout is not None
        return (await asyncio.wait_for(self.proc.stdout.readline(), timeout)).strip()


async def cancel_wait_around_release(
    holder: Locker, waiter: Locker, rng: random.Random, spread: float
) -> bool:
    """``waiter`` waits for the lock while ``holder`` releases it; cancel the wait
    at a random moment around the release. True when the waiter got the lock first."""
    waiting = asyncio.create_task(waiter.acquire())
    await asyncio.sleep(rng.uniform(0, spread))  # vary the interleaving, not a wait
    releasing = asyncio.create_task(holder.release())
    await asyncio.sleep(rng.uniform(0, spread / 2))
    waiting.cancel()
    try:
        await waiting
        took = True
    except asyncio.CancelledError:
        took = False
    await releasing
    return took
