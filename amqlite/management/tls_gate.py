"""HTTPS on the management listener with its TLS handshakes counted (issue 23).

aiohttp's own TLS (``create_server(ssl=...)``) holds every half-open handshake for its
whole timeout and counts none of them: a client opening sockets to the HTTPS port and
never finishing a handshake takes memory and file descriptors without limit. Here the
listener accepts plain TCP and runs TLS in an ``HttpTlsGate`` per socket, as the STOMP
listener does (``amqlite.server.TlsGate``), so that

- at most ``MAX_HTTP_CONNECTIONS`` sockets are open on it: past that a new one is closed
  at once (the STOMP listener's ``max_connections``);
- at most ``MAX_HTTP_HANDSHAKES`` of them are still in their handshake: past that the
  oldest handshake is closed, so a client connecting now gets in (its
  ``max_unauthenticated``);
- a handshake must complete within ``connect_timeout``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import socket
import ssl
from asyncio import sslproto
from typing import cast

from aiohttp import web

log = logging.getLogger(__name__)

#: Sockets open on the HTTPS listener at once. Its clients are an operator's browser
#: (six connections per host at most), a Prometheus scraper and the CLI: a few dozen
#: at most; 256 leaves room for several consoles and scripts, and file descriptors for
#: the STOMP side.
MAX_HTTP_CONNECTIONS = 256
#: Of those, sockets still in their TLS handshake: a browser opens a few at a time, so
#: 32 is many; past it the oldest goes (a flood of half-open handshakes delays a real
#: client by nothing but its own handshake).
MAX_HTTP_HANDSHAKES = 32


class HandshakeLimits:
    """The sockets of one HTTPS listener, and those still in their handshake (oldest
    first), with the caps above."""

    def __init__(self, max_connections: int = MAX_HTTP_CONNECTIONS,
                 max_handshakes: int = MAX_HTTP_HANDSHAKES) -> None:
        self.max_connections = max_connections
        self.max_handshakes = max_handshakes
        self.open: set[HttpTlsGate] = set()
        self.handshaking: dict[HttpTlsGate, None] = {}  # insertion order: oldest first
        #: Sockets closed by a cap since the last ``take_refused`` (logged in one line).
        self.refused = 0

    def accepted(self, gate: HttpTlsGate) -> bool:
        """A socket was accepted: counted (True), or past ``max_connections`` (False:
        the caller closes it)."""
        if len(self.open) >= self.max_connections:
            self._refuse("max connections", self.max_connections)
            return False
        self.open.add(gate)
        self.handshaking[gate] = None
        while len(self.handshaking) > self.max_handshakes:
            oldest = next(iter(self.handshaking))
            del self.handshaking[oldest]
            self._refuse("handshakes in progress", self.max_handshakes)
            oldest.abort()
        return True

    def handshake_over(self, gate: HttpTlsGate) -> None:
        self.handshaking.pop(gate, None)

    def lost(self, gate: HttpTlsGate) -> None:
        self.open.discard(gate)
        self.handshaking.pop(gate, None)

    def _refuse(self, what: str, limit: int) -> None:
        self.refused += 1
        if self.refused == 1 or self.refused % 1000 == 0:  # a flood: not a line a socket
            log.warning("management HTTPS: closing sockets past %s (%d); %d so far", what,
                        limit, self.refused)

    def close_all(self) -> None:
        """The listener stops: what is still in its handshake goes too (aiohttp only
        knows the connections whose handshake completed)."""
        for gate in list(self.handshaking):
            gate.abort()


class HttpTlsGate(sslproto.SSLProtocol):
    """The TLS layer of one socket of the HTTPS listener, counted in ``HandshakeLimits``
    from its accept to its close, as in its handshake until that completes."""

    def __init__(self, loop: asyncio.AbstractEventLoop, app: asyncio.BaseProtocol,
                 context: ssl.SSLContext, limits: HandshakeLimits,
                 handshake_timeout: float) -> None:
        waiter = loop.create_future()
        waiter.add_done_callback(self._handshake_over)
        super().__init__(loop, app, context, waiter, server_side=True,
                         ssl_handshake_timeout=math.ceil(handshake_timeout))
        self.limits = limits
        self.raw: asyncio.Transport | None = None
        self.started = False  # SSLProtocol.connection_made ran (not refused at once)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.raw = cast(asyncio.Transport, transport)
        if not self.limits.accepted(self):
            self.raw.abort()
            return
        self.started = True
        super().connection_made(transport)

    def _handshake_over(self, waiter: asyncio.Future[None]) -> None:
        # A failed handshake's exception is taken here, so asyncio does not log it as
        # never retrieved; the socket's close follows.
        if not waiter.cancelled():
            waiter.exception()
        self.limits.handshake_over(self)

    def abort(self) -> None:
        if self.raw is not None and not self.raw.is_closing():
            self.raw.abort()

    def connection_lost(self, exc: BaseException | None) -> None:
        self.limits.lost(self)
        if self.started:
            super().connection_lost(exc)


class GatedHttpsSite(web.SockSite):
    """aiohttp's SockSite, serving HTTPS through an HttpTlsGate per socket."""

    def __init__(self, runner: web.BaseRunner, sock: socket.socket,
                 context: ssl.SSLContext, handshake_timeout: float, backlog: int) -> None:
        super().__init__(runner, sock, ssl_context=context, backlog=backlog)
        self.context = context
        self.handshake_timeout = handshake_timeout
        self.limits = HandshakeLimits()

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registered with the runner, as SockSite does
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None
        self._server = await loop.create_server(
            lambda: HttpTlsGate(loop, server(), self.context, self.limits,
                                self.handshake_timeout),
            sock=self._sock, backlog=self._backlog)

    async def stop(self) -> None:
        await super().stop()
        self.limits.close_all()
