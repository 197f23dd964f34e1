"""A tiny real STOMP server on a loopback port, for the client's transport mechanics.

It speaks STOMP through ``amqlite.protocol.StompProtocol(role="server")`` over real
sockets; it is not the broker (no store, no election), but it implements what the failover
transport relies on: RECEIPTs, dedup by producer identity, queue dispatch with
redelivery of unacknowledged messages when a connection drops, transactions. Tests switch
behaviours on (withhold receipts, refuse CONNECT, accept-and-close, cluster headers) and
wait on its state with ``wait_for`` (futures, resolved on every change; no sleeps).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from amqlite.codec import Frame, ProtocolError
from amqlite.protocol import FrameReceived, StompProtocol
from tests.helpers.poll import Waiters

HOST = "127.0.0.1"
#: Deadline for a test's wait on server state.
WAIT = 10.0

_T = TypeVar("_T")


@dataclass(eq=False)
class ServerConn:
    """One client connection as the server sees it."""

    number: int
    transport: asyncio.Transport
    proto: StompProtocol = field(default_factory=lambda: StompProtocol("server"))
    connect: Frame | None = None
    subs: dict[str, dict[str, str]] = field(default_factory=dict)
    frames: list[Frame] = field(default_factory=list)
    inflight: dict[str, tuple[str, Frame]] = field(default_factory=dict)  # ack id -> (sub, msg)
    transactions: dict[str, list[Frame]] = field(default_factory=dict)
    closed: bool = False

    def write(self, frame: Frame) -> None:
        if not self.closed:
            self.transport.write(self.proto.send(frame))


class StompTestServer:
    """Start with ``await server.start()``; ``stop()`` closes the port (connection refused,
    like a slave broker) and drops every connection; ``start()`` again reuses the port."""

    def __init__(self, port: int = 0, *, heartbeat: tuple[int, int] = (0, 0)) -> None:
        self.port = port
        self.heartbeat = heartbeat
        self.server: asyncio.Server | None = None
        self.conns: list[ServerConn] = []
        self.numbers = itertools.count(1)
        self.accept_times: list[float] = []
        # behaviour switches
        self.accept_and_close = False  # accept TCP, then close at once (a failing broker)
        self.refuse_connect: str | None = None  # answer CONNECT with this ERROR message
        self.withhold_receipts = False  # process SENDs but send no RECEIPT (crash window)
        self.withhold_ack_receipts = False  # the same for ACK/NACK
        self.connected_headers: dict[str, str] = {}
        self.receipt_headers: dict[str, str] = {}
        self.reject_destination: str | None = None  # SEND there -> ERROR with receipt-id
        # observations
        self.sends: list[Frame] = []  # every SEND processed, duplicates included
        self.stored: list[Frame] = []  # persistent messages stored (dedup applied)
        self.identities: set[tuple[str, str]] = set()
        self.dedup_hits = 0
        self.acks: list[Frame] = []
        self.withheld: list[str] = []
        self.queues: dict[str, list[Frame]] = {}
        self.message_ids = itertools.count(1)
        self._waiters = Waiters()

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> StompTestServer:
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(
            lambda: _ServerProtocol(self), HOST, self.port, reuse_address=True
        )
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        """Stop listening and abort every connection (a crashed or demoted broker)."""
        if self.server is not None:
            self.server.close()
            self.kill_connections()
            await self.server.wait_closed()
            self.server = None
        self.kill_connections()

    def kill_connections(self) -> None:
        """Abort every client connection (RST), as a SIGKILLed broker would."""
        for conn in self.conns:
            if not conn.closed:
                conn.transport.abort()

    @property
    def uri(self) -> str:
        return f"tcp://{HOST}:{self.port}"

    @property
    def live(self) -> list[ServerConn]:
        return [c for c in self.conns if not c.closed and c.connect is not None]

    # -- waiting -----------------------------------------------------------------------

    def changed(self) -> None:
        self._waiters.changed()

    async def wait_for(self, predicate: Callable[[], bool], what: str,
                       timeout: float = WAIT) -> None:
        """Wait until ``predicate()`` holds (checked on every server event)."""
        await self._waiters.wait_for(
            predicate, timeout, lambda: f"server: {what} not seen within {timeout}s")

    # -- messages ----------------------------------------------------------------------

    def publish(self, destination: str, body: bytes, headers: dict[str, str] | None = None
                ) -> None:
        """Put a message on a queue and dispatch it to a subscriber if there is one."""
        message_id = f"m-{next(self.message_ids)}"
        frame = Frame("MESSAGE", {"destination": destination, "message-id": message_id,
                                  **(headers or {})}, body)
        self.queues.setdefault(destination, []).append(frame)
        self.dispatch(destination)

    def dispatch(self, destination: str) -> None:
        queue = self.queues.get(destination, [])
        while queue:
            target = next(((c, sid, h) for c in self.live for sid, h in c.subs.items()
                           if h["destination"] == destination), None)
            if target is None:
                return
            conn, sub_id, headers = target
            frame = queue.pop(0)
            out = Frame("MESSAGE", {**frame.headers, "subscription": sub_id,
                                    **self.receipt_headers}, frame.body)
            if headers.get("ack", "auto") != "auto":
                ack_id = f"{conn.number}:{frame.headers['message-id']}"
                out.headers["ack"] = ack_id
                conn.inflight[ack_id] = (destination, frame)
            conn.write(out)

    # -- frames ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> ServerConn | None:
        self.accept_times.append(time.monotonic())
        self.changed()
        if self.accept_and_close:
            transport.abort()
            return None
        conn = ServerConn(next(self.numbers), transport)
        self.conns.append(conn)
        return conn

    def connection_lost(self, conn: ServerConn) -> None:
        conn.closed = True
        for destination, frame in reversed(conn.inflight.values()):
            again = Frame(frame.command, {**frame.headers, "redelivered": "true"}, frame.body)
            self.queues.setdefault(destination, []).insert(0, again)
        conn.inflight.clear()
        for destination in list(self.queues):
            self.dispatch(destination)
        self.changed()

    def on_frame(self, conn: ServerConn, frame: Frame) -> None:
        conn.frames.append(frame)
        try:
            self._handle(conn, frame)
        finally:
            self.changed()

    def _handle(self, conn: ServerConn, frame: Frame) -> None:
        command = frame.command
        receipt = frame.headers.get("receipt")
        if command in ("CONNECT", "STOMP"):
            if self.refuse_connect is not None:
                conn.transport.write(conn.proto.error(ProtocolError(self.refuse_connect)))
                conn.transport.close()
                return
            conn.connect = frame
            conn.transport.write(conn.proto.accept_connect(
                frame, server_heartbeat=self.heartbeat, extra_headers=self.connected_headers))
            return
        if command == "SEND":
            if frame.headers["destination"] == self.reject_destination:
                conn.transport.write(conn.proto.error(ProtocolError(
                    "destination refused", receipt_id=receipt)))
                conn.transport.close()
                return
            tx = frame.headers.get("transaction")
            if tx is not None:
                conn.transactions[tx].append(frame)
            else:
                self._store([frame])
        elif command == "SUBSCRIBE":
            conn.subs[frame.headers["id"]] = dict(frame.headers)
            self.dispatch(frame.headers["destination"])
        elif command == "UNSUBSCRIBE":
            conn.subs.pop(frame.headers.get("id", ""), None)
        elif command in ("ACK", "NACK"):
            self.acks.append(frame)
            done = conn.inflight.pop(frame.headers.get("id", ""), None)
            if command == "NACK" and done is not None:
                destination, message = done
                again = Frame("MESSAGE", {**message.headers, "redelivered": "true"},
                              message.body)
                self.queues.setdefault(destination, []).insert(0, again)
                self.dispatch(destination)
        elif command == "BEGIN":
            conn.transactions[frame.headers["transaction"]] = []
        elif command == "COMMIT":
            self._store(conn.transactions.pop(frame.headers["transaction"]))
        elif command == "ABORT":
            conn.transactions.pop(frame.headers["transaction"], None)
        if receipt is None:
            return
        if (command == "SEND" and self.withhold_receipts) or (
                command in ("ACK", "NACK") and self.withhold_ack_receipts):
            self.withheld.append(receipt)
            return
        conn.write(Frame("RECEIPT", {"receipt-id": receipt, **self.receipt_headers}))
        if command == "DISCONNECT":
            conn.transport.close()

    def _store(self, frames: list[Frame]) -> None:
        for frame in frames:
            self.sends.append(frame)
            identity = (frame.headers.get("amqlite.producerId", ""),
                        frame.headers.get("amqlite.producerSeq", ""))
            if identity in self.identities:
                self.dedup_hits += 1
                continue
            if identity != ("", ""):
                self.identities.add(identity)
            if frame.headers.get("persistent") != "false":
                self.stored.append(frame)
            message = {k: v for k, v in frame.headers.items()
                       if k not in ("receipt", "transaction", "destination")}
            self.publish(frame.headers["destination"], frame.body, message)


class _ServerProtocol(asyncio.Protocol):
    def __init__(self, server: StompTestServer) -> None:
        self.server = server
        self.conn: ServerConn | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.conn = self.server.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        conn = self.conn
        if conn is None or conn.closed:
            return
        try:
            events = conn.proto.receive_data(data)
        except ProtocolError as exc:
            with contextlib.suppress(Exception):
                conn.transport.write(conn.proto.error(exc))
            conn.transport.close()
            return
        for event in events:
            if isinstance(event, FrameReceived):
                self.server.on_frame(conn, event.frame)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.conn is not None:
            self.server.connection_lost(self.conn)


class ServerThread:
    """The test server on its own event loop thread, for tests of the blocking Client."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="test-server",
                                       daemon=True)
        self.server = StompTestServer()

    def __enter__(self) -> ServerThread:
        self.thread.start()
        self.call(self.server.start())
        return self

    def __exit__(self, *exc: object) -> None:
        self.call(self.server.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(WAIT)
        self.loop.close()

    def call(self, coro: Coroutine[Any, Any, _T]) -> _T:
        """Run a coroutine on the server's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(WAIT)

    def do(self, fn: Callable[[], _T]) -> _T:
        """Run a plain function on the server's loop (its state is not thread-safe)."""

        async def run() -> _T:
            return fn()

        return self.call(run())
