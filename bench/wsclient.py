"""The load generator's WebSocket transport (``bench/load.py --transport ws``): the
client side of RFC 6455 with wsproto, in front of the same callback protocols the TCP
runs use, so W1 over WebSocket and W1 over TCP differ in the transport alone.

Each write of a peer (every frame answering one packet) goes as one text message, as
stompjs sends; what arrives is handed over as it comes. wsproto does the upgrade; the
frames after it are the broker's own framing (``amqlite.wsframes`` reading unmasked
server frames, a masked header written here), so the generator, which shares the cores
with the broker, costs about what the broker's side does.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Any

from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, RejectConnection, Request

from amqlite.websocket import OPCODE_CLOSE, OPCODE_PONG, OPCODE_TEXT, data_frame_header
from amqlite.wire import WS_PATH
from amqlite.wsframes import FrameError, FrameReader, Item, Kind, unmask

#: The second header byte's mask flag (RFC 6455 section 5.2).
MASK_BIT = 0x80


def masked_frame(opcode: int, payload: bytes) -> bytes:
    """One final client frame: masked, as RFC 6455 requires of clients."""
    key = os.urandom(4)
    head = bytearray(data_frame_header(opcode, len(payload)))
    head[1] |= MASK_BIT
    return bytes(head) + key + unmask(payload, key, 0)


class WsClientGate(asyncio.Protocol):
    """One client WebSocket carrying ``inner``'s STOMP bytes."""

    def __init__(self, inner: asyncio.Protocol, host: str, subprotocol: str) -> None:
        self.inner, self.host, self.subprotocol = inner, host, subprotocol
        self.ws = WSConnection(ConnectionType.CLIENT)  # the upgrade
        self.reader = FrameReader(masked=False)  # the server's frames after it
        self.raw: asyncio.Transport | None = None
        self.open = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.raw = transport  # type: ignore[assignment]
        self.raw.write(self.ws.send(Request(  # type: ignore[union-attr]
            host=self.host, target=WS_PATH, subprotocols=[self.subprotocol])))

    def data_received(self, data: bytes) -> None:
        if self.open:
            self._frames(data)
            return
        self.ws.receive_data(data)
        for event in self.ws.events():
            if isinstance(event, AcceptConnection):
                self.open = True
                self.inner.connection_made(WsClientTransport(self))
            elif isinstance(event, RejectConnection) and self.raw is not None:
                self.raw.close()

    def _frames(self, data: bytes) -> None:
        try:
            items = self.reader.feed(data)
        except FrameError:
            items = [Item(Kind.CLOSE)]
        for item in items:
            if item.kind is Kind.DATA:
                self.inner.data_received(item.payload)
            elif item.kind is Kind.PING:
                self.write(masked_frame(OPCODE_PONG, item.payload))
            elif self.raw is not None:  # CLOSE
                self.write(masked_frame(OPCODE_CLOSE, b""))
                self.raw.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.inner.connection_lost(exc or (None if self.open else ConnectionError(
            "WebSocket upgrade refused")))

    def write(self, data: bytes) -> None:
        if self.raw is not None and not self.raw.is_closing():
            self.raw.write(data)


class WsClientTransport(asyncio.Transport):
    """What the inner protocol writes to: one text message per write."""

    def __init__(self, gate: WsClientGate) -> None:
        super().__init__()
        self.gate = gate

    def write(self, data: Any) -> None:
        self.gate.write(masked_frame(OPCODE_TEXT, bytes(data)))

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
