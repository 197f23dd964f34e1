"""Throughput and latency of durable messaging, as clients see it.

W1-style workload: ``--producers`` connections each send persistent messages
and wait for each RECEIPT (so the rate includes the fsync'd group commit),
``--consumers`` connections consume with client-individual acks. Clients are
asyncio on raw sockets with the project's sans-I/O codec, so the load
generator costs little; its own CPU time is reported.

    python bench/load.py --port 61613 --seconds 10           # against a running broker
    python bench/load.py --spawn sqlite --seconds 10          # start a broker for the run
    python bench/load.py --spawn postgres --seconds 10        # throwaway PostgreSQL store

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from amqlite.codec import Frame  # noqa: E402
from amqlite.protocol import FrameReceived, StompProtocol  # noqa: E402
from tests.servers import PostgresServer, free_port, wait_for_port  # noqa: E402

QUEUE = "/queue/bench"


class Conn:
    """One STOMP connection driven by the sans-I/O protocol."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.proto = StompProtocol("client")
        self.frames: asyncio.Queue[Frame] = asyncio.Queue()

    @classmethod
    async def open(cls, port: int) -> Conn:
        r, w = await asyncio.open_connection("127.0.0.1", port)
        c = cls(r, w)
        w.write(c.proto.connect_frame("bench", versions=("1.2",)))
        c.pump = asyncio.ensure_future(c._pump())
        first = await c.frames.get()
        if first.command != "CONNECTED":
            raise ConnectionError(first.headers.get("message", "CONNECT refused"))
        return c

    async def _pump(self) -> None:
        while True:
            data = await self.reader.read(262144)
            if not data:
                return
            for ev in self.proto.receive_data(data):
                if isinstance(ev, FrameReceived):
                    self.frames.put_nowait(ev.frame)

    def send(self, frame: Frame) -> None:
        self.writer.write(self.proto.send(frame))

    def close(self) -> None:
        self.pump.cancel()
        self.writer.close()


async def producer(port: int, body: bytes, stop: float, latencies: list[float],
                   persistent: bool, receipts: bool, pid: int) -> int:
    c = await Conn.open(port)
    sent = 0
    headers = {"destination": QUEUE, "persistent": "true" if persistent else "false"}
    while time.monotonic() < stop:
        sent += 1
        h = dict(headers)
        if receipts:
            h["receipt"] = str(sent)
            h["amqlite.producerId"] = f"bench-{pid}"
            h["amqlite.producerSeq"] = str(sent)
        t = time.monotonic()
        c.send(Frame("SEND", h, body))
        if receipts:
            f = await c.frames.get()
            if f.command != "RECEIPT":
                raise RuntimeError(f"unexpected {f.command}: {f.headers}")
            latencies.append(time.monotonic() - t)
        elif sent % 100 == 0:
            await c.writer.drain()
    c.close()
    return sent


async def consumer(port: int, ack: str, counter: list[int], done: asyncio.Event,
                   e2e: list[float]) -> None:
    c = await Conn.open(port)
    c.send(Frame("SUBSCRIBE", {"destination": QUEUE, "id": "1", "ack": ack,
                               "activemq.prefetchSize": "500"}))
    while not done.is_set():
        try:
            f = await asyncio.wait_for(c.frames.get(), 0.5)
        except TimeoutError:
            continue
        if f.command != "MESSAGE":
            continue
        counter[0] += 1
        sent_at = f.headers.get("bench-ts")
        if sent_at:
            e2e.append(time.time() - float(sent_at))
        if ack != "auto":
            c.send(Frame("ACK", {"id": f.headers["ack"]}))
    c.close()


def pct(values: list[float], p: float) -> float:
    if not values:
        return 0.0
    values = sorted(values)
    return round(values[min(len(values) - 1, int(len(values) * p))] * 1000, 2)


async def run(opts: argparse.Namespace, port: int) -> dict:
    body = b"x" * opts.body_size
    latencies: list[float] = []
    received = [0]
    done = asyncio.Event()
    e2e: list[float] = []
    consumers = [asyncio.ensure_future(consumer(port, opts.ack, received, done, e2e))
                 for _ in range(opts.consumers)]
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.monotonic()
    stop = t0 + opts.seconds
    counts = await asyncio.gather(*(
        producer(port, body, stop, latencies, not opts.non_persistent, not opts.no_receipts, i)
        for i in range(opts.producers)))
    produce_s = time.monotonic() - t0
    sent = sum(counts)
    deadline = time.monotonic() + 30
    while received[0] < sent and time.monotonic() < deadline and opts.consumers:
        await asyncio.sleep(0.05)
    total_s = time.monotonic() - t0
    done.set()
    await asyncio.gather(*consumers, return_exceptions=True)
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    return {
        "sent": sent,
        "received": received[0],
        "produce_msg_s": round(sent / produce_s),
        "end_to_end_msg_s": round(received[0] / total_s) if opts.consumers else None,
        "receipt_latency_ms": {"p50": pct(latencies, 0.5), "p99": pct(latencies, 0.99),
                               "mean": round(statistics.fmean(latencies) * 1000, 2)
                               if latencies else 0},
        "loadgen_cpu_s": round(cpu, 2),
        "loadgen_cpu_pct": round(100 * cpu / total_s, 1),
    }


def spawn(kind: str, tmp: Path) -> tuple[subprocess.Popen, int, PostgresServer | None]:
    port = free_port()
    args = [sys.executable, "-m", "cli", "start", "--group", "bench", "--name", "bench",
            "--bind", f"127.0.0.1:{port}", "--log-level", "WARNING"]
    pg = None
    if kind == "postgres":
        pg = PostgresServer()
        pg.init()
        pg.start()
        url = pg.create_database()
        args += ["--store", url, "--locker", url]
    else:
        args += ["--data-dir", str(tmp / "data")]
    log = open(tmp / "broker.log", "wb")  # noqa: SIM115 - owned by the child
    proc = subprocess.Popen(args, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    wait_for_port(port, 60)
    return proc, port, pg


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port", type=int)
    ap.add_argument("--spawn", choices=["sqlite", "postgres"])
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--producers", type=int, default=50)
    ap.add_argument("--consumers", type=int, default=4)
    ap.add_argument("--body-size", type=int, default=1024)
    ap.add_argument("--ack", default="client-individual",
                    choices=["auto", "client", "client-individual"])
    ap.add_argument("--non-persistent", action="store_true")
    ap.add_argument("--no-receipts", action="store_true")
    opts = ap.parse_args()
    if not opts.port and not opts.spawn:
        ap.error("give --port of a running broker or --spawn sqlite|postgres")
    proc = pg = None
    tmp = Path(tempfile.mkdtemp(prefix="amqlite-load-"))
    port = opts.port
    try:
        if opts.spawn:
            proc, port, pg = spawn(opts.spawn, tmp)
        t_cpu0 = None
        if proc is not None:
            t_cpu0 = os.times()
        result = asyncio.run(run(opts, port))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
        if pg is not None:
            pg.cleanup()
    out = {
        "bench": "load",
        "config": {k: v for k, v in vars(opts).items() if k != "port"},
        **result,
    }
    if t_cpu0 is not None:
        t = os.times()
        out["broker_cpu_s"] = round((t.children_user - t_cpu0.children_user)
                                    + (t.children_system - t_cpu0.children_system), 2)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
