"""The group committer's CPU per W1 commit, without the event loop: W1-shaped batches
(N persistent 1 KB SENDs handed over to a consumer, with W1's headers and producer
identity, the N ACKs of the previous commit, the destination's totals) committed one
after another through ``store.commit_batch`` on a throwaway PostgreSQL
(tests/helpers/servers.py) or a SQLite file (``--store sqlite``: W4's store), timed
with the committing thread's own CPU clock.

    PYTHONPATH=<tree> .venv/bin/python bench/commit_bench.py [--sends N] [--commits C]
                                                             [--store postgres|sqlite]
    AMQLITE_COMMIT_PROFILE=tottime ... # the Python calls of the measured commits instead

With no event loop beside it there is no GIL hand-over and little of the machine's load
in the figure: it shows what a change to the committer's code saves (issue 25). Prints
one JSON object: CPU µs per commit (median, 10th percentile) and per message, wall µs
per commit, and PostgreSQL's CPU per commit (its whole process tree).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from amqlite.wire import PRODUCER_ID_HEADER, PRODUCER_SEQ_HEADER
from bench.counters_bench import BODY, QUEUE  # W1's 1 KB body, the one queue
from bench.procs import tree_cpu_seconds
from store import Batch, NewMessage, open_store
from store.schema import COUNTER_KINDS

#: Sends per commit: W1's commits carry 18-27 messages (bench/README.md, issue 25).
DEFAULT_SENDS = 24
#: Commits measured; the first WARMUP are not (the writer's first commit prepares the
#: statements; PostgreSQL's caches warm up).
DEFAULT_COMMITS = 1000
WARMUP = 50
PRODUCER = "bench-76e98e45-11"


def w1_batch(first_id: int, n: int, acks: list[int]) -> Batch:
    """What the broker hands the committer under W1 (a captured W1 commit's shape)."""
    sends = []
    for i in range(first_id, first_id + n):
        headers = {"persistent": "true", "bench_ts": f"{time.time()}",
                   PRODUCER_ID_HEADER: PRODUCER, PRODUCER_SEQ_HEADER: str(i)}
        sends.append(NewMessage(
            id=i, destination_id=QUEUE.id, message_id=f"ID:bench:{i}", headers=headers,
            body=BODY, priority=4, enqueued_at=int(time.time() * 1000), producer_id=PRODUCER,
            producer_seq=i, dedup_key=f"{PRODUCER}:{i}", delivery_count=1))
    deltas = [0] * len(COUNTER_KINDS)
    deltas[0], deltas[1] = n, len(acks)
    return Batch(inserts=sends, acks=[(None, mid) for mid in acks],
                 counters={QUEUE.id: deltas})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sends", type=int, default=DEFAULT_SENDS)
    ap.add_argument("--commits", type=int, default=DEFAULT_COMMITS)
    ap.add_argument("--store", choices=("postgres", "sqlite"), default="postgres",
                    help="sqlite: a file in a temporary directory (W4's store; its CPU is "
                         "the committing thread's, in this process)")
    opts = ap.parse_args()
    profile_sort = os.environ.get("AMQLITE_COMMIT_PROFILE")
    from tests.helpers.servers import PostgresServer

    server: PostgresServer | None = None
    tmp = tempfile.TemporaryDirectory(prefix="amqlite-commit-bench-")
    if opts.store == "sqlite":
        url = f"sqlite:///{tmp.name}/amqlite.db"
    else:
        server = PostgresServer()
        server.init()
        server.start()
        url = server.create_database()
    store = open_store(url, "bench")
    store.open()
    profiler = cProfile.Profile() if profile_sort else None
    cpu: list[float] = []
    wall: list[float] = []
    postmaster = server.postmaster_pid() if server is not None else None
    store_cpu = 0.0
    try:
        epoch = store.claim_epoch("bench")
        store.commit_batch(epoch, Batch(destinations=[QUEUE]))
        n, next_id, previous = opts.sends, 1, []
        for c in range(WARMUP + opts.commits):
            batch = w1_batch(next_id, n, previous)
            measured = c >= WARMUP
            if c == WARMUP and postmaster is not None:
                store_cpu = -tree_cpu_seconds(postmaster, reaped=True)
            if measured and profiler is not None:
                profiler.enable()
            t0, c0 = time.perf_counter(), time.thread_time()
            store.commit_batch(epoch, batch)
            c1, t1 = time.thread_time(), time.perf_counter()
            if measured and profiler is not None:
                profiler.disable()
            if measured:
                cpu.append((c1 - c0) * 1e6)
                wall.append((t1 - t0) * 1e6)
            previous = list(range(next_id, next_id + n))
            next_id += n
        if postmaster is not None:
            store_cpu += tree_cpu_seconds(postmaster, reaped=True)
    finally:
        store.close()
        if server is not None:
            server.stop()
        tmp.cleanup()
    if profiler is not None:
        stats = pstats.Stats(profiler)
        stats.sort_stats(profile_sort or "tottime").print_stats(30)
    median = statistics.median(cpu)
    print(json.dumps({
        "bench": "commit", "store": opts.store, "sends_per_commit": opts.sends,
        "commits": opts.commits,
        "cpu_us_per_commit": round(median, 1),
        "cpu_us_per_commit_p10": round(statistics.quantiles(cpu, n=10)[0], 1),
        "cpu_us_per_msg": round(median / opts.sends, 2),
        "wall_us_per_commit": round(statistics.median(wall), 1),
        # PostgreSQL's side (every process of the server, background writers included;
        # a clock tick is 10 ms, hence the thousand commits), mean per commit.
        "store_cpu_us_per_commit": (round(store_cpu / opts.commits * 1e6, 1)
                                    if server is not None else None),
        "load_average": round(os.getloadavg()[0], 2),
    }))


if __name__ == "__main__":
    main()
