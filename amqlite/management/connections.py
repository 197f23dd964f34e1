"""The management listener's open connections, bounded (issue 23).

aiohttp limits what one request may hold (line, header and body sizes) but not how many
sockets are open, nor how long a request's head may take to arrive: a client opening
thousands of idle keep-alive sockets, or trickling a request's headers a byte at a time
(slowloris), holds memory and file descriptors without limit. Every socket of the
listener (HTTP or HTTPS) goes through an ``HttpSocket`` in front of aiohttp's own
protocol, counted in the listener's ``HttpConnections``:

- at most ``MAX_HTTP_CONNECTIONS`` are open; past that the one that has waited longest
  without a request being handled (idle since its accept or its last answer, in its TLS
  handshake, or still sending a request's head) is closed, so a client connecting now
  gets in; only when every one of them is handling a request is the new socket refused;
- a request's head must arrive within ``HEADER_TIMEOUT`` of its first byte;
- an idle connection is closed after ``KEEPALIVE_TIMEOUT`` (aiohttp's
  ``keepalive_timeout``, which also runs from the accept until the first request).

Whether a request is being handled is told by ``ManagementServer``'s outermost middleware
(``begin``/``end``, keyed by ``request.protocol``).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import socket
import ssl
from collections.abc import Callable
from typing import cast

from aiohttp import web

log = logging.getLogger(__name__)

#: Sockets open on the management listener at once. Its clients are an operator's
#: browser (six connections per host at most), a Prometheus scraper and the CLI: a few
#: dozen at most; 256 leaves room for several consoles and scripts, and file
#: descriptors for the STOMP side.
MAX_HTTP_CONNECTIONS = 256
#: Of those, sockets still in their TLS handshake: a browser opens a few at a time, so
#: 32 is many; past it the oldest goes (a flood of half-open handshakes delays a real
#: client by nothing but its own handshake).
MAX_HTTP_HANDSHAKES = 32
#: Seconds from a request's first byte to its whole head (request line and headers):
#: a client sends it in one write, a slow link in well under a second; Go servers are
#: commonly given 10 s (``ReadHeaderTimeout``), Apache's mod_reqtimeout 20.
HEADER_TIMEOUT = 10.0
#: Seconds an idle connection is kept (aiohttp's ``keepalive_timeout``, default about an
#: hour). The console asks every 2 s, so its connection stays; nginx keeps 75 s, Apache
#: 5 s; a client whose connection was closed opens another.
KEEPALIVE_TIMEOUT = 15.0
#: Log one line for the first closing and then every this many (a flood is not a line
#: a socket).
LOG_EVERY = 1000


class Phase(enum.Enum):
    """Where one socket of the listener is."""

    HANDSHAKE = "handshake"  # TLS handshake in progress (HTTPS)
    IDLE = "idle"            # waiting for a request: no byte of it yet
    HEAD = "head"            # part of a request's head arrived, not all of it
    BUSY = "busy"            # a request is being handled


class HttpConnection:
    """One socket: how to close it, its phase, its header timer and aiohttp's
    protocol for it (the key ``request.protocol`` gives)."""

    __slots__ = ("abort", "handler", "phase", "timer")

    def __init__(self, abort: Callable[[], None], phase: Phase) -> None:
        self.abort = abort
        self.phase = phase
        self.handler: asyncio.BaseProtocol | None = None
        self.timer: asyncio.TimerHandle | None = None

    def stop_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


class HttpConnections:
    """The sockets of one management listener, with the caps above. ``waiting`` holds
    those not handling a request, in the order they began to wait: the first is the one
    closed when a new socket needs room."""

    def __init__(self, max_connections: int = MAX_HTTP_CONNECTIONS,
                 max_handshakes: int = MAX_HTTP_HANDSHAKES,
                 header_timeout: float = HEADER_TIMEOUT) -> None:
        self.max_connections = max_connections
        self.max_handshakes = max_handshakes
        self.header_timeout = header_timeout
        self.open: set[HttpConnection] = set()
        self.waiting: dict[HttpConnection, None] = {}      # insertion order: oldest first
        self.handshaking: dict[HttpConnection, None] = {}  # the same, in their handshake
        self.handlers: dict[asyncio.BaseProtocol, HttpConnection] = {}
        #: Sockets closed by a cap or a timeout, by reason (logged every LOG_EVERY).
        self.closed: dict[str, int] = {}

    def accepted(self, conn: HttpConnection) -> bool:
        """A socket was accepted: counted (True), making room by closing the longest
        waiting one, or refused (False: the caller closes it) when all are busy."""
        if len(self.open) >= self.max_connections:
            oldest = next(iter(self.waiting), None)
            if oldest is None:
                self._count("max connections, all busy: refused")
                return False
            self._close(oldest, "max connections: closed the longest waiting")
        self.open.add(conn)
        self.waiting[conn] = None
        if conn.phase is Phase.HANDSHAKE:
            self.handshaking[conn] = None
            while len(self.handshaking) > self.max_handshakes:
                self._close(next(iter(self.handshaking)), "handshakes in progress")
        return True

    def started(self, conn: HttpConnection, handler: asyncio.BaseProtocol) -> None:
        """aiohttp's protocol takes over the socket (after its TLS handshake, if any):
        idle from now."""
        self.handlers[handler] = conn
        conn.handler = handler
        if conn.phase is Phase.HANDSHAKE and conn in self.open:
            self.handshaking.pop(conn, None)
            self._wait(conn)

    def received(self, conn: HttpConnection) -> None:
        """Bytes arrived: an idle connection is now sending a request's head, which has
        ``header_timeout`` to complete."""
        if conn.phase is Phase.IDLE and conn in self.open:
            conn.phase = Phase.HEAD
            conn.timer = asyncio.get_running_loop().call_later(
                self.header_timeout, self._header_late, conn)

    def begin(self, handler: asyncio.BaseProtocol) -> None:
        """A request's head arrived and its handler runs: not closed to make room."""
        conn = self.handlers.get(handler)
        if conn is not None:
            conn.stop_timer()
            conn.phase = Phase.BUSY
            self.waiting.pop(conn, None)

    def end(self, handler: asyncio.BaseProtocol) -> None:
        """Its handler returned: the connection waits for the next request."""
        conn = self.handlers.get(handler)
        if conn is not None and conn in self.open:
            self._wait(conn)

    def lost(self, conn: HttpConnection) -> None:
        conn.stop_timer()
        self.open.discard(conn)
        self.waiting.pop(conn, None)
        self.handshaking.pop(conn, None)
        if conn.handler is not None:
            self.handlers.pop(conn.handler, None)

    def close_all(self) -> None:
        """The listener stops: what aiohttp does not know of yet (TLS handshakes) goes
        too."""
        for conn in list(self.handshaking):
            self._close(conn, None)

    def _wait(self, conn: HttpConnection) -> None:
        conn.stop_timer()
        conn.phase = Phase.IDLE
        self.waiting.pop(conn, None)
        self.waiting[conn] = None  # the newest waiting

    def _header_late(self, conn: HttpConnection) -> None:
        conn.timer = None
        if conn.phase is Phase.HEAD:
            self._close(conn, f"request head not complete within {self.header_timeout:g} s")

    def _close(self, conn: HttpConnection, why: str | None) -> None:
        self.lost(conn)  # at once: connection_lost comes on a later turn of the loop
        if why is not None:
            self._count(why)
        conn.abort()

    def _count(self, why: str) -> None:
        n = self.closed[why] = self.closed.get(why, 0) + 1
        if n == 1 or n % LOG_EVERY == 0:
            log.warning("management HTTP: closing sockets: %s (%d so far)", why, n)


class HttpSocket(asyncio.Protocol):
    """The protocol of one management socket, in front of aiohttp's: counted in
    ``HttpConnections`` from its accept (or, behind an ``HttpTlsGate``, from the gate's)
    to its close, its bytes reported, everything else passed through."""

    def __init__(self, handler: asyncio.Protocol, limits: HttpConnections,
                 conn: HttpConnection | None = None) -> None:
        self.handler = handler
        self.limits = limits
        self.conn = conn  # set by an HttpTlsGate; plain HTTP makes its own at accept
        self.started = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self.conn is None:
            raw = cast(asyncio.Transport, transport)
            self.conn = HttpConnection(raw.abort, Phase.IDLE)
            if not self.limits.accepted(self.conn):
                raw.abort()
                return
        self.limits.started(self.conn, self.handler)
        self.started = True
        self.handler.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self.conn is not None:
            self.limits.received(self.conn)
        self.handler.data_received(data)

    def eof_received(self) -> bool | None:
        return self.handler.eof_received() if self.started else None

    def pause_writing(self) -> None:
        self.handler.pause_writing()

    def resume_writing(self) -> None:
        self.handler.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.conn is not None:
            self.limits.lost(self.conn)
        if self.started:
            self.handler.connection_lost(exc)


class HttpSite(web.SockSite):
    """aiohttp's SockSite for plain HTTP, with an ``HttpSocket`` in front of each
    connection (``protocol``: what each accepted socket gets)."""

    def __init__(self, runner: web.BaseRunner, sock: socket.socket, limits: HttpConnections,
                 backlog: int, context: ssl.SSLContext | None = None) -> None:
        super().__init__(runner, sock, ssl_context=context, backlog=backlog)
        self.limits = limits

    def protocol(self, loop: asyncio.AbstractEventLoop, server: web.Server) -> asyncio.BaseProtocol:
        return HttpSocket(server(), self.limits)

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registered with the runner, as SockSite does
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None
        self._server = await loop.create_server(
            lambda: self.protocol(loop, server), sock=self._sock, backlog=self._backlog)
