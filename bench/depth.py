"""W5 depth: what a broker costs with a deep queue, and how fast it drains.

Fills a durable queue with ``--backlog`` persistent 1 KB messages (pipelined
SENDs, one RECEIPT per chunk), reports the broker's resident memory with the
backlog waiting, then starts ``--consumers`` client-individual consumers and
reports the drain rate. Broker RSS is the broker's own process tree (the JVM
for ActiveMQ, beam for RabbitMQ, the Python process for amqlite); PostgreSQL,
the store of amqlite and ActiveMQ-JDBC, is not counted -- RabbitMQ's store is
in its process, so its figure includes it.

    python bench/depth.py --spawn postgres --backlog 1000000
    python bench/depth.py --spawn activemq --backlog 1000000 --preload-timeout 900
    python bench/depth.py --spawn postgres --backlog 100000 --needle

``--needle`` (issue 21's selective consumer): once the backlog waits, one more message
with ``kind: needle`` is sent and a consumer subscribes with the selector
``kind = 'needle'``; the time from its SUBSCRIBE to that MESSAGE is reported
(``needle_s``) and the drain is skipped.

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from amqlite.codec import Frame  # noqa: E402
from amqlite.wire import ACK_CLIENT_INDIVIDUAL, ACK_MODES  # noqa: E402
from bench.load import (  # noqa: E402
    PRELOAD_CONNECTIONS,
    Conn,
    asyncio_run,
    consumer,
    preload,
)
from bench.peers import SPAWN_KINDS, PeerSet, tree_rss_bytes  # noqa: E402

QUEUE = "/queue/depth"
#: W5 runs on one-process brokers: the quorum queue's three nodes (whose headers the
#: needle's frames would need too) are not measured here.
DEPTH_KINDS = tuple(k for k in SPAWN_KINDS if k != "rabbitmq-quorum")
#: How often RSS is sampled while the queue fills and drains.
RSS_SAMPLE_INTERVAL = 0.5
#: Let the broker settle (GC, page-out of RabbitMQ's queue index) before the
#: "with the backlog waiting" RSS figure.
SETTLE_SECONDS = 3.0


async def run(opts: argparse.Namespace, port: int, pid: int | None) -> dict:
    body = b"x" * opts.body_size
    peak = [0]

    async def sample() -> None:
        while pid:
            peak[0] = max(peak[0], tree_rss_bytes(pid))
            await asyncio.sleep(RSS_SAMPLE_INTERVAL)

    sampler = asyncio.ensure_future(sample())
    rss_idle = tree_rss_bytes(pid) if pid else 0
    t0 = time.monotonic()
    loaded = await preload(port, opts.backlog, body, QUEUE, opts.preload_connections,
                           deadline=t0 + opts.preload_timeout)
    preload_s = time.monotonic() - t0
    await asyncio.sleep(SETTLE_SECONDS)
    rss_waiting = tree_rss_bytes(pid) if pid else 0
    if opts.needle:
        sampler.cancel()
        return {"preloaded": loaded, "preload_s": round(preload_s, 1),
                "rss_mb_backlog_waiting": round(rss_waiting / 2**20, 1),
                "needle_s": round(await needle(port), 3)}

    received = [0]
    done = asyncio.Event()
    readies = [asyncio.Event() for _ in range(opts.consumers)]
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    t1 = time.monotonic()
    consumers = [asyncio.ensure_future(consumer(port, opts.ack, received, done, [], r, QUEUE))
                 for r in readies]
    deadline = t1 + opts.drain_timeout
    while received[0] < loaded and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    drain_s = time.monotonic() - t1
    done.set()
    await asyncio.gather(*consumers, return_exceptions=True)
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    sampler.cancel()
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    mb = 2**20
    return {
        "preloaded": loaded,
        "preload_s": round(preload_s, 1),
        "preload_msg_s": round(loaded / preload_s) if preload_s else 0,
        "rss_mb_idle": round(rss_idle / mb, 1),
        "rss_mb_backlog_waiting": round(rss_waiting / mb, 1),
        "rss_mb_peak": round(peak[0] / mb, 1),
        "drained": received[0],
        "drain_s": round(drain_s, 1),
        "drain_msg_s": round(received[0] / drain_s) if drain_s else 0,
        "loadgen_cpu_pct_drain": round(100 * cpu / drain_s, 1) if drain_s else 0,
    }


async def needle(port: int) -> float:
    """Seconds from a selective SUBSCRIBE to the one message it matches, which waits
    behind the whole backlog."""
    producer = await Conn.open(port)
    producer.send(Frame("SEND", {"destination": QUEUE, "persistent": "true",
                                 "kind": "needle", "receipt": "needle"}, b"needle"))
    while (await asyncio.wait_for(producer.frames.get(), 60)).command != "RECEIPT":
        pass
    producer.close()
    c = await Conn.open(port)
    start = time.monotonic()
    c.send(Frame("SUBSCRIBE", {"destination": QUEUE, "id": "needle", "ack": "auto",
                               "selector": "kind = 'needle'"}))
    while True:
        f = await asyncio.wait_for(c.frames.get(), 120)
        if f.command == "MESSAGE" and f.body == b"needle":
            took = time.monotonic() - start
            c.close()
            return took
        if f.command != "MESSAGE":
            raise ConnectionError(f"selective SUBSCRIBE answered {f.command}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port", type=int)
    ap.add_argument("--spawn", choices=DEPTH_KINDS)
    ap.add_argument("--backlog", type=int, default=1_000_000)
    ap.add_argument("--consumers", type=int, default=4)
    ap.add_argument("--ack", default=ACK_CLIENT_INDIVIDUAL, choices=ACK_MODES)
    ap.add_argument("--body-size", type=int, default=1024)
    ap.add_argument("--preload-connections", type=int, default=PRELOAD_CONNECTIONS)
    ap.add_argument("--preload-timeout", type=float, default=900.0,
                    help="stop filling after this many seconds (a slow broker)")
    ap.add_argument("--drain-timeout", type=float, default=600.0)
    ap.add_argument("--needle", action="store_true",
                    help="time a selective consumer's one match behind the backlog")
    opts = ap.parse_args()
    if not opts.port and not opts.spawn:
        ap.error("give --port of a running broker or --spawn " + "|".join(DEPTH_KINDS))
    with PeerSet() as peers:
        port, pids, broker_config = peers.target(opts.spawn, opts.port)
        result = asyncio_run(run(opts, port, pids[0] if pids else None))
    print(json.dumps({"bench": "depth", "broker": broker_config,
                      "config": {k: v for k, v in vars(opts).items() if k != "port"},
                      **result}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
