"""W1 on one amqlite broker over time: what its PostgreSQL store costs once deleted rows
pile up, and after a drained message table was vacuumed (issue 25, session 15).

Every persistent message is a row inserted and deleted. The 20 s runs of ``load.py``
end before autovacuum comes round; this one runs W1 again and again on one broker and
store, and reports each run with the store's CPU per message (the postmaster's whole
tree, autovacuum workers that ended included) and the message table's size.

    python bench/store_churn.py --scenario vacuumed   # 2 runs, VACUUM the drained table, 3 runs
    python bench/store_churn.py --scenario long --seconds 150   # one run, the table every 10 s

Prints one JSON line per run (and per sample), then one for the whole.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.peers import PeerSet, tree_cpu_seconds  # noqa: E402

#: Seconds between two samples of the table in ``--scenario long``.
SAMPLE_INTERVAL = 10.0
#: The table's statistics, as a sample reports them.
TABLE_STATS = """\
SELECT pg_relation_size('amq_messages'), pg_indexes_size('amq_messages'), n_dead_tup,
       vacuum_count, autovacuum_count
FROM pg_stat_user_tables WHERE relname = 'amq_messages'"""


def table(url: str) -> dict[str, Any]:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(TABLE_STATS).fetchone()
    assert row is not None
    heap, indexes, dead, vacuums, autovacuums = row
    return {"table_mb": round(heap / 2**20, 1), "indexes_mb": round(indexes / 2**20, 1),
            "dead_rows": dead, "vacuums": vacuums, "autovacuums": autovacuums}


def w1(port: int, seconds: float, processes: int, postmaster: int, label: str,
       url: str) -> dict[str, Any]:
    """One ``load.py`` W1 run against the broker on ``port``."""
    cpu0 = tree_cpu_seconds(postmaster, reaped=True)
    out = subprocess.run(
        [sys.executable, "bench/load.py", "--port", str(port), "--seconds", str(seconds),
         "--processes", str(processes)],
        cwd=ROOT, capture_output=True, text=True, check=True, timeout=seconds + 300)
    cpu = tree_cpu_seconds(postmaster, reaped=True) - cpu0
    result = json.loads([ln for ln in out.stdout.splitlines() if ln.startswith("{")][-1])
    n = result["received"]
    record = {"run": label, "msg_s": result["end_to_end_msg_s"],
              "receipt_p50_ms": result["receipt_latency_ms"]["p50"],
              "receipt_p99_ms": result["receipt_latency_ms"]["p99"],
              "store_us_per_msg": round(cpu / n * 1e6, 1) if n else None, **table(url)}
    print(json.dumps(record), flush=True)
    return record


def sample_until(stop: threading.Event, url: str, started: float) -> None:
    while not stop.wait(SAMPLE_INTERVAL):
        print(json.dumps({"t_s": round(time.monotonic() - started), **table(url)}), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scenario", choices=("vacuumed", "long"), default="vacuumed")
    ap.add_argument("--seconds", type=float, default=15.0, help="of each W1 run")
    ap.add_argument("--processes", type=int, default=2,
                    help="load.py's producer processes (as side_by_side.py --processes)")
    opts = ap.parse_args()
    with PeerSet() as peers:
        pg = peers.postgres()
        url = pg.create_database()
        broker = peers.amqlite(url=url)
        postmaster = pg.postmaster_pid()
        assert postmaster is not None
        runs = []
        if opts.scenario == "vacuumed":
            runs += [w1(broker.port, opts.seconds, opts.processes, postmaster, f"before {i}", url)
                     for i in (1, 2)]
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("VACUUM amq_messages")  # what autovacuum does to a drained queue
            print(json.dumps({"vacuumed": table(url)}), flush=True)
            runs += [w1(broker.port, opts.seconds, opts.processes, postmaster, f"after {i}", url)
                     for i in (1, 2, 3)]
        else:
            stop = threading.Event()
            sampler = threading.Thread(target=sample_until, args=(stop, url, time.monotonic()))
            sampler.start()
            try:
                runs.append(w1(broker.port, opts.seconds, opts.processes, postmaster, "long",
                               url))
            finally:
                stop.set()
                sampler.join()
    print(json.dumps({"bench": "store_churn", "scenario": opts.scenario, "runs": runs}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
