"""Who runs the statements pushed into PostgreSQL, and that it changes nothing:
the driver's own connections (the default: they run while the JVM starts), Spark's
partitions (a read too big for the driver's memory, or no psycopg), and a big
group's duplicate checks split into hash classes. Each finds exactly the planted
damage of tests/spark/seed.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from spark.audit import pool, run, store_checks
from spark.audit.reader import local_frame
from spark.audit.snapshot import PsycopgSnapshot
from spark.audit.source import parse_store_url
from tests.helpers.servers import PostgresServer
from tests.spark.conftest import pg_store, run_audit
from tests.spark.seed import DAMAGE

pytestmark = [pytest.mark.spark, pytest.mark.integration]

EXPECTED = {finding: {finding: d.count} for finding, (_, d) in DAMAGE.items()}
#: msg_ids of the planted identity duplicates (test_audit_postgres.py says which).
IDENTITY_DUPLICATES = [102, 103, 104, 105]


@pytest.fixture(scope="module")
def damaged_pg(spark: SparkSession, postgres_server: PostgresServer) -> tuple[str, int]:
    return pg_store(postgres_server, damaged=True)


@pytest.mark.parametrize("mode", ["driver", "over_driver_limit", "no_psycopg"])
def test_every_way_of_running_the_statements_finds_the_same(
    damaged_pg: tuple[str, int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    url, now = damaged_pg
    if mode == "over_driver_limit":
        monkeypatch.setattr(pool, "DRIVER_READ_MAX_ROWS", 0)
    elif mode == "no_psycopg":
        monkeypatch.setattr(run, "psycopg_installed", lambda: False)
    got = run_audit(["--store", url, "--now", str(now)], str(tmp_path))
    assert got.code == 1, got.stderr
    assert got.counts_by_group() == EXPECTED
    dups = sorted(r["msg_id"] for r in got.finding_rows("duplicate_identity"))
    assert dups == IDENTITY_DUPLICATES
    pushed = got.summary["pushed"]
    if mode == "no_psycopg":
        assert pushed == {"run_by": "spark"}
        return
    assert pushed["run_by"] == "driver"
    assert pushed["connections"] >= 2
    if mode == "over_driver_limit":
        # Every read that returns a row is left to Spark: the rows never pass the driver.
        assert pushed["left_to_spark"] == sorted(n for n, c in got.summary["returned"].items()
                                                 if c > 0)
        assert pushed["left_to_spark"]
    else:
        assert pushed["left_to_spark"] == []


@pytest.mark.parametrize("group", ["duplicate_identity", "duplicate_content"])
def test_a_big_group_is_checked_for_duplicates_in_shares(
    damaged_pg: tuple[str, int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, group: str
) -> None:
    """A group of more than DUPLICATE_ROWS_PER_STATEMENT messages: its identity and
    content checks are several statements, a hash class each, judging the same rows."""
    url, now = damaged_pg
    args = ["--store", url, "--now", str(now), "--group", group]
    whole = run_audit(args, str(tmp_path / "whole"))
    monkeypatch.setattr(store_checks, "DUPLICATE_ROWS_PER_STATEMENT", 2)
    split = run_audit(args, str(tmp_path / "split"))
    assert whole.code == split.code == 1, split.stderr
    assert whole.counts_by_group() == split.counts_by_group() == {group: EXPECTED[group]}
    assert split.finding_rows(group) and (
        sorted(map(str, split.finding_rows(group))) == sorted(map(str, whole.finding_rows(group)))
    )
    messages = whole.summary["reads"]["amq_messages"]["rows"]
    # Two checks, one statement each, became two of ceil(rows / 2) each.
    extra = 2 * (-(-messages // 2) - 1)
    assert split.summary["pushed"]["statements"] == whole.summary["pushed"]["statements"] + extra


def test_driver_rows_reach_spark_as_they_were(spark: SparkSession) -> None:
    """Rows the pool returns are handed to Spark as JSON literals: text with
    newlines, quotes, backslashes and non-ASCII, NULLs and big numbers survive."""
    types = {"grp": "string", "n": "bigint", "note": "string"}
    rows = [("g\n1", 2**62, 'say "hi"\\'), ("ü€😀", None, None), ("", -1, "\t")]
    df = local_frame(spark, ["grp", "n", "note"], rows, types)
    assert sorted(tuple(r) for r in df.collect()) == sorted(rows)
    assert local_frame(spark, [], [], types).count() == 0


def test_the_drivers_snapshot_is_one_repeatable_read_view(
    damaged_pg: tuple[str, int], postgres_server: PostgresServer
) -> None:
    """The exporting connection's own queries (counts, quantiles, groups) see the
    snapshot it exported, not what commits after, and cannot write."""
    import psycopg

    url, _ = damaged_pg
    snap = PsycopgSnapshot(parse_store_url(url))
    try:
        before = snap.query("SELECT COUNT(*) FROM amq_meta")[0][0]
        with psycopg.connect(url, autocommit=True) as other:
            other.execute("INSERT INTO amq_meta (key, value) VALUES ('audit-test', 'x')")
        try:
            assert snap.query("SELECT COUNT(*) FROM amq_meta")[0][0] == before
            assert snap.query("SHOW transaction_isolation") == [("repeatable read",)]
            assert snap.query("SHOW transaction_read_only") == [("on",)]
        finally:
            with psycopg.connect(url, autocommit=True) as other:
                other.execute("DELETE FROM amq_meta WHERE key = 'audit-test'")
    finally:
        snap.close()
