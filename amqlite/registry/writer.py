"""The node's side of the registry: ``Registry`` (what the node calls), ``NullRegistry``
(none) and ``BackgroundRegistry``, the worker both backends (``store_rows``,
``zookeeper``) build on: it applies the newest wish, retries and heartbeats, so that
announcing never blocks and never raises (``amqlite.registry``).
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Awaitable, Callable

from amqlite.registry.model import ROLES, Member, Role
from amqlite.settings import Settings
from lockers.connections.errors import one_line

log = logging.getLogger("amqlite.registry")

#: How long ``withdraw()`` waits for the entry to be removed on a graceful stop
#: (s). Bounded so that a dead registry cannot hold up a stopping broker; the
#: entry then expires on its own (max age or session timeout).
WITHDRAW_TIMEOUT = 3.0


class Deferred(Exception):
    """Not now: apply the wanted entry again after ``delay`` seconds."""

    def __init__(self, delay: float) -> None:
        super().__init__(f"deferred {delay:g}s")
        self.delay = delay


class Registry(abc.ABC):
    """This node's entry in its group's registry. No method raises or blocks
    for long: failures are logged and retried in the background."""

    description = "registry"
    #: Set by the node: proves, right now, that this node still holds the lock.
    #: A master entry is (re)written only after it says yes, so a deposed master
    #: that wakes up (SIGCONT) never shows up as master while it demotes.
    confirm_master: Callable[[], Awaitable[bool]] | None = None
    #: The node's management API URL, announced with its role (None: no API).
    http: str | None = None

    @abc.abstractmethod
    async def announce(self, role: Role, epoch: int | None) -> None:
        """Say (and keep saying) that this node is ``role`` (MASTER or SLAVE);
        a master gives the epoch it claimed. Returns at once."""

    @abc.abstractmethod
    async def withdraw(self) -> None:
        """Remove this node's entry (graceful stop); waits at most WITHDRAW_TIMEOUT."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Stop the background work and free resources. Idempotent."""


class NullRegistry(Registry):
    """No registry (before one is opened, or when none could be)."""

    description = "no registry"

    async def announce(self, role: Role, epoch: int | None) -> None:
        return None

    async def withdraw(self) -> None:
        return None

    async def close(self) -> None:
        return None


class BackgroundRegistry(Registry):
    """A worker task applies the latest wanted state (an entry, or none) and
    re-applies it every ``period`` (heartbeat or check); the node only sets
    what it wants. One write at a time, always the newest wish, so an old
    "master" can never land after a newer "slave"."""

    period: float = 1.0

    def __init__(self, settings: Settings) -> None:
        self.group = settings.group
        self.name = settings.name
        self.services: tuple[str, ...] = tuple(settings.advertise_uris)
        self.websocket: tuple[str, ...] = tuple(settings.websocket_uris)
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self._wanted: Member | None = None
        self._wake: asyncio.Event | None = None
        self._withdrawn: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._failing = False

    # -- what the node calls ------------------------------------------------------
    async def announce(self, role: Role, epoch: int | None) -> None:
        if role not in ROLES:
            log.error("%s: unknown role %r not announced", self.description, role)
            return
        if self._closed:
            return
        role = Role(role)  # the plain string goes into the entry: .value
        self._wanted = Member(self.group, self.name, role.value, self.services, self.host,
                              self.pid, epoch if role is Role.MASTER else None, self.http,
                              websocket=self.websocket)
        self._kick()

    async def withdraw(self) -> None:
        if self._closed or (self._task is None and self._wanted is None):
            return
        self._wanted = None
        self._kick()
        assert self._withdrawn is not None
        try:
            await asyncio.wait_for(self._withdrawn.wait(), WITHDRAW_TIMEOUT)
        except TimeoutError:
            log.warning("%s: could not remove %s's entry within %gs; it will expire",
                        self.description, self.name, WITHDRAW_TIMEOUT)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        try:
            await self._close_backend()
        except Exception as e:
            log.warning("%s: close failed: %s", self.description, e)

    # -- the worker ---------------------------------------------------------------
    def _kick(self) -> None:
        if self._wake is None:
            self._wake = asyncio.Event()
            self._withdrawn = asyncio.Event()
        assert self._withdrawn is not None
        if self._wanted is not None:
            self._withdrawn.clear()
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())
        self._wake.set()

    async def _run(self) -> None:
        assert self._wake is not None and self._withdrawn is not None
        while True:
            self._wake.clear()
            wanted = self._wanted
            ok, delay = await self._apply_logged(wanted)
            if ok and wanted is None and self._wanted is None:
                self._withdrawn.set()
                await self._wake.wait()  # nothing to keep alive until the next wish
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), delay)

    async def _apply_logged(self, wanted: Member | None) -> tuple[bool, float]:
        """Apply; (applied?, seconds until the next attempt or heartbeat)."""
        try:
            await self._apply(wanted)
        except asyncio.CancelledError:
            raise
        except Deferred as d:
            return False, d.delay
        except Exception as e:
            if not self._failing:
                log.warning("%s: cannot update %s's entry (%s); retrying every %gs",
                            self.description, self.name, one_line(e), self.period)
            self._failing = True
            return False, self.period
        if self._failing:
            log.info("%s: %s's entry is up to date again", self.description, self.name)
            self._failing = False
        return True, self.period

    @abc.abstractmethod
    async def _apply(self, wanted: Member | None) -> None:
        """Make the registry hold ``wanted`` (None: no entry). May raise."""

    async def _close_backend(self) -> None:
        return None
