"""The asyncio side of STOMP: sockets, timers, limits, the CONNECT handshake.

Everything protocol-shaped is in the sans-I/O ``StompProtocol``; everything
messaging-shaped is in ``Broker``. This module only moves bytes and time.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import uuid
from typing import TYPE_CHECKING

from amqlite import __version__
from amqlite.broker import Broker, BrokerError
from amqlite.codec import Frame, Limits, ProtocolError
from amqlite.protocol import HEARTBEAT_GRACE, FrameReceived, StompProtocol

if TYPE_CHECKING:
    from amqlite.auth import Authenticator
    from amqlite.settings import Settings

log = logging.getLogger(__name__)

#: A socket must send CONNECT this soon or it is closed; an idle socket would
#: otherwise hold a connection slot forever (ActiveMQ: connectAttemptTimeout 30 s).
CONNECT_TIMEOUT = 30.0
#: Transport write buffer limits: above HIGH we stop dispatching to this
#: client (its socket is slow), below LOW we resume.
WRITE_BUFFER_HIGH = 4 * 1024 * 1024
WRITE_BUFFER_LOW = 1 * 1024 * 1024
#: Headers our client (amqlite.client) reads to learn the group's URIs.
CLUSTER_URIS_HEADER = "amqlite.clusterURIs"
REBALANCE_HEADER = "amqlite.rebalance"
CLUSTER_UPDATE_RECEIPT = "amqlite.cluster-update"


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
        self.server: asyncio.base_events.Server | None = None
        self.session_ids = itertools.count(1)
        self.session_prefix = uuid.uuid4().hex[:8]
        self.cluster_uris: list[str] = [settings.advertise]

    async def start(self) -> None:
        host, port = self.settings.bind_address
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(
            lambda: ClientConnection(self), host, port, reuse_address=True, backlog=512
        )

    def stop_accepting(self) -> None:
        if self.server is not None:
            self.server.close()

    def pause_reading(self) -> None:
        for conn in list(self.connections):
            conn.pause_reading("stopping")

    # -- cluster URIs pushed to clients (ActiveMQ's updateClusterClients) ------------
    def cluster_headers(self, rebalance: bool = False) -> dict[str, str]:
        if not self.settings.update_cluster_clients or not self.cluster_uris:
            return {}
        headers = {CLUSTER_URIS_HEADER: ",".join(self.cluster_uris)}
        if rebalance:
            headers[REBALANCE_HEADER] = "true"
        return headers

    def set_cluster_uris(self, uris: list[str], push: bool) -> None:
        """Remember the group's client URIs (master first); with ``push``, tell
        every connected client now, on a RECEIPT no client asked for (the only
        server frame STOMP allows outside a request; stomp.py ignores it)."""
        self.cluster_uris = list(uris)
        if not push or not self.settings.update_cluster_clients:
            return
        headers = {"receipt-id": CLUSTER_UPDATE_RECEIPT,
                   **self.cluster_headers(self.settings.rebalance_cluster_clients)}
        for conn in list(self.connections):
            if conn.connected:
                conn.write_frame(Frame("RECEIPT", dict(headers)))

    def close_all(self, reason: str) -> None:
        for conn in list(self.connections):
            conn.close_with_error(reason)

    async def wait_closed(self) -> None:
        if self.server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.server.wait_closed(), 5)


class ClientConnection(asyncio.Protocol):
    """One client socket."""

    def __init__(self, server: StompServer) -> None:
        self.server = server
        self.broker = server.broker
        self.loop = asyncio.get_event_loop()
        self.proto = StompProtocol("server", server.limits)
        self.transport: asyncio.Transport | None = None
        self.client_id: str | None = None
        self.version = "1.0"
        self.closed = False
        self.connected = False
        self.authenticating = False
        self.backlog: list[Frame] = []  # frames that arrived while CONNECT was checked
        self.writable = True
        self.pause_reasons: set[str] = set()  # reading resumes when none is left
        self.last_rx = self.loop.time()
        self.last_tx = self.last_rx
        self.timers: list[asyncio.TimerHandle] = []
        self.peer = "?"
        #: Frames encoded this loop iteration, written with one send at its end:
        #: a commit releases a RECEIPT or a dozen MESSAGEs per connection at once,
        #: and one syscall (and one TCP segment) each would cost more than the frames.
        self._out: list[bytes] = []
        #: Bytes in self._out: counted like the transport's buffer, so one
        #: dispatch cannot encode a whole backlog before the transport pushes back.
        self._out_bytes = 0
        self._flush_handle: asyncio.Handle | None = None

    # -- asyncio.Protocol ------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment] # uvloop's is not a subclass
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        transport.set_write_buffer_limits(WRITE_BUFFER_HIGH, WRITE_BUFFER_LOW)
        if len(self.server.connections) >= self.server.settings.max_connections:
            log.warning("refusing %s: max_connections=%d reached", self.peer,
                        self.server.settings.max_connections)
            self.closed = True
            transport.write(self.proto.error(ProtocolError(
                "too many connections",
                f"this broker allows {self.server.settings.max_connections}")))
            transport.close()
            return
        self.server.connections.add(self)
        self.timers.append(self.loop.call_later(CONNECT_TIMEOUT, self._connect_timeout))

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        self.last_rx = self.loop.time()
        try:
            events = self.proto.receive_data(data)
        except ProtocolError as exc:
            self._protocol_failed(exc)
            return
        for event in events:
            if self.closed:
                return
            if isinstance(event, FrameReceived):
                self._on_frame(event.frame)

    def eof_received(self) -> bool | None:
        return None  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._out.clear()
        self._out_bytes = 0
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
        self.broker.connection_writable(self)

    # -- Client interface used by the broker --------------------------------------------
    def write_frame(self, frame: Frame) -> None:
        if self.closed or self.transport is None:
            return
        data = self.proto.send(frame)
        self._out.append(data)
        self._out_bytes += len(data)
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
        held_back = self._out_bytes >= WRITE_BUFFER_HIGH
        self._out_bytes = 0
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(out[0] if len(out) == 1 else b"".join(out))
            self.last_tx = self.loop.time()
            if held_back and self.writable and not self.closed:
                self.broker.connection_writable(self)  # can_write() said no until now

    def can_write(self) -> bool:
        return self.writable and self._out_bytes < WRITE_BUFFER_HIGH

    def close_with_error(self, message: str, detail: str = "", receipt: str | None = None) -> None:
        if self.closed or self.transport is None:
            return
        # The client's request was refused: its fault, reported in its ERROR frame.
        exc = ProtocolError(message, detail, receipt_id=receipt)
        self._flush()
        with contextlib.suppress(Exception):
            self.transport.write(self.proto.error(exc))
        self.close()

    def close(self) -> None:
        self._flush()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()  # flushes what is buffered, then closes
        self.closed = True
        self.broker.detach(self)

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
            self.transport.resume_reading()
            self.last_rx = self.loop.time()  # its silence while paused was ours

    # -- frames ------------------------------------------------------------------------
    def _protocol_failed(self, exc: ProtocolError) -> None:
        log.info("closing %s: %s (%s fault)", self.peer, exc.message, exc.fault)
        if self.transport is not None and not self.closed:
            self._flush()
            with contextlib.suppress(Exception):
                self.transport.write(self.proto.error(exc))
        self.close()

    def _on_frame(self, frame: Frame) -> None:
        if self.authenticating:
            self.backlog.append(frame)
            return
        if not self.connected:
            self._on_connect(frame)
            return
        try:
            self.broker.handle(self, frame)
        except BrokerError as exc:
            self.close_with_error(str(exc), receipt=frame.headers.get("receipt"))

    def _on_connect(self, frame: Frame) -> None:
        login = frame.headers.get("login")
        if not self.server.auth.enabled:
            self._accept(frame)
            return
        self.authenticating = True
        future = asyncio.ensure_future(asyncio.to_thread(
            self.server.auth.check, login, frame.headers.get("passcode")))

        def checked(f: asyncio.Future[bool]) -> None:
            self.authenticating = False
            if self.closed:
                return
            if f.cancelled() or f.exception() is not None or not f.result():
                log.warning("authentication failed for login %r from %s", login, self.peer)
                self.close_with_error("authentication failed", "bad login or passcode")
                return
            self._accept(frame)
            backlog, self.backlog = self.backlog, []
            for queued in backlog:
                if self.closed:
                    return
                self._on_frame(queued)

        future.add_done_callback(checked)

    def _accept(self, frame: Frame) -> None:
        assert self.transport is not None
        session = f"{self.server.session_prefix}-{next(self.server.session_ids)}"
        try:
            reply = self.proto.accept_connect(
                frame,
                server_heartbeat=self.server.settings.heartbeat_ms,
                extra_headers={"server": f"amqlite/{__version__}", "session": session,
                               **self.server.cluster_headers()},
            )
        except ProtocolError as exc:
            self._protocol_failed(exc)
            return
        self.version = self.proto.version
        self.client_id = frame.headers.get("client-id") or None
        self.connected = True
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

    # -- timers ------------------------------------------------------------------------
    def _schedule(self, delay: float, fn) -> None:
        self.timers = [t for t in self.timers if not t.cancelled()]
        self.timers.append(self.loop.call_later(delay, fn))

    def _connect_timeout(self) -> None:
        if not self.connected and not self.closed:
            self.close_with_error("no CONNECT frame", f"send CONNECT within {CONNECT_TIMEOUT}s")

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
