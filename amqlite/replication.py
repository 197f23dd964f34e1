"""A node's watch on its PostgreSQL store's replication (``store.replication``): the
RECEIPT promise holds through a failover of the database only if every commit waits for
a synchronous standby.

* At start and at every activation ``check`` reads the state, logs it, and refuses
  (``StoreUnusable``: exit 2, as ``allow_fsync_off`` does for fsync) a server with
  standbys but none synchronous, or whose commits do not wait for it, unless
  ``allow_async_replication`` accepts it; a server that is itself a standby is refused
  always (it takes no writes).
* While master, ``watch`` re-reads it every ``REPLICATION_CHECK_INTERVAL`` (a change is
  logged; a state activation would refuse ends the term), and looks at the group commit
  in flight: one older than ``SLOW_COMMIT`` gets a diagnosis, which names a missing
  synchronous standby when the server shows the store's sessions waiting on ``SyncRep``.
  Such a commit is on the primary but not yet on a standby: no RECEIPT is given until
  one confirms it, and the node keeps its lock meanwhile (the lease is renewed without
  waiting for a standby, ``lockers/pg_lease.py``), so the group does not cycle through
  epochs while the database is alive and only the standby is missing.

SQLite has no replication: nothing is read and nothing is said.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from sqlalchemy import Engine

from amqlite.settings import Settings
from store import StoreError, StoreUnusable
from store.engine import store_application_name
from store.replication import (
    SYNC_REP_WAIT_EVENT,
    ReplicationState,
    read_replication,
    sync_rep_waiters,
)

log = logging.getLogger("amqlite.node")

#: How often a master re-reads the replication state (s): one catalog read of a few rows,
#: so a standby that goes away or a changed synchronous_standby_names is in the log and in
#: /readyz within 10 s at the cost of one query per 10 s.
REPLICATION_CHECK_INTERVAL = 10.0
#: A group commit taking longer than this gets a diagnosis (s). A healthy one takes
#: milliseconds; 3 s is the default lock lease (PG_LEASE, lockers/pg_lease.py), after
#: which a commit stuck on a missing standby used to cost the master its lock.
SLOW_COMMIT = 3.0
#: How often the master looks at the commit in flight (s): a tenth of SLOW_COMMIT and
#: more, a comparison of two floats.
STALL_POLL = 0.5
#: While one commit stays stuck, its diagnosis is logged again this often (s).
STALL_REMIND = 30.0


class _SqlStore(Protocol):
    """What the monitor needs of ``store.SqlStore``."""

    dialect: str
    description: str
    group: str

    @property
    def engine(self) -> Engine: ...


class _Committer(Protocol):
    """What the monitor needs of ``store.GroupCommitter``."""

    @property
    def busy_since(self) -> float | None: ...


class ReplicationMonitor:
    """The replication state a node last read, and what it made of it."""

    def __init__(self, settings: Settings, store: Any) -> None:
        self.settings = settings
        self.store: _SqlStore | None = store if getattr(store, "dialect", "") == "postgresql" \
            else None
        self.state: ReplicationState | None = None
        self.checked_at: float | None = None  # wall clock of the last read
        #: The diagnosis of the group commit that is stuck now, None when none is.
        self.stall: str | None = None
        self._stall_logged = 0.0

    # -- what the node shows -----------------------------------------------------------
    @property
    def warning(self) -> str | None:
        """What the operator accepted (allow_async_replication) or should know now."""
        state = self.state
        if state is None:
            return None
        if state.unsafe:
            return f"{state.unsafe} (accepted by allow_async_replication)"
        return self.stall or state.waiting

    def to_json(self) -> dict[str, Any] | None:
        """For /readyz and /api/v1/group; None for SQLite."""
        if self.store is None:
            return None
        if self.state is None:
            return {"summary": "not read yet"}
        return {**self.state.to_json(), "checked_at": self.checked_at,
                "accepted": bool(self.state.unsafe), "commit_waiting": self.stall}

    # -- checks --------------------------------------------------------------------------
    async def read(self) -> ReplicationState | None:
        """Read the state now (None for SQLite); raises ``StoreError``."""
        store = self.store
        if store is None:
            return None
        state = await asyncio.to_thread(read_replication, store.engine, store.description)
        self.state, self.checked_at = state, time.time()
        return state

    async def check(self, when: str) -> None:
        """At start and at activation: read, log, refuse what the settings do not accept
        (``StoreUnusable``). At activation a failed read only warns: the claim that
        follows meets the same database and says what is wrong with it."""
        try:
            state = await self.read()
        except StoreError as exc:
            if when == "start":
                raise
            log.warning("node %s: could not read the store's replication state at %s: %s",
                        self.settings.name, when, exc)
            return
        if state is None:
            return
        refused = self.refusal(state)
        if refused is not None:
            raise StoreUnusable(refused)
        self._log(state, when)

    def refusal(self, state: ReplicationState) -> str | None:
        """The one line a node that must not serve on ``state`` exits with, or None."""
        assert self.store is not None
        where = self.store.description
        if state.in_recovery:
            return (f"{where}: the server is a standby (in recovery) and takes no writes; "
                    "name the primary, or every host with target_session_attrs=read-write")
        if state.unsafe and not self.settings.allow_async_replication:
            return (f"{where}: {state.unsafe}; make a standby synchronous "
                    "(synchronous_standby_names, synchronous_commit = on), or set "
                    "allow_async_replication = true")
        return None

    def _log(self, state: ReplicationState, when: str) -> None:
        name = self.settings.name
        if state.unsafe:
            log.warning("node %s: store replication at %s: %s; serving anyway "
                        "(allow_async_replication): %s", name, when, state.summary,
                        state.unsafe)
        elif state.waiting:
            log.warning("node %s: store replication at %s: %s; %s", name, when,
                        state.summary, state.waiting)
        else:
            log.info("node %s: store replication at %s: %s", name, when, state.summary)

    # -- while master ----------------------------------------------------------------------
    async def watch(self, committer: _Committer, demote: Callable[[str], None]) -> None:
        """Re-read the state on a timer and diagnose a stuck commit, until cancelled."""
        if self.store is None:
            return
        next_read = time.monotonic() + REPLICATION_CHECK_INTERVAL
        while True:
            await asyncio.sleep(STALL_POLL)
            await self._look_at_commit(committer)
            if time.monotonic() < next_read:
                continue
            next_read = time.monotonic() + REPLICATION_CHECK_INTERVAL
            before = self.state
            try:
                state = await self.read()
            except StoreError as exc:
                log.debug("replication state unreadable: %s", exc)
                continue
            if state is None or state == before:
                continue
            refused = self.refusal(state)
            if refused is not None:
                log.error("node %s: %s", self.settings.name, refused)
                demote(f"store replication: {state.unsafe or state.summary}")
                return
            self._log(state, "a periodic check (changed)")

    async def _look_at_commit(self, committer: _Committer) -> None:
        since = committer.busy_since
        now = time.monotonic()
        if since is None or now - since < SLOW_COMMIT:
            if self.stall is not None:
                log.info("node %s: the group commit went through; commits flow again",
                         self.settings.name)
                self.stall = None
            return
        if self.stall is not None and now - self._stall_logged < STALL_REMIND:
            return
        self._stall_logged = now
        self.stall = await self.diagnose(now - since)
        log.warning("node %s: %s", self.settings.name, self.stall)

    async def diagnose(self, waited: float) -> str:
        """What holds a group commit that has taken ``waited`` seconds so far."""
        store = self.store
        assert store is not None
        app = store_application_name(store.group)
        try:
            waiters = await asyncio.to_thread(sync_rep_waiters, store.engine, app,
                                              store.description)
            state = await self.read()
        except StoreError as exc:
            return (f"a group commit has taken {waited:.1f}s and the database does not "
                    f"answer a diagnosis either: {exc}")
        if waiters and state is not None:
            return (f"a group commit has waited {waited:.1f}s for a synchronous standby: "
                    f"{waiters} store session(s) wait on {SYNC_REP_WAIT_EVENT}, "
                    f"synchronous_standby_names = '{state.standby_names}', connected "
                    f"standbys: {state.describe_standbys()}. The commit is on the primary "
                    "but no RECEIPT is given until a standby confirms it; this node keeps "
                    "the lock and carries on when one does")
        return (f"a group commit has taken {waited:.1f}s and no store session waits for a "
                "synchronous standby: the database is slow or out of reach")

