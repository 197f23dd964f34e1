"""The amqlite client: STOMP 1.2 with ActiveMQ's failover transport semantics.

``AsyncClient`` is the implementation (asyncio); ``Client`` is a blocking facade that runs
an ``AsyncClient`` on an event loop in a background thread, for scripts.

Broker URLs and options: see :mod:`amqlite.failover_uri` (``tcp://``, ``failover:``,
``discovery:``, every ActiveMQ failover option with ActiveMQ's default). Reconnect timing
and URI order: :mod:`amqlite.reconnect` (ActiveMQ's ``doReconnect``/``doDelay``).

What failover guarantees
    Every persistent SEND carries ``receipt`` and the producer message identity
    ``amqlite.producerId`` + ``amqlite.producerSeq``; ``send()`` returns when the RECEIPT
    arrives, which the broker sends only after the commit. A send without RECEIPT is kept
    and, after a reconnect, written again with the *same* identity, before any newer send;
    the broker's dedup window stores it at most once and answers with a RECEIPT either way.
    While no broker is connected, sends wait (``timeout=-1``) or fail after ``timeout`` ms
    (``SendTimeoutError``; the connection is not touched). A timed-out send that was never
    written is withdrawn; one that was written stays queued with its identity, so it still
    lands exactly once. ``trackMessages=true`` also replays non-persistent sends whose
    RECEIPT is missing, oldest evicted beyond ``maxCacheSize`` bytes. Persistent sends are
    always tracked: that is what makes a RECEIPT a promise across failover.

After a reconnect
    Every subscription is sent again with its id and headers (durable ones by
    ``activemq.subscriptionName``, under the same ``client-id``: the broker lets the newer
    connection take over the client-id). Open transactions are replayed (BEGIN, their
    SENDs with the same identities, and a pending COMMIT) unless they hold ACKs, which
    cannot be replayed: then ``commit()`` raises ``TransactionRolledBackError``. An ACK/NACK
    whose RECEIPT did not come back, or an ack for a message delivered on an older
    connection, is *unconfirmed*: ``ack()`` returns False, the message is appended to
    ``unconfirmed_acks`` and ``listener.on_exception(AckNotConfirmedError)`` is called. The
    ack may have committed before the connection dropped; if it did not, the broker
    redelivers the message with ``redelivered:true``. Messages of client-ack subscriptions
    not yet taken by the application are dropped at an interruption (ActiveMQ clears them
    too) because the broker redelivers them.

Transport listener
    Any object with some of ``on_command(frame)``, ``on_exception(exc)``,
    ``on_interrupted()``, ``on_resumed()`` (see ``TransportListener``). They are called on
    the event loop (for ``Client``: on its background loop thread), so they must not block;
    a coroutine function is scheduled as a task. Exceptions they raise are logged.

Cluster updates (contract with the broker: ActiveMQ's ``updateClusterClients`` and
``rebalanceClusterClients`` in STOMP terms)
    A broker may add to a CONNECTED, RECEIPT or MESSAGE frame the headers
    ``amqlite.clusterURIs: tcp://h1:p1,tcp://h2:p2`` (comma-separated tcp URIs, the group's
    client URIs in the order it wants clients to prefer) and ``amqlite.rebalance: true``.
    With ``updateURIsSupported=true`` (default) the client tries those URIs first on every
    reconnect pass (its configured URIs stay as fallback). With ``amqlite.rebalance:true``
    and ``reconnectSupported=true`` (default) a client not connected to the first listed
    URI closes its connection and reconnects there (re-subscribing and re-sending as after
    any interruption).

Standby connections
    ``backup=true`` keeps one more connection, to the next URI in connect order, open and
    handshaken; when the active one drops the client switches to it without the reconnect
    delay. A shared-store slave does not listen, so against a master/slave pair the standby
    simply keeps retrying (with the reconnect back-off) until the slave becomes master.
    ``priorityBackup=true`` polls the priority URI (``priorityURIs``, else the first
    configured URI) while connected elsewhere and moves back to it once it accepts.
    Standby connections carry the same ``client-id``; they only ever point at another
    broker than the active connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import logging
import random
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit

from amqlite.codec import Frame, ProtocolError, encode_frame
from amqlite.failover_uri import (
    BrokerURL,
    TcpURI,
    URIError,
    parse_broker_url,
    parse_tcp_uri,
    parse_uri_list,
)
from amqlite.protocol import FrameReceived, StompProtocol, receive_deadline_ms
from amqlite.reconnect import ReconnectPolicy, connect_order, is_priority

__all__ = [
    "CLUSTER_URIS_HEADER",
    "PRODUCER_ID_HEADER",
    "PRODUCER_SEQ_HEADER",
    "REBALANCE_HEADER",
    "AckNotConfirmedError",
    "AsyncClient",
    "BrokerRefusedError",
    "Client",
    "ClientClosedError",
    "ClientError",
    "ConnectionFailedError",
    "FailoverTimeoutError",
    "Interruption",
    "Message",
    "SendResult",
    "SendTimeoutError",
    "Subscription",
    "SyncSubscription",
    "TransactionOutcomeUnknownError",
    "TransactionRolledBackError",
    "TransportListener",
    "register_discovery_resolver",
    "stomp_destination",
]

log = logging.getLogger("amqlite.client")

#: The producer message identity; the broker's dedup window is keyed by it (broker.py).
PRODUCER_ID_HEADER = "amqlite.producerId"
PRODUCER_SEQ_HEADER = "amqlite.producerSeq"
#: Broker -> client cluster update (see the module docstring).
CLUSTER_URIS_HEADER = "amqlite.clusterURIs"
REBALANCE_HEADER = "amqlite.rebalance"

#: How long ``disconnect()`` waits for the broker's RECEIPT of DISCONNECT (it comes after
#: the broker finished the commits in flight, so this is a flush, not a formality).
DISCONNECT_TIMEOUT_S = 5.0
#: Bytes asked from the socket per read; a few frames per syscall.
READ_CHUNK = 64 * 1024
#: Versions offered in CONNECT. 1.0 cannot ack by subscription and has no heart-beats.
OFFERED_VERSIONS = ("1.1", "1.2")

Resolver = Callable[[str], Sequence[str] | Awaitable[Sequence[str]]]
_T = TypeVar("_T")

# --- errors ------------------------------------------------------------------------------


class ClientError(Exception):
    """Base class of the client's errors."""


class ConnectionFailedError(ClientError):
    """No broker could be reached within the attempt limits (or reconnect is disabled)."""


class ClientClosedError(ClientError):
    """The client was disconnected (or failed for good) while the call was pending."""


class FailoverTimeoutError(ClientError, TimeoutError):
    """The failover ``timeout`` elapsed before the request could be completed."""


class SendTimeoutError(FailoverTimeoutError):
    """A send did not get its RECEIPT within ``timeout`` ms.

    ``written`` False: it never reached a broker and was withdrawn. True: the outcome is
    unknown; it stays queued and is re-sent with the same ``identity`` after a reconnect.
    """

    def __init__(self, message: str, identity: tuple[str, int], written: bool) -> None:
        super().__init__(message)
        self.identity = identity
        self.written = written


class BrokerRefusedError(ClientError):
    """The broker answered a request with an ERROR frame (kept in ``frame``)."""

    def __init__(self, frame: Frame) -> None:
        text = frame.headers.get("message", "error")
        detail = frame.body.decode("utf-8", "replace").strip()
        super().__init__(f"broker refused: {text}" + (f": {detail}" if detail else ""))
        self.frame = frame


class AckNotConfirmedError(ClientError):
    """An ACK/NACK could not be confirmed: it may or may not have taken effect, so the
    message may come again (flagged ``redelivered``) or not."""

    def __init__(self, message: Message, reason: str) -> None:
        super().__init__(f"ack of {message.message_id} not confirmed: {reason}")
        self.message = message
        self.reason = reason


class TransactionRolledBackError(ClientError):
    """The transaction was lost with its connection (it held ACKs, which cannot be
    replayed); nothing of it was committed."""


class TransactionOutcomeUnknownError(TransactionRolledBackError):
    """COMMIT was written but the connection dropped before its RECEIPT, and the
    transaction held ACKs so it could not be replayed: it may or may not be committed."""


# --- discovery hook ------------------------------------------------------------------------

_RESOLVERS: dict[str | None, Resolver] = {}


def register_discovery_resolver(resolver: Resolver | None, scheme: str | None = None) -> None:
    """Plug a resolver for ``discovery:`` URLs: ``resolver(agent) -> [tcp URI, ...]``.

    ``agent`` is the text after ``discovery:`` without the failover options
    (``zk://h:2181/amqlite?group=default``, ``fabric:default``, ...). ``scheme`` restricts
    it to agents starting with ``scheme:``; None registers the fallback. Without any,
    ``amqlite.discovery.resolve_agent`` serves the schemes it lists (zk, postgresql,
    sqlite). It is called on every reconnect pass (a sync resolver runs in a worker
    thread, an async one on the loop); an empty list counts as a failed pass. ``None``
    unregisters.
    """
    if resolver is None:
        _RESOLVERS.pop(scheme, None)
    else:
        _RESOLVERS[scheme] = resolver


def _find_resolver(agent: str) -> Resolver | None:
    """A registered resolver for the agent's scheme, the registered fallback, or else the
    built-in registry lookup (``amqlite.discovery``) for the schemes it knows."""
    scheme = agent.partition(":")[0] if ":" in agent else None
    found = _RESOLVERS.get(scheme) or _RESOLVERS.get(None)
    if found is not None:
        return found
    try:  # imported late: it pulls in the registry backends
        from amqlite import discovery
    except ImportError:
        return None
    schemes: Sequence[str] = getattr(discovery, "AGENT_SCHEMES", ())
    resolve: Resolver | None = getattr(discovery, "resolve_agent", None)
    return resolve if scheme in schemes else None


# --- small public types --------------------------------------------------------------------


def stomp_destination(name: str) -> str:
    """``queue://x`` / ``topic://x`` (ActiveMQ style) or ``/queue/x`` / ``/topic/x`` ->
    the STOMP destination; anything else is a ValueError naming it."""
    for prefix, kind in (("queue://", "queue"), ("topic://", "topic")):
        if name.startswith(prefix) and len(name) > len(prefix):
            return f"/{kind}/{name[len(prefix):]}"
    if name.startswith(("/queue/", "/topic/")) and len(name) > len("/queue/"):
        return name
    raise ValueError(
        f"destination {name!r}: use queue://NAME, topic://NAME, /queue/NAME or /topic/NAME"
    )


class TransportListener:
    """No-op base for transport listeners; any object with some of these methods works."""

    def on_command(self, frame: Frame) -> None:
        """Every frame received from the broker (CONNECTED, MESSAGE, RECEIPT, ERROR)."""

    def on_exception(self, exc: BaseException) -> None:
        """Reconnect gave up (ConnectionFailedError) or an ack was not confirmed."""

    def on_interrupted(self) -> None:
        """The connection dropped; the client is reconnecting."""

    def on_resumed(self) -> None:
        """A connection is (re-)established and the client state restored on it."""


@dataclass(frozen=True, slots=True)
class SendResult:
    """What the broker confirmed: the message identity and where it went.

    ``seq`` of a persistent send is its producer sequence (1, 2, 3, ... with no
    holes); a non-persistent send gets a local number the broker never sees.
    """

    producer_id: str
    seq: int
    destination: str
    receipt: str | None

    @property
    def identity(self) -> tuple[str, int]:
        return (self.producer_id, self.seq)


@dataclass(slots=True)
class Interruption:
    """One outage of the client's connection, for reports (``amqlite produce``)."""

    started: float  # time.monotonic()
    from_uri: str
    reason: str
    ended: float | None = None
    to_uri: str | None = None

    @property
    def duration(self) -> float | None:
        return None if self.ended is None else self.ended - self.started


@dataclass(frozen=True, slots=True)
class Message:
    """A MESSAGE frame as delivered to the application."""

    frame: Frame
    subscription: Subscription
    #: Which connection delivered it: an ack is only meaningful on that connection.
    generation: int

    @property
    def headers(self) -> dict[str, str]:
        return self.frame.headers

    @property
    def body(self) -> bytes:
        return self.frame.body

    @property
    def text(self) -> str:
        return self.frame.body.decode("utf-8", "replace")

    @property
    def destination(self) -> str:
        return self.frame.headers.get("destination", "")

    @property
    def message_id(self) -> str:
        return self.frame.headers.get("message-id", "")

    @property
    def ack_id(self) -> str:
        return self.frame.headers.get("ack") or self.message_id

    @property
    def redelivered(self) -> bool:
        return self.frame.headers.get("redelivered", "false").lower() == "true"

    @property
    def identity(self) -> tuple[str, int] | None:
        """The producer identity, when the producer set one (amqlite clients do)."""
        pid = self.frame.headers.get(PRODUCER_ID_HEADER)
        seq = self.frame.headers.get(PRODUCER_SEQ_HEADER)
        if pid is None or seq is None or not seq.lstrip("-").isdigit():
            return None
        return (pid, int(seq))


_CLOSED = object()  # end-of-stream marker in a subscription's queue


class Subscription:
    """One subscription; messages come through ``receive()``/``async for`` or a callback."""

    def __init__(
        self,
        client: AsyncClient,
        sub_id: str,
        destination: str,
        ack: str,
        headers: dict[str, str],
        callback: Callable[[Message], Any] | None,
    ) -> None:
        self.client = client
        self.id = sub_id
        self.destination = destination
        self.ack = ack
        self.headers = headers  # the SUBSCRIBE headers, re-sent after every reconnect
        self.callback = callback
        self.closed = False
        self.delivered = 0
        self.dropped_at_interruption = 0
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._active: asyncio.Future[None] | None = None

    def __repr__(self) -> str:
        return f"<Subscription {self.id} {self.destination} ack={self.ack}>"

    @property
    def durable_name(self) -> str | None:
        return self.headers.get("activemq.subscriptionName")

    async def receive(self, timeout: float | None = None) -> Message | None:
        """The next message, or None after ``timeout`` seconds or once unsubscribed."""
        if self.closed and self._queue.empty():
            return None
        try:
            async with asyncio.timeout(timeout):
                item = await self._queue.get()
        except TimeoutError:
            return None
        if item is _CLOSED:
            self._queue.put_nowait(_CLOSED)  # wake every other reader too
            return None
        return item

    def __aiter__(self) -> AsyncIterator[Message]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Message]:
        while True:
            message = await self.receive()
            if message is None:
                return
            yield message

    def _deliver(self, message: Message) -> None:
        self.delivered += 1
        if self.callback is None:
            self._queue.put_nowait(message)
            return
        self.client._call_user(self.callback, message)

    def _drop_undelivered(self, generation: int) -> int:
        """Drop queued messages of an older connection (the broker redelivers them)."""
        kept: list[Any] = []
        dropped = 0
        while not self._queue.empty():
            item = self._queue.get_nowait()
            if isinstance(item, Message) and item.generation <= generation:
                dropped += 1
            else:
                kept.append(item)
        for item in kept:
            self._queue.put_nowait(item)
        self.dropped_at_interruption += dropped
        return dropped

    def _close(self) -> None:
        if not self.closed:
            self.closed = True
            self._queue.put_nowait(_CLOSED)


# --- internal bookkeeping ------------------------------------------------------------------


@dataclass(eq=False, slots=True)
class _PendingSend:
    receipt: str | None
    frame: Frame
    future: asyncio.Future[SendResult]
    result: SendResult
    persistent: bool
    size: int
    written_gen: int = 0  # generation it was last written on; 0: never written
    ever_written: bool = False

    @property
    def needs_receipt(self) -> bool:
        return self.receipt is not None


@dataclass(eq=False, slots=True)
class _Control:
    """A request other than SEND whose RECEIPT somebody waits for."""

    kind: str  # ack, nack, subscribe, unsubscribe, commit, abort, disconnect
    frame: Frame
    future: asyncio.Future[bool]
    generation: int
    replay: bool = False  # written again after a reconnect (durable removal)
    message: Message | None = None
    subscription: Subscription | None = None
    transaction: _Transaction | None = None


@dataclass(eq=False, slots=True)
class _Transaction:
    id: str
    frames: list[Frame] = field(default_factory=list)  # SEND/ACK/NACK frames, in order
    has_acks: bool = False
    broken: bool = False
    end: _Control | None = None  # the COMMIT/ABORT in flight
    end_written: bool = False


# --- one STOMP connection ----------------------------------------------------------------


class ConnectRefusedError(ClientError):
    """The broker answered CONNECT with ERROR."""


class _Connection:
    """One TCP connection speaking STOMP through the sans-I/O protocol; no failover."""

    def __init__(self, uri: TcpURI) -> None:
        self.uri = uri
        self.protocol = StompProtocol("client")
        self.loop = asyncio.get_running_loop()
        self.lost: asyncio.Future[BaseException | None] = self.loop.create_future()
        self.connected_frame: Frame | None = None
        self.on_frame: Callable[[_Connection, Frame], None] = lambda _c, _f: None
        self.closed = False
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._early: list[Frame] = []  # frames that arrived in the CONNECTED chunk
        self._last_rx = self.loop.time()
        self._last_tx = self.loop.time()

    def __repr__(self) -> str:
        return f"<_Connection {self.uri} {'closed' if self.closed else 'open'}>"

    async def open(
        self, *, login: str | None, passcode: str | None, headers: Mapping[str, str]
    ) -> Frame:
        """TCP connect + CONNECT/CONNECTED within the URI's connectionTimeout."""
        options = self.uri.options
        try:
            async with asyncio.timeout(options.connection_timeout_ms / 1000):
                reader, writer = await asyncio.open_connection(self.uri.host, self.uri.port)
                self._reader, self._writer = reader, writer
                writer.write(
                    self.protocol.connect_frame(
                        self.uri.host, login, passcode, heartbeat=options.heartbeat_ms,
                        versions=OFFERED_VERSIONS, extra=dict(headers),
                    )
                )
                frame = await self._handshake(reader)
        except BaseException:
            self.close()
            raise
        self.connected_frame = frame
        self._last_rx = self._last_tx = self.loop.time()
        return frame

    async def _handshake(self, reader: asyncio.StreamReader) -> Frame:
        while True:
            data = await reader.read(READ_CHUNK)
            if not data:
                raise ConnectionResetError(f"{self.uri} closed the connection during CONNECT")
            connected: Frame | None = None
            for event in self.protocol.receive_data(data):
                if not isinstance(event, FrameReceived):
                    continue
                frame = event.frame
                if connected is not None:
                    self._early.append(frame)
                elif frame.command == "ERROR":
                    text = frame.headers.get("message", "error")
                    detail = frame.body.decode("utf-8", "replace").strip()
                    raise ConnectRefusedError(
                        f"{self.uri} refused CONNECT: {text}" + (f": {detail}" if detail else "")
                    )
                elif frame.command == "CONNECTED":
                    connected = frame
            if connected is not None:
                return connected

    def start(self, on_frame: Callable[[_Connection, Frame], None]) -> None:
        """Begin reading and heart-beating; frames go to ``on_frame``. Starting a started
        connection (a standby being promoted) only redirects its frames."""
        self.on_frame = on_frame
        if self._tasks:
            return
        self._tasks.append(self.loop.create_task(self._read_loop()))
        heartbeat = self.protocol.heartbeat
        if heartbeat.send_ms or heartbeat.expect_ms:
            self._tasks.append(self.loop.create_task(self._heartbeat_loop()))

    async def _read_loop(self) -> None:
        assert self._reader is not None
        reason: BaseException | None = None
        try:
            early, self._early = self._early, []
            for frame in early:
                self.on_frame(self, frame)
            while not self.closed:
                data = await self._reader.read(READ_CHUNK)
                if not data:
                    reason = ConnectionResetError(f"{self.uri} closed the connection")
                    break
                self._last_rx = self.loop.time()
                for event in self.protocol.receive_data(data):
                    if isinstance(event, FrameReceived):
                        self.on_frame(self, event.frame)
        except (OSError, ProtocolError) as exc:
            reason = exc
        except asyncio.CancelledError:
            pass
        except Exception as exc:  # a bug in a frame handler must not hang the client
            log.exception("frame handling failed on %s", self.uri)
            reason = exc
        self._lose(reason)

    async def _heartbeat_loop(self) -> None:
        heartbeat = self.protocol.heartbeat
        send_s = heartbeat.send_ms / 1000
        deadline_ms = receive_deadline_ms(heartbeat)
        deadline_s = deadline_ms / 1000 if deadline_ms else 0.0
        ticks = [t for t in (send_s / 2, deadline_s / 2) if t > 0]
        tick = min(ticks)
        try:
            while not self.closed:
                await asyncio.sleep(tick)
                now = self.loop.time()
                if deadline_s and now - self._last_rx > deadline_s:
                    self._lose(TimeoutError(
                        f"no data or heart-beat from {self.uri} for {now - self._last_rx:.1f}s"
                    ))
                    return
                if send_s and now - self._last_tx >= send_s / 2:
                    self._write_bytes(self.protocol.heartbeat_data())
        except (OSError, ProtocolError) as exc:
            self._lose(exc)
        except asyncio.CancelledError:
            pass

    def _write_bytes(self, data: bytes) -> None:
        if self.closed or self._writer is None or self._writer.is_closing():
            raise ConnectionResetError(f"connection to {self.uri} is closed")
        self._writer.write(data)
        self._last_tx = self.loop.time()

    def write(self, frame: Frame) -> None:
        """Encode and write; ConnectionError when the connection is gone, a local
        ProtocolError when the frame cannot be sent at all."""
        if self.closed:
            raise ConnectionResetError(f"connection to {self.uri} is closed")
        try:
            data = self.protocol.send(frame)
        except ProtocolError as exc:
            if exc.fault == "local" and self.protocol.state == "closed":
                raise ConnectionResetError(str(exc)) from exc
            raise
        self._write_bytes(data)

    async def drain(self) -> None:
        """Wait for the socket buffer to empty (flow control); a lost connection is fine."""
        if self._writer is not None and not self.closed:
            with contextlib.suppress(OSError, RuntimeError):
                await self._writer.drain()

    def close(self, *, graceful: bool = False) -> None:
        """Close now; ``graceful`` sends DISCONNECT first (no receipt awaited)."""
        if graceful and not self.closed and self.protocol.connected:
            with contextlib.suppress(Exception):
                self.write(Frame("DISCONNECT", {}))
        self._lose(None)

    def _lose(self, reason: BaseException | None) -> None:
        if self.closed and self.lost.done():
            return
        self.closed = True
        current = asyncio.current_task()
        for task in self._tasks:
            if task is not current:
                task.cancel()
        if self._writer is not None:
            with contextlib.suppress(Exception):
                if reason is None:
                    self._writer.close()
                else:
                    self._writer.transport.abort()
        if not self.lost.done():
            self.lost.set_result(reason)


# --- the asyncio client --------------------------------------------------------------------


class AsyncClient:
    """A STOMP client with failover; all methods are coroutines on one event loop.

    ``broker_url``: see :mod:`amqlite.failover_uri`. ``client_id`` is sent in CONNECT
    (needed for durable subscriptions; the broker lets a newer connection with the same
    client-id replace an older one, which is what a reconnect needs). ``producer_id``
    defaults to a fresh uuid; a fixed one must come with a ``first_seq`` above anything it
    sent before, or the broker's dedup window drops the new messages as duplicates.
    ``resolver`` overrides the registered discovery resolver for ``discovery:`` URLs.
    """

    def __init__(
        self,
        broker_url: str | BrokerURL,
        *,
        login: str | None = None,
        passcode: str | None = None,
        client_id: str | None = None,
        producer_id: str | None = None,
        first_seq: int = 1,
        listener: object | None = None,
        resolver: Resolver | None = None,
        connect_headers: Mapping[str, str] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.url = parse_broker_url(broker_url) if isinstance(broker_url, str) else broker_url
        self.options = self.url.options
        _check_update_url(self.options.update_uris_url)
        self.login = login
        self.passcode = passcode
        self.client_id = client_id
        self.producer_id = producer_id or uuid.uuid4().hex
        if first_seq < 1:
            raise ValueError(f"first_seq must be >= 1, got {first_seq}")
        self.listener = listener
        self.resolver = resolver
        self.connect_headers = dict(connect_headers or {})
        if client_id:
            self.connect_headers["client-id"] = client_id
        self._rng = rng or random.Random()
        self._policy = ReconnectPolicy(self.options)
        self._nested = self.options.nested_map()
        self._configured: list[TcpURI] = list(self.url.uris)
        self._updated: list[TcpURI] = []
        self._seq = itertools.count(first_seq)
        #: Numbers for non-persistent sends: local only, never sent to the broker.
        self._local_seq = itertools.count(1)
        self._ids = itertools.count(1)
        self._generation = 0
        self._conn: _Connection | None = None
        self._standby: _Connection | None = None
        self._switch_to: _Connection | None = None
        self._standby_task: asyncio.Task[None] | None = None
        self._supervisor: asyncio.Task[None] | None = None
        self._first: asyncio.Future[None] | None = None
        self._connected = asyncio.Event()
        self._closing = asyncio.Event()
        self._wake = asyncio.Event()
        self._rebalance = False
        self._failed_uri: TcpURI | None = None
        self._failure: BaseException | None = None
        self._sends: dict[str, _PendingSend] = {}  # by receipt (or a local key), seq order
        self._tracked_bytes = 0
        self._controls: dict[str, _Control] = {}
        self._subs: dict[str, Subscription] = {}
        self._txs: dict[str, _Transaction] = {}
        self._user_tasks: set[asyncio.Task[Any]] = set()
        self.closed = False
        #: Messages whose ACK/NACK was not confirmed (they may come again, redelivered).
        self.unconfirmed_acks: list[Message] = []
        #: Every outage: when, from where, to where.
        self.interruptions: list[Interruption] = []
        #: SEND frames written again after a reconnect (same identity).
        self.resent = 0
        self.connected_uri: TcpURI | None = None

    # -- public state ----------------------------------------------------------------

    @property
    def connected(self) -> bool:
        return self._conn is not None and not self._conn.closed and self._connected.is_set()

    @property
    def pending_sends(self) -> int:
        """Sends still waiting for their RECEIPT (or for a connection)."""
        return len(self._sends)

    @property
    def known_uris(self) -> list[TcpURI]:
        """Broker-pushed / file URIs first, then configured ones (no shuffle)."""
        return connect_order(self._configured, self._updated)

    # -- lifecycle -------------------------------------------------------------------

    async def connect(self) -> None:
        """Connect (trying per ``startupMaxReconnectAttempts``) and start failing over.

        Raises ConnectionFailedError when the startup attempts are exhausted.
        """
        if self.closed:
            raise ClientClosedError("client is closed")
        if self._supervisor is not None:
            raise ClientError("connect() was already called")
        if self.url.kind == "discovery" and self.resolver is None:
            assert self.url.discovery is not None
            if _find_resolver(self.url.discovery) is None:
                raise ConnectionFailedError(
                    f"{self.url.text}: no discovery resolver registered for "
                    f"{self.url.discovery!r} (amqlite.client.register_discovery_resolver)"
                )
        loop = asyncio.get_running_loop()
        self._first = loop.create_future()
        self._supervisor = loop.create_task(self._supervise(), name="amqlite-failover")
        await asyncio.shield(self._first)

    async def disconnect(self, timeout: float = DISCONNECT_TIMEOUT_S) -> None:
        """DISCONNECT with a RECEIPT (a flush), then close everything. Idempotent."""
        if self.closed:
            return
        self.closed = True
        self._closing.set()
        conn = self._conn
        if conn is not None and not conn.closed and self._connected.is_set():
            receipt = self._next_id("d")
            future = asyncio.get_running_loop().create_future()
            frame = Frame("DISCONNECT", {"receipt": receipt})
            self._controls[receipt] = _Control("disconnect", frame, future, self._generation)
            with contextlib.suppress(ConnectionError, ProtocolError):
                conn.write(frame)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(timeout):
                        await asyncio.wait([future, conn.lost], return_when="FIRST_COMPLETED")
        self._shutdown(ClientClosedError("client disconnected"))
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._supervisor

    async def __aenter__(self) -> AsyncClient:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.disconnect()

    # -- sending ---------------------------------------------------------------------

    async def send(
        self,
        destination: str,
        body: bytes | str = b"",
        headers: Mapping[str, str] | None = None,
        *,
        persistent: bool = True,
        transaction: str | None = None,
        content_type: str | None = None,
    ) -> SendResult:
        """Send one message; for a persistent one, return once the broker committed it.

        Non-persistent sends return once written (ActiveMQ's async send). In a
        transaction, the send is recorded and confirmed by ``commit()``.
        """
        self._check_open()
        dest = stomp_destination(destination)
        # Only persistent sends are numbered: the store keeps a trace of every
        # numbered send, so the audit can tell a hole in the sequence from a
        # message that was never meant to be stored.
        seq = next(self._seq) if persistent else next(self._local_seq)
        frame_headers = {"destination": dest, **dict(headers or {})}
        data = body.encode("utf-8") if isinstance(body, str) else bytes(body)
        if content_type is not None:
            frame_headers["content-type"] = content_type
        elif isinstance(body, str) and "content-type" not in frame_headers:
            frame_headers["content-type"] = "text/plain;charset=utf-8"
        frame_headers["persistent"] = "true" if persistent else "false"
        if persistent:
            frame_headers[PRODUCER_ID_HEADER] = self.producer_id
            frame_headers[PRODUCER_SEQ_HEADER] = str(seq)
        try:  # fail now, not at the replay after a reconnect
            encode_frame(Frame("SEND", frame_headers), "1.2")
        except ProtocolError as exc:
            raise ValueError(f"cannot send these headers: {exc}") from None
        if transaction is not None:
            return self._send_in_transaction(transaction, Frame("SEND", frame_headers, data), seq)
        wants_receipt = persistent or self.options.track_messages
        receipt = f"s-{seq}-{self._next_id('')}" if wants_receipt else None
        if receipt is not None:
            frame_headers["receipt"] = receipt
        frame = Frame("SEND", frame_headers, data)
        future: asyncio.Future[SendResult] = asyncio.get_running_loop().create_future()
        result = SendResult(self.producer_id, seq, dest, receipt)
        size = len(data) + sum(len(k) + len(v) + 2 for k, v in frame_headers.items())
        pending = _PendingSend(receipt, frame, future, result, persistent, size)
        key = receipt or f"n-{seq}"
        self._sends[key] = pending
        if not persistent and receipt is not None:
            self._tracked_bytes += size
            self._evict_tracked()
        self._write_send(key, pending)
        timeout_s = self._timeout_s()
        try:
            async with asyncio.timeout(timeout_s):
                outcome = await asyncio.shield(future)
        except TimeoutError:
            if future.done() and not future.cancelled() and future.exception() is None:
                return future.result()
            if not pending.ever_written:
                self._forget_send(key)
                raise SendTimeoutError(
                    f"send to {dest} failed: no broker connection within "
                    f"{self.options.timeout} ms (failover timeout); not sent",
                    result.identity, written=False,
                ) from None
            raise SendTimeoutError(
                f"send to {dest}: no RECEIPT within {self.options.timeout} ms (failover "
                f"timeout); it stays queued and is re-sent with identity "
                f"{self.producer_id}:{seq} after a reconnect",
                result.identity, written=True,
            ) from None
        except asyncio.CancelledError:
            if not pending.ever_written:
                self._forget_send(key)
            raise
        conn = self._conn
        if conn is not None:
            await conn.drain()
        return outcome

    def _send_in_transaction(self, tx_id: str, frame: Frame, seq: int) -> SendResult:
        tx = self._transaction(tx_id)
        frame.headers["transaction"] = tx_id
        tx.frames.append(frame)
        if not tx.broken:
            self._write_quietly(frame)
        return SendResult(self.producer_id, seq, frame.headers["destination"], None)

    def _write_send(self, key: str, pending: _PendingSend) -> None:
        conn = self._conn
        if conn is None or not self._connected.is_set():
            return  # written by _activate after the reconnect
        try:
            conn.write(pending.frame)
        except ConnectionError:
            return  # the supervisor is about to notice; _activate re-sends it
        except ProtocolError as exc:
            self._forget_send(key)
            if not pending.future.done():
                pending.future.set_exception(ValueError(f"cannot send this frame: {exc}"))
            return
        if pending.ever_written:
            self.resent += 1
        pending.ever_written = True
        pending.written_gen = self._generation
        if not pending.needs_receipt:
            self._forget_send(key)
        if not pending.persistent and not pending.future.done():
            pending.future.set_result(pending.result)

    def _forget_send(self, key: str) -> None:
        pending = self._sends.pop(key, None)
        if pending is not None and not pending.persistent and pending.needs_receipt:
            self._tracked_bytes -= pending.size

    def _evict_tracked(self) -> None:
        """trackMessages: keep at most maxCacheSize bytes of non-persistent sends."""
        if self._tracked_bytes <= self.options.max_cache_size:
            return
        for key, pending in list(self._sends.items()):
            if self._tracked_bytes <= self.options.max_cache_size:
                break
            if not pending.persistent and pending.ever_written:
                self._forget_send(key)

    # -- subscriptions ---------------------------------------------------------------

    async def subscribe(
        self,
        destination: str,
        *,
        ack: str = "auto",
        id: str | None = None,
        durable_name: str | None = None,
        prefetch: int | None = None,
        headers: Mapping[str, str] | None = None,
        callback: Callable[[Message], Any] | None = None,
    ) -> Subscription:
        """Subscribe and wait until the broker confirmed it (RECEIPT).

        ``durable_name`` makes a durable topic subscription (needs ``client_id``).
        ``callback`` receives every message on the event loop instead of the queue.
        """
        self._check_open()
        if ack not in ("auto", "client", "client-individual"):
            raise ValueError(f"ack mode {ack!r}: use auto, client or client-individual")
        dest = stomp_destination(destination)
        sub_id = id or self._next_id("sub")
        if sub_id in self._subs:
            raise ValueError(f"subscription id {sub_id!r} is already in use")
        sub_headers = {"destination": dest, "id": sub_id, "ack": ack, **dict(headers or {})}
        if durable_name:
            if not self.client_id:
                raise ValueError("a durable subscription needs client_id")
            sub_headers["activemq.subscriptionName"] = durable_name
        if prefetch is not None:
            sub_headers["activemq.prefetchSize"] = str(prefetch)
        sub = Subscription(self, sub_id, dest, ack, sub_headers, callback)
        sub._active = asyncio.get_running_loop().create_future()
        self._subs[sub_id] = sub
        if self._connected.is_set() and self._conn is not None:
            self._write_subscribe(self._conn, sub)
        try:
            async with asyncio.timeout(self._timeout_s()):
                await asyncio.shield(sub._active)
        except TimeoutError:
            self._subs.pop(sub_id, None)
            sub._close()
            raise FailoverTimeoutError(
                f"subscribe to {dest}: not confirmed within {self.options.timeout} ms"
            ) from None
        except BaseException:
            self._subs.pop(sub_id, None)
            sub._close()
            raise
        return sub

    def _write_subscribe(self, conn: _Connection, sub: Subscription) -> None:
        receipt = self._next_id("sub-r")
        frame = Frame("SUBSCRIBE", {**sub.headers, "receipt": receipt})
        future = asyncio.get_running_loop().create_future()
        self._controls[receipt] = _Control(
            "subscribe", frame, future, self._generation, subscription=sub
        )
        try:
            conn.write(frame)
        except ConnectionError:
            self._controls.pop(receipt, None)

    async def unsubscribe(self, subscription: Subscription, *, remove_durable: bool = False
                          ) -> None:
        """Stop a subscription; ``remove_durable`` also deletes the durable subscription
        on the broker (retried after a reconnect until confirmed)."""
        self._check_open()
        self._subs.pop(subscription.id, None)
        subscription._close()
        headers = {"id": subscription.id}
        if remove_durable and subscription.durable_name:
            headers["activemq.subscriptionName"] = subscription.durable_name
        replay = "activemq.subscriptionName" in headers
        if not replay and not self.connected:
            return  # the next connection will simply not have it
        receipt = self._next_id("unsub")
        frame = Frame("UNSUBSCRIBE", {**headers, "receipt": receipt})
        control = _Control(
            "unsubscribe", frame, asyncio.get_running_loop().create_future(),
            self._generation, replay=replay,
        )
        self._controls[receipt] = control
        if self.connected and self._conn is not None:
            self._write_control(self._conn, control)
        async with asyncio.timeout(self._timeout_s()):
            await asyncio.shield(control.future)

    # -- acknowledgements ------------------------------------------------------------

    async def ack(self, message: Message, *, transaction: str | None = None) -> bool:
        """ACK and wait for the broker's confirmation. False: not confirmed (reported in
        ``unconfirmed_acks`` and to the listener); it may come again, flagged redelivered."""
        return await self._acknowledge("ACK", message, transaction)

    async def nack(self, message: Message, *, transaction: str | None = None) -> bool:
        """NACK (redeliver or dead-letter); False when not confirmed, as for ack()."""
        return await self._acknowledge("NACK", message, transaction)

    async def _acknowledge(self, command: str, message: Message, tx_id: str | None) -> bool:
        self._check_open()
        if message.subscription.ack == "auto":
            raise ValueError(f"{message.subscription} uses ack=auto: nothing to acknowledge")
        conn = self._conn
        if message.generation != self._generation or conn is None or not self.connected:
            self._unconfirmed(message, "the connection that delivered it is gone")
            return False
        headers = self._ack_headers(conn, message)
        if tx_id is not None:
            tx = self._transaction(tx_id)
            headers["transaction"] = tx_id
            frame = Frame(command, headers)
            tx.frames.append(frame)
            tx.has_acks = True
            if not tx.broken:
                self._write_quietly(frame)
            return True
        receipt = self._next_id("ack")
        headers["receipt"] = receipt
        control = _Control(
            command.lower(), Frame(command, headers), asyncio.get_running_loop().create_future(),
            self._generation, message=message,
        )
        self._controls[receipt] = control
        self._write_control(conn, control)
        return await asyncio.shield(control.future)

    @staticmethod
    def _ack_headers(conn: _Connection, message: Message) -> dict[str, str]:
        if conn.protocol.version == "1.2":
            return {"id": message.ack_id}
        return {"message-id": message.message_id, "subscription": message.subscription.id}

    def _unconfirmed(self, message: Message, reason: str) -> None:
        self.unconfirmed_acks.append(message)
        self._notify("on_exception", AckNotConfirmedError(message, reason))

    # -- transactions ----------------------------------------------------------------

    async def begin(self, transaction: str | None = None) -> str:
        """Start a transaction; returns its id for send/ack/commit/abort."""
        self._check_open()
        tx_id = transaction or self._next_id("tx")
        if tx_id in self._txs:
            raise ValueError(f"transaction {tx_id!r} is already open")
        self._txs[tx_id] = _Transaction(tx_id)
        self._write_quietly(Frame("BEGIN", {"transaction": tx_id}))
        return tx_id

    async def commit(self, transaction: str) -> None:
        """Commit and wait for the broker's RECEIPT. A transaction of sends only survives
        a failover (it is replayed with the same identities); one with acks raises
        TransactionRolledBackError (or ...OutcomeUnknownError) if its connection dropped."""
        await self._end_transaction("COMMIT", transaction)

    async def abort(self, transaction: str) -> None:
        """Roll back; after a failover there is nothing left to roll back on the broker."""
        await self._end_transaction("ABORT", transaction)

    async def _end_transaction(self, command: str, tx_id: str) -> None:
        self._check_open()
        tx = self._transaction(tx_id)
        if tx.end is not None:
            raise ValueError(f"transaction {tx_id!r} is already ending")
        if tx.broken:
            del self._txs[tx_id]
            if command == "ABORT":
                return
            raise TransactionRolledBackError(
                f"transaction {tx_id} was rolled back: its connection dropped and it held "
                "acks, which cannot be replayed"
            )
        receipt = self._next_id(command.lower())
        control = _Control(
            command.lower(), Frame(command, {"transaction": tx_id, "receipt": receipt}),
            asyncio.get_running_loop().create_future(), self._generation, replay=True,
            transaction=tx,
        )
        tx.end = control
        self._controls[receipt] = control
        if self.connected and self._conn is not None:
            self._write_tx_end(self._conn, tx)
        try:
            async with asyncio.timeout(self._timeout_s()):
                await asyncio.shield(control.future)
        finally:
            if control.future.done():
                self._txs.pop(tx_id, None)

    def _write_tx_end(self, conn: _Connection, tx: _Transaction) -> None:
        assert tx.end is not None
        try:
            conn.write(tx.end.frame)
            tx.end_written = True
        except ConnectionError:
            pass

    def _transaction(self, tx_id: str) -> _Transaction:
        try:
            return self._txs[tx_id]
        except KeyError:
            raise ValueError(f"no open transaction {tx_id!r}") from None

    # -- helpers ---------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._failure is not None:
            raise ClientClosedError(f"client failed: {self._failure}") from self._failure
        if self.closed:
            raise ClientClosedError("client is closed")
        if self._supervisor is None:
            raise ClientError("call connect() first")

    def _timeout_s(self) -> float | None:
        return self.options.timeout / 1000 if self.options.timeout > 0 else None

    def _next_id(self, prefix: str) -> str:
        return f"{prefix}-{next(self._ids)}" if prefix else str(next(self._ids))

    def _write_quietly(self, frame: Frame) -> None:
        """Write if connected; otherwise the reconnect restores it (transactions)."""
        conn = self._conn
        if conn is not None and self._connected.is_set():
            with contextlib.suppress(ConnectionError):
                conn.write(frame)

    def _write_control(self, conn: _Connection, control: _Control) -> None:
        with contextlib.suppress(ConnectionError):  # else settled by _interrupted
            conn.write(control.frame)

    def _call_user(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run an application callback on the loop without letting it hurt the transport."""
        try:
            result = fn(*args)
            if inspect.isawaitable(result):
                task = asyncio.ensure_future(result)
                self._user_tasks.add(task)
                task.add_done_callback(self._user_task_done)
        except Exception:
            log.exception("callback %r failed", fn)

    def _user_task_done(self, task: asyncio.Task[Any]) -> None:
        self._user_tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("callback task failed", exc_info=task.exception())

    def _notify(self, name: str, *args: Any) -> None:
        method = getattr(self.listener, name, None) if self.listener is not None else None
        if callable(method):
            self._call_user(method, *args)

    # -- frames from the broker ------------------------------------------------------

    def _on_frame(self, conn: _Connection, frame: Frame) -> None:
        if conn is not self._conn:
            return  # a late frame of a connection we already left
        self._notify("on_command", frame)
        command = frame.command
        if command == "MESSAGE":
            sub = self._subs.get(frame.headers.get("subscription", ""))
            if sub is None:
                log.debug("MESSAGE for unknown subscription %r", frame.headers.get("subscription"))
            else:
                sub._deliver(Message(frame, sub, self._generation))
        elif command == "RECEIPT":
            self._on_receipt(frame.headers.get("receipt-id", ""))
        elif command == "ERROR":
            self._on_error(conn, frame)
        if command in ("MESSAGE", "RECEIPT"):
            self._cluster_update(frame)

    def _on_receipt(self, receipt: str) -> None:
        pending = self._sends.get(receipt)
        if pending is not None:
            self._forget_send(receipt)
            if not pending.future.done():
                pending.future.set_result(pending.result)
            return
        control = self._controls.pop(receipt, None)
        if control is None:
            return
        if control.kind == "subscribe" and control.subscription is not None:
            active = control.subscription._active
            if active is not None and not active.done():
                active.set_result(None)
        if not control.future.done():
            control.future.set_result(True)

    def _on_error(self, conn: _Connection, frame: Frame) -> None:
        """ERROR: the broker closes the connection after it. A request it names was
        refused (not retried); everything else is resent after the reconnect."""
        log.warning(
            "ERROR from %s: %s %s", conn.uri, frame.headers.get("message", ""),
            frame.body.decode("utf-8", "replace").strip()[:200],
        )
        receipt = frame.headers.get("receipt-id")
        if not receipt:
            return
        error = BrokerRefusedError(frame)
        pending = self._sends.get(receipt)
        if pending is not None:
            self._forget_send(receipt)
            if not pending.future.done():
                pending.future.set_exception(error)
            return
        control = self._controls.pop(receipt, None)
        if control is None:
            return
        if control.kind == "subscribe" and control.subscription is not None:
            sub = control.subscription
            self._subs.pop(sub.id, None)
            sub._close()
            if sub._active is not None and not sub._active.done():
                sub._active.set_exception(error)
        if control.transaction is not None:
            self._txs.pop(control.transaction.id, None)
        if control.message is not None:
            self._unconfirmed(control.message, str(error))
            if not control.future.done():
                control.future.set_result(False)
        elif not control.future.done():
            control.future.set_exception(error)

    def _cluster_update(self, frame: Frame) -> None:
        """``amqlite.clusterURIs`` / ``amqlite.rebalance`` (module docstring)."""
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
            if conn is not None and conn.uri != self._updated[0] and not self._on_priority(conn):
                log.info("broker asks to rebalance to %s", self._updated[0])
                self._rebalance = True
                self._wake.set()

    def _on_priority(self, conn: _Connection) -> bool:
        return is_priority(conn.uri, self.options, self._configured)

    # -- the failover loop -----------------------------------------------------------

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
                    raise ConnectionFailedError(
                        f"connection to {conn.uri} lost ({_describe(reason)}) and reconnect "
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

    async def _establish(self) -> _Connection:
        """Reconnect passes until a broker accepts (ActiveMQ ``doReconnect``)."""
        self._rebalance = False
        self._wake.clear()
        while True:
            if self.closed:
                raise ClientClosedError("client is closed")
            ready = self._take_standby()
            if ready is not None:
                return ready
            await self._pause(self._policy.wait_before_pass())
            self._reload_update_file()
            try:
                uris = await self._connect_list()
            except ConnectionFailedError:
                raise
            except Exception as exc:
                uris, last_error = [], exc
            else:
                last_error = None
            for uri in uris:
                if self.closed:
                    raise ClientClosedError("client is closed")
                conn = _Connection(uri)
                try:
                    await conn.open(
                        login=self.login, passcode=self.passcode, headers=self.connect_headers
                    )
                    return conn
                except ProtocolError as exc:
                    if exc.fault == "local":
                        raise ConnectionFailedError(f"cannot build CONNECT: {exc}") from exc
                    last_error = exc
                except (OSError, TimeoutError, ConnectRefusedError) as exc:
                    last_error = exc
                log.debug("connect to %s failed: %s", uri, _describe(last_error))
            if not uris and last_error is None:
                found = f": discovery {self.url.discovery!r} found no broker" \
                    if self.url.kind == "discovery" else ""
                last_error = ConnectionError(f"no URIs to connect to{found}")
            outcome = self._policy.pass_failed()
            listed = ", ".join(map(str, uris))
            if outcome.give_up:
                raise ConnectionFailedError(
                    f"failed to connect to [{listed}] after {outcome.failures} attempt(s): "
                    f"{_describe(last_error)}"
                )
            if outcome.warn:
                log.warning(
                    "failed to connect to [%s] after %d attempt(s), continuing to retry: %s",
                    listed, outcome.failures, _describe(last_error),
                )
            await self._pause(outcome.delay_ms)

    async def _pause(self, delay_ms: float) -> None:
        if delay_ms <= 0:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay_ms / 1000):
                await self._closing.wait()

    def _take_standby(self) -> _Connection | None:
        for attr in ("_switch_to", "_standby"):
            conn: _Connection | None = getattr(self, attr)
            setattr(self, attr, None)
            if conn is not None and not conn.closed:
                return conn
        return None

    async def _connect_list(self, exclude: TcpURI | None = None) -> list[TcpURI]:
        configured = self._configured
        if self.url.kind == "discovery":
            configured = await self._resolve()
        updated = self._updated if self.options.update_uris_supported else []
        order = connect_order(
            configured, updated, failed=self._failed_uri,
            randomize=self.options.randomize, rng=self._rng,
        )
        return [u for u in order if u != exclude]

    async def _resolve(self) -> list[TcpURI]:
        agent = self.url.discovery or ""
        resolver = self.resolver or _find_resolver(agent)
        if resolver is None:
            raise ConnectionFailedError(f"no discovery resolver for {agent!r}")
        if inspect.iscoroutinefunction(resolver):
            found = await resolver(agent)
        else:
            found = await asyncio.to_thread(resolver, agent)
            if inspect.isawaitable(found):
                found = await found
        uris: list[TcpURI] = []
        for text in found:
            try:
                uri = parse_tcp_uri(text, self._nested)
            except URIError as exc:
                log.warning("discovery %s returned a bad URI: %s", agent, exc)
                continue
            if uri not in uris:
                uris.append(uri)
        if not uris:
            log.info("discovery %s resolved no broker", agent)
        return uris

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

    def _activate(self, conn: _Connection) -> None:
        """Make ``conn`` the active connection and restore the client's state on it, all
        in one step of the loop so no new request can slip in between."""
        self._generation += 1
        self._conn = conn
        self.connected_uri = conn.uri
        self._failed_uri = None
        self._policy.connected()
        conn.start(self._on_frame)
        try:
            for sub in list(self._subs.values()):
                self._write_subscribe(conn, sub)
            for control in list(self._controls.values()):
                if control.replay and control.transaction is None:
                    control.generation = self._generation
                    conn.write(control.frame)
            for tx in list(self._txs.values()):
                if tx.broken:
                    continue
                conn.write(Frame("BEGIN", {"transaction": tx.id}))
                for frame in tx.frames:
                    conn.write(frame)
                if tx.end is not None:
                    self._write_tx_end(conn, tx)
        except ConnectionError:
            pass  # lost again at once: _watch sees conn.lost
        self._connected.set()
        # Every send without RECEIPT, in sequence order: re-sends (same identity) first,
        # then what waited for this connection.
        for key, pending in list(self._sends.items()):
            if pending.written_gen != self._generation:
                self._write_send(key, pending)
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

    async def _watch(self, conn: _Connection) -> BaseException | str | None:
        """Wait until the connection is lost, or a rebalance / priority switch is due."""
        while True:
            wake = asyncio.ensure_future(self._wake.wait())
            closing = asyncio.ensure_future(self._closing.wait())
            try:
                await asyncio.wait([conn.lost, wake, closing], return_when="FIRST_COMPLETED")
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

    def _interrupted(self, conn: _Connection, reason: BaseException | str | None) -> None:
        """The active connection is gone: settle what depended on it."""
        moving = isinstance(reason, str)
        self._conn = None
        self._connected.clear()
        if not moving:
            self._failed_uri = conn.uri
            if conn.uri in self._updated:
                self._updated.remove(conn.uri)  # as ActiveMQ's updated.remove(failed)
        conn.close(graceful=moving)
        if self._standby_task is not None:
            self._standby_task.cancel()
            self._standby_task = None
        text = reason if isinstance(reason, str) else _describe(reason)
        log.warning("connection to %s interrupted: %s", conn.uri, text)
        self.interruptions.append(Interruption(time.monotonic(), str(conn.uri), text))
        generation = self._generation
        for receipt, control in list(self._controls.items()):
            if control.transaction is not None:
                continue  # settled with its transaction below
            if control.replay:
                continue
            del self._controls[receipt]
            if control.message is not None:
                self._unconfirmed(control.message, f"connection lost before its RECEIPT ({text})")
            if not control.future.done():
                control.future.set_result(False)
        for tx in list(self._txs.values()):
            if not tx.has_acks:
                continue
            tx.broken = True
            if tx.end is not None:
                self._controls.pop(tx.end.frame.headers["receipt"], None)
                self._txs.pop(tx.id, None)
                if tx.end.kind == "abort":
                    tx.end.future.set_result(True)  # the broker dropped it anyway
                elif tx.end_written:
                    tx.end.future.set_exception(TransactionOutcomeUnknownError(
                        f"transaction {tx.id}: connection lost after COMMIT, before its "
                        "RECEIPT; it held acks so it cannot be replayed"))
                else:
                    tx.end.future.set_exception(TransactionRolledBackError(
                        f"transaction {tx.id} was rolled back: connection lost ({text})"))
        for tx in self._txs.values():
            tx.end_written = False
        for sub in self._subs.values():
            if sub.ack != "auto":
                sub._drop_undelivered(generation)
        self._notify("on_interrupted")

    # -- standby connections (backup / priorityBackup) -------------------------------

    async def _standby_loop(self, active: _Connection) -> None:
        """Keep a warm standby (backup) and/or poll the priority broker (priorityBackup)."""
        policy = ReconnectPolicy(self.options)
        policy.connected()
        try:
            while not self.closed and self._conn is active and not active.closed:
                want_priority = self.options.priority_backup and not self._on_priority(active)
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
                    conn = _Connection(uri)
                    try:
                        await conn.open(
                            login=self.login, passcode=self.passcode,
                            headers=self.connect_headers,
                        )
                    except (OSError, TimeoutError, ProtocolError, ConnectRefusedError) as exc:
                        log.debug("standby connect to %s failed: %s", uri, _describe(exc))
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

    def _on_standby_frame(self, conn: _Connection, frame: Frame) -> None:
        if frame.command == "ERROR":
            log.info("standby %s: ERROR %s", conn.uri, frame.headers.get("message", ""))

    # -- giving up ---------------------------------------------------------------------

    def _fail(self, exc: BaseException) -> None:
        self._failure = exc
        self._shutdown(exc)
        self._notify("on_exception", exc)

    def _shutdown(self, exc: BaseException) -> None:
        """Close every connection and fail everything still pending."""
        if self._first is not None and not self._first.done():
            self._first.set_exception(exc)
            self._first.exception()  # retrieved here; connect() re-raises it
        self.closed = True
        self._closing.set()
        self._connected.clear()
        for attr in ("_conn", "_standby", "_switch_to"):
            conn = getattr(self, attr)
            setattr(self, attr, None)
            if conn is not None:
                conn.close()
        if self._standby_task is not None:
            self._standby_task.cancel()
        for pending in self._sends.values():
            if not pending.future.done():
                pending.future.set_exception(exc)
                pending.future.exception()
        self._sends.clear()
        for control in self._controls.values():
            if not control.future.done():
                if control.message is not None:
                    control.future.set_result(False)
                else:
                    control.future.set_exception(exc)
                    control.future.exception()
        self._controls.clear()
        for sub in self._subs.values():
            if sub._active is not None and not sub._active.done():
                sub._active.set_exception(exc)
                sub._active.exception()
            sub._close()


def _describe(exc: BaseException | None) -> str:
    if exc is None:
        return "closed"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _update_path(url: str | None) -> str | None:
    if not url:
        return None
    if url.startswith("file:"):
        return unquote(urlsplit(url).path)
    return url


def _check_update_url(url: str | None) -> None:
    if url and "://" in url and not url.startswith("file:"):
        raise URIError(f"updateURIsURL {url!r}: only local files (a path or file://) are read")


# --- blocking facade -----------------------------------------------------------------------


class SyncSubscription:
    """A subscription of the blocking ``Client``."""

    def __init__(self, client: Client, subscription: Subscription) -> None:
        self._client = client
        self.subscription = subscription

    @property
    def id(self) -> str:
        return self.subscription.id

    @property
    def destination(self) -> str:
        return self.subscription.destination

    def receive(self, timeout: float | None = None) -> Message | None:
        """The next message, or None after ``timeout`` seconds or once unsubscribed."""
        return self._client._run(self.subscription.receive(timeout))

    def __iter__(self) -> Iterator[Message]:
        while True:
            message = self.receive()
            if message is None:
                return
            yield message


class Client:
    """Blocking API over ``AsyncClient``: same arguments, same semantics.

    The asyncio client runs on a private event loop in a daemon thread; every method
    submits a coroutine there and waits. Listener and subscription callbacks run on that
    loop thread: they must not block and must not call this blocking API (use
    ``client.async_client`` coroutines from there).
    """

    def __init__(self, broker_url: str | BrokerURL, **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run_loop, name="amqlite-client",
                                        daemon=True)
        self._thread.start()
        self._ready.wait()
        try:
            self.async_client: AsyncClient = self._run(_make_client(broker_url, kwargs))
        except BaseException:
            self.close()
            raise

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.call_soon(self._ready.set)
        self._loop.run_forever()
        self._loop.close()

    def _run(self, coro: Awaitable[_T], timeout: float | None = None) -> _T:
        if threading.current_thread() is self._thread:
            if inspect.iscoroutine(coro):
                coro.close()
            raise RuntimeError("blocking Client call from its own loop thread (a callback?): "
                               "use client.async_client coroutines there")
        future = asyncio.run_coroutine_threadsafe(_awaitable(coro), self._loop)
        try:
            return future.result(timeout)
        except BaseException:
            future.cancel()
            raise

    # state
    @property
    def connected(self) -> bool:
        return self.async_client.connected

    @property
    def connected_uri(self) -> TcpURI | None:
        return self.async_client.connected_uri

    @property
    def producer_id(self) -> str:
        return self.async_client.producer_id

    @property
    def unconfirmed_acks(self) -> list[Message]:
        return self.async_client.unconfirmed_acks

    @property
    def interruptions(self) -> list[Interruption]:
        return self.async_client.interruptions

    @property
    def resent(self) -> int:
        return self.async_client.resent

    # calls
    def connect(self, timeout: float | None = None) -> None:
        self._run(self.async_client.connect(), timeout)

    def send(self, destination: str, body: bytes | str = b"",
             headers: Mapping[str, str] | None = None, **kwargs: Any) -> SendResult:
        return self._run(self.async_client.send(destination, body, headers, **kwargs))

    def subscribe(self, destination: str, **kwargs: Any) -> SyncSubscription:
        sub = self._run(self.async_client.subscribe(destination, **kwargs))
        return SyncSubscription(self, sub)

    def unsubscribe(self, subscription: SyncSubscription, *, remove_durable: bool = False
                    ) -> None:
        self._run(self.async_client.unsubscribe(subscription.subscription,
                                                remove_durable=remove_durable))

    def ack(self, message: Message, *, transaction: str | None = None) -> bool:
        return self._run(self.async_client.ack(message, transaction=transaction))

    def nack(self, message: Message, *, transaction: str | None = None) -> bool:
        return self._run(self.async_client.nack(message, transaction=transaction))

    def begin(self, transaction: str | None = None) -> str:
        return self._run(self.async_client.begin(transaction))

    def commit(self, transaction: str) -> None:
        self._run(self.async_client.commit(transaction))

    def abort(self, transaction: str) -> None:
        self._run(self.async_client.abort(transaction))

    def disconnect(self, timeout: float = DISCONNECT_TIMEOUT_S) -> None:
        if self._loop.is_running() and hasattr(self, "async_client"):
            self._run(self.async_client.disconnect(timeout))

    def close(self) -> None:
        """Disconnect and stop the loop thread. Idempotent."""
        if not self._thread.is_alive():
            return
        with contextlib.suppress(Exception):
            self.disconnect()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()

    def __enter__(self) -> Client:
        self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def _make_client(broker_url: str | BrokerURL, kwargs: dict[str, Any]) -> AsyncClient:
    return AsyncClient(broker_url, **kwargs)


async def _awaitable(value: Awaitable[_T]) -> _T:
    return await value
