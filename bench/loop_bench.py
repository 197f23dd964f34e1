"""The broker's event-loop CPU per W1 message, in one process: no sockets, no store.

W1's shape (``bench/load.py --spawn postgres``): 50 producers each send a persistent
1 KB SEND and wait for its RECEIPT, 4 client-individual consumers (prefetch 500) ACK
every MESSAGE of a write at once. Real ``StompServer`` connections (codec, protocol,
server, broker) on fake transports; a stub committer resolves each batch on the next
loop turn, as the group committer's one wake-up per commit does. What it leaves out
is what W1 adds on top: syscalls, the committer thread and its GIL hand-overs.

On a shared machine CPU time per message moves with the load; compare checkouts
with alternating runs and their minimum:

    PYTHONPATH=<checkout> .venv/bin/python bench/loop_bench.py [--messages N] [--runs R]
    AMQLITE_LOOP_PROFILE=tottime ...   # cProfile of each run, sorted by that key

Prints one JSON line: CPU µs per message of each run, and their minimum; with
AMQLITE_LOOP_PROFILE, Python function calls per message instead (the same in every
run: a measure of the work that the machine's load does not blur).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(os.environ.get("PYTHONPATH", "").split(os.pathsep)[0] or
            Path(__file__).resolve().parent.parent)
sys.path.insert(0, str(ROOT))

from amqlite.auth import Authenticator  # noqa: E402
from amqlite.broker import Broker  # noqa: E402
from amqlite.node import tune_gc  # noqa: E402
from amqlite.server import ClientConnection, StompServer  # noqa: E402
from amqlite.settings import Settings  # noqa: E402
from store import BatchResult, open_store  # noqa: E402

PRODUCERS, CONSUMERS = 50, 4  # W1's
BODY = b"x" * 1024
CONNECT = b"CONNECT\naccept-version:1.2\nhost:/\n\n\x00"
SUBSCRIBE = (b"SUBSCRIBE\ndestination:/queue/bench\nid:1\nack:client-individual\n"
             b"activemq.prefetchSize:500\nprefetch-count:500\nreceipt:sub\n\n\x00")
ACK_ID = re.compile(rb"\nack:([^\n]*)\n")


class StubCommitter:
    """Resolves every batch on the next loop turn (one wake-up per commit)."""

    failure = None

    def __init__(self, loop: asyncio.AbstractEventLoop, store: Any, epoch: int) -> None:
        self.loop, self.store, self.epoch = loop, store, epoch
        self.commits = 0
        self.busy_since = None

    def submit(self, batch: Any, units: Any = None) -> asyncio.Future[BatchResult]:
        fut: asyncio.Future[BatchResult] = self.loop.create_future()
        self.loop.call_soon(fut.set_result, BatchResult())
        self.commits += 1
        return fut

    def call(self, fn: Any, *args: Any) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = self.loop.create_future()
        fut.set_result(fn(*args))
        return fut

    def defer(self, flush: Any) -> bool:
        return False  # nothing is ever underway here


class FakeTransport:
    def __init__(self, on_write: Any) -> None:
        self.on_write = on_write
        self.closing = False

    def write(self, data: bytes) -> None:
        self.on_write(data)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else default

    def set_write_buffer_limits(self, *args: int) -> None:
        pass

    def is_closing(self) -> bool:
        return self.closing

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        self.closing = True

    abort = close


async def one_run(messages: int, profile: str | None) -> float:
    loop = asyncio.get_running_loop()
    settings = Settings(group="g1", data_dir=tempfile.mkdtemp(prefix="loop-bench-")).resolved()
    store = open_store(settings.store, settings.group)
    store.open()
    epoch = store.claim_epoch("bench")
    committer = StubCommitter(loop, store, epoch)
    broker = Broker(settings, committer, store.recover(epoch), loop)  # type: ignore[arg-type]
    server = StompServer(settings, broker, Authenticator(None))
    done = asyncio.Event()
    counts = {"sent": 0, "acked": 0}

    def consumer() -> None:
        conn = ClientConnection(server)

        def on_write(data: bytes) -> None:
            ids = ACK_ID.findall(data)
            if ids:
                counts["acked"] += len(ids)
                acks = b"".join(b"ACK\nid:" + i + b"\n\n\x00" for i in ids)
                loop.call_soon(conn.data_received, acks)
                if counts["acked"] >= messages:
                    done.set()

        conn.connection_made(FakeTransport(on_write))  # type: ignore[arg-type]
        conn.data_received(CONNECT)
        conn.data_received(SUBSCRIBE)

    def producer(k: int) -> Any:
        conn = ClientConnection(server)
        seq = itertools.count(1)

        def send_next() -> None:
            if counts["sent"] >= messages:
                return
            counts["sent"] += 1
            n = next(seq)
            head = (f"SEND\ndestination:/queue/bench\npersistent:true\nbench_ts:{time.time()!r}\n"
                    f"receipt:{n}\namqlite.producerId:bench-{k}\namqlite.producerSeq:{n}\n"
                    f"content-length:{len(BODY)}\n\n").encode()
            loop.call_soon(conn.data_received, head + BODY + b"\x00")

        def on_write(data: bytes) -> None:
            if b"RECEIPT" in data:
                send_next()

        conn.connection_made(FakeTransport(on_write))  # type: ignore[arg-type]
        conn.data_received(CONNECT)
        return send_next

    for _ in range(CONSUMERS):
        consumer()
    starts = [producer(k) for k in range(PRODUCERS)]
    await asyncio.sleep(0.05)
    tune_gc()  # as the node does
    prof = None
    if profile:
        import cProfile
        prof = cProfile.Profile()
        prof.enable()
    cpu0 = time.process_time()
    for start in starts:
        start()
    await asyncio.wait_for(done.wait(), 600)
    cpu = time.process_time() - cpu0
    calls = None
    if prof is not None:
        import pstats
        prof.disable()
        stats = pstats.Stats(prof, stream=sys.stderr)
        stats.sort_stats(profile).print_stats(40)
        calls = stats.total_calls / messages  # type: ignore[attr-defined]
    store.close()
    return calls if calls is not None else 1e6 * cpu / messages


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=30000)
    ap.add_argument("--runs", type=int, default=1)
    opts = ap.parse_args()
    try:
        import uvloop
        new_loop: Any = uvloop.new_event_loop
    except ImportError:  # pragma: no cover
        new_loop = asyncio.new_event_loop
    profile = os.environ.get("AMQLITE_LOOP_PROFILE")
    runs = []
    for _ in range(opts.runs):
        with asyncio.Runner(loop_factory=new_loop) as runner:
            runs.append(round(runner.run(one_run(opts.messages, profile)), 1))
    unit = "calls_per_msg" if profile else "cpu_us_per_msg"
    print(json.dumps({"bench": "loop", "root": str(ROOT), "messages": opts.messages,
                      unit: runs, "min": min(runs)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
