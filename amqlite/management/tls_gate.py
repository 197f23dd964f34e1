"""HTTPS on the management listener with its TLS handshakes counted (issue 23).

aiohttp's own TLS (``create_server(ssl=...)``) holds every half-open handshake for its
whole timeout and counts none of them: a client opening sockets to the HTTPS port and
never finishing a handshake takes memory and file descriptors without limit. Here the
listener accepts plain TCP and runs TLS in an ``HttpTlsGate`` per socket, as the STOMP
listener does (``amqlite.stomp_tls.TlsGate``), counted in the listener's
``HttpConnections`` (``amqlite.management.connections``) from its accept, so that

- at most ``MAX_HTTP_CONNECTIONS`` sockets are open on it, handshakes included (past
  that the longest waiting one is closed, or the new one when every one is busy);
- at most ``MAX_HTTP_HANDSHAKES`` of them are still in their handshake: past that the
  oldest handshake is closed, so a client connecting now gets in (the STOMP listener's
  ``max_unauthenticated``);
- a handshake must complete within ``connect_timeout``.
"""

from __future__ import annotations

import asyncio
import math
import socket
import ssl
from asyncio import sslproto
from typing import cast

from aiohttp import web

from amqlite.management.connections import (
    MAX_HTTP_CONNECTIONS,
    MAX_HTTP_HANDSHAKES,
    HttpConnection,
    HttpConnections,
    HttpSite,
    HttpSocket,
    Phase,
)

__all__ = ["MAX_HTTP_CONNECTIONS", "MAX_HTTP_HANDSHAKES", "GatedHttpsSite", "HttpTlsGate"]


class HttpTlsGate(sslproto.SSLProtocol):
    """The TLS layer of one socket of the HTTPS listener, counted in ``HttpConnections``
    from its accept to its close, as in its handshake until its ``HttpSocket`` starts."""

    def __init__(self, loop: asyncio.AbstractEventLoop, app: HttpSocket,
                 context: ssl.SSLContext, limits: HttpConnections,
                 handshake_timeout: float) -> None:
        waiter = loop.create_future()
        waiter.add_done_callback(self._handshake_over)
        super().__init__(loop, app, context, waiter, server_side=True,
                         ssl_handshake_timeout=math.ceil(handshake_timeout))
        self.limits = limits
        self.raw: asyncio.Transport | None = None
        self.conn = app.conn = HttpConnection(self.abort, Phase.HANDSHAKE)
        self.started = False  # SSLProtocol.connection_made ran (not refused at once)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.raw = cast(asyncio.Transport, transport)
        if not self.limits.accepted(self.conn):
            self.raw.abort()
            return
        self.started = True
        super().connection_made(transport)

    @staticmethod
    def _handshake_over(waiter: asyncio.Future[None]) -> None:
        # A failed handshake's exception is taken here, so asyncio does not log it as
        # never retrieved; the socket's close follows.
        if not waiter.cancelled():
            waiter.exception()

    def abort(self) -> None:
        if self.raw is not None and not self.raw.is_closing():
            self.raw.abort()

    def connection_lost(self, exc: BaseException | None) -> None:
        self.limits.lost(self.conn)
        if self.started:
            super().connection_lost(exc)


class GatedHttpsSite(HttpSite):
    """aiohttp's SockSite, serving HTTPS through an HttpTlsGate per socket."""

    def __init__(self, runner: web.BaseRunner, sock: socket.socket, limits: HttpConnections,
                 context: ssl.SSLContext, handshake_timeout: float, backlog: int) -> None:
        super().__init__(runner, sock, limits, backlog, context)
        self.context = context
        self.handshake_timeout = handshake_timeout

    def protocol(self, loop: asyncio.AbstractEventLoop, server: web.Server) -> asyncio.BaseProtocol:
        return HttpTlsGate(loop, HttpSocket(server(), self.limits), self.context,
                           self.limits, self.handshake_timeout)

    async def stop(self) -> None:
        await super().stop()
        self.limits.close_all()
