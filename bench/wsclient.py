"""The load generator's WebSocket transport (``bench/load.py --transport ws``): the
client side of RFC 6455 with wsproto, in front of the same callback protocols the TCP
runs use, so W1 over WebSocket and W1 over TCP differ in the transport alone.

Each write of a peer (every frame answering one packet) goes as one text message, as
stompjs sends; what arrives is handed over as it comes, message by message.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Ping,
    RejectConnection,
    Request,
    TextMessage,
)

from amqlite.wire import WS_PATH


class WsClientGate(asyncio.Protocol):
    """One client WebSocket carrying ``inner``'s STOMP bytes."""

    def __init__(self, inner: asyncio.Protocol, host: str, subprotocol: str) -> None:
        self.inner, self.host, self.subprotocol = inner, host, subprotocol
        self.ws = WSConnection(ConnectionType.CLIENT)
        self.raw: asyncio.Transport | None = None
        self.open = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.raw = transport  # type: ignore[assignment]
        self.raw.write(self.ws.send(Request(  # type: ignore[union-attr]
            host=self.host, target=WS_PATH, subprotocols=[self.subprotocol])))

    def data_received(self, data: bytes) -> None:
        self.ws.receive_data(data)
        for event in self.ws.events():
            if isinstance(event, AcceptConnection):
                self.open = True
                self.inner.connection_made(WsClientTransport(self))
            elif isinstance(event, TextMessage):
                self.inner.data_received(event.data.encode())
            elif isinstance(event, BytesMessage):
                self.inner.data_received(bytes(event.data))
            elif isinstance(event, Ping):
                self.send(event.response())
            elif isinstance(event, (CloseConnection, RejectConnection)):
                if isinstance(event, CloseConnection) and self.ws.state.name == "REMOTE_CLOSING":
                    self.send(event.response())
                if self.raw is not None:
                    self.raw.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.inner.connection_lost(exc or (None if self.open else ConnectionError(
            "WebSocket upgrade refused")))

    def send(self, event: Any) -> None:
        if self.raw is not None and not self.raw.is_closing():
            self.raw.write(self.ws.send(event))


class WsClientTransport(asyncio.Transport):
    """What the inner protocol writes to: one text message per write."""

    def __init__(self, gate: WsClientGate) -> None:
        super().__init__()
        self.gate = gate

    def write(self, data: Any) -> None:
        self.gate.send(TextMessage(data=bytes(data).decode()))

    def close(self) -> None:
        if self.gate.raw is not None:
            self.gate.raw.close()

    def is_closing(self) -> bool:
        return self.gate.raw is None or self.gate.raw.is_closing()


def ws_factory(inner: Callable[[], asyncio.Protocol], host: str,
               subprotocol: str = "v12.stomp") -> tuple[Callable[[], asyncio.Protocol],
                                                         list[asyncio.Protocol]]:
    """A protocol factory for ``create_connection`` and the list the inner protocol it
    made lands in (``create_connection`` returns the gate)."""
    made: list[asyncio.Protocol] = []

    def factory() -> asyncio.Protocol:
        proto = inner()
        made.append(proto)
        return WsClientGate(proto, host, subprotocol)
    return factory, made
