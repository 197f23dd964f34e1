"""STOMP over WebSocket (RFC 6455): the HTTP upgrade and the WebSocket framing in front
of a ``ClientConnection``, which then runs exactly as on a TCP or TLS socket.

``WsGate`` is the asyncio protocol of one accepted socket (behind a ``TlsGate`` for
wss://). It admits the connection at TCP accept, as the TCP listener does, so the
upgrade itself counts against max_connections and max_unauthenticated and runs inside
connect_timeout; it checks ``Host`` (the management API's ``HostGuard``) and ``Origin``
(403 before any STOMP), picks the subprotocol, and then hands every message's payload to
the connection's ``data_received`` and its frames back as WebSocket messages
(``WsTransport``). Limits, logins, authorization, memory budgets, flow control and the
RECEIPT promise are the connection's, unchanged: a paused connection pauses this socket.

Why not aiohttp's ``WebSocketResponse``: aiohttp reads a whole message (up to its
max_msg_size) before the handler sees a byte and owns the socket until the upgrade is
done, so neither the pre-login budgets (max_handshake_bytes, connect_timeout from
accept) nor the memory budget of partial frames could hold. The upgrade is read by
wsproto (sans-I/O, on h11), the frames after it by ``amqlite.wsframes``, which hands
payload over as it arrives; our own frames are written here.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    Event,
    RejectConnection,
    RejectData,
    Request,
)
from wsproto.utilities import ProtocolError as WsProtocolError

from amqlite.hosts import HostGuard, MisdirectedRequest
from amqlite.wire import SUPPORTED_VERSIONS, WS_PATH, WS_SUBPROTOCOLS
from amqlite.wsframes import FrameError, FrameReader, Kind

if TYPE_CHECKING:
    from amqlite.server import ClientConnection

log = logging.getLogger(__name__)

#: ``ws_allowed_origins`` value letting pages of any origin connect.
ANY_ORIGIN = "*"
#: Close code after the STOMP connection ended (an ERROR, a DISCONNECT): RFC 6455's
#: normal closure; the reason is in the STOMP ERROR frame sent before it.
CLOSE_NORMAL = 1000


#: After an HTTP error the socket's write side is shut and what the client still sends is
#: read and dropped, for at most this long, before the socket closes: closing a socket
#: with unread bytes sends a reset, which can destroy the answer before the client reads
#: it (a client still sending an oversized upgrade request). nginx lingers up to 5 s
#: (lingering_timeout); this socket has not logged in, so less.
LINGER_SECONDS = 2.0

#: The blank line that ends an HTTP request's head (h11 accepts bare LF lines too).
HEAD_END = re.compile(rb"\n\r?\n")

#: RFC 6455 section 5.2: FIN and the data opcodes, and the payload length forms.
OPCODE_TEXT = 0x81
OPCODE_BINARY = 0x82
OPCODE_CLOSE = 0x88
OPCODE_PONG = 0x8A
_LEN_16, _LEN_64 = 126, 127


def data_frame_header(opcode: int, length: int) -> bytes:
    """The header of one final, unmasked server frame of ``length`` payload bytes."""
    if length < _LEN_16:
        return bytes((opcode, length))
    if length < 1 << 16:
        return bytes((opcode, _LEN_16)) + length.to_bytes(2, "big")
    return bytes((opcode, _LEN_64)) + length.to_bytes(8, "big")


class OriginError(ValueError):
    """A ``ws_allowed_origins`` entry that is no origin."""


def parse_origins(text: str) -> list[str]:
    """``ws_allowed_origins`` as normalised origins (``scheme://host[:port]``, lower case,
    no path), or ``["*"]``; OriginError for an entry that is none."""
    origins = []
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        if entry == ANY_ORIGIN:
            origins.append(ANY_ORIGIN)
            continue
        parts = urlsplit(entry)
        if parts.scheme not in ("http", "https") or not parts.netloc or \
                parts.path.strip("/") or parts.query or parts.fragment:
            raise OriginError(f"{entry!r} is not an origin: write scheme://host:port "
                              "(http or https, no path), or *")
        origins.append(f"{parts.scheme}://{parts.netloc}".lower())
    return origins


def console_origins(url: str | None, names: Iterable[str]) -> list[str]:
    """The management console's own origin in every spelling its listener answers to
    (``url`` is its base URL, ``names`` its ``HostGuard`` names): the default of
    ``ws_allowed_origins``. None when there is no console."""
    if not url:
        return []
    parts = urlsplit(url)
    port = f":{parts.port}" if parts.port else ""
    hosts = {parts.hostname or "", *names}
    return sorted(f"{parts.scheme}://{f'[{h}]' if ':' in h else h}{port}"
                  for h in hosts if h)


def choose_subprotocol(offered: Iterable[str]) -> str | None:
    """The best STOMP subprotocol the client offered (the highest version), None when it
    offered none of ours: then no Sec-WebSocket-Protocol is sent and CONNECT's
    accept-version alone decides, as on TCP (docs/websocket.md)."""
    ours = [p for p in offered if p in WS_SUBPROTOCOLS]
    if not ours:
        return None
    return max(ours, key=lambda p: SUPPORTED_VERSIONS.index(WS_SUBPROTOCOLS[p]))


def versions_up_to(subprotocol: str | None) -> tuple[str, ...]:
    """The STOMP versions CONNECT may negotiate under ``subprotocol``: it names the
    version the server will speak at most."""
    if subprotocol is None:
        return SUPPORTED_VERSIONS
    top = SUPPORTED_VERSIONS.index(WS_SUBPROTOCOLS[subprotocol])
    return SUPPORTED_VERSIONS[:top + 1]


class WsPolicy:
    """What one WebSocket listener accepts: the ``Host`` names (``HostGuard``) and the
    ``Origin`` of a page. A request without ``Origin`` is no browser's (browsers send it
    with every WebSocket) and passes; so does the listener's own origin, which serves
    no page a browser could show."""

    def __init__(self, hosts: HostGuard, origins: Iterable[str], *, tls: bool) -> None:
        self.hosts = hosts
        self.origins = frozenset(origins)
        self.tls = tls

    def refusal(self, request: Request) -> tuple[int, str] | None:
        """(status, reason) when the upgrade is refused, None when it may go on."""
        if urlsplit(request.target).path != WS_PATH:
            return 404, f"STOMP over WebSocket is served at {WS_PATH}"
        try:
            self.hosts.check_host_value(request.host)
        except MisdirectedRequest as exc:
            return 421, str(exc)
        headers = {name.lower(): value for name, value in request.extra_headers}
        raw_origin = headers.get(b"origin")
        if raw_origin is None or ANY_ORIGIN in self.origins:
            return None
        origin = raw_origin.decode("latin-1").strip().lower().rstrip("/")
        own = {f"{scheme}://{request.host.lower()}" for scheme in ("http", "https")}
        if origin in self.origins or origin in own:
            return None
        return 403, (f"pages of origin {origin[:100]!r} may not connect "
                     "(ws_allowed_origins)")


class WsState(enum.Enum):
    UPGRADING = "upgrading"  # HTTP request not answered yet
    OPEN = "open"  # STOMP flows in WebSocket messages
    REFUSED = "refused"  # an HTTP error sent; the client's bytes dropped until it closes
    CLOSING = "closing"  # our close frame sent; the client's frames dropped until its own
    CLOSED = "closed"


class WsGate(asyncio.Protocol):
    """One accepted WebSocket socket in front of its ClientConnection (see the module)."""

    def __init__(self, conn: ClientConnection, policy: WsPolicy, *, behind_tls: bool,
                 max_request_bytes: int) -> None:
        self.conn = conn
        self.policy = policy
        self.behind_tls = behind_tls
        self.max_request_bytes = max_request_bytes
        self.ws = WSConnection(ConnectionType.SERVER)  # the upgrade
        self.reader = FrameReader()  # the frames after it
        self.raw: asyncio.Transport | None = None
        self.state = WsState.UPGRADING
        #: The upgrade request's head as it arrives, handed to wsproto once complete:
        #: h11 under wsproto refuses an incomplete head past 16 KiB with a 400, so fed
        #: piece by piece a request within max_handshake_bytes was refused or not
        #: depending on how the bytes happened to arrive.
        self.head = bytearray()
        self.subprotocol: str | None = None
        #: Answer in text messages while the client speaks text (stompjs does by default;
        #: RabbitMQ answers text too), binary once it sends binary or a frame is no UTF-8.
        self.client_text = True
        self.linger: asyncio.TimerHandle | None = None

    @property
    def done(self) -> bool:
        return self.state in (WsState.REFUSED, WsState.CLOSED)

    @property
    def closing(self) -> bool:
        """In the closing handshake (``close``): what comes in is read for its close frame."""
        return self.state is WsState.CLOSING

    # -- asyncio.Protocol (the raw TCP or TLS transport) -----------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.raw = transport  # type: ignore[assignment]  # a stream transport
        if not self.behind_tls:  # the TlsGate admitted it already at TCP accept
            self.conn.tcp_accepted(self.raw)  # type: ignore[arg-type]

    def data_received(self, data: bytes) -> None:
        if self.closing:
            self._frames(data)
            return
        if self.done or self.conn.closed:
            return
        if self.state is WsState.OPEN:
            self._frames(data)
            return
        searched = max(0, len(self.head) - 2)
        self.head += data
        if len(self.head) > self.max_request_bytes:
            self._reject(431, "upgrade request too large")
            return
        if HEAD_END.search(self.head, searched) is None:
            return  # more to come, within max_handshake_bytes and connect_timeout
        request, self.head = bytes(self.head), bytearray()  # not kept for the socket's life
        try:
            self.ws.receive_data(request)
            for event in self.ws.events():
                if isinstance(event, Request):
                    self._upgrade(event)
                    return  # wsproto keeps no bytes behind a server's request
        except WsProtocolError as exc:
            hint = getattr(exc, "event_hint", None)
            self._reject(hint.status_code if isinstance(hint, RejectConnection) else 400,
                         str(exc))
            return
        self._reject(400, "no request line before the blank line")  # only blank lines

    def _frames(self, data: bytes) -> None:
        """The client's frames (amqlite.wsframes): payload to the STOMP connection."""
        try:
            items = self.reader.feed(data)
        except FrameError as exc:
            log.info("closing WebSocket of %s: %s", self.conn.peer, exc)
            self.close(exc.code)
            return
        for item in items:
            if self.closing:  # the closing handshake: only the client's close frame counts
                if item.kind is Kind.CLOSE:
                    self._drop()
                    return
                continue
            if item.kind is Kind.DATA:
                self.client_text = item.text
                self.conn.data_received(item.payload)
            elif item.kind is Kind.PING:
                self._write(OPCODE_PONG, item.payload)
            else:  # CLOSE: answered with the client's code, then the socket goes
                self.close(item.code)
            if self.done or (self.conn.closed and not self.closing):
                return

    def _upgrade(self, request: Request) -> None:
        refusal = self.policy.refusal(request)
        if refusal is not None:
            status, reason = refusal
            log.info("refusing WebSocket from %s: %d %s", self.conn.peer, status, reason)
            self._reject(status, reason)
            return
        self.subprotocol = choose_subprotocol(request.subprotocols)
        self.conn.proto.supported_versions = versions_up_to(self.subprotocol)
        self._send(AcceptConnection(subprotocol=self.subprotocol))
        self.state = WsState.OPEN
        self.conn.connection_made(WsTransport(self))  # STOMP from here on

    def _reject(self, status: int, reason: str) -> None:
        body = f"{reason}\n".encode()
        with contextlib.suppress(WsProtocolError):
            self._send(RejectConnection(status_code=status, has_body=True, headers=[
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode())]))
            self._send(RejectData(data=body))
        raw = self.raw
        if raw is None or raw.is_closing() or not raw.can_write_eof():  # TLS: no half-close
            self._drop()
            return
        # A lingering close: the answer, then our FIN; the client's bytes are read and
        # dropped (data_received) until its own FIN (eof_received) or LINGER_SECONDS.
        self.state = WsState.REFUSED
        raw.write_eof()
        self.linger = asyncio.get_running_loop().call_later(LINGER_SECONDS, self._drop)

    def eof_received(self) -> bool | None:
        return None  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.state = WsState.CLOSED
        if self.linger is not None:
            self.linger.cancel()
        self.conn.connection_lost(exc)

    def pause_writing(self) -> None:
        self.conn.pause_writing()

    def resume_writing(self) -> None:
        self.conn.resume_writing()

    # -- what WsTransport asks ----------------------------------------------------
    def _send(self, event: Event) -> None:
        """An HTTP answer of the upgrade (wsproto's handshake)."""
        if self.raw is not None and not self.raw.is_closing():
            self.raw.write(self.ws.send(event))

    def _write(self, opcode: int, payload: bytes) -> None:
        if self.raw is not None and not self.raw.is_closing():
            self.raw.write(data_frame_header(opcode, len(payload)) + payload)

    def send_stomp(self, data: bytes) -> None:
        """Frames (one or more, or a heart-beat EOL) as one WebSocket message: framed
        here, not by wsproto, whose send costs ~20 times as much (a data frame of ours is
        one unfragmented, unmasked, extension-less frame: no state to keep)."""
        if self.state is not WsState.OPEN or self.raw is None or self.raw.is_closing():
            return
        opcode = OPCODE_BINARY
        if self.client_text:
            try:
                data.decode()
                opcode = OPCODE_TEXT
            except UnicodeDecodeError:  # a binary body: this message goes as bytes
                pass
        self.raw.write(data_frame_header(opcode, len(data)) + data)

    def close(self, code: int | None = CLOSE_NORMAL, linger: bool = False) -> None:
        """Close the WebSocket (close frame, then the socket once what is queued went).
        With ``linger`` (an ERROR to a logged-in client), the closing handshake of RFC
        6455 (5.5.1) first: the client's frames are read and dropped until its own close
        frame, its FIN or LINGER_SECONDS, so the socket goes with nothing unread, in a FIN
        and not a reset that can destroy the ERROR and the close frame before they are
        read (as ``ClientConnection.close`` does on plain TCP)."""
        if self.state is WsState.OPEN:
            self._write(OPCODE_CLOSE, b"" if code is None else code.to_bytes(2, "big"))
            if linger and self.raw is not None and not self.raw.is_closing():
                self.state = WsState.CLOSING
                self.linger = asyncio.get_running_loop().call_later(LINGER_SECONDS,
                                                                    self._drop)
                return
        self._drop()

    def _drop(self) -> None:
        self.state = WsState.CLOSED
        if self.linger is not None:
            self.linger.cancel()
        if self.raw is not None and not self.raw.is_closing():
            self.raw.close()


class WsTransport(asyncio.Transport):
    """What a ClientConnection writes to and pauses: the WebSocket of its ``WsGate``.
    Each write is one message; reading and write-buffer flow control are the socket's."""

    def __init__(self, gate: WsGate) -> None:
        super().__init__()
        self._gate = gate
        assert gate.raw is not None
        self._raw: asyncio.Transport = gate.raw

    def write(self, data: bytes | bytearray | memoryview[Any]) -> None:
        self._gate.send_stomp(bytes(data))

    def close(self, linger: bool = False) -> None:
        self._gate.close(linger=linger)

    def abort(self) -> None:
        self._gate.state = WsState.CLOSED
        self._raw.abort()

    def is_closing(self) -> bool:
        return self._gate.state is not WsState.OPEN or self._raw.is_closing()

    def pause_reading(self) -> None:
        self._raw.pause_reading()

    def resume_reading(self) -> None:
        self._raw.resume_reading()

    def is_reading(self) -> bool:
        return self._raw.is_reading()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "subprotocol":
            return self._gate.subprotocol
        return self._raw.get_extra_info(name, default)

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._raw.set_write_buffer_limits(high, low)

    def get_write_buffer_size(self) -> int:
        return self._raw.get_write_buffer_size()

