"""What the per-destination totals (``Batch.counters``, one ``amq_counters`` upsert per
commit) cost the PostgreSQL group commit: W1-shaped commits (N persistent sends and the
N acks of the previous commit, one queue) on the store thread, alternating with and
without the totals, on a throwaway PostgreSQL (tests/helpers/servers.py).

    .venv/bin/python bench/counters_bench.py [--sends N] [--rounds R]

Prints one JSON object: median CPU (the committing thread's) and wall time per commit.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from store import Batch, DestinationRow, NewMessage, open_store
from store.schema import COUNTER_KINDS

#: Sends per commit: W1's commits carry a few dozen frames.
DEFAULT_SENDS = 20
#: Commits of each kind; the first WARMUP of all are not measured (statement caches).
DEFAULT_ROUNDS = 300
WARMUP = 20
BODY = b"x" * 1024  # W1's 1 KB bodies
QUEUE = DestinationRow(1, "/queue/bench", "queue")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sends", type=int, default=DEFAULT_SENDS)
    ap.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS)
    opts = ap.parse_args()
    from tests.helpers.servers import PostgresServer

    server = PostgresServer()
    server.init()
    server.start()
    store = open_store(server.create_database(), "bench")
    store.open()
    try:
        epoch = store.claim_epoch("bench")
        store.commit_batch(epoch, Batch(destinations=[QUEUE]))
        cpu: dict[bool, list[float]] = {False: [], True: []}
        wall: dict[bool, list[float]] = {False: [], True: []}
        next_id, previous = 1, []
        n = opts.sends
        for r in range(2 * opts.rounds):
            counted = r % 2 == 1
            sends = [NewMessage(id=next_id + i, destination_id=QUEUE.id, message_id=f"m{r}.{i}",
                                headers={"h": "v"}, body=BODY, producer_id="p",
                                producer_seq=r * n + i, dedup_key=f"p:{r * n + i}")
                     for i in range(n)]
            next_id += n
            batch = Batch(inserts=sends, acks=[(None, mid) for mid in previous])
            if counted:
                deltas = [0] * len(COUNTER_KINDS)
                deltas[0], deltas[1] = n, len(previous)
                batch.counters = {QUEUE.id: deltas}
            t0, c0 = time.perf_counter(), time.thread_time()
            store.commit_batch(epoch, batch)
            c1, t1 = time.thread_time(), time.perf_counter()
            if r >= WARMUP:
                cpu[counted].append((c1 - c0) * 1e6)
                wall[counted].append((t1 - t0) * 1e6)
            previous = [x.id for x in sends]
    finally:
        store.close()
        server.stop()
    out = {"bench": "counters", "sends_per_commit": n, "rounds": opts.rounds}
    for counted, name in ((False, "without"), (True, "with")):
        out[name] = {"cpu_us_per_commit": round(statistics.median(cpu[counted]), 1),
                     "wall_us_per_commit": round(statistics.median(wall[counted]), 1)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
