"""ZooKeeper lock: kazoo's ``Lock`` recipe (ephemeral sequential nodes).

kazoo's ``Lock`` never tells you it was lost, so this module watches the
session itself and turns kazoo's connection states into ours:

* SUSPENDED (connection in doubt) -> SUSPENDED: the node pauses writes;
* CONNECTED again with the *same* session and our node still there -> HELD;
* LOST (session expired or closed), a new session, our node gone, or
  SUSPENDED for longer than the session timeout -> LOST: demote.

The last rule is Curator's: a client cut off from the ensemble never hears
that its session expired, but after one session timeout without the server
it must assume it did (the rest of the ensemble has already given the lock
to someone else).

kazoo calls listeners on its own threads and they must not block, so every
callback only hands the event to the event loop (``call_soon_threadsafe``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import CancelledError as KazooCancelledError
from kazoo.exceptions import (
    ConnectionLoss,
    KazooException,
    LockTimeout,
    NoNodeError,
    SessionExpiredError,
)
from kazoo.protocol.states import KazooState, ZnodeStat
from kazoo.recipe.lock import Lock
from kazoo.retry import ForceRetryError, KazooRetry
from kazoo.retry import InterruptedError as KazooInterruptedError

from lockers.base import (
    DEFAULT_KEEPALIVE_INTERVAL,
    DEFAULT_POLL_INTERVAL,
    Locker,
    LockerError,
    LockLost,
    LockState,
    RetryBackoff,
)
from lockers.connections.blocking import collect_outcome, run_blocking
from lockers.connections.zookeeper import (
    ZK_DEFAULT_ROOT,
    ZK_RETRY_MAX_DELAY,
    new_zk_client,
    stop_zk_client,
)

__all__ = ["ZK_DEFAULT_ROOT", "ZK_SESSION_TIMEOUT", "ZooKeeperLocker"]

log = logging.getLogger(__name__)

#: Default session timeout, seconds. A crashed or paused (SIGSTOP, frozen VM)
#: master keeps its ephemeral node, and so the lock, for this long: it is the
#: failover time after a crash or a pause (a graceful stop deletes the node at
#: once). Issue 12 wants a paused master taken over within 5 s: 4 s is the least
#: a stock server grants (2x-20x its 2 s tickTime = 4-40 s), and as long as the
#: PostgreSQL locker's lease plus its slave's check. kazoo pings every third of
#: it from its own thread, so a busy event loop cannot expire it. Artemis uses
#: 18 s, kazoo 10 s: raise it where ZooKeeper leader elections take longer.
ZK_SESSION_TIMEOUT = 4.0

#: How long ``try_acquire``/``acquire`` wait for a first connection, seconds.
ZK_CONNECT_TIMEOUT = 10.0

#: Longest single kazoo ``Lock.acquire`` of a contender, seconds. kazoo's
#: recipe looks at ``cancel()`` only while connected: during an outage it sits
#: in its own retry backoff (sleeps of up to 60 s), and a dropped session ends
#: it only at its next attempt. A slice bounds that; between slices our own
#: retry (cap ZK_RETRY_MAX_DELAY, interrupted by cancel) takes over. The price:
#: a slave still queued when its slice ends gives its node up and queues again
#: at once (kazoo deletes the node on a timeout) -- one delete and one create
#: per waiting slave every 5 s, nothing for ZooKeeper; which slave is next in
#: line does not matter. 5 s: a cancelled wait's thread ends within it.
ZK_WAIT_SLICE = 5.0

#: How long a cancelled acquire waits for kazoo's thread to clean up before it
#: drops the session (which removes the contender node with it), seconds.
ZK_CANCEL_GRACE = 2.0

#: Reconnect backoff of a waiting slave whose client could not start.
ZK_RECONNECT_INITIAL = 0.1
ZK_RECONNECT_MAX = 2.0


class _DropSession(Exception):
    """A node of ours may be left on the server: end the session to remove it."""


class _Contention:
    """One try for the lock, composed of kazoo's public API: its ``Lock``
    recipe, called in bounded slices (``ZK_WAIT_SLICE``) under a
    ``KazooRetry`` that ``cancel()`` interrupts.

    The stock recipe alone retries forever with up to 60 s sleeps while the
    connection is down and looks at ``cancel()`` only once connected. kazoo
    also clears ``Lock.cancelled`` when an attempt fails, so we keep our own flag.
    """

    def __init__(self, client: KazooClient, path: str, identifier: str) -> None:
        self.lock = Lock(client, path, identifier)
        self.cancelled = False
        self._retry = KazooRetry(
            max_tries=-1,
            max_delay=ZK_RETRY_MAX_DELAY,
            sleep_func=client.handler.sleep_func,
            interrupt=lambda: self.cancelled,
        )

    def cancel(self) -> None:
        """Any thread: end the wait (at once while connected, else within a slice)."""
        self.cancelled = True
        self.lock.cancel()

    def acquire(self, blocking: bool) -> bool:
        """kazoo's thread: True once granted; False when someone else holds it
        (``blocking=False``) or on cancel. Other kazoo errors are raised."""
        try:
            while not self.cancelled:
                if self._retry(self._attempt, blocking):
                    return True
                if not blocking:
                    return False
        except (KazooCancelledError, KazooInterruptedError):
            pass
        return False

    def _attempt(self, blocking: bool) -> bool:
        """One bounded kazoo acquire: True granted; False held by another (after
        waiting out a slice when ``blocking``); ``ForceRetryError`` when
        ZooKeeper did not answer within it, so our retry backs off and retries.
        ``blocking=False`` is a zero-length wait, so it too is bounded."""
        if self.cancelled:  # the retry looks at its interrupt only while it sleeps
            raise KazooCancelledError()
        try:
            got = self.lock.acquire(blocking=True, timeout=ZK_WAIT_SLICE if blocking else 0)
        except LockTimeout:
            return False
        if not got:
            raise ForceRetryError("ZooKeeper did not answer within the slice")
        return True


@dataclass
class _Grant:
    lock: Lock
    path: str
    session_id: int
    czxid: int


class ZooKeeperLocker(Locker):
    """An ephemeral sequential node under ``/<root>/groups/<group>/lock``.

    The fencing token is the ``czxid`` of our lock node: the zxid of the
    transaction that created it, which only grows across holders.
    ``keepalive()`` raises ``LockLost`` once the lock is LOST or our node is
    gone; while SUSPENDED it proves nothing and returns (the SUSPENDED
    notification already paused the node, and LOST follows within one session
    timeout if the connection does not come back).
    """

    def __init__(
        self,
        hosts: str,
        root: str,
        group: str,
        *,
        node: str,
        session_timeout: float = ZK_SESSION_TIMEOUT,
        keepalive_interval: float = DEFAULT_KEEPALIVE_INTERVAL,
    ) -> None:
        super().__init__()
        self.hosts = hosts
        self.group = group
        self.node = node
        self.session_timeout = session_timeout
        self.keepalive_interval = keepalive_interval
        self.lock_path = f"{root.rstrip('/')}/groups/{group}/lock"
        self.description = f"zookeeper lock {self.lock_path} on {hosts}"
        self._client: KazooClient | None = None
        self._client_guard = asyncio.Lock()
        self._conn_state: KazooState | None = None
        self._grant: _Grant | None = None
        self._held = False
        self._suspended = False
        self._suspend_timer: asyncio.TimerHandle | None = None
        self._verifying: asyncio.Task[None] | None = None
        self._background: set[asyncio.Future[Any]] = set()
        self._closed = False

    # -- the client and its session -------------------------------------------
    def _new_client(self) -> KazooClient:
        client = new_zk_client(self.hosts, self.session_timeout)
        loop = asyncio.get_running_loop()

        def on_state(state: KazooState) -> None:  # kazoo's thread: hand over, never block
            cid = client.client_id
            session_id = cid[0] if cid else None
            with contextlib.suppress(RuntimeError):  # the loop is gone: nobody listens
                loop.call_soon_threadsafe(self._on_state, client, state, session_id)

        client.add_listener(on_state)
        return client

    async def _ensure_client(self) -> KazooClient:
        if self._closed:
            raise LockerError(f"{self.description}: closed")
        async with self._client_guard:
            if self._client is not None:
                return self._client
            client = self._new_client()
            started = run_blocking(
                lambda: client.start(timeout=ZK_CONNECT_TIMEOUT), name="amqlite-zk-start"
            )
            try:
                await asyncio.shield(started)
            except asyncio.CancelledError:
                # A stop during the connect (SIGTERM while ZooKeeper is down): collect
                # its outcome, so no "Future exception was never retrieved".
                started.add_done_callback(collect_outcome)
                started.add_done_callback(lambda _: self._stop_client(client))
                raise
            except Exception as e:  # kazoo's timeout is not a KazooException
                self._stop_client(client)
                raise LockerError(f"{self.description}: cannot connect: {e}") from None
            self._client = client
            self._conn_state = KazooState.CONNECTED
            return client

    def _stop_client(self, client: KazooClient) -> asyncio.Future[None]:
        """End the session (and with it every ephemeral node of ours) in the background."""
        if self._client is client:
            self._client = None
            self._conn_state = None

        fut = run_blocking(lambda: stop_zk_client(client), name="amqlite-zk-stop")
        self._background.add(fut)
        fut.add_done_callback(self._background.discard)
        fut.add_done_callback(collect_outcome)
        return fut

    def _on_state(self, client: KazooClient, state: KazooState, session_id: int | None) -> None:
        if client is not self._client:
            return  # a client we already dropped
        self._conn_state = state
        if not self._held or self._grant is None:
            return
        if state == KazooState.LOST:
            self._declare_lost("ZooKeeper session expired or closed")
        elif state == KazooState.SUSPENDED:
            self._enter_suspended()
        elif session_id != self._grant.session_id:
            self._declare_lost("reconnected with a new ZooKeeper session")
        elif self._suspended:
            # A check still waiting was sent on a connection that is gone (its answer
            # may never come before the suspension runs out): this connection's own
            # check replaces it.
            if self._verifying is not None and not self._verifying.done():
                self._verifying.cancel()
            log.info("%s: connection to ZooKeeper back in the same session: checking our"
                     " lock node", self.description)
            self._verifying = asyncio.ensure_future(self._verify())

    def _enter_suspended(self) -> None:
        if self._suspended:
            return
        self._suspended = True
        log.warning("%s: connection to ZooKeeper suspended: pausing", self.description)
        loop = asyncio.get_running_loop()
        self._suspend_timer = loop.call_later(self.session_timeout, self._suspend_expired)
        self._notify(LockState.SUSPENDED)

    def _suspend_expired(self) -> None:
        if self._held and self._suspended:
            self._declare_lost(
                f"no ZooKeeper for the whole session timeout ({self.session_timeout:g}s):"
                " the ensemble has expired our session"
            )

    def _clear_suspended(self) -> None:
        self._suspended = False
        if self._suspend_timer is not None:
            self._suspend_timer.cancel()
            self._suspend_timer = None

    async def _verify(self) -> None:
        """After a reconnect: is our node still there and still ours?"""
        grant, client = self._grant, self._client
        if grant is None or client is None:
            return
        try:
            stat = await self._stat(client, grant)
        except SessionExpiredError:
            self._declare_lost("ZooKeeper session expired")
            return
        except (KazooException, TimeoutError) as e:
            log.info("%s: cannot verify the lock yet: %s", self.description, e)
            return  # still SUSPENDED: the next CONNECTED or keepalive retries
        if not self._held or self._grant is not grant or client is not self._client:
            return
        if stat is None or stat.ephemeralOwner != grant.session_id:
            self._declare_lost("our lock node is gone")
        elif self._suspended and self._conn_state == KazooState.CONNECTED:
            self._clear_suspended()
            log.info("%s: reconnected, lock node still ours: resuming", self.description)
            self._notify(LockState.HELD)

    async def _stat(self, client: KazooClient, grant: _Grant) -> ZnodeStat | None:
        """Our lock node's stat (None: it is gone), within the session timeout."""
        stat: ZnodeStat | None = await asyncio.wait_for(
            self._bridge(client.exists_async(grant.path)), self.session_timeout
        )
        return stat

    def _declare_lost(self, reason: str) -> None:
        if not self._held:
            return
        self._held = False
        self._grant = None
        self._clear_suspended()
        log.error("%s: lock lost: %s", self.description, reason)
        self._notify(LockState.LOST)
        # End the session: if it is somehow still alive, our node would keep
        # every other contender waiting. A new client is made on the next acquire.
        if self._client is not None:
            self._stop_client(self._client)

    def _bridge(self, result: Any) -> asyncio.Future[Any]:
        """An asyncio future for a kazoo ``IAsyncResult`` (no thread needed)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()

        def settle(value: Any, exc: BaseException | None) -> None:
            if fut.done():
                return
            if exc is not None:
                fut.set_exception(exc)
            else:
                fut.set_result(value)

        def done(ar: Any) -> None:  # kazoo's thread
            try:
                value, exc = ar.get_nowait(), None
            except Exception as e:
                value, exc = None, e
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(settle, value, exc)

        result.rawlink(done)
        return fut

    # -- contending (kazoo's thread) --------------------------------------------
    def _remove_contender_blocking(self, client: KazooClient, lock: Lock) -> None:
        """Delete every node this attempt may have created (kazoo's own clean-up
        swallows errors, and a lost create reply leaves a node we never saw)."""
        try:
            children = client.get_children(self.lock_path)
        except NoNodeError:
            return
        for child in children:
            if child.startswith(lock.prefix):
                with contextlib.suppress(NoNodeError):
                    client.delete(f"{self.lock_path}/{child}")

    def _contend_blocking(
        self, client: KazooClient, contention: _Contention, blocking: bool
    ) -> _Grant | None:
        lock = contention.lock
        try:
            got = contention.acquire(blocking)
            if got and not contention.cancelled:
                path = f"{self.lock_path}/{lock.node}"
                stat: ZnodeStat | None = client.exists(path)
                cid = client.client_id
                if stat is not None and cid is not None and stat.ephemeralOwner == cid[0]:
                    return _Grant(lock, path, cid[0], stat.czxid)
                log.warning("%s: granted node vanished at once; retrying", self.description)
            self._remove_contender_blocking(client, lock)
            return None
        except KazooException as e:
            try:
                self._remove_contender_blocking(client, lock)
            except KazooException:
                raise _DropSession(str(e)) from e
            raise

    async def _contend(self, client: KazooClient, blocking: bool) -> _Grant | None:
        contention = _Contention(client, self.lock_path, self.node)
        fut = run_blocking(
            lambda: self._contend_blocking(client, contention, blocking), name="amqlite-zk-lock"
        )
        try:
            grant = await asyncio.shield(fut)
        except asyncio.CancelledError:
            contention.cancel()
            cleanup = asyncio.ensure_future(self._after_cancel(client, fut))
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(cleanup)
            raise
        except _DropSession as e:
            log.warning("%s: %s; dropping the session", self.description, e)
            await self._stop_client(client)
            return None
        except KazooException as e:
            raise LockerError(f"{self.description}: {e!r}") from None
        if grant is not None and (
            client is not self._client or self._conn_state == KazooState.LOST
        ):
            # The session ended between the grant and now: the node went with it.
            await self._stop_client(client)
            return None
        if grant is not None and self._conn_state != KazooState.CONNECTED:
            # Between the grant and now the connection went: it is suspended.
            self._take(client, grant)
            self._enter_suspended()
            return grant
        if grant is not None:
            self._take(client, grant)
        return grant

    async def _after_cancel(self, client: KazooClient, fut: asyncio.Future[Any]) -> None:
        # The thread may fail after we stopped waiting (its session dropped):
        # retrieve that, so no "exception was never retrieved" traceback is logged.
        fut.add_done_callback(collect_outcome)
        done, _ = await asyncio.wait({fut}, timeout=ZK_CANCEL_GRACE)
        if done and fut.exception() is None and fut.result() is None:
            return  # kazoo's thread removed our contender node
        if done and fut.exception() is None:
            # Granted just as we cancelled: give it back.
            grant: _Grant = fut.result()
            try:
                await asyncio.wait_for(run_blocking(grant.lock.release), ZK_CANCEL_GRACE)
                return
            except Exception as e:
                log.warning("%s: release after cancel failed: %s", self.description, e)
        # Still running or failed: closing the session removes whatever it made.
        await self._stop_client(client)

    def _take(self, client: KazooClient, grant: _Grant) -> None:
        self._grant = grant
        self._held = True
        self._clear_suspended()
        log.info("acquired %s (node %s, czxid %d)", self.description, grant.path, grant.czxid)

    # -- Locker -----------------------------------------------------------------
    async def try_acquire(self) -> bool:
        if self._held:
            return True
        client = await self._ensure_client()
        return await self._contend(client, blocking=False) is not None

    async def acquire(self, poll_interval: float = DEFAULT_POLL_INTERVAL) -> None:
        """Wait on a watch of our predecessor node; ``poll_interval`` is unused."""
        backoff = RetryBackoff(ZK_RECONNECT_INITIAL, ZK_RECONNECT_MAX, log)
        while not self._held:
            try:
                client = await self._ensure_client()
                await self._contend(client, blocking=True)
            except LockerError as e:
                if self._closed:
                    raise
                await backoff.failed(e)
                continue
            backoff.succeeded()

    async def keepalive(self) -> None:
        await self._check(strict=False)

    async def prove(self) -> None:
        """``keepalive``, except that a suspended connection or a check that cannot
        reach ZooKeeper is ``LockerError`` (in doubt), not a pass."""
        await self._check(strict=True)

    async def _check(self, *, strict: bool) -> None:
        grant, client = self._grant, self._client
        if not self._held or grant is None or client is None:
            raise LockLost(f"{self.description}: not held")
        if self._suspended:
            if self._conn_state == KazooState.CONNECTED:
                await self._verify()
            if not self._held:
                raise LockLost(f"{self.description}: lock lost")
            if strict and self._suspended:
                raise LockerError(f"{self.description}: connection suspended")
            return
        try:
            stat = await self._stat(client, grant)
        except SessionExpiredError:
            self._declare_lost("ZooKeeper session expired")
            raise LockLost(f"{self.description}: session expired") from None
        except (ConnectionLoss, TimeoutError) as e:
            if strict:
                raise LockerError(f"{self.description}: cannot reach ZooKeeper: "
                                  f"{type(e).__name__}") from None
            return  # the session machinery turns this into SUSPENDED, then HELD or LOST
        if not self._held or self._grant is not grant:
            raise LockLost(f"{self.description}: lock lost")
        if stat is None or stat.ephemeralOwner != grant.session_id:
            self._declare_lost("our lock node is gone")
            raise LockLost(f"{self.description}: lock node gone")

    async def release(self) -> None:
        grant, client = self._grant, self._client
        self._held = False
        self._grant = None
        self._clear_suspended()
        if grant is None or client is None:
            return
        try:
            await asyncio.wait_for(
                run_blocking(grant.lock.release, name="amqlite-zk-release"), self.session_timeout
            )
        except Exception as e:
            log.warning("%s: release failed (%s); ending the session", self.description, e)
            await self._stop_client(client)
        else:
            log.info("released %s", self.description)

    async def close(self) -> None:
        if self._closed:
            return
        await self.release()
        self._closed = True
        if self._client is not None:
            self._stop_client(self._client)
        if self._background:
            await asyncio.wait(set(self._background), timeout=self.session_timeout + 1)

    @property
    def reachable(self) -> bool:
        return self._client is not None

    @property
    def fencing_token(self) -> int | None:
        grant = self._grant
        return grant.czxid if grant is not None and self._held else None
