"""Run every workload against amqlite and its peers in one go, and print the ratios.

One command per workload and broker, one after another on this machine
(never two brokers at once): each prints one JSON line, which the runner
echoes tagged with the workload, the broker and the load average around it,
then prints a ratios JSON line and a Markdown table for bench/README.md.

    python bench/run_all.py                          # everything, 1,000,000 backlog (~20 min)
    python bench/run_all.py --only W1,W3 --brokers amqlite,activemq
    python bench/run_all.py --quick                  # amqlite only, seconds (the smoke test)

Repeated, alternating runs of one workload with medians and ratios (issue 25's
comparison with RabbitMQ's classic and quorum queues) are bench/side_by_side.py.

Peers come from Debian's packages (bench/install-peers). A broker that is not
installed, or a command that fails or times out, yields an error line rather
than stopping the run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
PY = sys.executable

#: Broker names in the output -> the ``--spawn`` kind of load.py/depth.py;
#: ``rabbitmq-quorum`` is a quorum queue on a three-node cluster (bench/rabbitmq.py).
SPAWN = {"amqlite": "postgres", "activemq": "activemq", "rabbitmq": "rabbitmq",
         "rabbitmq-quorum": "rabbitmq-quorum"}
#: Column names in the Markdown tables.
NAMES = {"amqlite": "amqlite", "activemq": "ActiveMQ", "rabbitmq": "RabbitMQ",
         "rabbitmq-quorum": "RabbitMQ quorum, 3 nodes"}
#: W2's load.py flags: fire and forget.
W2_ARGS = ("--non-persistent", "--no-receipts", "--ack", "auto")
#: W4's embedded stores: amqlite on SQLite + file lock, ActiveMQ on KahaDB (its
#: default, embedded store); RabbitMQ's store is always embedded (its W1 run).
SPAWN_EMBEDDED = {"amqlite": "sqlite", "activemq": "activemq-kahadb"}
#: The issue's targets: W1 end-to-end ratios, W3 gap bounds, W5 RSS bound.
TARGET_W1_VS_RABBITMQ = 3.0
TARGET_W1_VS_ACTIVEMQ = 9.0
#: Issue 25's W1 targets: 1.5x RabbitMQ's classic queue, 4x its quorum queue.
TARGET_W1_VS_RABBITMQ_CLASSIC = 1.5
TARGET_W1_VS_RABBITMQ_QUORUM = 4.0
TARGET_GAP_P50_MS = 300.0
TARGET_GAP_MAX_MS = 1000.0
TARGET_RSS_MB = 200.0
#: A whole command is killed after this long (a stuck broker must not stall the run).
COMMAND_TIMEOUT = 1800.0
WORKLOADS = ("W1", "W2", "W3", "W4", "W5")


#: ``--processes`` of this script and side_by_side.py, passed to every load.py run.
PROCESSES_HELP = ("load.py's producers in this many processes of their own, for every "
                  "broker (default 1; bench/README.md, session 14: one process's loop adds "
                  "its latency to each RECEIPT round trip of the fastest broker)")


def loadavg() -> str:
    """1, 5 and 15 minute load: the machine is shared, so every figure carries it."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def machine() -> dict[str, Any]:
    """What the numbers ran on: they only compare within one run on one machine."""
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        mem_kb = int(Path("/proc/meminfo").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        mem_kb = 0
    return {"cpu": cpu, "cores": os.cpu_count(), "mem_gb": round(mem_kb / 2**20, 1),
            "kernel": platform.release(), "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}


#: Lines of a failed command's stderr kept in its record (tracebacks of its children too).
STDERR_TAIL_LINES = 60


def run_one(workload: str, broker: str, args: list[str], timeout: float) -> dict[str, Any]:
    """Run one bench command; its last stdout line is its JSON result."""
    before = loadavg()
    t0 = time.monotonic()
    cmd = [PY, *args]
    record: dict[str, Any] = {"workload": workload, "broker": broker,
                              "command": " ".join(["python", *args]), "loadavg_before": before}
    try:
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                             start_new_session=True)
        lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
        if out.returncode != 0 or not lines:
            stderr = out.stderr.strip().splitlines() or ["no output"]
            record["error"] = stderr[-1][:500]
            # What a post-mortem needs: a producer process's traceback comes before
            # the parent's, whose last line alone says only that a pipe closed.
            record["stderr_tail"] = stderr[-STDERR_TAIL_LINES:]
        else:
            record["result"] = json.loads(lines[-1])
    except subprocess.TimeoutExpired:
        record["error"] = f"timed out after {timeout:.0f} s"
    record["wall_s"] = round(time.monotonic() - t0, 1)
    record["loadavg_after"] = loadavg()
    print(json.dumps(record), flush=True)
    return record


def plan(opts: argparse.Namespace) -> list[tuple[str, str, list[str]]]:
    """(workload, broker, argv) for everything this run does, in order."""
    secs = ["--seconds", str(opts.seconds)]
    if opts.processes > 1:  # load.py's runs only (W1, W2, W4), every broker
        secs += ["--processes", str(opts.processes)]
    steps: list[tuple[str, str, list[str]]] = []
    for b in opts.brokers:
        if "W1" in opts.only:
            steps.append(("W1", b, ["bench/load.py", "--spawn", SPAWN[b], *secs]))
    for b in opts.brokers:
        if "W2" in opts.only:
            steps.append(("W2", b, ["bench/load.py", "--spawn", SPAWN[b], *secs, *W2_ARGS]))
    for b in opts.brokers:
        if "W3" in opts.only and not b.startswith("rabbitmq"):
            base = ["bench/failover.py", "--broker", b, "--rounds", str(opts.rounds)]
            steps.append(("W3-empty", b, base))
            steps.append(("W3-backlog", b, [*base, "--backlog", str(opts.backlog)]))
    for b in opts.brokers:
        if "W4" in opts.only and b in SPAWN_EMBEDDED:
            steps.append(("W4", b, ["bench/load.py", "--spawn", SPAWN_EMBEDDED[b], *secs]))
    for b in opts.brokers:
        if "W5" in opts.only and b != "rabbitmq-quorum":  # depth.py: one-process brokers
            steps.append(("W5", b, ["bench/depth.py", "--spawn", SPAWN[b],
                                    "--backlog", str(opts.backlog)]))
    return steps


def _get(results: dict[tuple[str, str], dict], workload: str, broker: str,
         *path: str) -> Any:
    value: Any = results.get((workload, broker), {}).get("result")
    for key in path:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


def _ratio(a: Any, b: Any) -> float | None:
    if not isinstance(a, int | float) or not isinstance(b, int | float) or not b:
        return None
    return round(a / b, 2)


def summarize(results: dict[tuple[str, str], dict]) -> dict[str, Any]:
    """Ratios amqlite / peer (higher is better for amqlite) and the targets."""
    def r(w: str, peer: str, *path: str, invert: bool = False) -> float | None:
        a, p = _get(results, w, "amqlite", *path), _get(results, w, peer, *path)
        return _ratio(p, a) if invert else _ratio(a, p)

    ratios = {
        "W1_e2e_vs_rabbitmq": r("W1", "rabbitmq", "end_to_end_msg_s"),
        "W1_e2e_vs_activemq": r("W1", "activemq", "end_to_end_msg_s"),
        "W1_e2e_vs_rabbitmq_quorum": r("W1", "rabbitmq-quorum", "end_to_end_msg_s"),
        "W1_produce_vs_rabbitmq": r("W1", "rabbitmq", "produce_msg_s"),
        "W1_produce_vs_activemq": r("W1", "activemq", "produce_msg_s"),
        "W2_e2e_vs_rabbitmq": r("W2", "rabbitmq", "end_to_end_msg_s"),
        "W2_e2e_vs_rabbitmq_quorum": r("W2", "rabbitmq-quorum", "end_to_end_msg_s"),
        "W2_e2e_vs_activemq": r("W2", "activemq", "end_to_end_msg_s"),
        "W3_gap_p50_activemq_over_amqlite": r("W3-empty", "activemq", "gap_ms", "p50",
                                              invert=True),
        "W3_gap_max_activemq_over_amqlite": r("W3-empty", "activemq", "gap_ms", "max",
                                              invert=True),
        "W4_e2e_vs_activemq_kahadb": r("W4", "activemq", "end_to_end_msg_s"),
        "W5_rss_rabbitmq_over_amqlite": r("W5", "rabbitmq", "rss_mb_backlog_waiting",
                                          invert=True),
        "W5_rss_activemq_over_amqlite": r("W5", "activemq", "rss_mb_backlog_waiting",
                                          invert=True),
        "W5_drain_vs_rabbitmq": r("W5", "rabbitmq", "drain_msg_s"),
        "W5_drain_vs_activemq": r("W5", "activemq", "drain_msg_s"),
    }
    w4_rabbit = _ratio(_get(results, "W4", "amqlite", "end_to_end_msg_s"),
                       _get(results, "W1", "rabbitmq", "end_to_end_msg_s"))
    ratios["W4_e2e_vs_rabbitmq"] = w4_rabbit

    def below(value: Any, bound: float) -> bool | None:
        return None if not isinstance(value, int | float) else value < bound

    def at_least(value: Any, bound: float) -> bool | None:
        return None if value is None else value >= bound

    targets = {
        f"W1 e2e >= {TARGET_W1_VS_RABBITMQ}x RabbitMQ": at_least(
            ratios["W1_e2e_vs_rabbitmq"], TARGET_W1_VS_RABBITMQ),
        f"W1 e2e >= {TARGET_W1_VS_ACTIVEMQ}x ActiveMQ-JDBC": at_least(
            ratios["W1_e2e_vs_activemq"], TARGET_W1_VS_ACTIVEMQ),
        f"W1 e2e >= {TARGET_W1_VS_RABBITMQ_CLASSIC}x RabbitMQ classic": at_least(
            ratios["W1_e2e_vs_rabbitmq"], TARGET_W1_VS_RABBITMQ_CLASSIC),
        f"W1 e2e >= {TARGET_W1_VS_RABBITMQ_QUORUM}x RabbitMQ quorum (3 nodes)": at_least(
            ratios["W1_e2e_vs_rabbitmq_quorum"], TARGET_W1_VS_RABBITMQ_QUORUM),
    }
    for w in ("W3-empty", "W3-backlog"):
        targets[f"{w} gap p50 < {TARGET_GAP_P50_MS:.0f} ms"] = below(
            _get(results, w, "amqlite", "gap_ms", "p50"), TARGET_GAP_P50_MS)
        targets[f"{w} gap max < {TARGET_GAP_MAX_MS:.0f} ms"] = below(
            _get(results, w, "amqlite", "gap_ms", "max"), TARGET_GAP_MAX_MS)
        targets[f"{w} nothing lost or duplicated"] = (
            None if _get(results, w, "amqlite", "lost") is None else
            _get(results, w, "amqlite", "lost") == 0
            and _get(results, w, "amqlite", "duplicated") == 0)
    targets[f"W5 RSS < {TARGET_RSS_MB:.0f} MB"] = below(
        _get(results, "W5", "amqlite", "rss_mb_peak"), TARGET_RSS_MB)
    return {"ratios": ratios, "targets": targets}


#: Rows of the Markdown table: (label, workload, paths into the result JSON);
#: several paths make one "a / b" cell.
TABLE_ROWS: list[tuple[str, str, list[tuple[str, ...]]]] = [
    ("W1 durable: produce msg/s", "W1", [("produce_msg_s",)]),
    ("W1 durable: end-to-end msg/s", "W1", [("end_to_end_msg_s",)]),
    ("W1 RECEIPT latency p50 / p99 ms", "W1",
     [("receipt_latency_ms", "p50"), ("receipt_latency_ms", "p99")]),
    ("W1 end-to-end latency p50 / p99 ms", "W1",
     [("e2e_latency_ms", "p50"), ("e2e_latency_ms", "p99")]),
    ("W1 CPU s: broker / its PostgreSQL / load generator", "W1",
     [("broker_cpu_s",), ("store_cpu_s",), ("loadgen_cpu_s",)]),
    ("W1 CPU µs per message: broker / its PostgreSQL / load generator", "W1",
     [("cpu_us_per_msg", "broker"), ("cpu_us_per_msg", "store"),
      ("cpu_us_per_msg", "loadgen")]),
    ("W1 broker RSS MB", "W1", [("broker_rss_mb",)]),
    ("W2 fire-and-forget: produce msg/s", "W2", [("produce_msg_s",)]),
    ("W2 fire-and-forget: end-to-end msg/s", "W2", [("end_to_end_msg_s",)]),
    ("W2 load generator CPU %", "W2", [("loadgen_cpu_pct",)]),
    ("W3 empty queue: gap p50 / max ms", "W3-empty", [("gap_ms", "p50"), ("gap_ms", "max")]),
    ("W3 empty queue: lost / duplicated / redelivered", "W3-empty",
     [("lost",), ("duplicated",), ("redelivered",)]),
    ("W3 backlog: gap p50 / max ms", "W3-backlog", [("gap_ms", "p50"), ("gap_ms", "max")]),
    ("W3 backlog: lost / duplicated / redelivered", "W3-backlog",
     [("lost",), ("duplicated",), ("redelivered",)]),
    ("W4 embedded: end-to-end msg/s", "W4", [("end_to_end_msg_s",)]),
    ("W4 embedded: RECEIPT latency p50 / p99 ms", "W4",
     [("receipt_latency_ms", "p50"), ("receipt_latency_ms", "p99")]),
    ("W5 depth: preload msg/s", "W5", [("preload_msg_s",)]),
    ("W5 depth: RSS MB, backlog waiting / peak", "W5",
     [("rss_mb_backlog_waiting",), ("rss_mb_peak",)]),
    ("W5 depth: drain msg/s", "W5", [("drain_msg_s",)]),
]


def table(results: dict[tuple[str, str], dict], brokers: list[str]) -> str:
    """The Markdown table bench/README.md shows."""
    lines = ["| workload | " + " | ".join(NAMES[b] for b in brokers) + " |",
             "|---|" + "---:|" * len(brokers)]
    for label, w, paths in TABLE_ROWS:
        cells = []
        for b in brokers:
            rec = results.get((w, b))
            if ((w.startswith("W3") and b.startswith("rabbitmq"))
                    or (w in ("W4", "W5") and b == "rabbitmq-quorum")):
                cells.append("n/a")
            elif rec is None:
                cells.append("")
            elif "error" in rec:
                cells.append("error")
            else:
                values = (_get(results, w, b, *p) for p in paths)
                cells.append(" / ".join("-" if v is None else str(v) for v in values))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default=",".join(WORKLOADS), help="e.g. W1,W3")
    ap.add_argument("--brokers", default="amqlite,activemq,rabbitmq,rabbitmq-quorum")
    ap.add_argument("--seconds", type=float, default=20.0, help="W1/W2/W4 measuring time")
    ap.add_argument("--processes", type=int, default=1, help="W1/W2/W4: " + PROCESSES_HELP)
    ap.add_argument("--backlog", type=int, default=1_000_000, help="W3/W5 messages waiting")
    ap.add_argument("--rounds", type=int, default=2, help="W3 kills per run")
    ap.add_argument("--quick", action="store_true",
                    help="amqlite only, seconds per workload: the smoke test")
    ap.add_argument("--save", type=Path, help="also write every record and the summary here")
    opts = ap.parse_args()
    if opts.quick:
        opts.brokers, opts.seconds, opts.backlog, opts.rounds = "amqlite", 2.0, 2000, 1
    opts.only = [w.strip() for w in opts.only.split(",")]
    opts.brokers = [b.strip() for b in opts.brokers.split(",")]
    unknown = set(opts.brokers) - set(SPAWN)
    if unknown:
        ap.error(f"unknown broker(s) {sorted(unknown)}: choose from {sorted(SPAWN)}")
    info = {"machine": machine(), "loadavg_start": loadavg(),
            "config": {k: v for k, v in vars(opts).items() if k != "save"}}
    print(json.dumps({"run": info}), flush=True)
    results: dict[tuple[str, str], dict] = {}
    for w, b, args in plan(opts):
        results[(w, b)] = run_one(w, b, args, COMMAND_TIMEOUT)
    if "W3" in opts.only and {"rabbitmq", "rabbitmq-quorum"} & set(opts.brokers):
        print(json.dumps({"workload": "W3", "broker": "rabbitmq", "result": "not applicable: "
                          "RabbitMQ has no shared-store master/slave; its HA replicates "
                          "queues across a cluster (quorum queues)"}), flush=True)
    summary = {**summarize(results), "loadavg_end": loadavg()}
    print(json.dumps(summary), flush=True)
    md = table(results, opts.brokers)
    print(md)
    if opts.save:
        opts.save.write_text(json.dumps({"run": info, "records": list(results.values()),
                                         "summary": summary, "table": md}, indent=1))
    failed = [f"{w}/{b}" for (w, b), rec in results.items() if "error" in rec]
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
