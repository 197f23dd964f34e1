"""A STOMP-over-WebSocket test client on aiohttp's WebSocket client (a third-party
implementation of RFC 6455, not ours): raw WebSocket messages in, parsed frames out."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import socket
import ssl
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import aiohttp

from amqlite.codec import HEARTBEAT, Frame, FrameParser, Limits
from amqlite.wsframes import FrameReader, Item, Kind
from bench.wsclient import masked_frame
from tests.helpers.broker_proc import HOST, WAIT
from tests.helpers.raw_stomp import recv_before

WS_PATH = "/ws"


def ws_url(port: int, scheme: str = "ws") -> str:
    return f"{scheme}://{HOST}:{port}{WS_PATH}"


def frame_bytes(command: str, headers: Mapping[str, str] | None = None,
                body: bytes = b"") -> bytes:
    head = "".join(f"{k}:{v}\n" for k, v in (headers or {}).items())
    return f"{command}\n{head}\n".encode() + body + b"\x00"


def connect_frame(login: str | None = None, passcode: str | None = None,
                  heartbeat: str = "0,0", version: str = "1.0,1.1,1.2",
                  extra: Mapping[str, str] | None = None) -> bytes:
    headers = {"accept-version": version, "host": "localhost", "heart-beat": heartbeat,
               **({"login": login} if login else {}),
               **({"passcode": passcode} if passcode else {}), **(extra or {})}
    return frame_bytes("CONNECT", headers)


@dataclass
class WsStomp:
    """One WebSocket: what was received, as frames, heart-beats and message kinds."""

    session: aiohttp.ClientSession
    ws: aiohttp.ClientWebSocketResponse
    parser: FrameParser = field(default_factory=lambda: FrameParser(Limits(), "1.2"))
    frames: list[Frame] = field(default_factory=list)
    heartbeats: int = 0
    kinds: list[aiohttp.WSMsgType] = field(default_factory=list)
    closed: bool = False

    @property
    def protocol(self) -> str | None:
        return self.ws.protocol

    async def send(self, data: bytes, binary: bool = False) -> None:
        if binary:
            await self.ws.send_bytes(data)
        else:
            await self.ws.send_str(data.decode())

    async def pump(self, timeout: float) -> bool:
        """Read one WebSocket message (False when none came or the socket closed)."""
        try:
            msg = await self.ws.receive(timeout=timeout)
        except TimeoutError:
            return False
        if msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED,
                        aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.ERROR):
            self.closed = True
            return False
        self.kinds.append(msg.type)
        data = msg.data.encode() if isinstance(msg.data, str) else msg.data
        for item in self.parser.feed(data):
            if item is HEARTBEAT:
                self.heartbeats += 1
            else:
                assert isinstance(item, Frame)
                self.frames.append(item)
        return True

    async def until(self, predicate: object, timeout: float = WAIT) -> bool:
        """Read until ``predicate()`` holds or the socket closes or time is up."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not predicate():  # type: ignore[operator]
            left = deadline - loop.time()
            if left <= 0 or self.closed:
                return bool(predicate())  # type: ignore[operator]
            await self.pump(left)
        return True

    async def frame(self, command: str, timeout: float = WAIT) -> Frame:
        """The first received frame of ``command`` (waiting for it)."""
        def found() -> Frame | None:
            return next((f for f in self.frames if f.command == command), None)
        await self.until(lambda: found() is not None, timeout)
        got = found()
        assert got is not None, f"no {command} within {timeout}s; got {self.frames}"
        return got

    async def wait_closed(self, timeout: float = WAIT) -> bool:
        return await self.until(lambda: self.closed, timeout)

    async def close(self) -> None:
        await self.ws.close()
        await self.session.close()


async def ws_open(url: str, *, protocols: Sequence[str] = (),
                  headers: Mapping[str, str] | None = None,
                  ssl_context: ssl.SSLContext | None = None) -> WsStomp:
    """Open a WebSocket (raises aiohttp.WSServerHandshakeError with the HTTP status when
    the upgrade is refused)."""
    session = aiohttp.ClientSession()
    try:
        ws = await session.ws_connect(url, protocols=tuple(protocols), headers=headers,
                                      ssl=ssl_context if ssl_context is not None else True,
                                      autoping=True, timeout=aiohttp.ClientWSTimeout(ws_close=2))
    except BaseException:
        await session.close()
        raise
    return WsStomp(session, ws)


async def refused_status(url: str, **kwargs: object) -> int:
    """The HTTP status of a refused upgrade (AssertionError when it is accepted)."""
    try:
        client = await ws_open(url, **kwargs)  # type: ignore[arg-type]
    except aiohttp.WSServerHandshakeError as exc:
        return exc.status
    await client.close()
    raise AssertionError(f"{url} accepted a WebSocket it should refuse ({kwargs})")


def upgrade_request(port: int, protocol: str = "v12.stomp", extra: str = "") -> bytes:
    """A WebSocket upgrade request written by hand (``extra``: more header lines)."""
    key = base64.b64encode(os.urandom(16)).decode()
    return (f"GET {WS_PATH} HTTP/1.1\r\nHost: {HOST}:{port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13"
            f"\r\nSec-WebSocket-Protocol: {protocol}\r\n{extra}\r\n").encode()


class RawWs:
    """A blocking WebSocket on a bare socket, for what a polite client never does (keep
    sending after the broker closed, never answer its close frame): the upgrade by hand,
    masked frames out (``bench.wsclient.masked_frame``), the broker's frames read with
    ``amqlite.wsframes``. ``reset`` tells a reset from the broker's FIN."""

    def __init__(self, port: int, protocol: str = "v12.stomp") -> None:
        self.sock = socket.create_connection((HOST, port), timeout=WAIT)
        self.sock.sendall(upgrade_request(port, protocol))
        answer = b""
        while b"\r\n\r\n" not in answer and (chunk := self.sock.recv(4096)):
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 101"), answer[:200]
        self.reader = FrameReader(masked=False)
        self.items = self.reader.feed(answer.split(b"\r\n\r\n", 1)[1])
        self.ended = self.reset = False

    def send(self, opcode: int, payload: bytes) -> bool:
        """One masked frame; False once the broker's socket is gone."""
        try:
            self.sock.sendall(masked_frame(opcode, payload))
            return True
        except OSError:
            return False

    def read_until(self, kind: Kind, timeout: float = WAIT) -> list[Item]:
        """The frames read until one of ``kind`` (included), the end of the stream or
        the timeout: the items read meanwhile."""
        deadline = time.monotonic() + timeout
        got: list[Item] = []
        while True:
            while self.items:
                item = self.items.pop(0)
                got.append(item)
                if item.kind is kind:
                    return got
            if self.ended:
                return got
            data, reset = recv_before(self.sock, deadline)
            if data is None:
                return got
            if not data:
                self.ended, self.reset = True, reset
                return got
            self.items += self.reader.feed(data)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()
