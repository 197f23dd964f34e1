"""The failover supervisor: which broker to connect to, when, and what to do when the
connection drops (reconnect passes, standby and priority connections, cluster updates),
and the client's state (``ClientState``).

The decisions it follows (how long to wait, when to give up, when to warn, in which order
to try the brokers: ActiveMQ's ``FailoverTransport.doReconnect``/``doDelay``) are
``amqlite.client.reconnect``'s, re-exported here.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import random
import ssl
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from amqlite.client.attempts import ATTEMPT_HEAD_START_S, ConnectRace, Failure
from amqlite.client.connection import Connection, describe
from amqlite.client.discovery import Resolver, resolve_uris
from amqlite.client.errors import (
    ClientClosedError,
    ConnectionFailedError,
    ConnectRefusedError,
)
from amqlite.client.messages import CLUSTER_URIS_HEADER, REBALANCE_HEADER, Interruption
from amqlite.client.reconnect import (
    ATTEMPT_DEADLINE_S,
    PassOutcome,
    ReconnectPolicy,
    attempt_timeout_s,
    backoff_waits,
    connect_order,
    is_priority,
    preference,
)
from amqlite.client.uri import (
    BrokerURL,
    TcpURI,
    URIError,
    parse_uri_list,
)
from amqlite.codec import Frame, ProtocolError
from amqlite.tls import ClientTls

__all__ = [
    "ATTEMPT_DEADLINE_S",
    "ATTEMPT_HEAD_START_S",
    "ClientState",
    "FailoverSupervisor",
    "PassOutcome",
    "ReconnectPolicy",
    "backoff_waits",
    "connect_order",
    "is_priority",
]

log = logging.getLogger(__name__)


# --- the client's state --------------------------------------------------------------------


class ClientState(enum.Enum):
    """Where a client is in its life; the one source of ``connected`` and ``closed``."""

    #: Built; ``connect()`` not called yet.
    NEW = "new"
    #: ``connect()`` called, no connection established yet (startup attempts).
    CONNECTING = "connecting"
    #: A connection is up and the client's state (subscriptions, transactions, unconfirmed
    #: sends) is restored on it.
    CONNECTED = "connected"
    #: The connection dropped (or is being moved); reconnect passes are running.
    RECONNECTING = "reconnecting"
    #: ``disconnect()`` is flushing (DISCONNECT, waiting for its RECEIPT).
    CLOSING = "closing"
    #: Disconnected by the application; no call is accepted any more.
    CLOSED = "closed"
    #: Gave up (attempt limits, reconnect disabled); ``failure`` says why.
    FAILED = "failed"


#: States in which the client accepts no call.
_ENDED = frozenset({ClientState.CLOSING, ClientState.CLOSED, ClientState.FAILED})


# --- the supervisor ------------------------------------------------------------------------


class FailoverSupervisor:
    """The connection side of ``AsyncClient``: owns the active, standby and priority
    connections, runs the reconnect passes and drives ``state``.

    What a connection event means for the client's requests is the subclass's: it
    implements ``_on_frame``, ``_restore``, ``_resend``, ``_settle_interrupted``,
    ``_fail_pending`` and ``_notify``.
    """

    def __init__(
        self,
        url: BrokerURL,
        *,
        login: str | None,
        passcode: str | None,
        connect_headers: dict[str, str],
        resolver: Resolver | None,
        rng: random.Random | None,
        tls: ClientTls | ssl.SSLContext | None = None,
    ) -> None:
        self.url = url
        #: For ssl:// URIs. Given explicitly, the client also refuses to fall back to
        #: plain tcp:// URIs it learns (discovery, cluster updates) when ssl:// ones exist.
        self._ssl_context = tls.context() if isinstance(tls, ClientTls) else tls
        self._prefer_tls = tls is not None
        self.options = url.options
        _check_update_url(self.options.update_uris_url)
        self.login = login
        self.passcode = passcode
        self.connect_headers = connect_headers
        self.resolver = resolver
        self.state = ClientState.NEW
        #: Why the client gave up (state FAILED).
        self.failure: BaseException | None = None
        self._rng = rng or random.Random()
        self._policy = ReconnectPolicy(self.options)
        self._nested = self.options.nested_map()
        self._configured: list[TcpURI] = list(url.uris)
        self._updated: list[TcpURI] = []
        #: Which connection this is (1, 2, ...): a delivery can only be acked on its own.
        self._generation = 0
        self._conn: Connection | None = None
        self._standby: Connection | None = None
        self._switch_to: Connection | None = None
        self._standby_task: asyncio.Task[None] | None = None
        self._supervisor: asyncio.Task[None] | None = None
        self._first: asyncio.Future[None] | None = None
        self._closing = asyncio.Event()
        #: Connect attempts in progress (they outlive a pass: ``amqlite.client.attempts``).
        self._attempts = ConnectRace(self._open, self._closing)
        self._wake = asyncio.Event()
        self._rebalance = False
        self._failed_uri: TcpURI | None = None
        #: Every outage: when, from where, to where.
        self.interruptions: list[Interruption] = []
        self.connected_uri: TcpURI | None = None
        #: Why the last reconnect pass failed (for a caller that stops waiting).
        self.last_error: BaseException | None = None

    # -- state ---------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        """Connected, restored, and the connection not (yet noticed as) lost."""
        conn = self._conn
        return self.state is ClientState.CONNECTED and conn is not None and not conn.closed

    @property
    def _live(self) -> Connection | None:
        """The active connection while ``connected``, else None: where a request is
        written now (otherwise the reconnect restores or re-sends it)."""
        return self._conn if self.connected else None

    @property
    def closed(self) -> bool:
        """Disconnected or failed (or disconnecting): no call is accepted."""
        return self.state in _ENDED

    @property
    def known_uris(self) -> list[TcpURI]:
        """Broker-pushed / file URIs first, then configured ones (no shuffle)."""
        return connect_order(self._configured, self._updated)

    # -- what the client does at connection events ----------------------------------------

    def _on_frame(self, conn: Connection, frame: Frame) -> None:
        """A frame on the active connection."""
        raise NotImplementedError

    def _restore(self, conn: Connection) -> None:
        """Re-subscribe and replay on a new connection (may raise ConnectionError)."""
        raise NotImplementedError

    def _resend(self) -> None:
        """Write the sends still without RECEIPT on the (now connected) connection."""
        raise NotImplementedError

    def _settle_interrupted(self, generation: int, text: str) -> None:
        """The connection of ``generation`` is gone: settle what depended on it."""
        raise NotImplementedError

    def _fail_pending(self, exc: BaseException) -> None:
        """The client is closed for good: end every waiting request with ``exc``."""
        raise NotImplementedError

    def _notify(self, name: str, *args: object) -> None:
        """Call the transport listener's ``name``."""
        raise NotImplementedError

    # -- start ---------------------------------------------------------------------------

    async def _start(self) -> None:
        """Start the supervisor; return once the first connection is up (or raise)."""
        loop = asyncio.get_running_loop()
        self.state = ClientState.CONNECTING
        self._first = loop.create_future()
        self._supervisor = loop.create_task(self._supervise(), name="amqlite-failover")
        await asyncio.shield(self._first)

    async def _stop(self) -> None:
        """Wait for the supervisor task to end (after ``_shutdown``)."""
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._supervisor

    # -- cluster updates -----------------------------------------------------------------

    def _cluster_update(self, frame: Frame) -> None:
        """``amqlite.clusterURIs`` / ``amqlite.rebalance`` (``amqlite.client`` docstring)."""
        text = frame.headers.get(CLUSTER_URIS_HEADER)
        if text and self.options.update_uris_supported:
            try:
                uris = parse_uri_list(text, self._nested, what=CLUSTER_URIS_HEADER)
            except URIError as exc:
                log.warning("ignoring cluster update: %s", exc)
            else:
                if uris != self._updated:
                    log.info("cluster URIs from broker: %s", ", ".join(map(str, uris)))
                    self._updated = uris
        rebalance = frame.headers.get(REBALANCE_HEADER, "").lower() == "true"
        if rebalance and self.options.reconnect_supported and self._updated:
            conn = self._conn
            if (conn is not None and conn.uri != self._updated[0]
                    and not self._is_priority(conn.uri)):
                log.info("broker asks to rebalance to %s", self._updated[0])
                self._rebalance = True
                self._wake.set()

    # -- the failover loop ---------------------------------------------------------------

    async def _supervise(self) -> None:
        try:
            while not self.closed:
                conn = await self._establish()
                self._activate(conn)
                if self._first is not None and not self._first.done():
                    self._first.set_result(None)
                reason = await self._watch(conn)
                if self.closed:
                    return
                self._interrupted(conn, reason)
                if not self._policy.can_reconnect():
                    text = reason if isinstance(reason, str) else describe(reason)
                    raise ConnectionFailedError(
                        f"connection to {conn.uri} lost ({text}) and reconnect "
                        "is disabled (maxReconnectAttempts=0)"
                    )
        except asyncio.CancelledError:
            pass
        except ConnectionFailedError as exc:
            log.error("%s", exc)
            self._fail(exc)
        except ClientClosedError:
            pass
        except Exception as exc:
            log.exception("failover loop crashed")
            self._fail(ConnectionFailedError(f"failover loop crashed: {exc!r}"))

    async def _establish(self) -> Connection:
        """Reconnect passes until a broker accepts (ActiveMQ ``doReconnect``); the attempts
        of a pass run side by side and may win during the pause after it."""
        self._rebalance = False
        self._wake.clear()
        rank: dict[TcpURI, int] = {}
        while True:
            if self.closed:
                raise ClientClosedError("client is closed")
            ready = self._take_standby()
            if ready is not None:
                self._attempts.cancel()
                return ready
            won = await self._pause_racing(self._policy.wait_before_pass(), rank)
            if won is not None:
                return won
            self._reload_update_file()
            last_error: BaseException | None
            try:
                uris = await self._connect_list()
            except ConnectionFailedError:
                raise
            except Exception as exc:
                uris, last_error = [], exc
            else:
                last_error = None
            if uris:
                rank = preference(uris, self.options, self._configured)
                won, error = await self._pass(uris, rank)
                if won is not None:
                    return won
                last_error = error
            if not uris and last_error is None:
                found = f": discovery {self.url.discovery!r} found no broker" \
                    if self.url.kind == "discovery" else ""
                last_error = ConnectionError(f"no URIs to connect to{found}")
            self.last_error = last_error
            outcome = self._policy.pass_failed()
            listed = ", ".join(map(str, uris))
            if outcome.give_up:
                won = await self._last_chance(rank)
                if won is not None:
                    return won
                raise ConnectionFailedError(
                    f"failed to connect to [{listed}] after {outcome.failures} attempt(s): "
                    f"{describe(self.last_error)}"
                )
            if outcome.warn:
                log.warning(
                    "failed to connect to [%s] after %d attempt(s), continuing to retry: %s",
                    listed, outcome.failures, describe(last_error),
                )
            won = await self._pause_racing(outcome.delay_ms, rank)
            if won is not None:
                return won

    async def _pass(self, uris: Sequence[TcpURI], rank: dict[TcpURI, int]
                    ) -> tuple[Connection | None, BaseException | None]:
        """One pass (``amqlite.client.attempts``): an attempt to every URI of ``uris``,
        each ``ATTEMPT_HEAD_START_S`` after the last or at once when one fails (one still
        running from the last pass goes on), each within its own deadline
        (``attempt_timeout_s``). Returns (connection, None), or (None, error) at the first
        failure once all have started; the attempts still running go on into the pause.
        So a broker that hangs on connect (frozen, partitioned) never holds back a retry
        of the others. Raises ConnectionFailedError for what retrying cannot fix (a
        refused login, a CONNECT that cannot be built)."""
        outcome = await self._attempts.run_pass(uris, rank)
        if isinstance(outcome, Connection):
            return self._won(outcome), None
        if outcome is None:
            if self.closed:
                raise ClientClosedError("client is closed")
            return None, None
        self._check_final(outcome)
        return None, outcome[-1].error

    async def _pause_racing(self, delay_ms: float, rank: dict[TcpURI, int]
                            ) -> Connection | None:
        """Wait ``delay_ms`` (the back-off) unless an attempt still running wins first."""
        if delay_ms <= 0:
            return None
        until = asyncio.get_running_loop().time() + delay_ms / 1000
        while True:
            outcome = await self._attempts.next(rank, until)
            if isinstance(outcome, Connection):
                return self._won(outcome)
            if outcome is None:
                if self.closed:
                    raise ClientClosedError("client is closed")
                return None
            self._check_final(outcome)
            self.last_error = outcome[-1].error

    async def _last_chance(self, rank: dict[TcpURI, int]) -> Connection | None:
        """Before giving up: the attempts still running may yet connect (each within its
        deadline)."""
        while True:
            outcome = await self._attempts.next(rank)
            if isinstance(outcome, Connection):
                return self._won(outcome)
            if outcome is None:
                return None
            self._check_final(outcome)
            self.last_error = outcome[-1].error

    def _won(self, conn: Connection) -> Connection:
        if self.closed:
            conn.close()
            raise ClientClosedError("client is closed")
        return conn

    @staticmethod
    def _check_final(failures: list[Failure]) -> None:
        """Raise ConnectionFailedError for a failure that retrying cannot fix."""
        for failure in failures:
            exc = failure.error
            if isinstance(exc, ProtocolError) and exc.fault == "local":
                raise ConnectionFailedError(f"cannot build CONNECT: {exc}") from exc
            if isinstance(exc, ConnectRefusedError) and exc.security:
                raise ConnectionFailedError(
                    f"{exc} (a refused login is final: not retried)"
                ) from exc
            if not isinstance(exc, (OSError, TimeoutError, ConnectRefusedError,
                                    ProtocolError)):
                raise exc

    async def _open(self, uri: TcpURI) -> Connection:
        """One connect attempt, within its deadline (``attempt_timeout_s``)."""
        conn = Connection(uri, self._ssl_context)
        await conn.open(login=self.login, passcode=self.passcode, headers=self.connect_headers,
                        timeout_s=attempt_timeout_s(uri, self.url.kind))
        return conn

    async def _pause(self, delay_ms: float) -> None:
        if delay_ms <= 0:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay_ms / 1000):
                await self._closing.wait()

    def _take_standby(self) -> Connection | None:
        for attr in ("_switch_to", "_standby"):
            conn: Connection | None = getattr(self, attr)
            setattr(self, attr, None)
            if conn is not None and not conn.closed:
                return conn
        return None

    async def _connect_list(self, exclude: TcpURI | None = None) -> list[TcpURI]:
        configured = self._configured
        if self.url.kind == "discovery":
            configured = self._learned(await self._resolve())
        updated = self._learned(self._updated) if self.options.update_uris_supported else []
        order = connect_order(
            configured, updated, failed=self._failed_uri,
            randomize=self.options.randomize, rng=self._rng,
        )
        return [u for u in order if u != exclude]

    def _learned(self, uris: list[TcpURI]) -> list[TcpURI]:
        """URIs the client did not configure: with TLS settings, only the ssl:// ones when
        there are any, so a registry or broker cannot talk the client into plain text."""
        if self._prefer_tls and any(u.tls for u in uris):
            return [u for u in uris if u.tls]
        return uris

    async def _resolve(self) -> list[TcpURI]:
        return await resolve_uris(self.url.discovery or "", self.resolver, self._nested)

    def _reload_update_file(self) -> None:
        """updateURIsURL: re-read the file of comma-separated URIs before every pass."""
        path = _update_path(self.options.update_uris_url)
        if path is None or not self.options.update_uris_supported:
            return
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            log.warning("cannot read updateURIsURL %s: %s", path, exc)
            return
        if not text.strip():
            return
        try:
            uris = parse_uri_list(text, self._nested, what=f"updateURIsURL {path}")
        except URIError as exc:
            log.warning("ignoring updateURIsURL: %s", exc)
            return
        if uris != self._updated:
            log.info("URIs from %s: %s", path, ", ".join(map(str, uris)))
            self._updated = uris

    def _activate(self, conn: Connection) -> None:
        """Make ``conn`` the active connection and restore the client's state on it, all
        in one step of the loop so no new request can slip in between."""
        self._generation += 1
        self._conn = conn
        self.connected_uri = conn.uri
        self._failed_uri = None
        self._policy.connected()
        conn.start(self._on_frame)
        with contextlib.suppress(ConnectionError):  # lost again at once: _watch sees it
            self._restore(conn)
        self.state = ClientState.CONNECTED
        self._resend()
        if self.interruptions and self.interruptions[-1].ended is None:
            self.interruptions[-1].ended = time.monotonic()
            self.interruptions[-1].to_uri = str(conn.uri)
            log.info("reconnected to %s", conn.uri)
        else:
            log.info("connected to %s", conn.uri)
        assert conn.connected_frame is not None
        self._notify("on_command", conn.connected_frame)
        self._cluster_update(conn.connected_frame)
        self._notify("on_resumed")
        if self.options.backup or self.options.priority_backup:
            self._standby_task = asyncio.get_running_loop().create_task(
                self._standby_loop(conn), name="amqlite-standby"
            )

    async def _watch(self, conn: Connection) -> BaseException | str | None:
        """Wait until the connection is lost, or a rebalance / priority switch is due."""
        while True:
            wake = asyncio.ensure_future(self._wake.wait())
            closing = asyncio.ensure_future(self._closing.wait())
            try:
                waiting: list[asyncio.Future[Any]] = [conn.lost, wake, closing]
                await asyncio.wait(waiting, return_when="FIRST_COMPLETED")
            finally:
                wake.cancel()
                closing.cancel()
            self._wake.clear()
            if conn.lost.done():
                return conn.lost.result()
            if self.closed:
                return None
            if self._switch_to is not None and not self._switch_to.closed:
                return f"moving to priority broker {self._switch_to.uri}"
            if self._rebalance:
                self._rebalance = False
                if self._updated and conn.uri != self._updated[0]:
                    return f"rebalancing to {self._updated[0]}"

    def _interrupted(self, conn: Connection, reason: BaseException | str | None) -> None:
        """The active connection is gone: settle what depended on it."""
        moving = isinstance(reason, str)
        self._conn = None
        self.state = ClientState.RECONNECTING
        if not moving:
            self._failed_uri = conn.uri
            if conn.uri in self._updated:
                self._updated.remove(conn.uri)  # as ActiveMQ's updated.remove(failed)
        conn.close(graceful=moving)
        if self._standby_task is not None:
            self._standby_task.cancel()
            self._standby_task = None
        text = reason if isinstance(reason, str) else describe(reason)
        log.warning("connection to %s interrupted: %s", conn.uri, text)
        self.interruptions.append(Interruption(time.monotonic(), str(conn.uri), text))
        self._settle_interrupted(self._generation, text)
        self._notify("on_interrupted")

    # -- standby connections (backup / priorityBackup) -------------------------------

    async def _standby_loop(self, active: Connection) -> None:
        """Keep a warm standby (backup) and/or poll the priority broker (priorityBackup)."""
        policy = ReconnectPolicy(self.options)
        policy.connected()
        try:
            while not self.closed and self._conn is active and not active.closed:
                want_priority = self.options.priority_backup and not self._is_priority(active.uri)
                standby = self._standby
                want_backup = self.options.backup and (standby is None or standby.closed)
                if not want_priority and not want_backup:
                    assert standby is not None
                    await asyncio.wait([standby.lost, active.lost], return_when="FIRST_COMPLETED")
                    continue
                self._reload_update_file()
                try:
                    order = await self._connect_list(exclude=active.uri)
                except Exception as exc:
                    log.debug("standby: cannot list URIs: %s", exc)
                    order = []
                candidates = [u for u in order if want_priority and self._is_priority(u)]
                if want_backup:
                    candidates += [u for u in order if u not in candidates]
                if standby is not None and not standby.closed:
                    candidates = [u for u in candidates if u != standby.uri]
                made = False
                for uri in candidates:
                    try:
                        conn = await self._open(uri)
                    except (OSError, TimeoutError, ProtocolError, ConnectRefusedError) as exc:
                        log.debug("standby connect to %s failed: %s", uri, describe(exc))
                        continue
                    if self._conn is not active or self.closed:
                        conn.close(graceful=True)
                        return
                    conn.start(self._on_standby_frame)
                    if want_priority and self._is_priority(uri):
                        log.info("priority broker %s is back: moving there", uri)
                        old, self._switch_to = self._switch_to, conn
                        if old is not None:
                            old.close(graceful=True)
                        self._wake.set()
                        return
                    if self._standby is not None:
                        self._standby.close(graceful=True)
                    self._standby = conn
                    log.info("standby connection to %s ready", uri)
                    made = True
                    break
                if made and not want_priority:
                    policy.connected()
                    continue
                await self._pause(policy.delay_ms)
                policy.grow()
        except asyncio.CancelledError:
            pass

    def _is_priority(self, uri: TcpURI) -> bool:
        return is_priority(uri, self.options, self._configured)

    def _on_standby_frame(self, conn: Connection, frame: Frame) -> None:
        if frame.command == "ERROR":
            log.info("standby %s: ERROR %s", conn.uri, frame.headers.get("message", ""))

    # -- giving up ---------------------------------------------------------------------

    def _fail(self, exc: BaseException) -> None:
        self.failure = exc
        self._shutdown(exc, ClientState.FAILED)
        self._notify("on_exception", exc)

    def _shutdown(self, exc: BaseException, state: ClientState = ClientState.CLOSED) -> None:
        """Close every connection and fail everything still pending."""
        if self._first is not None and not self._first.done():
            self._first.set_exception(exc)
            self._first.exception()  # retrieved here; connect() re-raises it
        self.state = state
        self._closing.set()
        self._attempts.cancel()
        for attr in ("_conn", "_standby", "_switch_to"):
            conn = getattr(self, attr)
            setattr(self, attr, None)
            if conn is not None:
                conn.close()
        if self._standby_task is not None:
            self._standby_task.cancel()
        self._fail_pending(exc)


def _update_path(url: str | None) -> str | None:
    if not url:
        return None
    if url.startswith("file:"):
        return unquote(urlsplit(url).path)
    return url


def _check_update_url(url: str | None) -> None:
    if url and "://" in url and not url.startswith("file:"):
        raise URIError(f"updateURIsURL {url!r}: only local files (a path or file://) are read")

