"""bench/side_by_side.py's arithmetic on made-up run records (pure logic): the ratios
pair runs of one round, the medians and issue 25's goals come out of them, and a
failed run is left out rather than counted as zero."""

from __future__ import annotations

from typing import Any

from bench.side_by_side import plan, summarize, table


def record(msg_s: int, broker_us: float, load1: str = "1.00 1.00 1.00") -> dict[str, Any]:
    return {"loadavg_before": load1, "result": {
        "end_to_end_msg_s": msg_s, "receipt_latency_ms": {"p50": 5.0, "p99": 9.0},
        "cpu_us_per_msg": {"broker": broker_us, "store": 30.0, "loadgen": 25.0},
        "config": {"no_receipts": False}}}


RUNS = [
    (1, "W1", "amqlite", record(6000, 80.0, "0.50 0.4 0.3")),
    (1, "W1", "rabbitmq", record(5000, 130.0)),
    (1, "W1", "rabbitmq-quorum", record(2000, 300.0)),
    (2, "W1", "amqlite", record(8000, 70.0, "0.70 0.4 0.3")),
    (2, "W1", "rabbitmq", record(4000, 140.0)),
    (2, "W1", "rabbitmq-quorum", {"error": "rabbitmqctl join_cluster failed"}),
    (3, "W1", "amqlite", record(7000, 75.0, "0.60 0.4 0.3")),
    (3, "W1", "rabbitmq", record(7000, 120.0)),
    (3, "W1", "rabbitmq-quorum", record(1000, 310.0)),
]


def test_ratios_pair_rounds_and_skip_failed_runs() -> None:
    s = summarize(RUNS)
    classic = s["ratios"]["W1 amqlite/rabbitmq"]
    assert classic["per_round"] == [1.2, 2.0, 1.0]
    assert classic["median_of_rounds"] == 1.2
    assert classic["of_medians"] == 1.4  # 7000 / 5000
    quorum = s["ratios"]["W1 amqlite/rabbitmq-quorum"]
    assert quorum["per_round"] == [3.0, 7.0]  # round 2 failed: not a zero
    assert s["medians"]["W1/rabbitmq-quorum"]["runs"] == 2
    assert s["medians"]["W1/amqlite"]["load1"] == 0.6
    assert s["medians"]["W1/amqlite"]["broker_us"] == 75.0


def test_goals_follow_issue_25() -> None:
    goals = summarize(RUNS)["goals"]
    assert goals["W1 amqlite >= 1.5x rabbitmq"] is False  # median of rounds 1.2
    assert goals["W1 amqlite >= 4.0x rabbitmq-quorum"] is True  # median 5.0
    assert goals["W2 amqlite >= 1.0x rabbitmq"] is None  # not run


def test_table_shows_medians_and_each_rounds_ratio() -> None:
    md = table(summarize(RUNS), ["W1"], ["amqlite", "rabbitmq", "rabbitmq-quorum"])
    assert "| W1 (median of runs) | amqlite | RabbitMQ | RabbitMQ quorum, 3 nodes |" in md
    assert "| end-to-end msg/s | 7000 | 5000 | 1500.0 |" in md
    assert "|  | 1.2 (1.2, 2.0, 1.0) | 5.0 (3.0, 7.0) |" in md


def test_plan_alternates_brokers_within_each_round() -> None:
    class Opts:
        rounds, seconds, producers, consumers, processes = 2, 5.0, None, 2, 2
        workloads = ["W1", "W4"]
        brokers = ["amqlite", "rabbitmq", "activemq"]

    steps = plan(Opts())  # type: ignore[arg-type]
    assert [(r, w, b) for r, w, b, _ in steps] == [
        (1, "W1", "amqlite"), (1, "W1", "rabbitmq"), (1, "W1", "activemq"),
        (1, "W4", "amqlite"), (1, "W4", "activemq"),  # RabbitMQ has no W4
        (2, "W1", "amqlite"), (2, "W1", "rabbitmq"), (2, "W1", "activemq"),
        (2, "W4", "amqlite"), (2, "W4", "activemq")]
    assert steps[0][3] == ["bench/load.py", "--spawn", "postgres", "--seconds", "5.0",
                           "--consumers", "2", "--processes", "2"]
    # the same load generator for every broker
    assert all(args[5:9] == ["--consumers", "2", "--processes", "2"]
               for *_, args in steps)
    assert steps[3][3][:3] == ["bench/load.py", "--spawn", "sqlite"]
    assert steps[4][3][:3] == ["bench/load.py", "--spawn", "activemq-kahadb"]


def test_run_all_gives_every_brokers_load_runs_the_same_generator() -> None:
    """bench/run_all.py --processes 2: W1, W2 and W4 of every broker get it, the
    failover and depth benches (their own clients) do not."""
    from bench.run_all import plan as full_plan

    class Opts:
        only, brokers = ["W1", "W2", "W3", "W4", "W5"], ["amqlite", "activemq"]
        seconds, processes, rounds, backlog = 5.0, 2, 1, 100

    steps = full_plan(Opts())  # type: ignore[arg-type]
    loads = [args for w, _, args in steps if args[0] == "bench/load.py"]
    assert {w for w, _, args in steps if args[0] == "bench/load.py"} == {"W1", "W2", "W4"}
    assert len(loads) == 6 and all(args[3:7] == ["--seconds", "5.0", "--processes", "2"]
                                   for args in loads)
    assert not any("--processes" in args for _, _, args in steps
                   if args[0] != "bench/load.py")
