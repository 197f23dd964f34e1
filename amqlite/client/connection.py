"""One TCP connection speaking STOMP through the sans-I/O protocol: handshake, reading,
heart-beats, writing. No failover: the supervisor (``failover``) decides what to do when
``lost`` resolves."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import ssl
from collections.abc import Callable, Mapping

from amqlite.client.errors import ConnectRefusedError, error_text
from amqlite.client.uri import TcpURI
from amqlite.codec import Frame, ProtocolError
from amqlite.protocol import FrameReceived, State, StompProtocol, receive_deadline_ms
from amqlite.tls import client_context
from amqlite.wire import STOMP_1_1, STOMP_1_2

__all__ = ["OFFERED_VERSIONS", "READ_CHUNK", "Connection", "describe"]

log = logging.getLogger(__name__)

#: Bytes asked from the socket per read; a few frames per syscall.
READ_CHUNK = 64 * 1024
#: Versions offered in CONNECT. 1.0 cannot ack by subscription and has no heart-beats.
OFFERED_VERSIONS = (STOMP_1_1, STOMP_1_2)


@functools.cache
def default_ssl_context() -> ssl.SSLContext:
    """For ssl:// without client TLS settings: system CAs, hostname checked. Built once:
    loading the trust store costs milliseconds, too much for every reconnect."""
    return client_context()


class Connection:
    """One TCP connection speaking STOMP through the sans-I/O protocol; no failover."""

    def __init__(self, uri: TcpURI, ssl_context: ssl.SSLContext | None = None) -> None:
        self.uri = uri
        #: Used for ssl:// URIs only; None: the system trust store, hostname checked.
        self.ssl_context = ssl_context
        self.protocol = StompProtocol("client")
        self.loop = asyncio.get_running_loop()
        self.lost: asyncio.Future[BaseException | None] = self.loop.create_future()
        self.connected_frame: Frame | None = None
        self.on_frame: Callable[[Connection, Frame], None] = lambda _c, _f: None
        self.closed = False
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._early: list[Frame] = []  # frames that arrived in the CONNECTED chunk
        self._last_rx = self.loop.time()
        self._last_tx = self.loop.time()

    def __repr__(self) -> str:
        return f"<Connection {self.uri} {'closed' if self.closed else 'open'}>"

    async def open(
        self, *, login: str | None, passcode: str | None, headers: Mapping[str, str],
        timeout_s: float | None = None,
    ) -> Frame:
        """TCP connect + CONNECT/CONNECTED within ``timeout_s`` (by default the URI's
        connectionTimeout); past it, TimeoutError naming the broker and the deadline."""
        options = self.uri.options
        deadline = options.connection_timeout_ms / 1000 if timeout_s is None else timeout_s
        bound = asyncio.timeout(deadline)
        try:
            async with bound:
                tls = (self.ssl_context or default_ssl_context()) if self.uri.tls else None
                reader, writer = await asyncio.open_connection(
                    self.uri.host, self.uri.port, ssl=tls,
                    server_hostname=self.uri.host if tls is not None else None,
                )
                self._reader, self._writer = reader, writer
                writer.write(
                    self.protocol.connect_frame(
                        self.uri.host, login, passcode, heartbeat=options.heartbeat_ms,
                        versions=OFFERED_VERSIONS, extra=dict(headers),
                    )
                )
                frame = await self._handshake(reader)
        except BaseException as exc:
            self.close()
            if isinstance(exc, TimeoutError) and bound.expired():
                raise TimeoutError(
                    f"no CONNECTED from {self.uri} within {deadline:g}s") from None
            raise
        self.connected_frame = frame
        self._last_rx = self._last_tx = self.loop.time()
        return frame

    async def _handshake(self, reader: asyncio.StreamReader) -> Frame:
        while True:
            data = await reader.read(READ_CHUNK)
            if not data:
                raise ConnectionResetError(f"{self.uri} closed the connection during CONNECT")
            connected: Frame | None = None
            for event in self.protocol.receive_data(data):
                if not isinstance(event, FrameReceived):
                    continue
                frame = event.frame
                if connected is not None:
                    self._early.append(frame)
                elif frame.command == "ERROR":
                    raise ConnectRefusedError(f"{self.uri} refused CONNECT: {error_text(frame)}",
                                              frame.headers.get("message", "error"))
                elif frame.command == "CONNECTED":
                    connected = frame
            if connected is not None:
                return connected

    def start(self, on_frame: Callable[[Connection, Frame], None]) -> None:
        """Begin reading and heart-beating; frames go to ``on_frame``. Starting a started
        connection (a standby being promoted) only redirects its frames."""
        self.on_frame = on_frame
        if self._tasks:
            return
        self._tasks.append(self.loop.create_task(self._read_loop()))
        heartbeat = self.protocol.heartbeat
        if heartbeat.send_ms or heartbeat.expect_ms:
            self._tasks.append(self.loop.create_task(self._heartbeat_loop()))

    async def _read_loop(self) -> None:
        assert self._reader is not None
        reason: BaseException | None = None
        try:
            early, self._early = self._early, []
            for frame in early:
                self.on_frame(self, frame)
            while not self.closed:
                data = await self._reader.read(READ_CHUNK)
                if not data:
                    reason = ConnectionResetError(f"{self.uri} closed the connection")
                    break
                self._last_rx = self.loop.time()
                for event in self.protocol.receive_data(data):
                    if isinstance(event, FrameReceived):
                        self.on_frame(self, event.frame)
        except (OSError, ProtocolError) as exc:
            reason = exc
        except asyncio.CancelledError:
            pass
        except Exception as exc:  # a bug in a frame handler must not hang the client
            log.exception("frame handling failed on %s", self.uri)
            reason = exc
        self._lose(reason)

    async def _heartbeat_loop(self) -> None:
        heartbeat = self.protocol.heartbeat
        send_s = heartbeat.send_ms / 1000
        deadline_ms = receive_deadline_ms(heartbeat)
        deadline_s = deadline_ms / 1000 if deadline_ms else 0.0
        ticks = [t for t in (send_s / 2, deadline_s / 2) if t > 0]
        tick = min(ticks)
        try:
            while not self.closed:
                await asyncio.sleep(tick)
                now = self.loop.time()
                if deadline_s and now - self._last_rx > deadline_s:
                    self._lose(TimeoutError(
                        f"no data or heart-beat from {self.uri} for {now - self._last_rx:.1f}s"
                    ))
                    return
                if send_s and now - self._last_tx >= send_s / 2:
                    self._write_bytes(self.protocol.heartbeat_data())
        except (OSError, ProtocolError) as exc:
            self._lose(exc)
        except asyncio.CancelledError:
            pass

    def _write_bytes(self, data: bytes) -> None:
        if self.closed or self._writer is None or self._writer.is_closing():
            raise ConnectionResetError(f"connection to {self.uri} is closed")
        self._writer.write(data)
        self._last_tx = self.loop.time()

    def write(self, frame: Frame) -> None:
        """Encode and write; ConnectionError when the connection is gone, a local
        ProtocolError when the frame cannot be sent at all."""
        if self.closed:
            raise ConnectionResetError(f"connection to {self.uri} is closed")
        try:
            data = self.protocol.send(frame)
        except ProtocolError as exc:
            if exc.fault == "local" and self.protocol.state is State.CLOSED:
                raise ConnectionResetError(str(exc)) from exc
            raise
        self._write_bytes(data)

    async def drain(self) -> None:
        """Wait for the socket buffer to empty (flow control); a lost connection is fine."""
        if self._writer is not None and not self.closed:
            with contextlib.suppress(OSError, RuntimeError):
                await self._writer.drain()

    def close(self, *, graceful: bool = False) -> None:
        """Close now; ``graceful`` sends DISCONNECT first (no receipt awaited)."""
        if graceful and not self.closed and self.protocol.connected:
            with contextlib.suppress(Exception):
                self.write(Frame("DISCONNECT", {}))
        self._lose(None)

    def _lose(self, reason: BaseException | None) -> None:
        if self.closed and self.lost.done():
            return
        self.closed = True
        current = asyncio.current_task()
        for task in self._tasks:
            if task is not current:
                task.cancel()
        if self._writer is not None:
            with contextlib.suppress(Exception):
                if reason is None:
                    self._writer.close()
                else:
                    self._writer.transport.abort()
        if not self.lost.done():
            self.lost.set_result(reason)


def describe(exc: BaseException | None) -> str:
    """An exception as one line for logs and reports; None is a deliberate close."""
    if exc is None:
        return "closed"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
