"""The group registry: who is in each group, in which role, reachable where.

Every broker, master or slave, announces itself (group, name, role, client
URIs, host, pid, epoch) so that ``amqlite cluster-list``, ``amqlite container
list`` and ``discovery:`` URIs can show or find a group's master without
asking the brokers. Two backends, chosen like the locker:

* ZooKeeper (``--locker zk://...``): an ephemeral znode
  ``/<root>/groups/<group>/members/<name>`` holding JSON. It vanishes with the
  broker's session, so a crashed broker leaves the registry after one session
  timeout, the same bound as its lock.
* the store otherwise (``amq_registry``): a heartbeat row per broker; a row
  whose heartbeat is older than ``STORE_MAX_AGE_MS`` counts as gone.

A master entry carries the epoch it claimed in the store. Epochs only grow, so
when a deposed master has not withdrawn yet (it is paused, or crashed and its
row or znode has not expired), readers still know which of two "masters" is
the real one: the higher epoch. ``GroupView.masters`` lists it first.

Announcing never blocks and never raises: the node sets what it wants the
registry to say, and a background task writes it, retries and heartbeats. A
registry that is down must not stop a broker from serving (it is a view for
operators and clients, not part of the election).
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import enum
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from amqlite.settings import Settings
from lockers.connections.blocking import run_blocking
from lockers.connections.errors import one_line
from lockers.connections.zookeeper import (
    ZkTarget,
    ZkUrlError,
    is_zk_url,
    new_zk_client,
    parse_zk_url,
    stop_zk_client,
)

log = logging.getLogger("amqlite.registry")


class Role(enum.StrEnum):
    """A node's role (amqlite.node). A registry entry carries MASTER or SLAVE, stored
    as the plain strings "master" and "slave" (readers, old and new, compare those);
    the other roles are the node's own moments between the two."""

    STARTING = "starting"
    SLAVE = "slave"
    MASTER = "master"
    DEMOTED = "demoted"  # lost mastership, closing everything
    STOPPING = "stopping"  # graceful stop as master


#: The roles a registry entry may carry.
ROLES = (Role.MASTER, Role.SLAVE)

#: Store registry heartbeat period (s). Role changes are written at once (they
#: do not wait for a heartbeat); the heartbeat only proves liveness. 0.5 s is
#: two short upserts a second per broker: nothing for PostgreSQL and a small
#: share of SQLite's write lock next to a master's group commits.
STORE_HEARTBEAT_INTERVAL = 0.5
#: Store registry rows older than this are gone (ms): four heartbeat periods,
#: so three late heartbeats in a row (a busy SQLite write lock, a GC pause, a
#: loaded machine) do not make a live broker vanish, while a crashed broker
#: leaves the view within 2 s. Assumes broker and reader clocks agree to well
#: under a second (NTP), as heartbeats carry the writer's clock.
STORE_MAX_AGE_MS = 2_000
#: ZooKeeper registry: how often a broker checks that its znode still exists
#: and is up to date (s). The znode lives as long as the session; the check
#: only repairs it after a session was lost (kazoo makes a new session, our
#: ephemeral node is gone) or deleted by hand. One ``exists`` per second.
ZK_CHECK_INTERVAL = 1.0
#: After losing its ZooKeeper session, a node that still thinks it is master
#: waits this long before writing its master entry under the new session (s).
#: A lost session nearly always means the lock was lost too: the locker's LOST
#: comes at the same moment and the node demotes within milliseconds. Without
#: the wait, a deposed master (SIGSTOP past the session timeout, then SIGCONT)
#: would put a stale master entry back for a moment.
ZK_MASTER_REANNOUNCE_GRACE = 1.0
#: Retry delay after a command failed because our session expired (s): kazoo
#: is making a new session, which takes one round trip.
ZK_SESSION_RETRY = 0.1
#: How long a registry write or a reader waits for a first ZooKeeper connection (s).
ZK_CONNECT_TIMEOUT = 5.0
#: How long ``withdraw()`` waits for the entry to be removed on a graceful stop
#: (s). Bounded so that a dead registry cannot hold up a stopping broker; the
#: entry then expires on its own (max age or session timeout).
WITHDRAW_TIMEOUT = 3.0
#: How long ``close()`` waits for the ZooKeeper session to be closed (s).
CLOSE_TIMEOUT = 3.0

#: Service URIs with these schemes are a node's management API, not a client URI.
HTTP_SCHEMES = ("http://", "https://")


class RegistryError(Exception):
    """The registry cannot be read (bad URL, unreachable); one line for the CLI."""


class _Deferred(Exception):
    """Not now: apply the wanted entry again after ``delay`` seconds."""

    def __init__(self, delay: float) -> None:
        super().__init__(f"deferred {delay:g}s")
        self.delay = delay


@dataclass(frozen=True)
class Member:
    """One broker's registry entry."""

    group: str
    name: str
    role: str
    services: tuple[str, ...]
    host: str | None = None
    pid: int | None = None
    epoch: int | None = None
    #: The node's management API (``http://host:port``), None when it has none.
    http: str | None = None
    #: Last heartbeat (ms since the Unix epoch), store registry only.
    heartbeat_at: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"group": self.group, "name": self.name, "role": self.role,
                "services": list(self.services), "host": self.host, "pid": self.pid,
                "epoch": self.epoch, "http": self.http, "heartbeat_at": self.heartbeat_at}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Member:
        services = data.get("services") or ()
        if isinstance(services, str):
            services = [s for s in services.split(",") if s]
        pid, epoch = data.get("pid"), data.get("epoch")
        # The store registry has one services column: an http(s):// entry in it is the
        # management URL (kept out of the client URIs); ZooKeeper entries carry "http".
        http = data.get("http")
        uris = []
        for uri in (str(s) for s in services):
            if uri.startswith(HTTP_SCHEMES):
                http = http or uri
            else:
                uris.append(uri)
        heartbeat = data.get("heartbeat_at")
        return cls(
            group=str(data["group"]), name=str(data["name"]), role=str(data["role"]),
            services=tuple(uris),
            host=None if data.get("host") is None else str(data["host"]),
            pid=None if pid is None else int(pid),
            epoch=None if epoch is None else int(epoch),
            http=None if http is None else str(http),
            heartbeat_at=None if heartbeat is None else int(heartbeat),
        )


#: A store registry entry whose heartbeat is older than this is shown as stale, not in
#: its role (ms): six heartbeat periods. A heartbeat or two late is common on a loaded
#: machine (a 2-core CI box running PostgreSQL and several brokers) and a live master
#: must not flicker; a crashed master nobody took over from is then no longer listed as
#: master after 3 s, before its row expires at ``STORE_MAX_AGE_MS``; one somebody took
#: over from is stale at once (superseded by a higher epoch).
STALE_AFTER_MS = 6 * int(STORE_HEARTBEAT_INTERVAL * 1000)


@dataclass(frozen=True)
class GroupView:
    """One group of one registry as ``cluster-list`` shows it (Fabric's cluster row).

    ``masters``: the live master announcing the highest epoch (more than one only
    when two live masters announce the same epoch, which fencing rules out).
    ``stale``: entries not to be trusted in their role: a master superseded by a
    higher epoch (a deposed or crashed master not gone from the registry yet) or a
    store entry whose heartbeat is late (``STALE_AFTER_MS``).
    ``services``: the client URIs of the real master.
    ``registry``: where the entries were read (password masked); two groups of
    one name in two stores are two views.
    """

    group: str
    masters: list[str]
    slaves: list[str]
    services: list[str]
    members: list[Member] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)
    registry: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"cluster": self.group, "registry": self.registry, "masters": self.masters,
                "slaves": self.slaves, "stale": self.stale, "services": self.services,
                "members": [m.to_json() for m in self.members]}


def master_order(m: Member) -> tuple[int, str]:
    """Sort key of master entries: highest epoch first, then by name."""
    return (-(m.epoch if m.epoch is not None else -1), m.name)


def heartbeat_stale(m: Member, now_ms: int) -> bool:
    """True if ``m`` has a heartbeat (store registry) older than ``STALE_AFTER_MS``."""
    return m.heartbeat_at is not None and now_ms - m.heartbeat_at > STALE_AFTER_MS


def _sort_out(entries: list[Member], now_ms: int) -> tuple[list[Member], list[Member], set[str]]:
    """One group's entries as (masters, live slaves, stale names): the one rule for who
    is master (see ``GroupView``), used by every reader of the registry."""
    live: list[Member] = []
    stale: set[str] = set()
    for m in entries:
        if heartbeat_stale(m, now_ms):
            stale.add(m.name)
        else:
            live.append(m)
    masters = sorted((m for m in live if m.role == Role.MASTER), key=master_order)
    if masters:
        top = masters[0].epoch
        stale |= {m.name for m in masters if m.epoch != top}
        masters = [m for m in masters if m.epoch == top]
    slaves = [m for m in live if m.role != Role.MASTER and m.name not in stale]
    return masters, slaves, stale


def _now_ms(now_ms: int | None) -> int:
    return int(time.time() * 1000) if now_ms is None else now_ms


def current_master(members: Iterable[Member], now_ms: int | None = None) -> Member | None:
    """The real master among one group's entries (the first of ``GroupView.masters``),
    None when no live master announces itself. ``cluster-list``, the management API and
    the management CLI all ask this, so a stale entry is never anybody's master."""
    masters = _sort_out(list(members), _now_ms(now_ms))[0]
    return masters[0] if masters else None


def group_views(members: Iterable[Member], registry: str = "",
                now_ms: int | None = None) -> list[GroupView]:
    """Fold the entries of one registry into one view per group, sorted by group
    name; stale entries (see ``GroupView``) are set apart, never listed as master."""
    now = _now_ms(now_ms)
    by_group: dict[str, list[Member]] = {}
    for m in members:
        by_group.setdefault(m.group, []).append(m)
    views = []
    for group in sorted(by_group):
        entries = by_group[group]
        masters, slaves, stale = _sort_out(entries, now)
        services = list(masters[0].services) if masters else []
        views.append(GroupView(group, [m.name for m in masters], sorted(m.name for m in slaves),
                               services, sorted(entries, key=lambda m: m.name), sorted(stale),
                               registry))
    return views


def display_url(url: str) -> str:
    """A registry URL as the user should see it: a store URL normalised (absolute
    SQLite path, no driver suffix) with its password masked; a zk:// URL as given.
    Two spellings of one store give one string."""
    if is_zk_url(url):
        return url
    from store import StoreError, parse_store_url
    from store.url import describe

    try:
        parsed = parse_store_url(url)
    except StoreError:
        return url
    return describe(parsed.url.set(drivername=parsed.dialect))


# --------------------------------------------------------------------------- URLs


def zk_target(url: str) -> ZkTarget:
    """Hosts and root of a zk:// registry URL; raises ``RegistryError``."""
    try:
        return parse_zk_url(url)
    except ZkUrlError as e:
        raise RegistryError(f"zk:// URL: {e}") from None


def registry_url(settings: Settings) -> str:
    """Where a node with these settings registers: its zk:// locker, else its store."""
    return settings.locker if is_zk_url(settings.locker) else settings.store


# --------------------------------------------------------------------------- writers


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


class _BackgroundRegistry(Registry):
    """A worker task applies the latest wanted state (an entry, or none) and
    re-applies it every ``period`` (heartbeat or check); the node only sets
    what it wants. One write at a time, always the newest wish, so an old
    "master" can never land after a newer "slave"."""

    period: float = 1.0

    def __init__(self, settings: Settings) -> None:
        self.group = settings.group
        self.name = settings.name
        self.services: tuple[str, ...] = tuple(settings.advertise_uris)
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
                              self.pid, epoch if role is Role.MASTER else None, self.http)
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
        except _Deferred as d:
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


class StoreRegistry(_BackgroundRegistry):
    """Heartbeat rows in the store's ``amq_registry`` table."""

    period = STORE_HEARTBEAT_INTERVAL

    def __init__(self, settings: Settings, store: Any | None = None) -> None:
        super().__init__(settings)
        from store import open_store

        self._own_store = store is None
        self.store = open_store(settings.store, settings.group) if store is None else store
        self.description = f"registry in {self.store.description}"
        self._opened = not self._own_store

    async def _apply(self, wanted: Member | None) -> None:
        await asyncio.to_thread(self._apply_blocking, wanted)

    def _apply_blocking(self, wanted: Member | None) -> None:
        if not self._opened:
            self.store.open()
            self._opened = True
        if wanted is None:
            self.store.unregister(self.name)
        else:
            services = list(wanted.services) + ([wanted.http] if wanted.http else [])
            self.store.register(self.name, wanted.role, services, wanted.host,
                                wanted.pid, wanted.epoch)

    async def _close_backend(self) -> None:
        if self._own_store:
            await asyncio.to_thread(self.store.close)


class ZooKeeperRegistry(_BackgroundRegistry):
    """An ephemeral znode per broker, on a kazoo client of its own (the
    locker drops and replaces its client on every loss; sharing it would
    tie the registry's lifetime to the lock's)."""

    period = ZK_CHECK_INTERVAL

    def __init__(self, settings: Settings, hosts: str, root: str) -> None:
        super().__init__(settings)
        self.hosts, self.root = hosts, root
        self.path = f"{root}/groups/{self.group}/members/{self.name}"
        self.session_timeout = settings.zk_session_timeout
        self.description = f"registry zk://{hosts}{root}"
        self._client: Any = None
        self._client_lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        #: (session id, data) of the last write: skips rewriting an unchanged node.
        self._written: tuple[int, bytes] | None = None
        #: Session under which we last wrote a master entry; a master entry under
        #: another session waits ZK_MASTER_REANNOUNCE_GRACE (kazoo's thread only).
        self._master_session: int | None = None
        self._pending: tuple[int, float] | None = None  # (new session, since when)

    async def _apply(self, wanted: Member | None) -> None:
        if (
            wanted is not None
            and wanted.role == Role.MASTER
            and self.confirm_master is not None
            and not await self.confirm_master()
        ):
            raise _Deferred(ZK_SESSION_RETRY)  # demoting: the node will announce slave
        self._loop = asyncio.get_running_loop()
        await run_blocking(lambda: self._apply_blocking(wanted), name="amqlite-zk-registry")

    def _ensure_client(self) -> Any:
        with self._client_lock:
            if self._client is not None:
                return self._client
            if self._closed:
                raise RegistryError("closed")
            client = new_zk_client(self.hosts, self.session_timeout, ignore_expire=False)
            client.add_listener(self._on_state)
            try:
                client.start(timeout=ZK_CONNECT_TIMEOUT)
            except Exception as e:
                stop_zk_client(client)
                raise RegistryError(f"cannot connect to ZooKeeper {self.hosts}: {e}") from None
            self._client = client
            return client

    def _on_state(self, state: Any) -> None:
        """kazoo's thread: never block; a reconnect wakes the worker to repair."""
        from kazoo.protocol.states import KazooState

        loop = self._loop
        if loop is not None and state == KazooState.CONNECTED:
            with contextlib.suppress(RuntimeError):  # the loop is gone
                loop.call_soon_threadsafe(self._kick_if_running)

    def _kick_if_running(self) -> None:
        if self._task is not None and self._wake is not None and not self._closed:
            self._wake.set()

    def _may_write_master(self, session: int) -> None:
        """Raise ``_Deferred`` while a master entry must wait for its grace."""
        if self._master_session is None or self._master_session == session:
            return
        now = time.monotonic()
        if self._pending is None or self._pending[0] != session:
            self._pending = (session, now)
        waited = now - self._pending[1]
        if waited < ZK_MASTER_REANNOUNCE_GRACE:
            raise _Deferred(ZK_MASTER_REANNOUNCE_GRACE - waited)

    def _apply_blocking(self, wanted: Member | None) -> None:
        from kazoo.exceptions import NodeExistsError, NoNodeError, SessionExpiredError

        client = self._ensure_client()
        try:
            stat = client.exists(self.path)
        except SessionExpiredError:
            self._written = None
            raise _Deferred(ZK_SESSION_RETRY) from None
        cid = client.client_id  # read after the command: the session it ran in
        session = cid[0] if cid else None
        if session is None:
            raise _Deferred(ZK_SESSION_RETRY)
        ours = stat is not None and stat.ephemeralOwner == session
        if wanted is None or wanted.role != Role.MASTER:
            self._master_session = None
        if wanted is None:
            if ours:
                with contextlib.suppress(NoNodeError):
                    client.delete(self.path)
            self._written = None
            return
        data = json.dumps(wanted.to_json(), sort_keys=True).encode()
        if ours and self._written == (session, data):
            return
        if wanted.role == Role.MASTER:
            self._may_write_master(session)
        if stat is not None and not ours:
            # An older incarnation of this name (a crash: its session has not
            # expired yet) or, wrongly, a second live broker with our name.
            log.warning("%s: replacing %s, left by another session", self.description,
                        self.path)
            with contextlib.suppress(NoNodeError):
                client.delete(self.path, version=stat.version)
            stat = None
        if stat is None:
            try:
                client.create(self.path, data, ephemeral=True, makepath=True)
            except NodeExistsError:
                raise _Deferred(ZK_SESSION_RETRY) from None  # raced: look again
        else:
            client.set(self.path, data, version=stat.version)
        self._written = (session, data)
        if wanted.role == Role.MASTER:
            self._master_session, self._pending = session, None

    async def _close_backend(self) -> None:
        with self._client_lock:
            client, self._client = self._client, None
        if client is not None:
            # Closing the session removes the ephemeral node at once.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(run_blocking(lambda: stop_zk_client(client)), CLOSE_TIMEOUT)


def open_registry(settings: Settings, store: Any | None = None) -> Registry:
    """The registry for a node: ZooKeeper when its locker is zk://, else its store
    (``store``: the node's own, already open, to share its connection pool).
    Never raises: a registry that cannot be set up is logged and skipped."""
    try:
        if is_zk_url(settings.locker):
            target = zk_target(settings.locker)
            return ZooKeeperRegistry(settings, target.hosts, target.root)
        return StoreRegistry(settings, store)
    except Exception as e:
        log.error("no registry for node %s: %s", settings.name, one_line(e))
        return NullRegistry()


# --------------------------------------------------------------------------- readers


def _read_zk(url: str, group: str | None) -> list[Member]:
    from kazoo.exceptions import KazooException, NoNodeError

    target = zk_target(url)
    hosts, root = target.hosts, target.root
    client = new_zk_client(hosts, ZK_CONNECT_TIMEOUT * 2)
    try:
        client.start(timeout=ZK_CONNECT_TIMEOUT)
    except Exception as e:
        stop_zk_client(client)
        raise RegistryError(f"cannot connect to ZooKeeper {hosts}: {e}") from None
    members: list[Member] = []
    try:
        if group is not None:
            groups = [group]
        else:
            try:
                groups = client.get_children(f"{root}/groups")
            except NoNodeError:
                groups = []
        for g in groups:
            base = f"{root}/groups/{g}/members"
            try:
                names = client.get_children(base)
            except NoNodeError:
                continue
            for name in names:
                try:
                    raw, _ = client.get(f"{base}/{name}")
                    members.append(Member.from_json(json.loads(raw)))
                except NoNodeError:
                    continue  # left while we read
                except (ValueError, KeyError, TypeError):
                    log.warning("ignoring a malformed registry entry %s/%s", base, name)
    except KazooException as e:
        raise RegistryError(f"reading the registry in ZooKeeper {hosts} failed: {e!r}") from None
    finally:
        stop_zk_client(client)
    return members


def _read_store(url: str, group: str | None) -> list[Member]:
    from store import StoreError, read_registry

    try:
        rows = read_registry(url, group, max_age_ms=STORE_MAX_AGE_MS)
    except StoreError as e:
        raise RegistryError(str(e)) from None
    members = []
    for row in rows:
        members.append(Member.from_json({**row, "group": row["grp"]}))
    return members


def read_members(url: str, group: str | None = None) -> list[Member]:
    """Every live registry entry at ``url`` (a zk:// URL or a store URL), of
    one group or all. Blocking; raises ``RegistryError``."""
    if is_zk_url(url):
        return _read_zk(url, group)
    return _read_store(url, group)


def read_cluster(url: str, group: str | None = None) -> list[GroupView]:
    """One ``GroupView`` per group registered at ``url``; blocking; raises
    ``RegistryError``."""
    return group_views(read_members(url, group), display_url(url))


def poll_cluster(predicate: Callable[[list[GroupView]], bool], url: str, group: str | None,
                 timeout: float, interval: float = 0.1) -> list[GroupView] | None:
    """Poll ``read_cluster`` until ``predicate(views)`` holds; the views, or None
    at the deadline. For the CLI's start/stop and for tests."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            views = read_cluster(url, group)
        except RegistryError:
            views = None
        if views is not None and predicate(views):
            return views
        if time.monotonic() >= deadline:
            return None
        time.sleep(interval)
