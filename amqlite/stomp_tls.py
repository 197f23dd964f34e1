"""The TLS layer of a STOMP listener's socket (``amqlite.server``): TLS runs in a gate
per accepted TCP socket, so a socket still in its handshake is counted and timed like
any before CONNECT."""

from __future__ import annotations

import asyncio
import math
import ssl
from asyncio import sslproto
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from amqlite.server import ClientConnection


class TlsGate(sslproto.SSLProtocol):
    """The TLS layer of one accepted socket, which tells its ClientConnection of the TCP
    connection before the handshake (so it is counted and timed from then on) and of its
    loss if the handshake never completed (the app protocol hears of nothing then). The
    app protocol is the connection itself, or (wss://) the ``WsGate`` in front of it.

    asyncio's own SSLProtocol, also under uvloop: ``loop.start_tls`` on a uvloop server
    transport delivered the ClientHello to the old protocol (uvloop 0.23)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, conn: ClientConnection,
                 context: ssl.SSLContext, *, ssl_handshake_timeout: float,
                 app: asyncio.Protocol | None = None) -> None:
        # Nobody waits for the handshake: its outcome reaches conn; the exception of a
        # failed one is taken here so asyncio does not log it as never retrieved.
        waiter = loop.create_future()
        waiter.add_done_callback(lambda f: f.cancelled() or f.exception())
        super().__init__(loop, app or conn, context, waiter, server_side=True,
                         ssl_handshake_timeout=math.ceil(ssl_handshake_timeout))
        self.conn = conn

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.conn.tcp_accepted(cast(asyncio.Transport, transport))

    def connection_lost(self, exc: BaseException | None) -> None:
        super().connection_lost(exc)
        if self.conn.handshaking:  # never got TLS up: the app protocol is not told
            self.conn.connection_lost(exc if isinstance(exc, Exception) else None)
