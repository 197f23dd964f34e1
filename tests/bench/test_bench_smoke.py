"""Seconds-long runs of the benchmark harness against amqlite, so it cannot rot.

The figures are not judged here (the machine is shared and tiny runs are
noisy): only that each command runs, prints its one JSON line with the fields
bench/README.md and bench/run_all.py read, and moved messages. The peers
(ActiveMQ, RabbitMQ) are never needed by the suite.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.servers import wait_for_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[2]
#: Each command's own bound; it starts and stops a broker (and maybe PostgreSQL).
COMMAND_TIMEOUT = 150


def bench(*args: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                         timeout=COMMAND_TIMEOUT)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    assert lines, out.stdout + out.stderr[-3000:]
    return json.loads(lines[-1])


@pytest.mark.parametrize("spawn", ["sqlite", "postgres"])
def test_load_durable(spawn: str) -> None:
    r = bench("bench/load.py", "--spawn", spawn, "--seconds", "1.5", "--producers", "5",
              "--consumers", "2")
    assert r["bench"] == "load"
    assert r["broker"]["broker"] == "amqlite"
    assert r["config"]["spawn"] == spawn and r["config"]["producers"] == 5
    assert r["sent"] > 0 and r["received"] == r["sent"]
    assert r["produce_msg_s"] > 0 and r["end_to_end_msg_s"] > 0
    assert r["receipt_latency_ms"]["p50"] > 0
    assert set(r["receipt_latency_ms"]) == {"p50", "p99", "mean"}
    assert set(r["e2e_latency_ms"]) == {"p50", "p99"}
    for key in ("loadgen_cpu_s", "loadgen_cpu_pct", "broker_cpu_s", "broker_rss_mb"):
        assert isinstance(r[key], int | float)
    # CPU per delivered message: the broker's tree and the generator always,
    # the store's PostgreSQL when there is one (SQLite lives in the broker).
    per_msg = r["cpu_us_per_msg"]
    assert set(per_msg) == ({"broker", "store", "loadgen"} if spawn == "postgres"
                            else {"broker", "loadgen"})
    rounding = 1e6 * 0.005 / r["received"] + 0.1  # broker_cpu_s has 2 decimals
    assert per_msg["broker"] == pytest.approx(1e6 * r["broker_cpu_s"] / r["received"],
                                              abs=rounding)
    assert all(v > 0 for v in per_msg.values())


def test_load_fire_and_forget() -> None:
    r = bench("bench/load.py", "--spawn", "sqlite", "--seconds", "1", "--producers", "3",
              "--consumers", "1", "--non-persistent", "--no-receipts", "--ack", "auto")
    assert r["config"]["non_persistent"] and r["config"]["no_receipts"]
    assert r["sent"] > 0 and r["received"] > 0 and r["produce_msg_s"] > 0


def test_load_producer_processes() -> None:
    r = bench("bench/load.py", "--spawn", "sqlite", "--seconds", "1", "--producers", "4",
              "--consumers", "1", "--processes", "2")
    assert r["config"]["processes"] == 2
    assert r["sent"] > 0 and r["received"] == r["sent"]
    assert r["receipt_latency_ms"]["p50"] > 0


def test_takeover() -> None:
    r = bench("bench/takeover.py", "--rounds", "1")
    assert r["bench"] == "takeover"
    assert len(r["takeover_ms"]) == 1
    assert 0 < r["p50_ms"] <= r["max_ms"]


def test_failover_under_load() -> None:
    r = bench("bench/failover.py", "--store", "sqlite", "--nodes", "2", "--rounds", "1",
              "--warmup", "1", "--settle", "0.5", "--producers", "4", "--consumers", "1")
    assert r["bench"] == "failover" and r["broker"]["broker"] == "amqlite"
    assert r["gap_ms"]["samples"] == 4, r
    assert 0 < r["gap_ms"]["p50"] <= r["gap_ms"]["max"], r
    assert r["rounds"][0]["producers_resumed"] == 4, r
    assert r["receipted"] > 0
    assert r["lost"] == 0 and r["duplicated"] == 0, r


def test_depth() -> None:
    r = bench("bench/depth.py", "--spawn", "sqlite", "--backlog", "500", "--consumers", "2")
    assert r["bench"] == "depth"
    assert r["preloaded"] == 500 and r["drained"] == 500
    assert r["rss_mb_backlog_waiting"] > 0 and r["drain_msg_s"] > 0


def test_runner_quick_prints_records_ratios_and_table() -> None:
    out = subprocess.run([sys.executable, "bench/run_all.py", "--quick", "--only", "W4"],
                         cwd=ROOT, capture_output=True, text=True, timeout=COMMAND_TIMEOUT)
    assert out.returncode == 0, out.stderr[-3000:]
    records = [json.loads(ln) for ln in out.stdout.splitlines() if ln.startswith("{")]
    assert "machine" in records[0]["run"]
    w4 = [r for r in records if r.get("workload") == "W4"]
    assert len(w4) == 1 and w4[0]["result"]["end_to_end_msg_s"] > 0
    assert "ratios" in records[-1] and "targets" in records[-1]
    assert "| W4 embedded: end-to-end msg/s |" in out.stdout


def test_load_over_tls() -> None:
    """W1 over TLS: a throwaway certificate, every connection over the ssl listener."""
    r = bench("bench/load.py", "--spawn", "sqlite", "--tls", "--seconds", "1.5",
              "--producers", "5", "--consumers", "2", "--processes", "2")
    assert r["broker"]["tls"] is True and r["config"]["tls"] is True
    assert r["sent"] > 0 and r["received"] == r["sent"]


def test_load_over_websocket_beside_tcp() -> None:
    """W1 over TCP, then over WebSocket, against one spawned broker (--transport both):
    every message of each run arrives (producer identities are new per run)."""
    r = bench("bench/load.py", "--spawn", "sqlite", "--transport", "both", "--seconds", "1.5",
              "--producers", "4", "--consumers", "2")
    for transport in ("tcp", "ws"):
        assert r[transport]["sent"] > 0, r
        assert r[transport]["received"] == r[transport]["sent"], r


def test_load_scrapes_the_spawned_brokers_metrics() -> None:
    """W1 with Prometheus-like scrapes: every GET of the spawned broker's /metrics answers."""
    r = bench("bench/load.py", "--spawn", "sqlite", "--seconds", "1.5", "--producers", "2",
              "--consumers", "1", "--scrape-interval", "0.2")
    scrapes = r["scrapes"]
    assert scrapes["url"] == r["broker"]["http"] + "/metrics"
    assert scrapes["count"] > 0 and scrapes["failures"] == 0, scrapes
    assert r["sent"] > 0 and r["received"] == r["sent"]


def test_side_by_side_alternates_runs_and_prints_each_runs_costs() -> None:
    """Issue 25's side-by-side command on its amqlite path (the peers are never
    needed here; the order of runs over rounds and brokers is
    tests/unit/test_side_by_side_summary.py's): each run's line carries msg/s, RECEIPT
    p50/p99, CPU per message of broker, store and load generator, and the load
    average before it; the summary has each median."""
    out = subprocess.run([sys.executable, "bench/side_by_side.py", "--brokers", "amqlite",
                          "--workloads", "W1,W2", "--rounds", "1", "--seconds", "1",
                          "--producers", "3", "--consumers", "1"],
                         cwd=ROOT, capture_output=True, text=True, timeout=COMMAND_TIMEOUT)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    runs = [ln for ln in lines if " round " in ln and not ln.startswith("{")]
    assert [ln.split(":")[0] for ln in runs] == ["W1 round 1 amqlite", "W2 round 1 amqlite"]
    for ln in runs:
        assert " msg/s, RECEIPT p50/p99 " in ln and "CPU µs/msg broker " in ln, ln
        assert " store " in ln and " loadgen " in ln and "load (1 min) before " in ln, ln
    assert "RECEIPT p50/p99 -/- ms" in runs[1]  # W2 awaits no RECEIPT
    summary = json.loads(next(ln for ln in lines if ln.startswith('{"medians"')))
    w1 = summary["medians"]["W1/amqlite"]
    assert w1["runs"] == 1 and w1["msg_s"] > 0 and w1["receipt_p50_ms"] > 0
    assert w1["broker_us"] > 0 and w1["store_us"] > 0 and w1["loadgen_us"] > 0
    assert w1["load1"] is not None
    assert summary["medians"]["W2/amqlite"]["receipt_p50_ms"] is None
    assert summary["ratios"] == {}  # no peer ran
    assert "| W1 (median of runs) | amqlite |" in out.stdout


def test_a_bench_stopped_with_sigterm_stops_the_broker_it_started() -> None:
    """`kill` or `timeout` on a bench must not leave its brokers running (RabbitMQ's
    nodes were left so): PeerSet turns SIGTERM into an exit through its cleanup."""
    proc = subprocess.Popen([sys.executable, "bench/peers.py", "sqlite"], cwd=ROOT,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # "sqlite STOMP on 127.0.0.1:PORT (log PATH); ..."
        match = re.search(r"127\.0\.0\.1:(\d+) \(log (\S+)\)", line)
        assert match, line
        port, tmp = int(match[1]), Path(match[2]).parent
        wait_for_port(port)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=COMMAND_TIMEOUT) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    assert not tmp.exists()
