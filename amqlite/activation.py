"""Activation: from holding the lock to serving, with the lock proved at every step.

A node that acquired the group's lock can lose it before it serves: the process was
paused and a slave ended its PostgreSQL session once the lease ran out, its ZooKeeper
session expired, its lock file was replaced. It must then never serve, nor claim an
epoch over the node that took the lock from it (issue 22). So ``claim`` and the node:

* read the group's epoch, then prove the lock with the locker (``Locker.prove``:
  the PostgreSQL ``pg_locks`` query and lease, the ZooKeeper node and session, the
  lock file's inode): the epoch was read while the lock was ours, nobody claimed since;
* claim exactly that epoch (a compare-and-set in the store): a claim that comes late,
  after another node claimed, is refused by the store (``StaleClaim``) and changes
  nothing;
* prove the lock again after the claim, and right before the STOMP listener opens and
  the registry says master;
* a LOST notification (or a locker's freeze) at any moment of activation aborts it at
  its next step: the node never opens its port nor says master, releases what it holds
  and ends its term as a lost lock does (exit 3, or slave again with ``--rejoin``).

A SUSPENDED lock (ZooKeeper) proves nothing: a proof waits for HELD or LOST, which the
locker sends within its session timeout (PROOF_TIMEOUT bounds it regardless).

Test-only: ``AMQLITE_TEST_GATE=<point>:<path>`` (read by ``gate_file`` only) makes an
activation wait at ``point`` ("claim": just before the claim's statement, as a slow
claim would; "listen": just before the last proof) until ``path`` exists, so a test can
take the lock away at that moment. Never set it in production.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from pathlib import Path

from amqlite.settings import Settings
from lockers import Locker, LockerError, LockLost, LockState
from store import Recovery, Store
from store.api import StaleClaim

log = logging.getLogger("amqlite.node")

#: Environment variable of the test-only gate (see the module docstring).
TEST_GATE_ENV = "AMQLITE_TEST_GATE"
#: How often a gated activation looks for its gate file.
TEST_GATE_POLL = 0.02
#: While the lock is in doubt (SUSPENDED), prove it again this often (s) ...
DOUBT_RETRY = 1.0
#: ... and count it lost when it could not be proved for this long (s). ZooKeeper's
#: locker says LOST within one session timeout of SUSPENDED anyway.
PROOF_TIMEOUT = 60.0


class ActivationAborted(Exception):
    """The lock was lost, or could not be proved ours, while activating."""


def gate_file(point: str) -> Path | None:
    """The gate file an activation waits for at ``point`` (tests only), or None."""
    where, sep, path = os.environ.get(TEST_GATE_ENV, "").partition(":")
    return Path(path) if sep and path and where == point else None


class ActivationGuard:
    """Watches the lock while a node activates. The node hands it every lock state and
    every reason to demote; ``check`` and ``confirm`` raise ``ActivationAborted`` once
    the lock is gone."""

    def __init__(self, locker: Locker, node: str, stopping: asyncio.Event) -> None:
        self.locker = locker
        self.node = node
        self.stopping = stopping
        #: Why the lock is gone (None: not known to be gone).
        self.reason: str | None = None
        #: Set from a locker thread (``Locker.freeze``): the lock may be gone.
        self.frozen = False
        #: SUSPENDED and not yet HELD or LOST again.
        self.suspended = False
        self._changed = asyncio.Event()

    def lost(self, reason: str) -> None:
        """The lock is gone (or the node must give up): abort at the next step."""
        if self.reason is None:
            self.reason = reason
        self._changed.set()

    def state(self, state: LockState) -> None:
        """A lock state from the locker (on the event loop)."""
        if state is LockState.LOST:
            self.lost("lock lost")
        self.suspended = state is LockState.SUSPENDED
        self._changed.set()

    def freeze(self) -> None:
        """From a locker thread: only a flag (``Locker.freeze``)."""
        self.frozen = True

    def check(self, step: str) -> None:
        """Raise ``ActivationAborted`` if the lock was reported gone; no I/O."""
        if self.reason is not None:
            raise ActivationAborted(f"{step}: {self.reason}")
        if self.frozen:
            raise ActivationAborted(f"{step}: the locker says the lock may be gone")

    async def confirm(self, step: str) -> None:
        """Prove with the locker (``Locker.prove``) that the lock is ours right now. In
        doubt (SUSPENDED, ZooKeeper out of reach) wait for HELD or LOST, proving again
        every DOUBT_RETRY; a lock not proved within PROOF_TIMEOUT counts as lost."""
        deadline = time.monotonic() + PROOF_TIMEOUT
        warned = False
        while True:
            self.check(step)
            self._changed.clear()
            try:
                await self.locker.prove()
            except LockLost as exc:
                self.lost(str(exc))
                raise ActivationAborted(f"{step}: {exc}") from None
            except LockerError as exc:
                doubt = str(exc)
            else:
                if not self.suspended:
                    self.check(step)
                    return
                doubt = "lock connection suspended"
            left = deadline - time.monotonic()
            if left <= 0:
                self.lost(f"not proved for {PROOF_TIMEOUT:g}s ({doubt})")
                self.check(step)
            if not warned:
                log.warning("node %s: %s: the lock is in doubt (%s); waiting for it to be "
                            "confirmed or lost", self.node, step, doubt)
                warned = True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(left, DOUBT_RETRY))

    async def pass_gate(self, point: str) -> None:
        """Tests only: wait at ``point`` while ``AMQLITE_TEST_GATE`` says so."""
        gate = gate_file(point)
        if gate is None:
            return
        log.warning("node %s: test gate: activation waits at %r until %s exists", self.node,
                    point, gate)
        while not gate.exists() and not self.stopping.is_set():
            await asyncio.sleep(TEST_GATE_POLL)
        log.warning("node %s: test gate %r passed", self.node, point)


async def claim(store: Store, locker: Locker, guard: ActivationGuard,
                settings: Settings) -> tuple[int, Recovery]:
    """Claim the group's next epoch while the lock is provably ours and read what the
    new master needs. ``ActivationAborted`` when the lock is gone; ``StoreError`` (a
    ``StaleClaim`` too, when the lock is still ours) when the store failed."""
    s = settings
    seen = await asyncio.to_thread(store.read_epoch)
    await guard.confirm(f"before claiming (the group was at epoch {seen})")
    await guard.pass_gate("claim")
    try:
        epoch = await asyncio.to_thread(
            store.claim_epoch, s.name, locker.fencing_token, int(s.dedup_window * 1000),
            expected=seen)
    except StaleClaim as exc:
        log.error("node %s: claim refused: %s", s.name, exc)
        await guard.confirm("after the store refused the claim")
        raise  # still ours: a deposed node's late claim came in between; retried
    await guard.confirm(f"after claiming epoch {epoch}")
    recovery = await asyncio.to_thread(store.recover, epoch)
    guard.check(f"after reading epoch {epoch}'s state")
    return epoch, recovery
