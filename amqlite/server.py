"""The asyncio side of STOMP: sockets, timers, limits, the CONNECT handshake.

Everything protocol-shaped is in the sans-I/O ``StompProtocol``; everything
messaging-shaped is in ``Broker``. This module only moves bytes and time.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import itertools
import logging
import ssl
import time
import uuid
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, cast

from amqlite import __version__
from amqlite.auth import CheckOutcome, CheckQueue, CredentialCache, PendingCheck, crowded_out
from amqlite.broker import Broker, BrokerError
from amqlite.broker.memory import WRITE_SHARE
from amqlite.codec import Frame, Limits, ProtocolError
from amqlite.hosts import HostGuard
from amqlite.listen import STOMP_BACKLOG, listen_all, naming
from amqlite.protocol import HEARTBEAT_GRACE, Event, FrameReceived, StompProtocol
from amqlite.settings import default_max_unauthenticated
from amqlite.stomp_tls import TlsGate
from amqlite.validation import check_connect
from amqlite.websocket import LINGER_SECONDS, WsGate, WsPolicy, WsTransport, parse_origins
from amqlite.wire import CLUSTER_UPDATE_RECEIPT, CLUSTER_URIS_HEADER, REBALANCE_HEADER

if TYPE_CHECKING:
    from amqlite.auth import Authenticator
    from amqlite.settings import Settings

log = logging.getLogger(__name__)

#: How often slow frames are looked for, at most (a fraction of frame_timeout, see
#: StompServer._sweep): one timer for the server, not one per partial read on the hot path.
SWEEP_INTERVAL_MAX = 1.0
SWEEP_INTERVAL_MIN = 0.05
#: A closed connection's last frames (its ERROR, DISCONNECT's RECEIPT) get this long to
#: be read; then the socket is dropped: a client that does not read keeps no memory.
CLOSE_LINGER = 10.0
#: After an ERROR to a logged-in client on plain TCP, its socket stays half-closed this
#: long, what it still sends read and dropped: closed with unread bytes, the kernel sends
#: a reset instead of our FIN, and a client whose system drops unread data on a reset
#: (Windows) loses the ERROR. Apache httpd lingers as long (SECONDS_TO_LINGER = 2).
ERROR_LINGER = LINGER_SECONDS


class StompServer:
    """Owns the listening socket and every client connection of one master."""

    def __init__(self, settings: Settings, broker: Broker, auth: Authenticator) -> None:
        self.settings = settings
        self.broker = broker
        self.auth = auth
        self.limits = Limits(
            max_frame_size=settings.max_frame_size,
            max_header_count=settings.max_header_count,
            max_header_length=settings.max_header_length,
        )
        self.connections: set[ClientConnection] = set()
        #: Sockets without CONNECTED yet, oldest first (a dict keeps insertion order).
        self.unauthenticated: dict[ClientConnection, None] = {}
        self.checks = CheckQueue(auth, cache=CredentialCache())
        #: Settings.resolved() fills 0 in; a Settings built by hand may still hold it.
        self.max_unauthenticated = (settings.max_unauthenticated
                                   or default_max_unauthenticated(settings.max_connections))
        #: Sockets refused since the last sweep, by reason: logged as one line per sweep,
        #: since a flood would otherwise write a log line per socket.
        self.refused: collections.Counter[str] = collections.Counter()
        self._sweep_handle: asyncio.TimerHandle | None = None
        #: One listening server per listener: plain ``bind`` and/or TLS ``ssl_bind``.
        self.servers: list[asyncio.base_events.Server] = []
        self.session_ids = itertools.count(1)
        self.session_prefix = uuid.uuid4().hex[:8]
        self.cluster_uris: list[str] = settings.advertise_uris
        #: The same for pages on the WebSocket listeners: the group's ws(s):// URLs.
        self.ws_cluster_uris: list[str] = settings.websocket_uris
        #: Origins allowed on the WebSocket listeners when ws_allowed_origins is empty:
        #: the management console's (the node sets them once its HTTP listener is up).
        self.console_origins: list[str] = []

    async def start(self) -> None:
        """Listen on ``bind`` and/or ``ssl_bind``; OSError (with the address in
        ``listener``) when one cannot be bound, after closing those already open."""
        s = self.settings
        listeners: list[tuple[str, tuple[str, int], ssl.SSLContext | None]] = []
        if s.plain_enabled:
            listeners.append((s.bind, s.bind_address, None))
        if s.ssl_address is not None:
            listeners.append((s.ssl_bind, s.ssl_address, s.ssl_context()))
        loop = asyncio.get_running_loop()
        factories: list[Callable[[], asyncio.BaseProtocol]] = [
            functools.partial(ClientConnection, self) if context is None
            else functools.partial(self._tls_protocol, context)
            for _, _, context in listeners]
        for scheme, address in s.ws_listeners:  # STOMP over WebSocket (amqlite.websocket)
            context = s.ssl_context() if scheme == "wss" else None
            listeners.append((getattr(s, f"{scheme}_bind"), address, context))
            factories.append(functools.partial(self._ws_protocol, self._ws_policy(
                address[0], tls=context is not None), context))
        # Every listener listens before any serves (``listen_all``: the STOMP port last).
        # TLS listeners accept plain TCP and run TLS in a TlsGate, so a socket still in
        # its handshake is counted (max_connections, max_unauthenticated) and timed
        # (connect_timeout) like any before CONNECT.
        opened = await asyncio.to_thread(
            listen_all, [(name, address) for name, address, _ in listeners], STOMP_BACKLOG)
        try:
            for (name, _, _), socks, factory in zip(listeners, opened, factories, strict=True):
                while socks:  # handed over one by one: a failure closes the rest here
                    with naming(name):
                        self.servers.append(await loop.create_server(
                            factory, sock=socks[0], backlog=STOMP_BACKLOG))
                    socks.pop(0)
        except OSError:
            for sock in itertools.chain.from_iterable(opened):
                sock.close()
            for server in self.servers:
                server.close()
            self.servers.clear()
            raise
        self._schedule_sweep()

    def _tls_protocol(self, context: ssl.SSLContext) -> asyncio.BaseProtocol:
        return TlsGate(asyncio.get_running_loop(), ClientConnection(self, tls=True), context,
                       ssl_handshake_timeout=self.settings.connect_timeout)

    def _ws_policy(self, bind_host: str, tls: bool) -> WsPolicy:
        s = self.settings
        origins = parse_origins(s.ws_allowed_origins) or self.console_origins
        return WsPolicy(HostGuard(bind_host, s.http_allowed_hosts.split(",")), origins, tls=tls)

    def _ws_protocol(self, policy: WsPolicy,
                     context: ssl.SSLContext | None) -> asyncio.BaseProtocol:
        conn = ClientConnection(self, tls=context is not None, websocket=True)
        gate = WsGate(conn, policy, behind_tls=context is not None,
                      max_request_bytes=self.settings.max_handshake_bytes)
        if context is None:
            return gate
        return TlsGate(asyncio.get_running_loop(), conn, context, app=gate,
                       ssl_handshake_timeout=self.settings.connect_timeout)

    def stop_accepting(self) -> None:
        for server in self.servers:
            server.close()
        if self._sweep_handle is not None:
            self._sweep_handle.cancel()
            self._sweep_handle = None
        self.checks.close()

    # -- limits on unauthenticated and slow sockets ------------------------------------
    def admit_unauthenticated(self, conn: ClientConnection) -> None:
        """Count a new socket as unauthenticated; past the cap an old one goes, so a
        socket flood cannot lock out a client that is connecting now (``crowded_out``)."""
        limit = self.max_unauthenticated
        while len(self.unauthenticated) >= limit:
            oldest = crowded_out(self.unauthenticated, self.checks)
            del self.unauthenticated[oldest]
            self.refused[f"max_unauthenticated={limit} reached"] += 1
            oldest.close_with_error(
                "server busy", f"too many connections still logging in (limit {limit}); retry")
        self.unauthenticated[conn] = None

    def _schedule_sweep(self) -> None:
        interval = min(SWEEP_INTERVAL_MAX,
                       max(SWEEP_INTERVAL_MIN, self.settings.frame_timeout / 4))
        self._sweep_handle = asyncio.get_running_loop().call_later(interval, self._sweep)

    def _sweep(self) -> None:
        """Close connected clients whose current frame has been arriving for longer than
        frame_timeout (a trickler with heart-beat 0,0 would otherwise be held forever)."""
        self._sweep_handle = None
        self.close_slow(self.connections, asyncio.get_running_loop().time())
        for reason, count in self.refused.items():
            log.warning("closed %d socket(s) before login: %s", count, reason)
        self.refused.clear()
        counts = self.checks.take_counts()
        if counts["dropped"] or counts["busy"]:  # a flood: say what the login queue did
            log.warning("login checks: %(run)d run, %(dropped)d dropped unrun (socket closed), "
                        "%(busy)d refused (server busy), %(cached)d answered from the cache",
                        counts)
        self._schedule_sweep()

    def close_slow(self, conns: Iterable[ClientConnection], now: float) -> None:
        limit = self.settings.frame_timeout
        for conn in list(conns):
            since = conn.partial_since
            if since is not None and now - since > limit and not conn.pause_reasons:
                log.info("closing %s: frame incomplete after %.1fs", conn.peer, now - since)
                conn.close_with_error(
                    "frame timeout",
                    f"a frame must arrive within {limit:g}s of its first byte")

    def pause_reading(self) -> None:
        for conn in list(self.connections):
            conn.pause_reading("stopping")

    # -- cluster URIs pushed to clients (ActiveMQ's updateClusterClients) ------------
    def cluster_headers(self, rebalance: bool = False,
                        websocket: bool = False) -> dict[str, str]:
        """The cluster header for a client of the TCP/TLS listeners, or with
        ``websocket`` for a page, which can only open ws(s):// URLs."""
        uris = self.ws_cluster_uris if websocket else self.cluster_uris
        if not self.settings.update_cluster_clients or not uris:
            return {}
        headers = {CLUSTER_URIS_HEADER: ",".join(uris)}
        if rebalance:
            headers[REBALANCE_HEADER] = "true"
        return headers

    def set_cluster_uris(self, uris: list[str], push: bool,
                         ws_uris: list[str] | None = None) -> None:
        """Remember the group's client URIs (master first) and WebSocket URLs; with
        ``push``, tell every connected client now, on a RECEIPT no client asked for (the
        only server frame STOMP allows outside a request; stomp.py ignores it)."""
        self.cluster_uris = list(uris)
        if ws_uris is not None:
            self.ws_cluster_uris = list(ws_uris)
        if not push or not self.settings.update_cluster_clients:
            return
        rebalance = self.settings.rebalance_cluster_clients
        for conn in list(self.connections):
            if conn.connected:
                conn.write_frame(Frame("RECEIPT", {
                    "receipt-id": CLUSTER_UPDATE_RECEIPT,
                    **self.cluster_headers(rebalance, websocket=conn.websocket)}))

    def close_all(self, reason: str) -> None:
        for conn in list(self.connections):
            conn.close_with_error(reason, linger=False)  # the listener goes: no lingering

    async def wait_closed(self) -> None:
        for server in self.servers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 5)


class ClientConnection(asyncio.Protocol):
    """One client socket."""

    def __init__(self, server: StompServer, tls: bool = False, websocket: bool = False) -> None:
        self.server = server
        #: Behind a WsGate: its transport is the WebSocket (amqlite.websocket).
        self.websocket = websocket
        #: connection_lost ran (a TlsGate and a WsGate may both report one loss).
        self.lost = False
        #: Behind a TlsGate; ``handshaking`` while its handshake runs (the transport is
        #: then the raw TCP one: nothing STOMP may be written to it).
        self.tls = tls
        self.handshaking = False
        self.broker = server.broker
        self.loop = asyncio.get_event_loop()
        self.proto = StompProtocol("server", server.limits, hold_handshake=True)
        self.transport: asyncio.Transport | None = None
        self.client_id: str | None = None
        #: The socket is done with (refused, lost or closed by us): the transport's
        #: state, which the protocol does not know. Version and handshake are the
        #: protocol's (see the properties below).
        self.closed = False
        self.check: PendingCheck | None = None  # the login being checked
        #: loop time when the frame now arriving started; None between frames
        self.partial_since: float | None = None
        #: Bytes buffered for it, as counted in the broker's memory budget (partial frames).
        self.partial_held = 0
        #: The transport holds bytes its socket has not taken (pause_writing) ...
        self.writable = True
        #: ... this many when last asked (counted in the memory budget's output_bytes,
        #: as are ``_out_bytes``), and can_write() said no since (resume dispatch then).
        self._sent_held = 0
        self.refused = False
        self.pause_reasons: set[str] = set()  # reading resumes when none is left
        self.last_rx = self.loop.time()
        self.last_tx = self.last_rx
        self.timers: list[asyncio.TimerHandle] = []
        self.peer = "?"
        #: For the management API's connection list (wall clock, login as given).
        self.connected_at: float | None = None
        self.login: str | None = None
        #: Frames encoded this loop iteration, written with one send at its end:
        #: a commit releases a RECEIPT or a dozen MESSAGEs per connection at once,
        #: and one syscall (and one TCP segment) each would cost more than the frames.
        self._out: list[bytes] = []
        #: Bytes in self._out: counted like the transport's buffer, so one
        #: dispatch cannot encode a whole backlog before the transport pushes back.
        self._out_bytes = 0
        self._flush_handle: asyncio.Handle | None = None

    @property
    def version(self) -> str:
        """The negotiated STOMP version ("1.0" until CONNECTED)."""
        return self.proto.version

    @property
    def connected(self) -> bool:
        """CONNECTED was sent; stays true after DISCONNECT or an ERROR (``closed`` says
        whether the socket is still in use)."""
        return self.proto.handshake_done

    # -- asyncio.Protocol ------------------------------------------------------------
    def tcp_accepted(self, raw: asyncio.Transport) -> None:
        """TLS listener: the socket is accepted, its handshake begins."""
        self.handshaking = True
        self._admit(raw)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's is not a subclass of asyncio.Transport)
        transport = cast(asyncio.Transport, transport)
        if self.handshaking:  # TLS is up: counted and timed since tcp_accepted
            self.handshaking = False
            self.transport = transport
            if self.closed:  # closed by us as the handshake completed
                transport.abort()
                return
            self._watch_writes(transport)
            return
        self._admit(transport)

    def _watch_writes(self, transport: asyncio.Transport) -> None:
        """pause_writing as soon as the transport holds a byte, resume_writing once it
        holds none: what it holds is known (counted in the memory budget) without
        asking it on every write. (asyncio's TLS transport pauses at >= high.)"""
        transport.set_write_buffer_limits(1 if self.tls else 0, 0)

    def _admit(self, transport: asyncio.Transport) -> None:
        """Count a new socket (against max_connections, max_unauthenticated) and time
        it (connect_timeout), or refuse it."""
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        if not self.handshaking:  # a TLS socket's raw transport is TlsGate's
            self._watch_writes(transport)
        if len(self.server.connections) >= self.server.settings.max_connections:
            log.warning("refusing %s: max_connections=%d reached", self.peer,
                        self.server.settings.max_connections)
            self.closed = True
            if not self.handshaking:  # before TLS is up there is no way to say why
                transport.write(self.proto.error(ProtocolError(
                    "too many connections",
                    f"this broker allows {self.server.settings.max_connections}")))
            transport.close()
            return
        self.server.connections.add(self)
        self.server.admit_unauthenticated(self)
        self.timers.append(self.loop.call_later(self.server.settings.connect_timeout,
                                                self._connect_timeout))

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        now = self.last_rx = self.loop.time()
        try:
            events = self.proto.receive_data(data)
        except ProtocolError as exc:
            self._protocol_failed(exc)
            return
        if events:
            self._on_events(events)
            if self.closed:
                return
        buffered = self.proto.buffered
        if buffered != self.partial_held:
            self._hold_partial(buffered)
        if not buffered:
            self.partial_since = None
            return
        if not self.connected and buffered > self.server.settings.max_handshake_bytes:
            # A CONNECT still arriving, or bytes held behind one whose login is checked.
            self._protocol_failed(ProtocolError(
                "too much data before CONNECTED",
                f"{buffered} bytes buffered before the handshake completed, limit "
                f"{self.server.settings.max_handshake_bytes}; wait for CONNECTED"))
            return
        # Frame timing: a chunk that completed something started whatever is left over.
        if events or self.partial_since is None:
            self.partial_since = now

    def _on_events(self, events: list[Event]) -> None:
        for event in events:
            if self.closed:
                return
            if isinstance(event, FrameReceived):
                self._on_frame(event.frame)

    def eof_received(self) -> bool | None:
        return None  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        if self.lost:
            return
        self.lost = self.closed = True
        if self.partial_held:
            self._hold_partial(0)
        self._forget_handshake()
        self._out.clear()
        self.broker.memory.output_changed(-self._out_bytes - self._sent_held)
        self._out_bytes = self._sent_held = 0
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        for t in self.timers:
            t.cancel()
        self.timers.clear()
        self.server.connections.discard(self)
        self.broker.detach(self)

    def pause_writing(self) -> None:
        self.writable = False

    def resume_writing(self) -> None:
        self.writable = True
        self._sent(0)

    # -- Client interface used by the broker --------------------------------------------
    def write_frame(self, frame: Frame) -> None:
        if self.closed or self.transport is None:
            return
        self._write(self.proto.send(frame))

    def write_receipt(self, receipt: str) -> None:
        if self.closed or self.transport is None:
            return
        self._write(self.proto.receipt(receipt))

    def write_message(self, head: str, body: bytes) -> None:
        if self.closed or self.transport is None:
            return
        self._write(self.proto.message(head, body))

    def _write(self, data: bytes) -> None:
        self._out.append(data)
        n = len(data)
        self._out_bytes += n
        memory = self.broker.memory  # held from now: a MESSAGE frame is a copy
        memory.output_bytes += n
        memory.held_bytes += n
        if self._flush_handle is None:
            self._flush_handle = self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        """Write what this iteration produced; anything written directly to the
        transport (ERROR, heart-beat, CONNECTED) calls this first to keep order."""
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        if not self._out:
            return
        out, self._out = self._out, []
        flushed, self._out_bytes = self._out_bytes, 0
        transport = self.transport
        held = 0
        if transport is not None and not transport.is_closing():
            transport.write(out[0] if len(out) == 1 else b"".join(out))
            self.last_tx = self.loop.time()
            held = transport.get_write_buffer_size() if not self.writable else 0
        self._sent(held, flushed)

    def _sent(self, held: int, flushed: int = 0) -> None:
        """The transport holds ``held`` bytes now, ``flushed`` more were handed to it:
        the memory budget follows; a connection refused frames gets a dispatch."""
        delta = held - self._sent_held - flushed
        self._sent_held = held
        if delta:
            self.broker.memory.output_changed(delta)
        if self.refused and not self.closed and self.can_write():
            self.refused = False
            self.broker.connection_writable(self)

    def can_write(self) -> bool:
        """Below its WRITE_SHARE of encoded frames waiting, and the broker below its
        output budget; a connection with none waiting always gets one more."""
        held = self._out_bytes + self._sent_held
        if not held:
            return True
        memory = self.broker.memory
        if held < WRITE_SHARE and memory.output_bytes < memory.output_budget:
            return True
        self.refused = True
        return False

    def close_with_error(self, message: str, detail: str = "", receipt: str | None = None,
                         linger: bool = True) -> None:
        if self.closed or self.transport is None:
            return
        if self.handshaking:  # no TLS yet: the socket just goes
            self.close()
            return
        # The client's request was refused: its fault, reported in its ERROR frame.
        exc = ProtocolError(message, detail, receipt_id=receipt)
        self._flush()
        with contextlib.suppress(Exception):
            self.transport.write(self.proto.error(exc))
        self.close(linger)

    def close(self, linger: bool = False) -> None:
        """Close; with ``linger`` (after an ERROR to a logged-in client), a lingering
        close where it can be had: on plain TCP our FIN, then the client's bytes dropped
        until its own; on a WebSocket its closing handshake (``WsGate.close``); not over
        TLS (no half-close) nor before login (no more of our time for such a socket)."""
        self._flush()
        transport = self.transport
        if transport is not None and not transport.is_closing():
            linger = linger and self.connected
            if linger and self.pause_reasons:  # read (and drop) what the client still sends
                self.pause_reasons.clear()
                transport.resume_reading()
            if linger and not self.tls and not self.websocket and transport.can_write_eof():
                transport.write_eof()  # our FIN after the ERROR; eof_received closes
                self._schedule(CLOSE_LINGER if self._sent_held else ERROR_LINGER,
                               transport.abort)
            else:
                if isinstance(transport, WsTransport):
                    transport.close(linger=linger)  # lingering: its closing handshake
                else:
                    transport.close()  # flushes what is buffered, then closes
                if self._sent_held:  # not taken by the socket yet (a no-op once gone)
                    self.loop.call_later(CLOSE_LINGER, transport.abort)
        self.closed = True
        if self.partial_held:
            self._hold_partial(0)
        self._forget_handshake()
        self.broker.detach(self)

    def _forget_handshake(self) -> None:
        """No longer unauthenticated: a queued password check for this socket never runs."""
        self.server.unauthenticated.pop(self, None)
        if self.check is not None:
            self.server.checks.cancel(self.check)
            self.check = None

    def pause_reading(self, reason: str) -> None:
        """Stop reading from this client (flow control) until every reason is gone."""
        if self.transport is None or self.closed:
            return
        if not self.pause_reasons:
            self.transport.pause_reading()
        self.pause_reasons.add(reason)

    def resume_reading(self, reason: str) -> None:
        if reason not in self.pause_reasons:
            return
        self.pause_reasons.discard(reason)
        if not self.pause_reasons and self.transport is not None and not self.closed:
            if self.partial_since is not None:
                self.partial_since = self.loop.time()  # the pause was ours, not the client's
            self.transport.resume_reading()
            self.last_rx = self.loop.time()  # its silence while paused was ours

    # -- frames ------------------------------------------------------------------------
    def _protocol_failed(self, exc: ProtocolError) -> None:
        log.info("closing %s: %s (%s fault)", self.peer, exc.message, exc.fault)
        if self.transport is not None and not self.closed:
            self._flush()
            with contextlib.suppress(Exception):
                self.transport.write(self.proto.error(exc))
        self.close(linger=True)

    def _on_frame(self, frame: Frame) -> None:
        if not self.connected:
            self._on_connect(frame)
            return
        try:
            self.broker.handle(self, frame)
        except BrokerError as exc:
            self.close_with_error(str(exc), receipt=frame.headers.get("receipt"))
        except Exception:
            # A bug, not the client's fault: this client gets an ERROR (no traceback on
            # the wire), the log gets the traceback, every other client goes on.
            log.exception("closing %s: internal error handling %s", self.peer,
                          frame.command)
            self.close_with_error("internal error", f"the broker failed to handle {frame.command}",
                                  receipt=frame.headers.get("receipt"))

    def _on_connect(self, frame: Frame) -> None:
        """CONNECT parsed; whatever was pipelined behind it stays unparsed bytes in the
        protocol (hold_handshake) until CONNECTED is sent."""
        if not self.server.auth.enabled:
            self._accept(frame)
            return
        login = frame.headers.get("login")
        # Reading goes on while the check waits: what arrives stays bytes, bounded by
        # max_handshake_bytes (data_received), and a close is noticed at once, which
        # cancels the check. (A paused socket would not report its peer's close.)
        host = self.peer.rpartition(":")[0] or self.peer

        def checked(outcome: CheckOutcome) -> None:
            self.check = None
            if self.closed:
                return
            if outcome is CheckOutcome.BUSY:  # counted and logged by the queue
                self.close_with_error("server busy", "too many logins being checked; retry")
                return
            if outcome is not CheckOutcome.ACCEPTED:
                log.warning("authentication failed for login %r from %s", login, self.peer)
                self.close_with_error("authentication failed", "bad login or passcode")
                return
            self._accept(frame)

        self.check = self.server.checks.submit(host, login, frame.headers.get("passcode"),
                                               checked)

    def _accept(self, frame: Frame) -> None:
        assert self.transport is not None
        session = f"{self.server.session_prefix}-{next(self.server.session_ids)}"
        client_id = frame.headers.get("client-id") or None
        login = frame.headers.get("login") or None
        try:
            self.broker.check_client_id(client_id, login)
        except BrokerError as exc:
            self.close_with_error(str(exc), receipt=frame.headers.get("receipt"))
            return
        try:
            check_connect(frame.headers)  # a client-id the store cannot hold: ERROR
            reply = self.proto.accept_connect(
                frame,
                server_heartbeat=self.server.settings.heartbeat_ms,
                extra_headers={"server": f"amqlite/{__version__}", "session": session,
                               **self.server.cluster_headers(websocket=self.websocket)},
            )
        except ProtocolError as refused:  # not ``exc``: typed BrokerError above (mypyc)
            self._protocol_failed(refused)
            return
        self.client_id = client_id
        self.login = login
        self.connected_at = time.time()
        self._forget_handshake()
        for t in self.timers:
            t.cancel()
        self.timers.clear()
        self.transport.write(reply)
        self.last_tx = self.loop.time()
        self.broker.attach(self)
        hb = self.proto.heartbeat
        if hb.send_ms > 0:
            self._schedule(hb.send_ms / 1000, self._send_heartbeat)
        if hb.expect_ms > 0:
            self._schedule(hb.expect_ms / 1000, self._check_heartbeat)
        self._release_pipelined()

    def _release_pipelined(self) -> None:
        """Parse, with the negotiated version, what the client sent behind its CONNECT."""
        try:
            events = self.proto.release_handshake()
        except ProtocolError as exc:
            self._protocol_failed(exc)
            return
        if events:
            self._on_events(events)
        if not self.closed:
            self.partial_since = self.loop.time() if self.proto.buffered else None
            if self.proto.buffered != self.partial_held:
                self._hold_partial(self.proto.buffered)

    def _hold_partial(self, buffered: int) -> None:
        """Count a partial frame's bytes in the memory budget, which may stop reading
        from this connection (``MemoryBudget.partial_changed``)."""
        old, self.partial_held = self.partial_held, buffered
        self.broker.memory.partial_changed(self, old, buffered)

    # -- timers ------------------------------------------------------------------------
    def _schedule(self, delay: float, fn: Callable[[], object]) -> None:
        self.timers = [t for t in self.timers if not t.cancelled()]
        self.timers.append(self.loop.call_later(delay, fn))

    def _connect_timeout(self) -> None:
        if not self.connected and not self.closed:
            timeout = self.server.settings.connect_timeout
            self.close_with_error("handshake timeout",
                                  f"CONNECT must be sent and answered within {timeout:g}s")

    def _send_heartbeat(self) -> None:
        if self.closed or self.transport is None:
            return
        interval = self.proto.heartbeat.send_ms / 1000
        if self.loop.time() - self.last_tx >= interval * 0.9:
            self._flush()
            self.transport.write(self.proto.heartbeat_data())
            self.last_tx = self.loop.time()
        self._schedule(interval, self._send_heartbeat)

    def _check_heartbeat(self) -> None:
        if self.closed:
            return
        expect = self.proto.heartbeat.expect_ms / 1000
        silent = self.loop.time() - self.last_rx
        # While we do not read (flow control) its heart-beats wait in our socket.
        if silent > expect * HEARTBEAT_GRACE and not self.pause_reasons:
            log.info("closing %s: no heart-beat for %.1fs", self.peer, silent)
            self.close_with_error("heart-beat timeout", f"nothing received for {silent:.1f}s")
            return
        self._schedule(max(expect / 2, 0.05), self._check_heartbeat)
