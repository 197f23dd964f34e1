"""Throughput and latency of durable messaging, as clients see it.

W1-style workload: ``--producers`` connections each send persistent messages
and wait for each RECEIPT (so the rate includes the fsync'd group commit),
``--consumers`` connections consume with client-individual acks. Clients are
asyncio on raw sockets with the project's sans-I/O codec, so the load
generator costs little; its own CPU time is reported.

    python bench/load.py --port 61613 --seconds 10           # against a running broker
    python bench/load.py --spawn sqlite --seconds 10          # start a broker for the run
    python bench/load.py --spawn postgres --seconds 10        # throwaway PostgreSQL store
    python bench/load.py --spawn activemq --seconds 10        # ActiveMQ, JDBC on PostgreSQL
    python bench/load.py --spawn rabbitmq --seconds 10        # RabbitMQ + rabbitmq_stomp
    python bench/load.py --spawn rabbitmq-quorum --seconds 10 # its quorum queue, 3 nodes

W2 (fire-and-forget) is ``--non-persistent --no-receipts --ack auto``; W4
(embedded) is ``--spawn sqlite``. ``--tls`` runs every connection over TLS (a spawned
amqlite gets a throwaway self-signed certificate and an ``ssl_bind`` listener; a running
broker's ``--port`` must then be its TLS port, verified with ``--ssl-ca``). Prints one
JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import resource
import ssl
import statistics
import sys
import tempfile
import time
from collections.abc import Coroutine
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from amqlite.codec import Frame  # noqa: E402
from amqlite.protocol import FrameReceived, StompProtocol  # noqa: E402
from amqlite.tls import client_context  # noqa: E402
from amqlite.wire import (  # noqa: E402
    ACK_AUTO,
    ACK_CLIENT_INDIVIDUAL,
    ACK_MODES,
    PRODUCER_ID_HEADER,
    PRODUCER_SEQ_HEADER,
    STOMP_1_2,
)
from bench.peers import SPAWN_KINDS, PeerSet  # noqa: E402
from bench.procs import CpuMeter  # noqa: E402
from bench.scrape import Scraper  # noqa: E402
from bench.wsclient import ws_factory  # noqa: E402
from tests.helpers.servers import free_port  # noqa: E402

QUEUE = "/queue/bench"
#: CONNECT's host header. RabbitMQ takes it as the virtual host, so "/" (its
#: default vhost); amqlite and ActiveMQ ignore it.
STOMP_HOST = "/"
#: Messages a consumer may hold unacknowledged; ActiveMQ's STOMP default is 1000
#: for queues, RabbitMQ's is unlimited. 500 is what every broker gets here.
PREFETCH = "500"
#: How long consumers may take to catch up after the producers stop.
DRAIN_TIMEOUT = 30.0
#: Set by setup_tls() (--tls): every connection of this process goes over TLS.
TLS: ssl.SSLContext | None = None
#: Set by setup_tls() for a run over WebSocket (--transport ws|both; bench/wsclient.py).
WS = False
#: Set by setup_tls(): part of every producer identity, new for each run and process.
RUN_TAG = ""
#: Set by setup_tls() (--queue-type): RabbitMQ's queue-declaring header, on every SEND
#: and SUBSCRIBE, as its STOMP guide says (the queue is declared by whichever comes
#: first, and a later frame without it would ask for a classic queue and be refused).
QUEUE_ARGS: dict[str, str] = {}


def setup_tls(opts: argparse.Namespace) -> None:
    """In each process that opens connections (producer workers are spawned)."""
    global TLS, WS, RUN_TAG, QUEUE_ARGS
    if opts.tls:
        TLS = client_context(opts.ssl_ca or "")
    WS = getattr(opts, "run_ws", False)
    RUN_TAG = os.urandom(4).hex()
    queue_type = getattr(opts, "queue_type", None)
    QUEUE_ARGS = {"x-queue-type": queue_type} if queue_type else {}


async def open_peer(make: Any, port: int) -> Any:
    """A callback peer connected to ``port`` over TCP, TLS or (WS) a WebSocket."""
    loop = asyncio.get_running_loop()
    factory, made = ws_factory(make, f"127.0.0.1:{port}") if WS else (make, [])
    _, proto = await asyncio.wait_for(loop.create_connection(factory, "127.0.0.1", port,
                                                             **tls_kwargs()), 30)
    return made[0] if WS else proto


def tls_kwargs() -> dict[str, Any]:
    return {"ssl": TLS, "server_hostname": "127.0.0.1"} if TLS is not None else {}


#: Put on a connection's frame queue when the broker closed it (or it broke):
#: a client waiting for a RECEIPT learns of it at once.
CLOSED = Frame("CLOSED")


class Conn:
    """One STOMP connection driven by the sans-I/O protocol."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.proto = StompProtocol("client")
        self.frames: asyncio.Queue[Frame] = asyncio.Queue()

    @classmethod
    async def open(cls, port: int, timeout: float = 30.0) -> Conn:
        r, w = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", port, **tls_kwargs()), timeout)
        c = cls(r, w)
        w.write(c.proto.connect_frame(STOMP_HOST, versions=(STOMP_1_2,)))
        c.pump = asyncio.ensure_future(c._pump())
        try:
            first = await asyncio.wait_for(c.frames.get(), timeout)
        except TimeoutError:
            c.close()
            raise
        if first.command != "CONNECTED":
            c.close()
            raise ConnectionError(first.headers.get("message", "CONNECT refused"))
        return c

    async def _pump(self) -> None:
        try:
            while True:
                data = await self.reader.read(262144)
                if not data:
                    return
                for ev in self.proto.receive_data(data):
                    if isinstance(ev, FrameReceived):
                        self.frames.put_nowait(ev.frame)
        except (OSError, ValueError):  # reset by a killed broker; a protocol error
            return
        finally:
            self.frames.put_nowait(CLOSED)

    def send(self, frame: Frame) -> None:
        """Write one frame; ConnectionError once the broker is gone (uvloop raises
        RuntimeError on a closed transport: a failover client must see a lost
        connection, not a crash)."""
        if self.writer.is_closing():
            raise ConnectionError("connection closed")
        try:
            self.writer.write(self.proto.send(frame))
        except RuntimeError as exc:
            raise ConnectionError(str(exc)) from exc

    def close(self) -> None:
        self.pump.cancel()
        self.writer.close()


class _Peer(asyncio.Protocol):
    """A STOMP connection driven by callbacks instead of a frame queue: the
    producers and consumers of a run answer each frame where it is parsed,
    with no task switch per frame, and write once per packet received, so the
    load generator costs a fraction of a broker's CPU."""

    def __init__(self) -> None:
        self.proto = StompProtocol("client")
        self.transport: asyncio.Transport | None = None
        self.ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.out: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.write(self.proto.connect_frame(STOMP_HOST, versions=(STOMP_1_2,)))  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        try:
            events = self.proto.receive_data(data)
        except Exception as exc:  # a protocol error ends this connection's run
            self.end(exc)
            return
        for ev in events:
            if isinstance(ev, FrameReceived):
                self.on_frame(ev.frame)
        if self.out and self.transport is not None and not self.transport.is_closing():
            out, self.out = self.out, []
            self.transport.write(b"".join(out))

    def connection_lost(self, exc: Exception | None) -> None:
        self.end(exc or ConnectionError("connection closed by the broker"))

    def on_frame(self, frame: Frame) -> None:
        raise NotImplementedError

    def write(self, frame: Frame) -> None:
        self.out.append(self.proto.send(frame))

    def end(self, exc: BaseException | None = None) -> None:
        if not self.ended.done():
            if exc is None:
                self.ended.set_result(None)
            else:
                self.ended.set_exception(exc)
        if self.transport is not None:
            self.transport.close()


class _ReceiptProducer(_Peer):
    """Sends one persistent SEND, waits for its RECEIPT, sends the next, until ``stop``."""

    def __init__(self, body: bytes, stop: float, latencies: list[float],
                 headers: dict[str, str], pid: int, parts: int = 0) -> None:
        super().__init__()
        self.body, self.stop, self.latencies = body, stop, latencies
        # A fresh identity per run: the dedup window would drop a second run's copies.
        self.headers, self.pid = headers, f"bench-{RUN_TAG}-{pid}"
        self.parts = parts
        self.sent = 0
        self.t = 0.0

    def _send_next(self) -> None:
        self.sent += 1
        n = str(self.sent)
        h = dict(self.headers)
        h["bench_ts"] = repr(time.time())
        h["receipt"] = n
        h[PRODUCER_ID_HEADER] = self.pid
        h[PRODUCER_SEQ_HEADER] = n
        if self.parts:  # W6: messages tagged round robin, one part per consumer
            h[PART_HEADER] = str(self.sent % self.parts)
        self.t = time.monotonic()
        self.write(Frame("SEND", h, self.body))

    def on_frame(self, frame: Frame) -> None:
        command = frame.command
        if command == "RECEIPT":
            now = time.monotonic()
            self.latencies.append(now - self.t)
            if now < self.stop:
                self._send_next()
            else:
                self.end()
        elif command == "CONNECTED":
            self._send_next()
        else:
            self.end(RuntimeError(f"unexpected {command}: {frame.headers}"))


async def producer(port: int, body: bytes, stop: float, latencies: list[float],
                   persistent: bool, receipts: bool, pid: int,
                   omit_persistent_header: bool = False, parts: int = 0) -> int:
    headers = {"destination": QUEUE, "persistent": "true" if persistent else "false",
               **QUEUE_ARGS}
    if omit_persistent_header and not persistent:
        del headers["persistent"]
    if receipts:
        p = await open_peer(lambda: _ReceiptProducer(body, stop, latencies, headers, pid,
                                                     parts), port)
        await p.ended
        return p.sent
    c = await Conn.open(port)
    sent = 0
    while time.monotonic() < stop:
        sent += 1
        h = dict(headers)
        h["bench_ts"] = repr(time.time())
        c.send(Frame("SEND", h, body))
        if sent % 100 == 0:
            # A broker that stops reading (flow control) must not stretch the run.
            try:
                await asyncio.wait_for(c.writer.drain(), max(0.001, stop - time.monotonic()))
            except TimeoutError:
                break
    c.close()
    return sent


async def subscribe(c: Conn, destination: str, ack: str) -> None:
    """SUBSCRIBE and wait for its RECEIPT: RabbitMQ drops SENDs to a queue nobody
    declared yet, so producers start only once every consumer is in place."""
    c.send(Frame("SUBSCRIBE", {"destination": destination, "id": "1", "ack": ack,
                               "activemq.prefetchSize": PREFETCH, "prefetch-count": PREFETCH,
                               "receipt": "sub", **QUEUE_ARGS}))
    early: list[Frame] = []  # MESSAGEs that overtook the RECEIPT: kept, in order
    while True:
        f = await asyncio.wait_for(c.frames.get(), 30)
        if f.command == "RECEIPT":
            break
        if f is CLOSED or f.command == "ERROR":
            raise ConnectionError(f"SUBSCRIBE refused: {f.headers.get('message', 'closed')}")
        early.append(f)
    if early:
        rest = []
        while not c.frames.empty():
            rest.append(c.frames.get_nowait())
        for f in (*early, *rest):
            c.frames.put_nowait(f)


class _Consumer(_Peer):
    """Subscribes (waiting for the RECEIPT, see ``subscribe``) and acknowledges
    every MESSAGE of a packet in one write."""

    def __init__(self, destination: str, ack: str, counter: list[int], e2e: list[float],
                 ready: asyncio.Event | None, selector: str | None = None) -> None:
        super().__init__()
        self.destination, self.ack, self.counter, self.e2e = destination, ack, counter, e2e
        self.ready = ready
        self.selector = selector
        self.subscribed = asyncio.get_running_loop().create_future()

    def on_frame(self, frame: Frame) -> None:
        command = frame.command
        if command == "MESSAGE":
            self.counter[0] += 1
            sent_at = frame.headers.get("bench_ts")
            if sent_at:
                self.e2e.append(time.time() - float(sent_at))
            if self.ack != ACK_AUTO:
                self.write(Frame("ACK", {"id": frame.headers["ack"]}))
        elif command == "RECEIPT":
            if not self.subscribed.done():
                self.subscribed.set_result(None)
        elif command == "CONNECTED":
            headers = {"destination": self.destination, "id": "1", "ack": self.ack,
                       "activemq.prefetchSize": PREFETCH, "prefetch-count": PREFETCH,
                       "receipt": "sub", **QUEUE_ARGS}
            if self.selector is not None:
                headers["selector"] = self.selector
            self.write(Frame("SUBSCRIBE", headers))
        elif command == "ERROR":
            exc = ConnectionError(f"consumer refused: {frame.headers.get('message')}")
            if not self.subscribed.done():
                self.subscribed.set_exception(exc)
            self.end(exc)


async def consumer(port: int, ack: str, counter: list[int], done: asyncio.Event,
                   e2e: list[float], ready: asyncio.Event | None = None,
                   destination: str = QUEUE, selector: str | None = None) -> None:
    c = await open_peer(lambda: _Consumer(destination, ack, counter, e2e, ready, selector),
                        port)
    # Producers start only once every SUBSCRIBE is confirmed (RabbitMQ drops
    # SENDs to a queue nobody declared yet).
    await asyncio.wait_for(c.subscribed, 30)
    if ready is not None:
        ready.set()
    waiter = asyncio.ensure_future(done.wait())
    await asyncio.wait([waiter, c.ended], return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()
    c.end()
    if not c.ended.cancelled():
        c.ended.exception()  # a lost connection ends this consumer; the counts tell


#: W6's message header, and the selector each consumer uses on it.
PART_HEADER = "part"


#: Preload: SENDs written back to back per connection before one RECEIPT is
#: awaited (flow control without a round trip per message).
PRELOAD_CHUNK = 500
#: Preload connections: enough to keep a broker's store busy on 2 cores.
PRELOAD_CONNECTIONS = 8


async def preload(port: int, count: int, body: bytes, destination: str,
                  connections: int = PRELOAD_CONNECTIONS, chunk: int = PRELOAD_CHUNK,
                  deadline: float | None = None) -> int:
    """Fill ``destination`` with ``count`` persistent messages; returns how many
    were confirmed before ``deadline`` (a monotonic time), so a slow broker
    bounds the run instead of stalling it."""
    per_conn = [count // connections + (i < count % connections) for i in range(connections)]

    async def one(n: int) -> int:
        c = await Conn.open(port)
        done = 0
        headers = {"destination": destination, "persistent": "true", **QUEUE_ARGS}
        while done < n and (deadline is None or time.monotonic() < deadline):
            k = min(chunk, n - done)
            for i in range(k):
                h = headers if i < k - 1 else {**headers, "receipt": str(done + k)}
                c.send(Frame("SEND", h, body))
            await c.writer.drain()
            while True:
                f = await asyncio.wait_for(c.frames.get(), 120)
                if f.command == "RECEIPT":
                    break
                if f.command == "ERROR":
                    raise ConnectionError(f"preload refused: {f.headers.get('message')}")
            done += k
        c.close()
        return done

    return sum(await asyncio.gather(*(one(n) for n in per_conn if n)))


def pct(values: list[float], p: float) -> float:
    if not values:
        return 0.0
    values = sorted(values)
    return round(values[min(len(values) - 1, int(len(values) * p))] * 1000, 2)


def _producer_worker(pipe: Connection, port: int, opts: argparse.Namespace,
                     first: int, count: int) -> None:
    """A producer process of ``--processes``: says ready, waits for the stop time
    (wall clock), sends, and returns its counts, latencies and CPU."""
    setup_tls(opts)

    async def go() -> dict:
        stop_wall = pipe.recv()
        stop = time.monotonic() + (stop_wall - time.time())
        body = b"x" * opts.body_size
        latencies: list[float] = []
        cpu0 = resource.getrusage(resource.RUSAGE_SELF)
        counts = await asyncio.gather(*(
            producer(port, body, stop, latencies, not opts.non_persistent,
                     not opts.no_receipts, first + i, opts.omit_persistent_header,
                     opts.parts)
            for i in range(count)))
        cpu1 = resource.getrusage(resource.RUSAGE_SELF)
        return {"sent": sum(counts), "latencies": latencies,
                "cpu": (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)}

    pipe.send("ready")
    pipe.send(asyncio_run(go()))


class ProducerProcesses:
    """``--processes N``: the producers run in N processes of their own (spawned,
    so no event loop is forked), the consumers in this one."""

    def __init__(self, port: int, opts: argparse.Namespace) -> None:
        ctx = multiprocessing.get_context("spawn")
        n = opts.processes
        shares = [opts.producers // n + (i < opts.producers % n) for i in range(n)]
        self.pipes: list[Connection] = []
        self.procs = []
        first = 0
        for share in shares:
            mine, theirs = ctx.Pipe()
            proc = ctx.Process(target=_producer_worker, args=(theirs, port, opts, first, share),
                               daemon=True)
            proc.start()
            self.pipes.append(mine)
            self.procs.append(proc)
            first += share

    async def ready(self) -> None:
        loop = asyncio.get_running_loop()
        for pipe in self.pipes:
            if not await loop.run_in_executor(None, pipe.poll, 60):
                raise TimeoutError("a producer process did not start")
            pipe.recv()

    async def run(self, stop_wall: float) -> tuple[int, list[float], float]:
        loop = asyncio.get_running_loop()
        for pipe in self.pipes:
            pipe.send(stop_wall)
        sent, latencies, cpu = 0, [], 0.0
        for pipe in self.pipes:
            if not await loop.run_in_executor(None, pipe.poll, stop_wall - time.time() + 60):
                raise TimeoutError("a producer process did not finish")
            r = pipe.recv()
            sent += r["sent"]
            latencies.extend(r["latencies"])
            cpu += r["cpu"]
        for proc in self.procs:
            proc.join(10)
        return sent, latencies, cpu

    def close(self) -> None:
        for proc in self.procs:
            if proc.is_alive():
                proc.kill()
                proc.join(5)


async def run(opts: argparse.Namespace, port: int, broker_pids: tuple[int, ...] = (),
              store_pid: int | None = None) -> dict:
    """``broker_pids``: the broker's processes (a cluster's nodes); ``store_pid``: the
    PostgreSQL a spawned broker uses, whose CPU is the third share of a run on one
    machine (broker, store, load generator)."""
    meter = CpuMeter(broker_pids, store_pid)
    body = b"x" * opts.body_size
    latencies: list[float] = []
    received = [0]
    done = asyncio.Event()
    e2e: list[float] = []
    workers = ProducerProcesses(port, opts) if opts.processes > 1 else None
    worker_cpu = 0.0
    try:
        if workers is not None:
            await workers.ready()
        readies = [asyncio.Event() for _ in range(opts.consumers)]
        consumers: list[asyncio.Future[None]] = []
        for k, r in enumerate(readies):
            consumers.append(asyncio.ensure_future(consumer(
                port, opts.ack, received, done, e2e, r,
                selector=f"{PART_HEADER} = '{k}'" if opts.selectors else None)))
            if k == 0 and QUEUE_ARGS:
                # The first SUBSCRIBE declares RabbitMQ's queue alone: four declaring a
                # quorum queue at once got "Processing error" in two rounds of three.
                await asyncio.wait_for(r.wait(), 60)
        await asyncio.wait_for(asyncio.gather(*(r.wait() for r in readies)), 60)
        meter.start()
        cpu0 = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.monotonic()
        stop = t0 + opts.seconds
        if workers is not None:
            sent, latencies, worker_cpu = await workers.run(time.time() + opts.seconds)
        else:
            sent = sum(await asyncio.gather(*(
                producer(port, body, stop, latencies, not opts.non_persistent,
                         not opts.no_receipts, i, opts.omit_persistent_header, opts.parts)
                for i in range(opts.producers))))
    finally:
        if workers is not None:
            workers.close()
    produce_s = time.monotonic() - t0
    deadline = time.monotonic() + DRAIN_TIMEOUT
    while received[0] < sent and time.monotonic() < deadline and opts.consumers:
        await asyncio.sleep(0.05)
    total_s = time.monotonic() - t0
    spent = meter.stop()
    done.set()
    await asyncio.gather(*consumers, return_exceptions=True)
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime) + worker_cpu
    # Per message that made the whole trip: on a machine where broker, store
    # and generator share the cores, their sum bounds the rate (bench/README.md).
    done_msgs = received[0] if opts.consumers else sent
    cpu_s = {"broker": spent.get("broker_cpu_s"), "store": spent.get("store_cpu_s"),
             "loadgen": cpu}
    per_msg = {k: round(1e6 * v / done_msgs, 1) for k, v in cpu_s.items()
               if v is not None and done_msgs}
    broker = meter.per_message(spent, done_msgs)
    return {
        "sent": sent,
        "received": received[0],
        "produce_msg_s": round(sent / produce_s),
        "end_to_end_msg_s": round(received[0] / total_s) if opts.consumers else None,
        "receipt_latency_ms": {"p50": pct(latencies, 0.5), "p99": pct(latencies, 0.99),
                               "mean": round(statistics.fmean(latencies) * 1000, 2)
                               if latencies else 0},
        "e2e_latency_ms": {"p50": pct(e2e, 0.5), "p99": pct(e2e, 0.99)},
        "loadgen_cpu_s": round(cpu, 2),
        "loadgen_cpu_pct": round(100 * cpu / total_s, 1),
        "cpu_us_per_msg": per_msg,
        **broker,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port", type=int)
    ap.add_argument("--spawn", choices=SPAWN_KINDS,
                    help="start a broker for the run: amqlite on postgres|sqlite, or a peer")
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--producers", type=int, default=50)
    ap.add_argument("--consumers", type=int, default=4)
    ap.add_argument("--body-size", type=int, default=1024)
    ap.add_argument("--ack", default=ACK_CLIENT_INDIVIDUAL, choices=ACK_MODES)
    ap.add_argument("--non-persistent", action="store_true")
    ap.add_argument("--omit-persistent-header", action="store_true",
                    help="non-persistent SENDs carry no persistent header (the default of "
                         "ActiveMQ and RabbitMQ; RabbitMQ reads persistent:false as 'declare "
                         "the queue non-durable' and refuses it); implied by --spawn rabbitmq")
    ap.add_argument("--no-receipts", action="store_true")
    ap.add_argument("--queue-type", choices=("classic", "quorum"),
                    help="RabbitMQ: declare the queue of this type (x-queue-type on every "
                         "SEND and SUBSCRIBE); implied quorum by --spawn rabbitmq-quorum")
    ap.add_argument("--parts", type=int, default=0,
                    help="W6: tag each message with a 'part' header, 0..N-1 round robin "
                         "per producer (give --parts equal to --consumers)")
    ap.add_argument("--selectors", action="store_true",
                    help="W6: consumer k subscribes with the selector \"part = 'k'\" "
                         "(without it, the same tagged load with plain consumers)")
    ap.add_argument("--processes", type=int, default=1,
                    help="run the producers in this many processes of their own (the "
                         "consumers stay in this one), for when one core cannot drive a broker")
    ap.add_argument("--scrape-interval", type=float, default=0,
                    help="GET the broker's /metrics this often (s) during the run, as "
                         "Prometheus would (amqlite: its management API; --scrape-url "
                         "for a broker not spawned here); 0: never")
    ap.add_argument("--scrape-url", help="metrics URL to scrape (default: the spawned "
                                         "amqlite's http://.../metrics)")
    ap.add_argument("--tls", action="store_true",
                    help="every connection over TLS (W1 over TLS beside W1 in plain text)")
    ap.add_argument("--ssl-ca", help="with --tls and --port: CA file of the broker's "
                                     "certificate (default: the system's)")
    ap.add_argument("--transport", choices=("tcp", "ws", "both"), default="tcp",
                    help="STOMP over TCP, over WebSocket (ws_bind; wss with --tls), or both "
                         "one after the other against the same broker (W1 over WebSocket "
                         "beside W1 over TCP)")
    ap.add_argument("--ws-port", type=int, help="with --port: the broker's ws_bind port")
    opts = ap.parse_args()
    if opts.transport != "tcp" and (opts.no_receipts or (opts.port and not opts.ws_port)
                                    or (opts.spawn and opts.spawn not in ("postgres", "sqlite"))):
        ap.error("--transport ws|both: amqlite (--spawn postgres|sqlite, or --port with "
                 "--ws-port), with receipts")
    if opts.selectors and opts.parts != opts.consumers:
        ap.error("--selectors: give --parts equal to --consumers (one part per consumer)")
    if not opts.port and not opts.spawn:
        ap.error("give --port of a running broker or --spawn " + "|".join(SPAWN_KINDS))
    if opts.tls and opts.spawn and opts.spawn not in ("postgres", "sqlite"):
        ap.error("--tls with --spawn: amqlite (postgres|sqlite) only")
    if (opts.scrape_interval > 0 and not opts.scrape_url
            and opts.spawn not in ("postgres", "sqlite")):
        ap.error("--scrape-interval needs --scrape-url unless --spawn is amqlite "
                 "(postgres|sqlite)")
    tls_dir = None
    if opts.tls and opts.spawn:
        # The spawned broker inherits these (AMQLITE_* settings): a TLS listener beside
        # its plain one, and the run uses the TLS one.
        from tests.helpers.tls import make_pki  # the tests' throwaway CA

        tls_dir = tempfile.TemporaryDirectory(prefix="amqlite-bench-tls-")
        pki = make_pki(Path(tls_dir.name))
        opts.ssl_ca = str(pki.ca)
        ssl_port = free_port()
        os.environ.update({"AMQLITE_SSL_BIND": f"127.0.0.1:{ssl_port}",
                           "AMQLITE_SSL_CERT": str(pki.server_cert),
                           "AMQLITE_SSL_KEY": str(pki.server_key),
                           "AMQLITE_HTTP_SSL": "false"})
    if opts.transport != "tcp" and opts.spawn:
        opts.ws_port = free_port()
        os.environ["AMQLITE_WSS_BIND" if opts.tls else "AMQLITE_WS_BIND"] = \
            f"127.0.0.1:{opts.ws_port}"
    if opts.spawn == "rabbitmq-quorum":
        opts.queue_type = "quorum"
    setup_tls(opts)
    if opts.spawn in ("rabbitmq", "rabbitmq-quorum"):
        opts.omit_persistent_header = True
    with PeerSet() as peers:
        port, pids, broker_config = peers.target(opts.spawn, opts.port)
        if tls_dir is not None:
            port = ssl_port
            broker_config = {**broker_config, "tls": True}
        store_pid = peers.pg.postmaster_pid() if peers.pg is not None else None
        scraper = None
        if opts.scrape_interval > 0:
            url = opts.scrape_url or broker_config["http"] + "/metrics"
            scraper = Scraper(url, opts.scrape_interval)
        result: dict[str, Any] = {}
        for transport in ("tcp", "ws") if opts.transport == "both" else (opts.transport,):
            opts.run_ws = transport == "ws"  # read by setup_tls, here and in workers
            setup_tls(opts)
            one = asyncio_run(run(opts, opts.ws_port if opts.run_ws else port, pids, store_pid))
            result = one if opts.transport != "both" else {**result, transport: one}
        if peers.cluster is not None:  # the queue the run used: quorum, on every node?
            result["queue"] = peers.cluster.queue_members(QUEUE.rsplit("/", 1)[1])
        if scraper is not None:
            result["scrapes"] = scraper.stop()
    out = {
        "bench": "load",
        "broker": broker_config,
        "config": {k: v for k, v in vars(opts).items() if k != "port"},
        **result,
    }
    print(json.dumps(out))
    return 0


def asyncio_run(coro: Coroutine[Any, Any, T]) -> T:
    """asyncio.run on uvloop when it is installed: the load generator's own loop
    should cost as little CPU as the broker's."""
    with contextlib.suppress(ImportError):
        import uvloop

        return uvloop.run(coro)
    return asyncio.run(coro)


if __name__ == "__main__":
    sys.exit(main())
