"""The audit job against a real PostgreSQL, through Spark's JDBC source.

One damaged store holds one group per finding type plus healthy groups, so a
single run proves each finding with its exact count *and* that no group
reports anything but its own damage.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from spark.audit_job import (
    EXIT_CLEAN,
    EXIT_ERROR,
    EXIT_FINDINGS,
    FINDINGS,
    PG_IDLE_IN_TRANSACTION_TIMEOUT_MS,
    PG_STATEMENT_TIMEOUT_MS,
    ROWS_PER_PARTITION,
    StoreReader,
    parse_store_url,
)
from tests.helpers.servers import PostgresServer, free_port
from tests.spark.conftest import Run, pg_store, run_audit
from tests.spark.seed import CLEAN_GROUPS, DAMAGE, create_store

pytestmark = [pytest.mark.spark, pytest.mark.integration]


@pytest.fixture(scope="module")
def damaged(
    spark: SparkSession, postgres_server: PostgresServer, tmp_path_factory: pytest.TempPathFactory
) -> Run:
    url = postgres_server.create_database()
    now = int(time.time() * 1000)
    create_store(url, now, damaged=True)
    out = str(tmp_path_factory.mktemp("audit-pg"))
    return run_audit(["--store", url, "--now", str(now)], out)


@pytest.fixture(scope="module")
def clean_pg(spark: SparkSession, postgres_server: PostgresServer) -> tuple[str, int]:
    return pg_store(postgres_server, damaged=False)


def test_damaged_store_exits_1(damaged: Run) -> None:
    assert damaged.code == EXIT_FINDINGS, damaged.stderr
    assert damaged.stderr == ""
    expected_total = sum(d.count for _, d in DAMAGE.values())
    assert damaged.summary["total"] == expected_total == 30
    assert f"FOUND {expected_total} in {len(FINDINGS)} finding type(s)" in damaged.stdout


@pytest.mark.parametrize("finding", list(DAMAGE))
def test_each_damage_is_found_exactly(damaged: Run, finding: str) -> None:
    """The group damaged with ``finding`` reports that finding, its exact count
    per destination, and nothing else."""
    want = DAMAGE[finding][1]
    assert damaged.counts_by_group()[finding] == {finding: want.count}
    per_dest = {
        r["destination"]: r["count"]
        for r in damaged.summary["findings"]
        if r["group"] == finding and r["finding"] == finding
    }
    assert per_dest == want.destinations
    rows = damaged.finding_rows(finding)
    assert len(rows) == want.rows
    assert {r["grp"] for r in rows} == {finding}
    assert len(damaged.summary["samples"][finding]) == min(5, want.rows)


def test_healthy_groups_in_a_damaged_store_report_nothing(damaged: Run) -> None:
    reported = damaged.counts_by_group()
    assert [g for g in CLEAN_GROUPS if g in reported] == []
    assert set(damaged.summary["groups"]) == set(CLEAN_GROUPS) | set(DAMAGE)


def test_finding_rows_carry_what_to_act_on(damaged: Run) -> None:
    gaps = sorted(
        (r["after_seq"], r["before_seq"], r["missing"])
        for r in damaged.finding_rows("sequence_gap")
    )
    assert gaps == [(2, 6, 3), (13, 15, 1)]
    dups = sorted(r["msg_id"] for r in damaged.finding_rows("duplicate_identity"))
    assert dups == [102, 103, 104, 105]  # copies of 12, 13 (twice), and p1:5 stored again
    ghost = next(r for r in damaged.finding_rows("duplicate_identity") if r["msg_id"] == 105)
    assert (ghost["identity"], ghost["first_msg_id"], ghost["copies"]) == ("p1:5", 5, 2)
    stale = sorted((r["msg_id"], r.get("sub_id")) for r in damaged.finding_rows("stale_inflight"))
    assert stale == [(12, None), (13, None), (20, 2)]


def test_output_directory_holds_only_the_findings_that_exist(damaged: Run) -> None:
    assert damaged.output is not None
    folders = [p.name for p in (Path(damaged.output) / "findings").iterdir() if p.is_dir()]
    assert sorted(folders) == sorted(DAMAGE)
    assert damaged.summary["files"] == {f: f"findings/{f}" for f in DAMAGE}


def test_clean_store_exits_0(clean_pg: tuple[str, int], tmp_path: Path) -> None:
    url, now = clean_pg
    run = run_audit(["--store", url, "--now", str(now), "--json"], str(tmp_path))
    assert run.code == EXIT_CLEAN, run.stderr
    printed = json.loads(run.stdout)
    assert printed == run.summary
    assert printed["clean"] is True
    assert printed["total"] == 0
    assert printed["counts"] == {f: 0 for f in FINDINGS}
    assert printed["findings"] == []
    assert not (tmp_path / "findings").exists()
    assert printed["reads"]["amq_messages"]["rows"] == 3 * 23


def test_one_group_with_partitioned_reads(damaged: Run, postgres_server: PostgresServer) -> None:
    """--group restricts every read; small partitions give several read statements."""
    url = damaged.summary["store"]
    run = run_audit(
        [
            "--store",
            url,
            "--group",
            "sequence_gap",
            "--rows-per-partition",
            "5",
            "--json",
            "--now",
            str(damaged.summary["now_ms"]),
        ]
    )
    assert run.code == EXIT_FINDINGS, run.stderr
    summary = json.loads(run.stdout)
    assert summary["groups"] == ["sequence_gap"]
    assert summary["counts"] == {f: (4 if f == "sequence_gap" else 0) for f in FINDINGS}
    # 22 messages (23 seeded, one deleted): ceil(22 / 5) partitions.
    assert summary["reads"]["amq_messages"] == {"rows": 22, "partitions": 5}
    assert summary["reads"]["amq_sub_pending"] == {"rows": 6, "partitions": 2}


def test_password_is_never_printed(clean_pg: tuple[str, int], tmp_path: Path) -> None:
    url, now = clean_pg
    secret = "s3cret-pw"
    with_pw = url.replace("postgres@", f"postgres:{secret}@")
    run = run_audit(["--store", with_pw, "--now", str(now)], str(tmp_path))
    assert run.code == EXIT_CLEAN, run.stderr
    written = (tmp_path / "summary.json").read_text()
    assert secret not in run.stdout + run.stderr + written
    assert run.summary["store"] == url


def test_unreachable_store_exits_2_with_one_line(spark: SparkSession) -> None:
    secret = "hunter2"
    run = run_audit(["--store", f"postgresql://postgres:{secret}@127.0.0.1:{free_port()}/x"])
    assert run.code == EXIT_ERROR
    assert run.stdout == ""
    lines = run.stderr.splitlines()
    assert len(lines) == 1, run.stderr
    assert lines[0].startswith("amqlite audit: error: ")
    assert "refused" in lines[0]
    assert secret not in run.stderr


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("mysql://root@127.0.0.1/amq", "expected postgresql://... or sqlite:///path"),
        ("postgresql://postgres@127.0.0.1:notaport/x", "bad store URL"),
        ("postgresql:///amq?host=/var/run/postgresql", "no host (JDBC needs TCP)"),
        ("postgresql://h/amq?target_session_attrs=any", "'target_session_attrs' is not supported"),
    ],
)
def test_bad_url_exits_2_with_one_line(spark: SparkSession, url: str, message: str) -> None:
    run = run_audit(["--store", url])
    assert run.code == EXIT_ERROR
    assert run.stderr.count("\n") == 1 and message in run.stderr, run.stderr


def test_unknown_group_exits_2(clean_pg: tuple[str, int]) -> None:
    url, _ = clean_pg
    run = run_audit(["--store", url, "--group", "nope"])
    assert run.code == EXIT_ERROR
    assert run.stderr == f"amqlite audit: error: group 'nope' not found in {url}\n"


def test_database_without_the_schema_exits_2(spark: SparkSession, pg_url: str) -> None:
    run = run_audit(["--store", pg_url])
    assert run.code == EXIT_ERROR
    assert run.stderr.count("\n") == 1
    assert 'relation "amq_groups" does not exist' in run.stderr


def test_audit_connections_are_read_only_and_time_limited(
    spark: SparkSession, clean_pg: tuple[str, int]
) -> None:
    """What every JDBC partition read runs under: it cannot write, and the
    server ends a statement or an idle transaction that would pin the broker."""
    url, _ = clean_pg
    reader = StoreReader(spark, parse_store_url(url), None, ROWS_PER_PARTITION)
    row = reader.small(
        "SELECT current_setting('default_transaction_read_only') AS ro,"
        " (SELECT setting FROM pg_settings WHERE name = 'statement_timeout') AS st,"
        " (SELECT setting FROM pg_settings WHERE name = 'idle_in_transaction_session_timeout')"
        " AS it, current_setting('application_name') AS app",
        {"ro": "string", "st": "bigint", "it": "bigint", "app": "string"},
    ).first()
    assert row is not None
    assert (row["ro"], row["st"], row["it"], row["app"]) == (
        "on",
        PG_STATEMENT_TIMEOUT_MS,
        PG_IDLE_IN_TRANSACTION_TIMEOUT_MS,
        "amqlite-audit",
    )
