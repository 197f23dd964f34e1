"""``run_blocking``: a blocking call on a thread of its own, awaited on the loop;
``wait_running`` to bound it by the time this process ran; ``collect_outcome``
for such a call nobody awaits any more.

Used by every locker backend and by the ZooKeeper registry (``amqlite.registry``),
so it sits on the floor they share (``lockers.connections``).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def run_blocking(fn: Callable[[], T], *, name: str = "amqlite-locker") -> asyncio.Future[T]:
    """Run ``fn`` in a fresh daemon thread and return a future on the running loop.

    Not ``asyncio.to_thread``: a call wedged on a dead network would sit in the
    default executor, whose shutdown ``asyncio.run`` waits for, so the process
    could not exit. Cancelling the returned future does not stop ``fn``;
    callers that need that (a server-side lock wait) cancel it their own way.
    """
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, exc: BaseException | None) -> None:
        if fut.done():
            return
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(result)  # type: ignore[arg-type]

    def runner() -> None:
        try:
            result: T | None = fn()
            exc: BaseException | None = None
        except BaseException as e:  # handed to the loop, never lost in the thread
            result, exc = None, e
        # RuntimeError: the loop is closed, nobody is waiting any more.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle, result, exc)

    threading.Thread(target=runner, name=name, daemon=True).start()
    return fut


#: ``wait_running`` waits in slices this long, and a slice that ends more than
#: PAUSED_LATENESS after it should have is taken for a pause of this process
#: (SIGSTOP, a suspended VM, a loop that did not run): a quarter second keeps the
#: wake-ups rare, and a second late is far beyond a busy loop's normal lag.
RUNNING_SLICE = 0.25
PAUSED_LATENESS = 1.0


async def wait_running(fut: asyncio.Future[Any], timeout: float) -> bool:
    """Wait for ``fut`` until ``timeout`` seconds of this process's running time have
    passed; True when it is done.

    A wall-clock bound is wrong across a pause of the whole process: the thread waiting
    for the server stops with it, and on resume the loop's timer has long expired while
    the answer already sits in the socket, so the timer wins the race and a call that
    was answered counts as unanswered (a paused master gave up a lock it still held).
    Time the process did not run is not the server's silence: the slice it falls in
    counts as one slice. Never cancels ``fut``.
    """
    left = timeout
    while not fut.done() and left > 0:
        step = min(left, RUNNING_SLICE)
        started = time.monotonic()
        await asyncio.wait({fut}, timeout=step)
        spent = time.monotonic() - started
        left -= step if spent > step + PAUSED_LATENESS else spent
    return fut.done()


def collect_outcome(fut: asyncio.Future[Any]) -> None:
    """Done callback for an abandoned future (a call whose thread outlived its
    waiter): retrieve its outcome, so asyncio does not log "Future exception
    was never retrieved" when it fails late (its session already closed)."""
    if not fut.cancelled():
        fut.exception()
