"""The audit job against the embedded SQLite store, through xerial's JDBC driver
(Debian's libxerial-sqlite-jdbc-java), opened read-only."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import pytest
from py4j.protocol import Py4JJavaError
from pyspark.sql import SparkSession
from sqlalchemy import create_engine, insert, text

from spark.audit_job import EXIT_CLEAN, EXIT_FINDINGS, FINDINGS, parse_store_url
from store.schema import dedup, groups, messages, metadata
from tests.spark.conftest import Run, run_audit
from tests.spark.seed import CLEAN_GROUPS, DAMAGE, create_store

pytestmark = pytest.mark.spark


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def damaged_sqlite(
    spark: SparkSession, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Run, str, str]:
    db = tmp_path_factory.mktemp("sqlite-store") / "amqlite.db"
    now = int(time.time() * 1000)
    create_store(f"sqlite:///{db}", now, damaged=True)
    before = _digest(db)
    out = str(tmp_path_factory.mktemp("audit-sqlite"))
    run = run_audit(["--store", f"sqlite:///{db}", "--now", str(now)], out)
    return run, before, _digest(db)


def test_damaged_sqlite_store_reports_every_finding_exactly(
    damaged_sqlite: tuple[Run, str, str],
) -> None:
    run, _, _ = damaged_sqlite
    assert run.code == EXIT_FINDINGS, run.stderr
    assert run.summary["backend"] == "sqlite"
    expected = {finding: {finding: d.count} for finding, (_, d) in DAMAGE.items()}
    assert run.counts_by_group() == expected
    for finding, (_, d) in DAMAGE.items():
        assert len(run.finding_rows(finding)) == d.rows, finding
    assert set(run.summary["groups"]) == set(CLEAN_GROUPS) | set(DAMAGE)


def test_the_audit_never_writes_to_the_store(damaged_sqlite: tuple[Run, str, str]) -> None:
    _, before, after = damaged_sqlite
    assert after == before


def test_the_audit_opens_sqlite_read_only(spark: SparkSession, tmp_path: Path) -> None:
    """The connection properties the job gives xerial's driver refuse writes."""
    db = tmp_path / "amqlite.db"
    create_store(f"sqlite:///{db}", int(time.time() * 1000), damaged=False)
    source = parse_store_url(f"sqlite:///{db}")
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    props = jvm.java.util.Properties()
    for key, value in source.properties.items():
        props.setProperty(key, value)
    conn = jvm.org.sqlite.JDBC().connect(source.jdbc_url, props)
    try:
        with pytest.raises(Py4JJavaError, match="SQLITE_READONLY"):
            conn.createStatement().execute("DELETE FROM amq_messages")
    finally:
        conn.close()


def test_clean_sqlite_store_exits_0(spark: SparkSession, tmp_path: Path) -> None:
    db = tmp_path / "amqlite.db"
    now = int(time.time() * 1000)
    create_store(f"sqlite:///{db}", now, damaged=False)
    run = run_audit(["--store", f"sqlite:///{db}", "--now", str(now)])
    assert run.code == EXIT_CLEAN, run.stderr
    assert run.stdout.endswith(
        "clean: no duplicates, orphans, stale state or sequence gaps found\n"
    )
    assert "FOUND" not in run.stdout
    assert not any(line.startswith(tuple(FINDINGS)) for line in run.stdout.splitlines())


def test_store_with_empty_tables_exits_0(spark: SparkSession, tmp_path: Path) -> None:
    """A group that just claimed its first epoch: every table but amq_groups is
    empty, so every bound query aggregates nothing."""
    db = tmp_path / "amqlite.db"
    engine = create_engine(f"sqlite:///{db}")
    metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(insert(groups).values(grp="fresh", epoch=1, dedup_window_ms=600_000))
    engine.dispose()
    run = run_audit(["--store", f"sqlite:///{db}", "--json"])
    assert run.code == EXIT_CLEAN, run.stderr
    summary = json.loads(run.stdout)
    assert summary["groups"] == ["fresh"]
    assert summary["rows_read"] == 0


def test_missing_sqlite_file_exits_2(spark: SparkSession, tmp_path: Path) -> None:
    run = run_audit(["--store", f"sqlite:///{tmp_path}/nope.db"])
    assert run.code == 2
    assert run.stderr == f"amqlite audit: error: SQLite store {tmp_path}/nope.db does not exist\n"


def test_scheduled_messages_not_yet_due_are_no_finding(spark: SparkSession,
                                                        tmp_path: Path) -> None:
    """A scheduled topic message (``deliver_at > 0``) is owed to no durable subscription
    until a copy of it is due, and a scheduled row never expires itself: the audit of a
    clean store with such rows stays clean. The same topic row without ``deliver_at``
    is an orphan (the check still runs)."""
    db = tmp_path / "amqlite.db"
    now = int(time.time() * 1000)
    create_store(f"sqlite:///{db}", now, damaged=False)
    engine = create_engine(f"sqlite:///{db}")
    with engine.begin() as conn:
        topic, queue = (conn.scalar(text(
            "SELECT min(id) FROM amq_destinations WHERE grp = 'alpha' AND kind = :k"), {"k": k})
            for k in ("topic", "queue"))
        top = conn.scalar(text("SELECT max(id) FROM amq_messages WHERE grp = 'alpha'"))
        plan = '{"delay":3600000,"period":0,"repeat":0,"cron":null,"fired":0,"ttl":0}'
        for i, dest in ((top + 1, topic), (top + 2, queue)):
            conn.execute(insert(messages).values(
                grp="alpha", id=i, destination_id=dest, message_id=f"ID:alpha-{i}",
                producer_id="sched", producer_seq=i, dedup_key=f"sched:{i}", priority=4,
                expires_at=0, enqueued_at=now - 1000, delivery_count=0, headers="{}",
                body=b"later %d" % i, deliver_at=now + 3_600_000, schedule=plan))
            conn.execute(insert(dedup).values(grp="alpha", dedup_key=f"sched:{i}",
                                              producer_id="sched", producer_seq=i,
                                              msg_id=i, created_at=now - 1000))
    run = run_audit(["--store", f"sqlite:///{db}", "--now", str(now)])
    assert run.code == EXIT_CLEAN, run.stdout + run.stderr
    with engine.begin() as conn:
        conn.execute(text("UPDATE amq_messages SET deliver_at = NULL WHERE id = :i"),
                     {"i": top + 1})
    engine.dispose()
    run = run_audit(["--store", f"sqlite:///{db}", "--now", str(now), "--json"])
    assert run.code == EXIT_FINDINGS
    assert json.loads(run.stdout)["counts"]["orphan_topic_message"] == 1, run.stdout
