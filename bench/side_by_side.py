"""amqlite beside RabbitMQ's classic queue and its quorum queue, alternating (issue 25).

Each round runs every broker once, one after another on this machine (never two
at once), for each workload asked: W1 (durable, a RECEIPT awaited for each SEND),
W2 (fire and forget) and W4 (embedded stores: amqlite on SQLite, ActiveMQ on KahaDB).
Every run is one ``bench/load.py --spawn ...`` that starts and stops its broker
(the RabbitMQ cluster's three nodes included). Per run it prints msg/s, RECEIPT
p50/p99, the CPU per message of the broker (a cluster's nodes summed), its store
(amqlite's PostgreSQL) and the load generator, and the 1-minute load average
before the run; at the end the medians per broker and the ratios amqlite/peer,
per round (alternating runs pair up) and on the medians, against issue 25's goals.

    python bench/side_by_side.py                               # W1, 3 rounds of 20 s (~5 min)
    python bench/side_by_side.py --workloads W1,W2 --rounds 5
    python bench/side_by_side.py --processes 2                 # producers in 2 processes
    python bench/side_by_side.py --workloads W4 --brokers amqlite,activemq

Peers come from Debian's packages (bench/install-peers). A run that fails prints
an error line and the rest go on; the exit status is then 1.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))

from bench.run_all import (  # noqa: E402
    COMMAND_TIMEOUT,
    NAMES,
    PROCESSES_HELP,
    SPAWN,
    SPAWN_EMBEDDED,
    TARGET_W1_VS_RABBITMQ_CLASSIC,
    TARGET_W1_VS_RABBITMQ_QUORUM,
    W2_ARGS,
    loadavg,
    machine,
    run_one,
)

#: Workloads load.py runs, with their flags and the spawn kind per broker.
WORKLOADS: dict[str, tuple[tuple[str, ...], dict[str, str]]] = {
    "W1": ((), SPAWN),
    "W2": (W2_ARGS, SPAWN),
    "W4": ((), SPAWN_EMBEDDED),
}
#: Issue 25's goals as (workload, peer, amqlite/peer at least).
GOALS = (("W1", "rabbitmq", TARGET_W1_VS_RABBITMQ_CLASSIC),
         ("W1", "rabbitmq-quorum", TARGET_W1_VS_RABBITMQ_QUORUM),
         ("W2", "rabbitmq", 1.0), ("W4", "activemq", 1.0))


def plan(opts: argparse.Namespace) -> list[tuple[int, str, str, list[str]]]:
    """(round, workload, broker, load.py argv): every round runs each broker once
    per workload, in the order given, so runs of different brokers alternate."""
    extra = ["--seconds", str(opts.seconds)]
    for flag in ("producers", "consumers", "processes"):
        if getattr(opts, flag) is not None:
            extra += [f"--{flag}", str(getattr(opts, flag))]
    steps = []
    for r in range(1, opts.rounds + 1):
        for w in opts.workloads:
            flags, spawn = WORKLOADS[w]
            steps.extend((r, w, b, ["bench/load.py", "--spawn", spawn[b], *extra, *flags])
                         for b in opts.brokers if b in spawn)
    return steps


def figures(record: dict[str, Any]) -> dict[str, Any]:
    """One run's figures, flat: what the per-run line and the summary use."""
    res = record.get("result") or {}
    cpu = res.get("cpu_us_per_msg", {})
    # W2 awaits no RECEIPT: its latencies are empty, not zero.
    receipts = {} if res.get("config", {}).get("no_receipts") else \
        res.get("receipt_latency_ms", {})
    return {"msg_s": res.get("end_to_end_msg_s"),
            "receipt_p50_ms": receipts.get("p50"), "receipt_p99_ms": receipts.get("p99"),
            "broker_us": cpu.get("broker"), "store_us": cpu.get("store"),
            "loadgen_us": cpu.get("loadgen"),
            "load1": _float(record.get("loadavg_before", "").split()[:1])}


def _float(words: list[str]) -> float | None:
    try:
        return float(words[0])
    except (IndexError, ValueError):
        return None


def line(r: int, w: str, b: str, record: dict[str, Any]) -> str:
    """The per-run line a reader scans: rate, receipts, CPU, the machine's load."""
    if "error" in record:
        return f"{w} round {r} {b}: error: {record['error']}"
    f = figures(record)

    def fmt(v: Any) -> str:
        return "-" if v is None else str(v)  # load.py rounded them already
    return (f"{w} round {r} {b}: {fmt(f['msg_s'])} msg/s, RECEIPT p50/p99 "
            f"{fmt(f['receipt_p50_ms'])}/{fmt(f['receipt_p99_ms'])} ms, CPU µs/msg broker "
            f"{fmt(f['broker_us'])} store {fmt(f['store_us'])} loadgen "
            f"{fmt(f['loadgen_us'])}, load (1 min) before {fmt(f['load1'])}")


def _median(values: list[Any]) -> float | None:
    nums = [v for v in values if isinstance(v, int | float)]
    return round(statistics.median(nums), 2) if nums else None


def summarize(runs: list[tuple[int, str, str, dict[str, Any]]]) -> dict[str, Any]:
    """Medians per workload and broker; amqlite/peer per round and on the medians;
    issue 25's goals (None when a side is missing)."""
    by: dict[tuple[str, str], dict[int, dict[str, Any]]] = {}
    for r, w, b, record in runs:
        if "error" not in record:
            by.setdefault((w, b), {})[r] = figures(record)
    medians = {f"{w}/{b}": {k: _median([f[k] for f in rounds.values()])
                            for k in ("msg_s", "receipt_p50_ms", "receipt_p99_ms",
                                      "broker_us", "store_us", "loadgen_us", "load1")}
               | {"runs": len(rounds)}
               for (w, b), rounds in sorted(by.items())}
    ratios: dict[str, Any] = {}
    for (w, b), rounds in sorted(by.items()):
        ours = by.get((w, "amqlite"), {})
        if b == "amqlite" or not ours:
            continue
        paired = [round(ours[r]["msg_s"] / rounds[r]["msg_s"], 2) for r in sorted(rounds)
                  if r in ours and ours[r]["msg_s"] and rounds[r]["msg_s"]]
        a, p = medians[f"{w}/amqlite"]["msg_s"], medians[f"{w}/{b}"]["msg_s"]
        ratios[f"{w} amqlite/{b}"] = {
            "per_round": paired, "median_of_rounds": _median(paired),
            "of_medians": round(a / p, 2) if a and p else None}
    goals = {}
    for w, peer, bound in GOALS:
        got = ratios.get(f"{w} amqlite/{peer}", {}).get("median_of_rounds")
        goals[f"{w} amqlite >= {bound}x {peer}"] = None if got is None else got >= bound
    return {"medians": medians, "ratios": ratios, "goals": goals}


def table(summary: dict[str, Any], workloads: list[str], brokers: list[str]) -> str:
    """Markdown: medians per broker and the ratios, one block per workload."""
    out = []
    for w in workloads:
        cols = [b for b in brokers if f"{w}/{b}" in summary["medians"]]
        if not cols:
            continue
        out += [f"| {w} (median of runs) | " + " | ".join(NAMES[b] for b in cols) + " |",
                "|---|" + "---:|" * len(cols)]
        rows = [("end-to-end msg/s", ("msg_s",)),
                ("RECEIPT p50 / p99 ms", ("receipt_p50_ms", "receipt_p99_ms")),
                ("CPU µs per message: broker / store / load generator",
                 ("broker_us", "store_us", "loadgen_us")),
                ("load average (1 min) before a run", ("load1",)),
                ("runs", ("runs",))]
        for label, keys in rows:
            cells = [" / ".join("-" if (v := summary["medians"][f"{w}/{b}"][k]) is None
                                else str(v) for k in keys) for b in cols]
            out.append(f"| {label} | " + " | ".join(cells) + " |")
        ratios = [summary["ratios"].get(f"{w} amqlite/{b}") for b in cols]
        if any(ratios):
            cells = ["" if r is None else
                     f"{r['median_of_rounds']} ({', '.join(map(str, r['per_round']))})"
                     for r in ratios]
            out.append("| amqlite / this: median (each round) | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workloads", default="W1", help="W1, W2, W4, comma-separated")
    ap.add_argument("--brokers", default="amqlite,rabbitmq,rabbitmq-quorum",
                    help="amqlite, rabbitmq, rabbitmq-quorum, activemq")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=20.0, help="measuring time per run")
    ap.add_argument("--producers", type=int, help="load.py's (default 50)")
    ap.add_argument("--consumers", type=int, help="load.py's (default 4)")
    ap.add_argument("--processes", type=int, help=PROCESSES_HELP)
    ap.add_argument("--save", type=Path, help="also write every record and the summary here")
    opts = ap.parse_args()
    opts.workloads = [w.strip() for w in opts.workloads.split(",")]
    opts.brokers = [b.strip() for b in opts.brokers.split(",")]
    if unknown := set(opts.workloads) - set(WORKLOADS):
        ap.error(f"unknown workload(s) {sorted(unknown)}: choose from {sorted(WORKLOADS)}")
    if unknown := set(opts.brokers) - set(SPAWN):
        ap.error(f"unknown broker(s) {sorted(unknown)}: choose from {sorted(SPAWN)}")
    if opts.rounds < 1 or opts.seconds <= 0:
        ap.error("--rounds and --seconds must be positive")
    info = {"machine": machine(), "loadavg_start": loadavg(),
            "config": {k: v for k, v in vars(opts).items() if k != "save"}}
    print(json.dumps({"run": info}), flush=True)
    runs = []
    for r, w, b, args in plan(opts):
        record = run_one(w, b, args, COMMAND_TIMEOUT)
        record["round"] = r
        runs.append((r, w, b, record))
        print(line(r, w, b, record), flush=True)
    summary = {**summarize(runs), "loadavg_end": loadavg()}
    print(json.dumps(summary), flush=True)
    md = table(summary, opts.workloads, opts.brokers)
    print(md)
    if opts.save:
        opts.save.write_text(json.dumps({"run": info, "records": [r[3] for r in runs],
                                         "summary": summary, "table": md}, indent=1))
    return 1 if any("error" in r[3] for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
