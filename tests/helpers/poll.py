"""Poll with a deadline: the one helper for state that has no event of its own (another
process's log, SQL rows, a client's flags). Tests wait on a condition, never on a sleep;
the deadline only bounds how long a broken run takes to fail."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")

#: Pause between two looks (s): short enough that a test ends right after the
#: condition holds, long enough not to steal the CPU the brokers need.
DEFAULT_INTERVAL = 0.02


def _truthy(value: Any) -> bool:
    return bool(value)


def _failure(why: str, value: Any, context: Callable[[], str] | None = None,
             ) -> AssertionError:
    text = f"{why}; last: {value!r}"
    return AssertionError(text if context is None else f"{text}\n{context()}")


def poll(fetch: Callable[[], T], predicate: Callable[[T], bool] = _truthy, *,
         timeout: float, what: str, interval: float = DEFAULT_INTERVAL,
         give_up: Callable[[], bool] | None = None,
         context: Callable[[], str] | None = None) -> tuple[T, float]:
    """Call ``fetch`` until ``predicate(result)`` holds (by default: the result is truthy);
    returns the result and the seconds it took. AssertionError at the deadline, or as soon
    as ``give_up()`` holds (the process that would make it true has exited: waiting longer
    only delays the failure); ``context()`` is added to the failure (a log tail)."""
    start = time.monotonic()
    while True:
        value = fetch()
        if predicate(value):
            return value, time.monotonic() - start
        if give_up is not None and give_up():
            value = fetch()  # one last look: it may have come just before the exit
            if predicate(value):
                return value, time.monotonic() - start
            raise _failure(f"gave up, its process exited: {what}", value, context)
        if time.monotonic() - start > timeout:
            raise _failure(f"not within {timeout}s: {what}", value, context)
        time.sleep(interval)


async def apoll(fetch: Callable[[], Awaitable[T] | T], predicate: Callable[[T], bool] = _truthy,
                *, timeout: float, what: str,
                interval: float = DEFAULT_INTERVAL) -> tuple[T, float]:
    """``poll`` for a running event loop: sleeps without blocking it, and ``fetch`` may be
    a coroutine function."""
    start = time.monotonic()
    while True:
        value = fetch()
        if inspect.isawaitable(value):
            value = await value
        if predicate(value):  # type: ignore[arg-type]
            return value, time.monotonic() - start  # type: ignore[return-value]
        if time.monotonic() - start > timeout:
            raise _failure(f"not within {timeout}s: {what}", value)
        await asyncio.sleep(interval)


class Waiters:
    """Coroutines waiting for a condition on state that announces its changes: the owner
    calls ``changed()`` after each change, so a waiter wakes at once, with no polling."""

    def __init__(self) -> None:
        self._waiting: list[tuple[Callable[[], bool], asyncio.Future[None]]] = []

    def changed(self) -> None:
        """Wake every waiter whose condition now holds."""
        for predicate, future in list(self._waiting):
            if not future.done() and predicate():
                future.set_result(None)

    async def wait_for(self, predicate: Callable[[], bool], timeout: float,
                       failure: Callable[[], str]) -> None:
        """Until ``predicate()`` holds; AssertionError(``failure()``) after ``timeout``."""
        if predicate():
            return
        future = asyncio.get_running_loop().create_future()
        entry = (predicate, future)
        self._waiting.append(entry)
        try:
            async with asyncio.timeout(timeout):
                await future
        except TimeoutError:
            raise AssertionError(failure()) from None
        finally:
            self._waiting.remove(entry)
