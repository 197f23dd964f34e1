"""Helpers for the client tests: run async tests, record listener callbacks, wait on state."""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from amqlite.codec import Frame
from tests.helpers.poll import Waiters, apoll

#: Upper bound for one async test; a hang fails instead of blocking the suite.
TEST_TIMEOUT = 60.0
#: Default deadline for waiting on the client's state.
WAIT = 10.0

_T = TypeVar("_T")


def async_test(fn: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Run an async test function on a fresh event loop, bounded by TEST_TIMEOUT."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        async def bounded() -> None:
            async with asyncio.timeout(TEST_TIMEOUT):
                await fn(*args, **kwargs)

        asyncio.run(bounded())

    return wrapper


async def poll_until(predicate: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    """Poll client-side state with a deadline (the state has no event of its own)."""
    await apoll(predicate, timeout=timeout, what=what, interval=0.005)


async def within(awaitable: Awaitable[_T], timeout: float = WAIT) -> _T:
    async with asyncio.timeout(timeout):
        return await awaitable


class RecordingListener:
    """A transport listener that records every callback; tests wait on it."""

    def __init__(self) -> None:
        self.events: list[tuple[str, object]] = []
        self.threads: set[str] = set()
        self._waiters = Waiters()

    def _record(self, name: str, value: object = None) -> None:
        self.events.append((name, value))
        self.threads.add(threading.current_thread().name)
        self._waiters.changed()

    def on_command(self, frame: Frame) -> None:
        self._record("command", frame)

    def on_exception(self, exc: BaseException) -> None:
        self._record("exception", exc)

    def on_interrupted(self) -> None:
        self._record("interrupted")

    def on_resumed(self) -> None:
        self._record("resumed")

    def names(self) -> list[str]:
        """Callbacks other than on_command, in order."""
        return [name for name, _ in self.events if name != "command"]

    def count(self, name: str) -> int:
        return sum(1 for n, _ in self.events if n == name)

    def exceptions(self) -> list[BaseException]:
        return [v for n, v in self.events if n == "exception"]  # type: ignore[misc]

    def commands(self) -> list[str]:
        return [v.command for n, v in self.events if n == "command"]  # type: ignore[attr-defined]

    async def wait_for(self, predicate: Callable[[], bool], what: str,
                       timeout: float = WAIT) -> None:
        await self._waiters.wait_for(
            predicate, timeout,
            lambda: f"listener: {what} not seen within {timeout}s; events: {self.names()}")

    async def wait_count(self, name: str, count: int, timeout: float = WAIT) -> None:
        await self.wait_for(lambda: self.count(name) >= count, f"{count}x {name}", timeout)
