"""The node lifecycle: poll as slave, activate, serve as master, demote.

    start -> [slave: wait for lock] -> activate -> [master: serve]
          -> lock lost / store fenced -> demote (fail-stop) -> exit, or slave again (--rejoin)

Demotion is fail-stop: stop accepting, close every client, stop writing,
release what we hold. A master that merely *suspects* its lock (ZooKeeper
SUSPENDED) pauses dispatch and commits until the locker says HELD or LOST.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import errno
import gc
import logging
import os
import re
import signal
import time
from collections.abc import Awaitable
from pathlib import Path

from amqlite import activation, native, pidfile, vacuum
from amqlite.activation import ActivationAborted, ActivationGuard
from amqlite.auth import Authenticator, AuthError
from amqlite.authz import UsersFile, load_users_file
from amqlite.broker import Broker, inactive, limits
from amqlite.broker.heap import tune_malloc
from amqlite.listen import bound_sockets
from amqlite.management import ManagementServer
from amqlite.name_check import refuse_duplicate_name
from amqlite.registry import (
    NullRegistry,
    Registry,
    RegistryError,
    Role,
    open_registry,
    read_members,
    registry_url,
)
from amqlite.replication import ReplicationMonitor
from amqlite.server import StompServer
from amqlite.settings import Settings, SettingsError
from amqlite.websocket import console_origins
from lockers import Locker, LockerError, LockLost, LockState, open_locker
from store import GroupCommitter, Store, StoreError, StoreRejected, StoreUnusable, open_store

log = logging.getLogger("amqlite.node")

EXIT_OK = 0
EXIT_ERROR = 1
#: The node lost mastership and was not asked to rejoin: a supervisor (systemd,
#: Docker, ``amqlite container``) may restart it; it will come back as slave.
EXIT_DEMOTED = 3

#: How long a graceful stop waits for the group commit in flight.
GRACEFUL_DRAIN_TIMEOUT = 10.0
#: Back-off while the store is unreachable at start or after a failed activation.
RETRY_DELAY = 1.0
#: Cap of the doubling back-off at start: a store that comes back is noticed within
#: 10 s, and a node waiting for it logs at most one line per 10 s.
RETRY_MAX_DELAY = 10.0
#: How often a starting node looks whether its locker's server answered yet.
REACHABLE_POLL = 0.2
#: How long a start that gave up on an unreachable locker waits for its clients to close.
UNREACHED_CLOSE = 0.5
#: How often a master re-reads its group's members to update clients' URIs.
#: The registry itself notices a change within ~1 s; polling faster buys nothing.
CLUSTER_POLL_INTERVAL = 1.0
#: Housekeeping batch sizes: small so a housekeeping commit never stalls SENDs.
REAP_BATCH = 1000
PRUNE_BATCH = 5000


class Outcome(enum.Enum):
    """How a term as master (``Node._serve_as_master``) ended."""

    RETRY = "retry"  # activation failed; the lock is released, wait for it again
    STOPPED = "stopped"  # a stop was asked for: the node ends
    LOST = "lost"  # mastership (or the lock, while activating) lost: exit (demoted) or,
    # with --rejoin, slave again
    CANNOT_SERVE = "cannot serve"  # the listener cannot open: the node ends with an error


class Demoted(Exception):
    """Mastership ended (lock lost or store fenced)."""


def check_data_dir(data_dir: str) -> None:
    """The data directory must be a writable directory (created when missing):
    a SettingsError now, not an error retried for ever later."""
    path = Path(data_dir)
    if path.exists() and not path.is_dir():
        raise SettingsError(f"--data-dir {data_dir}: not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SettingsError(f"--data-dir {data_dir}: cannot create it: "
                            f"{exc.strerror or exc}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise SettingsError(f"--data-dir {data_dir}: not writable by this user")


def probe_listen(host: str, port: int) -> OSError | None:
    """Bind (and at once close) the STOMP address: the error a listener would get, or
    None. Bound, not listening: a client must not be accepted, then reset, by a node
    that is not serving yet. Blocking (name resolution). Done before an epoch is
    claimed, so a node that cannot serve never bumps the group's epoch; the real
    listener binds right after."""
    try:
        socks = bound_sockets(host, port)
    except OSError as exc:
        return exc
    for sock in socks:
        sock.close()
    return None


class Node:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.stopping = asyncio.Event()
        self.lost = asyncio.Event()
        self.lost_reason = ""
        self.broker: Broker | None = None
        self.server: StompServer | None = None
        self.role: Role = Role.STARTING
        #: This node's registry entry (cluster-list, discovery); never blocks or raises.
        self.registry: Registry = NullRegistry()
        #: Read by the management API and its metrics.
        self.takeovers = 0
        self.store_errors = 0
        self.master_since: float | None = None  # wall clock of the last activation
        self.management: ManagementServer | None = None
        #: The users file as last loaded (None: no users file, no login); SIGHUP reloads it.
        self.users_file: UsersFile | None = None
        self.auth = Authenticator(None)
        #: Risks the settings accepted, shown in the log and in /readyz (fsync = off).
        self.warnings: list[str] = []
        #: The store's replication as last read (PostgreSQL), for the log and /readyz.
        self.replication = ReplicationMonitor(settings, None)
        #: Watches the lock from the start of an activation until the node serves.
        self.guard: ActivationGuard | None = None
        #: The locker's server never answered within start_timeout (the start gave up).
        self.unreached = False

    # -- entry point ----------------------------------------------------------------
    async def run(self) -> int:
        s = self.settings
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self.request_stop)
        with contextlib.suppress(NotImplementedError, RuntimeError, AttributeError):
            loop.add_signal_handler(signal.SIGHUP, self.reload_users)
        self.users_file = load_users_file(s.users_file) if s.users_file else None
        auth = self.auth = Authenticator(self.users_file.users if self.users_file else None)
        check_data_dir(s.data_dir)
        host, port = s.bind_address
        refused = await asyncio.to_thread(probe_listen, host, port)
        if refused is not None and refused.errno != errno.EADDRINUSE:
            # In use may be this group's master on this host (it frees the port when
            # it goes): checked again at activation. Anything else never gets better.
            raise SettingsError(f"--bind {s.bind}: cannot listen: {refused.strerror or refused}")
        if refused is not None:
            log.warning("node %s: %s is in use now; this node needs it when it becomes master",
                        s.name, s.bind)
        await refuse_duplicate_name(s)  # before its pid file and registry entry
        store = open_store(s.store, s.group)
        locker = open_locker(
            s.locker, s.group, session_timeout=s.zk_session_timeout,
            keepalive_interval=s.lock_keepalive, node=s.name, lease=s.lock_lease,
        )
        locker.add_listener(self._lock_state)
        locker.freeze = self._freeze
        log.info("node %s of group %s: store %s, locker %s; %s", s.name, s.group,
                 store.description, locker.description, native.implementation())
        pid_info = pidfile.PidInfo(pid=os.getpid(), name=s.name, group=s.group,
                                   stomp=s.advertise, users_file=os.path.abspath(
                                       s.users_file) if s.users_file else None)
        pidfile.write(pid_info, s.data_dir)
        try:
            if not await self._open_store(store):
                return EXIT_OK
            await self._check_durability(store)
            self.replication = ReplicationMonitor(s, store)
            await self.replication.check("start")  # refuses (exit 2) what is not accepted
            self.registry = open_registry(s, store)
            self.registry.confirm_master = lambda: self._still_master(locker)
            if not await self._start_management():
                return EXIT_ERROR
            if self.registry.http:
                pid_info.http = self.registry.http
                with contextlib.suppress(OSError):
                    pidfile.write(pid_info, s.data_dir)
            first = True
            while not self.stopping.is_set():
                self.role = Role.SLAVE
                log.info("node %s: slave of group %s, waiting for the lock", s.name, s.group)
                await self.registry.announce(Role.SLAVE, None)
                acquire = locker.acquire(s.lock_poll_interval)
                if first and s.start_timeout:
                    acquire = self._bounded(acquire, locker)
                first = False
                if not await self._until_stopped(acquire):
                    break
                outcome = await self._serve_as_master(store, locker, auth)
                if outcome is Outcome.STOPPED:
                    break
                if outcome is Outcome.CANNOT_SERVE:
                    return EXIT_ERROR
                if not s.rejoin:
                    return EXIT_DEMOTED
                self.lost.clear()
            return EXIT_OK
        finally:
            if self.management is not None:
                with contextlib.suppress(Exception):
                    await self.management.stop()
            # Gave up on an unreachable locker: nothing to withdraw, and nobody to tell
            # that the session ends, so start_timeout is (about) how long the start took.
            unreached = self.unreached
            with contextlib.suppress(Exception):
                if not unreached:
                    await self.registry.withdraw()
            with contextlib.suppress(Exception):
                if not unreached:  # its connect to the same server may hold it for seconds
                    await self.registry.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(locker.close(), UNREACHED_CLOSE if unreached else None)
            with contextlib.suppress(Exception):
                await asyncio.to_thread(store.close)
            pidfile.remove(s.data_dir, s.name)
            log.info("node %s: stopped", s.name)

    async def _start_management(self) -> bool:
        """Start the HTTP listener before the node waits as slave, so a slave serves
        health, role and metrics; False when an explicit http_bind cannot be bound."""
        try:
            self.management = ManagementServer(self)
            self.registry.http = await self.management.start()
        except OSError as exc:
            log.error("node %s: cannot listen for HTTP on %s: %s", self.settings.name,
                      self.settings.http_bind, exc.strerror or exc)
            return False
        return True

    def reload_users(self) -> None:
        """SIGHUP: re-read the users file. A bad file is refused with one line and the old
        rules stay; else new logins, groups and rules apply to the next frame, and the
        connections of logins no longer in the file are closed."""
        path = self.settings.users_file
        if not path:
            log.warning("node %s: SIGHUP: no users file to reload", self.settings.name)
            return
        try:
            new = load_users_file(path)
        except AuthError as exc:
            log.error("node %s: users file reload refused, old rules kept: %s",
                      self.settings.name, exc)
            return
        self.users_file = new
        self.auth.users = new.users
        if self.broker is not None:
            self.broker.authz = new.policy if new.policy.enabled else None
            self.broker.known_destinations.clear()
        if self.management is not None:
            self.management.access.apply(new)
        closed = 0
        if self.server is not None:
            for conn in list(self.server.connections):
                if conn.connected and not conn.closed and conn.login not in new.users:
                    conn.close_with_error("login removed", "the users file no longer has it")
                    closed += 1
        log.info("node %s: users file reloaded: %d logins, %d authorization entries, "
                 "%d connection(s) of removed logins closed", self.settings.name,
                 len(new.users), len(new.policy.entries), closed)

    def request_stop(self) -> None:
        if not self.stopping.is_set():
            log.info("node %s: stopping (signal)", self.settings.name)
            self.stopping.set()

    async def _until_stopped(self, aw: Awaitable[None]) -> bool:
        """Run ``aw`` unless a stop comes first; True when it completed."""
        task = asyncio.ensure_future(aw)
        stop = asyncio.ensure_future(self.stopping.wait())
        try:
            done, _ = await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
        if task in done:
            task.result()
            return True
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        return False

    async def _bounded(self, acquire: Awaitable[None], locker: Locker) -> None:
        """``acquire``, but a LockerError when the lock's server has not answered within
        start_timeout (waiting for a master to go is not bounded: that is a slave's job)."""
        task = asyncio.ensure_future(acquire)
        deadline = time.monotonic() + self.settings.start_timeout
        try:
            while not task.done() and not locker.reachable:
                if time.monotonic() >= deadline:
                    self.unreached = True
                    raise LockerError(
                        f"{locker.description}: unreachable after start_timeout = "
                        f"{self.settings.start_timeout:g} s")
                await asyncio.wait({task}, timeout=REACHABLE_POLL)
            await task
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    async def _open_store(self, store: Store) -> bool:
        """Open the store, waiting while it is unreachable (doubling back-off up to
        RETRY_MAX_DELAY, one line per attempt, at most start_timeout seconds); a store
        that answers no for good (StoreUnusable) ends the node at once."""
        timeout = self.settings.start_timeout
        deadline = time.monotonic() + timeout if timeout else None
        delay = RETRY_DELAY
        while not self.stopping.is_set():
            try:
                await asyncio.to_thread(store.open)
                return True
            except StoreUnusable:
                raise
            except StoreError as exc:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise StoreError(f"{exc} (still unreachable after start_timeout = "
                                     f"{timeout:g} s)") from None
                log.error("store %s unreachable: %s; retrying in %g s", store.description,
                          exc, delay)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.stopping.wait(),
                                           delay if left is None else min(delay, left))
                delay = min(delay * 2, RETRY_MAX_DELAY)
        return False

    async def _check_durability(self, store: Store) -> None:
        """A RECEIPT promises the message survives a crash; a PostgreSQL server with
        fsync = off cannot keep that promise, so it is refused unless accepted."""
        check = getattr(store, "server_fsync", None)
        if check is None or await asyncio.to_thread(check) is not False:
            return
        if not self.settings.allow_fsync_off:
            raise StoreUnusable(
                f"{store.description}: the server runs with fsync = off, so a server crash "
                "can lose RECEIPTed messages; turn fsync on, or set allow_fsync_off = true")
        warning = ("the store's server runs with fsync = off (allow_fsync_off): a server "
                   "crash can lose RECEIPTed messages")
        self.warnings.append(warning)
        log.warning("node %s: %s", self.settings.name, warning)

    # -- lock state -------------------------------------------------------------------
    def _lock_state(self, state: LockState) -> None:
        broker = self.broker
        if self.guard is not None:
            self.guard.state(state)
        if state is LockState.LOST:
            self._demote("lock lost")
        elif state is LockState.SUSPENDED and broker is not None:
            log.warning("node %s: lock connection suspended; pausing dispatch and writes",
                        self.settings.name)
            broker.pause()
        elif state is LockState.HELD and broker is not None and broker.paused:
            log.info("node %s: lock confirmed again; resuming", self.settings.name)
            broker.resume()

    def _freeze(self) -> None:
        """From a locker thread: the lock may be gone (a paused master woke up).
        Only flags: nothing is dispatched or committed until LOST demotes us."""
        broker, guard = self.broker, self.guard
        if guard is not None:
            guard.freeze()
        if broker is not None:
            broker.paused = True
            broker.writes.held = True

    def _demote(self, reason: str) -> None:
        """Mastership ends: a master demotes, an activation in progress aborts."""
        if not self.lost.is_set() and self.role is Role.MASTER:
            self.lost_reason = reason
            self.lost.set()
        elif self.guard is not None:
            self.guard.lost(reason)

    # -- master -------------------------------------------------------------------------
    async def _serve_as_master(self, store: Store, locker: Locker,
                               auth: Authenticator) -> Outcome:
        s = self.settings
        loop = asyncio.get_running_loop()
        started = time.monotonic()
        refused = await asyncio.to_thread(probe_listen, *s.bind_address)
        if refused is not None:
            # Before the claim: a node that cannot serve must not bump the epoch.
            log.error("node %s: cannot listen on %s: %s; not taking over", s.name, s.bind,
                      refused.strerror or refused)
            await locker.release()
            return Outcome.CANNOT_SERVE
        await self.replication.check("activation")  # refuses as at start, before the claim
        # A LOST that came before the guard is caught by its first proof (keepalive).
        guard = self.guard = ActivationGuard(locker, s.name, self.stopping)
        try:
            epoch, recovery = await activation.claim(store, locker, guard, s)
        except ActivationAborted as exc:
            return await self._abort_activation(locker, exc)
        except StoreError as exc:
            self.guard = None
            log.error("node %s: activation failed: %s; releasing the lock", s.name, exc)
            await locker.release()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), RETRY_DELAY)
            return Outcome.RETRY
        committer = GroupCommitter(store, epoch, loop, on_failure=self._store_failed)
        broker = Broker(s, committer, recovery, loop)
        if self.users_file is not None and self.users_file.policy.enabled:
            broker.authz = self.users_file.policy
        server = StompServer(s, broker, auth)
        if self.management is not None and self.management.url:  # ws_allowed_origins' default
            server.console_origins = console_origins(self.management.url,
                                                     self.management.hosts.names)
        broker.pause()  # nothing dispatched or committed until the last check below
        try:
            await limits.load(broker)  # bounded queues' ledgers, before any SEND
        except StoreError as exc:
            log.warning("node %s: bounded queues count from empty: reading them failed: %s",
                        s.name, exc)
        try:
            await guard.pass_gate("listen")
            await guard.confirm("before listening")
        except ActivationAborted as exc:
            committer.close()
            return await self._abort_activation(locker, exc)
        try:
            await server.start()
        except OSError as exc:
            self.guard = None
            log.error("node %s: cannot listen on %s: %s", s.name,
                      getattr(exc, "listener", s.bind), exc.strerror)
            committer.close()
            await locker.release()
            return Outcome.CANNOT_SERVE
        try:
            guard.check("after opening the listener")
        except ActivationAborted as exc:
            server.stop_accepting()
            server.close_all("broker lost mastership; fail over")
            committer.close()
            return await self._abort_activation(locker, exc)
        # No await from the last check to here: a LOST from now on demotes a master.
        self.guard = None
        broker.resume()
        self.broker, self.server, self.role = broker, server, Role.MASTER
        self.takeovers += 1
        self.master_since = time.time()
        if self.management is not None:
            broker.writes.observer = self.management.observer()
        log.info(
            "node %s: master of group %s (epoch %d), serving stomp on %s "
            "(activated in %.0f ms; %d destinations, %d durable subscriptions)",
            s.name, s.group, epoch, s.advertise, (time.monotonic() - started) * 1000,
            len(recovery.destinations), len(recovery.subscriptions),
        )
        await self.registry.announce(Role.MASTER, epoch)
        background = [
            asyncio.ensure_future(self._keepalive(locker)),
            asyncio.ensure_future(self._check_integrity(epoch)),
            asyncio.ensure_future(self._housekeeping(committer, store, epoch)),
            asyncio.ensure_future(vacuum.every_interval(store)),
            asyncio.ensure_future(self.replication.watch(committer, self._demote)),
        ]
        if s.update_cluster_clients:
            background.append(asyncio.ensure_future(self._cluster_updates(server)))
        if s.gc_inactive_destinations:
            background.append(asyncio.ensure_future(
                inactive.collect(broker, s.gc_inactive_destinations)))
        stop = asyncio.ensure_future(self.stopping.wait())
        lost = asyncio.ensure_future(self.lost.wait())
        try:
            await asyncio.wait({stop, lost}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            lost.cancel()
            for task in background:
                task.cancel()
        self.broker, self.server = None, None
        if self.lost.is_set():
            self.role = Role.DEMOTED
            log.error("node %s: DEMOTED (%s): closing every client, writing nothing more",
                      s.name, self.lost_reason)
            await self.registry.announce(Role.SLAVE, None)
            server.stop_accepting()
            broker.pause()
            server.close_all("broker lost mastership; fail over")
            committer.close()
            with contextlib.suppress(Exception):
                await locker.release()
            return Outcome.LOST
        # Graceful stop: finish what is in flight, then let a slave in at once.
        self.role = Role.STOPPING
        server.stop_accepting()
        server.pause_reading()
        broker.writes.flush()
        try:
            await asyncio.wait_for(committer.drain(), GRACEFUL_DRAIN_TIMEOUT)
            await committer.call(store.end_activation, epoch)
        except (TimeoutError, StoreError) as exc:
            log.warning("node %s: could not finish in-flight commits: %s", s.name, exc)
        server.close_all("broker shutting down; fail over")
        committer.close()
        await locker.release()
        await server.wait_closed()
        log.info("node %s: released the lock of group %s", s.name, s.group)
        return Outcome.STOPPED

    async def _abort_activation(self, locker: Locker, exc: ActivationAborted) -> Outcome:
        """The lock went while activating: serve nothing, release, end the term as a
        lost lock does (exit 3, or slave again with --rejoin)."""
        self.guard = None
        log.error("node %s: lock lost while activating (%s): not serving", self.settings.name,
                  exc)
        with contextlib.suppress(Exception):
            await locker.release()
        return Outcome.LOST

    async def _still_master(self, locker: Locker) -> bool:
        """For the registry: may this node (still) call itself master?"""
        if self.role is not Role.MASTER or self.lost.is_set():
            return False
        try:
            await locker.keepalive()
        except (LockLost, LockerError) as exc:
            self._demote(f"lock keepalive failed: {exc}")
            return False
        return not self.lost.is_set()

    def _store_failed(self, exc: BaseException) -> None:
        """Demote: the store is gone or we are fenced. A refused write is
        neither (the committer never reports one here; this is the guard)."""
        if isinstance(exc, StoreRejected):
            log.warning("node %s: the store refused a write: %s", self.settings.name, exc)
            return
        if not self.lost.is_set():  # one failure reaches us from several callers
            self.store_errors += 1
            log.error("node %s: store write failed: %s", self.settings.name, exc)
        self._demote(f"store: {exc}")

    async def _keepalive(self, locker: Locker) -> None:
        while True:
            await asyncio.sleep(self.settings.lock_keepalive)
            try:
                await locker.keepalive()
            except (LockLost, LockerError) as exc:
                self._demote(f"lock keepalive failed: {exc}")
                return

    async def _check_integrity(self, epoch: int) -> None:
        """HornetQ-style journal comparison, off the activation path: it counts
        every row, so it runs on its own connection and never delays a commit."""
        s = self.settings
        checker = open_store(s.store, s.group)
        try:
            await asyncio.to_thread(checker.open)
            result = await asyncio.to_thread(checker.check_integrity, epoch)
        except StoreError as exc:
            log.warning("integrity check failed to run: %s", exc)
            return
        finally:
            await asyncio.to_thread(checker.close)
        if result.mismatch:
            log.warning(
                "INTEGRITY MISMATCH in group %s: the previous master committed %d messages "
                "(max id %d) but the store holds %d (max id %d)", s.group,
                result.expected_count, result.expected_max_id, result.actual_count,
                result.actual_max_id,
            )
        else:
            log.info("integrity check ok: %d messages, max id %d", result.actual_count,
                     result.actual_max_id)

    async def _cluster_updates(self, server: StompServer) -> None:
        """Tell connected clients the group's URIs when brokers join (and leave,
        with update_cluster_clients_on_remove): ActiveMQ's updateClusterClients."""
        s = self.settings
        url = registry_url(s)
        name_filter = re.compile(s.update_cluster_filter) if s.update_cluster_filter else None
        known: list[str] = list(server.cluster_uris)
        while True:
            try:
                members = await asyncio.to_thread(read_members, url, s.group)
            except RegistryError as exc:
                log.debug("cluster update: registry unreadable: %s", exc)
                members = []
            others = [
                uri for m in sorted(members, key=lambda m: m.name)
                if m.name != s.name and (name_filter is None or name_filter.search(m.name))
                for uri in m.services
            ]
            own = s.advertise_uris
            uris = [*own, *dict.fromkeys(u for u in others if u not in own)]
            ws_uris = [*s.websocket_uris, *dict.fromkeys(
                u for m in sorted(members, key=lambda m: m.name) if m.name != s.name
                for u in m.websocket if u not in s.websocket_uris)]
            if (uris, ws_uris) != (known, server.ws_cluster_uris):
                was = {*known, *server.ws_cluster_uris}
                added, removed = {*uris, *ws_uris} - was, was - {*uris, *ws_uris}
                push = bool(added) or (bool(removed) and s.update_cluster_clients_on_remove)
                server.set_cluster_uris(uris, push, ws_uris)
                log.info("cluster URIs now %s%s", ",".join(uris), " (pushed)" if push else "")
                known = uris
            await asyncio.sleep(CLUSTER_POLL_INTERVAL)

    async def _housekeeping(self, committer: GroupCommitter, store: Store,
                           epoch: int) -> None:
        """Reap expired messages and forget dedup keys past the window."""
        s = self.settings
        while True:
            await asyncio.sleep(s.housekeeping_interval)
            if self.broker is None or self.broker.paused:
                continue
            now = int(time.time() * 1000)
            try:
                reaped = await committer.call(store.reap_expired_counted, epoch, now,
                                              REAP_BATCH)
                if reaped and self.broker is not None:
                    self.broker.reaped(reaped)
                await committer.call(store.prune_dedup, epoch, now - int(s.dedup_window * 1000),
                                     PRUNE_BATCH)
            except StoreRejected as exc:  # not a lost store: try again next time
                log.warning("housekeeping: the store refused it: %s", exc)
            except StoreError as exc:
                self._store_failed(exc)
                return


#: The cyclic garbage collector's thresholds for a node. CPython's (700, 10, 10) run a
#: young collection every 700 container allocations: a few persistent messages' worth,
#: and each one walks everything young. W1 spent ~4 µs of ~40 per message in the loop
#: on it (bench/README.md). 10,000 collects the same garbage (little: the hot path makes
#: no cycles) fifteen times less often, holding at most a few MB more until it does.
GC_THRESHOLDS = (10_000, 20, 20)


def tune_gc() -> None:
    """Collect less often, and never walk what startup made (modules, settings: it
    lives as long as the process) in a full collection again."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def run_node(settings: Settings) -> int:
    """Run a node until it stops; returns the process exit code."""
    tune_gc()
    tune_malloc()
    try:
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        runner = asyncio.Runner()
    with runner:
        return runner.run(Node(settings).run())
