"""The ZooKeeper registry: an ephemeral znode ``/<root>/groups/<group>/members/<name>``
holding JSON, gone with the broker's session (``amqlite.registry``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from typing import Any

from amqlite.registry.model import Member, RegistryError, Role, zk_target
from amqlite.registry.writer import BackgroundRegistry, Deferred
from amqlite.settings import Settings
from lockers.connections.blocking import run_blocking
from lockers.connections.zookeeper import new_zk_client, stop_zk_client

log = logging.getLogger("amqlite.registry")

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
#: How long ``close()`` waits for the ZooKeeper session to be closed (s).
CLOSE_TIMEOUT = 3.0


class ZooKeeperRegistry(BackgroundRegistry):
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
            raise Deferred(ZK_SESSION_RETRY)  # demoting: the node will announce slave
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
        """Raise ``Deferred`` while a master entry must wait for its grace."""
        if self._master_session is None or self._master_session == session:
            return
        now = time.monotonic()
        if self._pending is None or self._pending[0] != session:
            self._pending = (session, now)
        waited = now - self._pending[1]
        if waited < ZK_MASTER_REANNOUNCE_GRACE:
            raise Deferred(ZK_MASTER_REANNOUNCE_GRACE - waited)

    def _apply_blocking(self, wanted: Member | None) -> None:
        from kazoo.exceptions import NodeExistsError, NoNodeError, SessionExpiredError

        client = self._ensure_client()
        try:
            stat = client.exists(self.path)
        except SessionExpiredError:
            self._written = None
            raise Deferred(ZK_SESSION_RETRY) from None
        cid = client.client_id  # read after the command: the session it ran in
        session = cid[0] if cid else None
        if session is None:
            raise Deferred(ZK_SESSION_RETRY)
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
                raise Deferred(ZK_SESSION_RETRY) from None  # raced: look again
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


def read_zk(url: str, group: str | None) -> list[Member]:
    """The entries under a zk:// registry URL, of one group or all (``read_members``)."""
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
