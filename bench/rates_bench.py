"""Cost of the console's rate sampler (amqlite/management/rates.py); prints one JSON
object per destination count.

Why: the sampler runs in the node's loop every 2 s whether or not anyone looks, so one
sample must stay a few milliseconds, and its rings must stay within the memory the
docs promise. Per count: one sample's time (rings full, every destination's totals
moved), ``/api/v1/rates``' body built, and the sampler's memory (tracemalloc, a
separate pass: tracing slows the timing). The broker is a stand-in holding the
counters the sampler reads; the stored-depth query is not included (it is the one
``/metrics`` makes). Run: ``.venv/bin/python bench/rates_bench.py``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import tracemalloc
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from amqlite.management.rates import SAMPLES, Sampler

COUNTS = (100, 1000, 10_000)


def filled(n: int, trace: bool = False) -> tuple[Sampler, Any, list[dict[str, Any]], int]:
    """A sampler with full rings; with ``trace``, the bytes it holds (the stand-in's
    counters and rows, which the broker holds anyway, are made before tracing)."""
    memory = SimpleNamespace(used=0, held_bytes=0, blocked_producers_all={}, memory_budget=1)
    broker = SimpleNamespace(enqueued=defaultdict(int), delivered=defaultdict(int),
                             dequeued=defaultdict(int), memory=memory)
    rows = [{"name": f"/queue/q{i}", "waiting": 1, "in_flight": 0, "consumers": 1}
            for i in range(n)]
    for row in rows:
        broker.enqueued[row["name"]] = broker.delivered[row["name"]] = 0
        broker.dequeued[row["name"]] = 0
    if trace:
        tracemalloc.start()
    sampler = Sampler(SimpleNamespace(broker=broker))  # type: ignore[arg-type]
    sampler.broker = broker  # type: ignore[assignment]
    for _ in range(SAMPLES):
        for row in rows:
            broker.enqueued[row["name"]] += 1
        sampler.record(broker, rows, 5)  # type: ignore[arg-type]
    held = tracemalloc.get_traced_memory()[0] if trace else 0
    if trace:
        tracemalloc.stop()
    return sampler, broker, rows, held


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n")[0]).parse_args()
    for n in COUNTS:
        sampler, broker, rows, _ = filled(n)
        for row in rows:
            broker.enqueued[row["name"]] += 1
        start = time.perf_counter()
        sampler.record(broker, rows, 5)
        sample_ms = (time.perf_counter() - start) * 1000
        start = time.perf_counter()
        body = json.dumps(sampler.node_json())
        json_ms = (time.perf_counter() - start) * 1000
        del sampler, broker, rows
        memory = filled(n, trace=True)[3]
        print(json.dumps({"destinations": n, "sample_ms": round(sample_ms, 2),
                          "rates_json_ms": round(json_ms, 2), "rates_json_bytes": len(body),
                          "sampler_mb": round(memory / 1e6, 1)}))


if __name__ == "__main__":
    main()
