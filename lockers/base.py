"""The one seam every election backend sits behind.

A node asks its ``Locker`` for the group's exclusive lock. The holder is the
master. The locker never decides anything about the store: it only says
"you hold it", "you may not trust it right now" (SUSPENDED, kazoo's term) or
"it is gone" (LOST). Fencing against a master that learns of its loss too
late is the store's job (the epoch row); a locker may contribute a token that
only grows (ZooKeeper's ``czxid``) to make the epoch jump past it.
"""

from __future__ import annotations

import abc
import asyncio
import enum
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)

#: How often a slave asks for the lock when the backend has no watch.
#: Artemis' backup retries its file lock every 500 ms; ActiveMQ's 10 s is why
#: its failovers are slow.
DEFAULT_POLL_INTERVAL = 0.5

#: How often a master re-checks that it still holds the lock. Artemis' live
#: node checks its file lock every 2 s; we check more often because the check
#: is one cheap query.
DEFAULT_KEEPALIVE_INTERVAL = 1.0


class LockState(enum.Enum):
    """What the holder may assume about its lock (kazoo's model).

    Acquisition itself is announced by ``acquire()``/``try_acquire()`` returning,
    not by a HELD notification: HELD is only sent when a SUSPENDED lock is
    proven ours again, so a listener never "activates" twice.
    """

    HELD = "held"  # we hold it and can prove it
    SUSPENDED = "suspended"  # connection to the backend is in doubt: pause writes
    LOST = "lost"  # it is gone: demote


class LockerError(Exception):
    """The backend could not be reached or refused us; not a lost lock."""


class LockerUnusable(LockerError):
    """The backend refused us for what the settings name (a wrong password): waiting
    changes nothing, so a starting node ends (exit 2) instead of retrying."""


class LockLost(Exception):  # not "...Error": the name says what happened
    """The lock we held is gone (or can no longer be proven to be ours)."""


StateListener = Callable[[LockState], None]


class RetryBackoff:
    """A wait for the lock that outlives an unreachable backend (a locker's ``acquire``):
    the first failure of an outage is logged as a warning, each retry sleeps twice as
    long as the one before, up to ``cap`` (s), and a try that reaches the backend starts
    over. ``log`` is the backend's logger."""

    def __init__(self, initial: float, cap: float, log: logging.Logger) -> None:
        self.initial = initial
        self.cap = cap
        self.log = log
        self.delay = initial
        self.failing = False

    async def failed(self, error: Exception) -> None:
        """A try failed: warn (once an outage), sleep, then grow the delay."""
        if not self.failing:
            self.log.warning("%s; retrying", error, stacklevel=2)  # the locker's line
            self.failing = True
        await asyncio.sleep(self.delay)
        self.delay = min(self.delay * 2, self.cap)

    def succeeded(self) -> bool:
        """A try reached the backend: start over; True when that ends an outage."""
        was_failing, self.failing = self.failing, False
        self.delay = self.initial
        return was_failing


class Locker(abc.ABC):
    """An exclusive, per-group lock with liveness checks and a loss signal.

    All coroutine methods run on the node's event loop; implementations that
    need blocking I/O or threads (psycopg, kazoo) hop to a thread themselves
    and report state changes back with ``loop.call_soon_threadsafe``.
    """

    #: Human-readable description with secrets removed, for log lines.
    description: str = "locker"

    #: How often the node should call ``keepalive()`` while it is master.
    keepalive_interval: float = DEFAULT_KEEPALIVE_INTERVAL

    def __init__(self) -> None:
        self._listeners: list[StateListener] = []
        #: Called from a locker *thread* the instant the lock may no longer be
        #: ours (a lease that ran out while the process was paused), before the
        #: LOST notification reaches the event loop: the loop may serve a few
        #: frames first. It must only set flags (``Broker.paused``).
        self.freeze: Callable[[], None] | None = None

    def freeze_now(self) -> None:
        """Run ``freeze`` (from any thread); a failing hook must not break the locker."""
        freeze = self.freeze
        if freeze is None:
            return
        try:
            freeze()
        except Exception:
            log.exception("lock freeze hook failed")

    # -- election -------------------------------------------------------
    @abc.abstractmethod
    async def try_acquire(self) -> bool:
        """Try once, without waiting; True when we now hold the lock.

        Must never stack: calling it while holding the lock returns True
        without taking the lock a second time.
        """

    async def acquire(self, poll_interval: float = DEFAULT_POLL_INTERVAL) -> None:
        """Wait until we hold the lock. Backends with a watch override this."""
        while not await self.try_acquire():
            await asyncio.sleep(poll_interval)

    @abc.abstractmethod
    async def keepalive(self) -> None:
        """Prove we still hold the lock; raise ``LockLost`` when we cannot."""

    async def prove(self) -> None:
        """Prove, right now, that we hold the lock (an activation's check): ``LockLost``
        when it is gone, ``LockerError`` when it cannot be proved at the moment (the
        connection is in doubt), never a pass without proof. A locker whose
        ``keepalive`` passes only with proof needs no override."""
        await self.keepalive()

    @abc.abstractmethod
    async def release(self) -> None:
        """Give the lock up at once so a slave takes over without a timeout."""

    async def close(self) -> None:
        """Release (if held) and free every resource. Idempotent."""
        await self.release()

    @property
    def reachable(self) -> bool:
        """False while the lock's server has never answered (a starting node bounds
        that wait with ``start_timeout``); a locker without a server is always reachable."""
        return True

    # -- fencing --------------------------------------------------------
    @property
    def fencing_token(self) -> int | None:
        """A number that only grows across lock holders, or None.

        The store bumps the group epoch to ``max(epoch + 1, token)`` so an
        external token (ZooKeeper czxid) and the epoch row agree.
        """
        return None

    # -- loss notification ------------------------------------------------
    def add_listener(self, listener: StateListener) -> None:
        """Call ``listener(state)`` on the event loop when the lock state changes."""
        self._listeners.append(listener)

    def _notify(self, state: LockState) -> None:
        for listener in list(self._listeners):
            try:
                listener(state)
            except Exception:  # a listener must not break the locker
                log.exception("lock state listener failed")
