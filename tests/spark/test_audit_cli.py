"""``amqlite audit`` (click, in-process) and ``spark-submit spark/audit_job.py``:
the same job, the same arguments, the same exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from pyspark.sql import SparkSession

from cli.audit_cmd import audit
from spark.audit_job import DEFAULT_SQLITE_JAR, EXIT_CLEAN, EXIT_ERROR, EXIT_FINDINGS
from tests.spark.seed import create_store

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]
#: The spark-submit that pip's pyspark installs next to the interpreter.
SPARK_SUBMIT = Path(sys.executable).parent / "spark-submit"
#: A JVM start plus the audit on one core of a shared machine; generous.
SUBMIT_TIMEOUT_S = 240


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, int]:
    """A clean and a damaged SQLite store, seeded at one instant."""
    now = int(time.time() * 1000)
    base = tmp_path_factory.mktemp("cli-stores")
    clean, damaged = f"sqlite:///{base / 'clean.db'}", f"sqlite:///{base / 'damaged.db'}"
    create_store(clean, now, damaged=False)
    create_store(damaged, now, damaged=True)
    return clean, damaged, now


def test_cli_clean_store_json(spark: SparkSession, stores: tuple[str, str, int]) -> None:
    clean, _, now = stores
    result = CliRunner().invoke(audit, ["--store", clean, "--now", str(now), "--json"])
    assert result.exit_code == EXIT_CLEAN, result.output
    summary = json.loads(result.stdout)
    assert (summary["clean"], summary["total"]) == (True, 0)


def test_cli_store_from_environment_and_one_group(
    spark: SparkSession, stores: tuple[str, str, int], tmp_path: Path
) -> None:
    _, damaged, now = stores
    result = CliRunner().invoke(
        audit,
        ["--group", "orphan_destination", "--now", str(now), "--output", str(tmp_path)],
        env={"AMQLITE_STORE": damaged},
    )
    assert result.exit_code == EXIT_FINDINGS, result.output
    assert "orphan_destination  orphan_destination  #2 (gone)        5" in result.stdout
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["groups"] == ["orphan_destination"]
    assert summary["total"] == 5


def test_cli_bad_url_exits_2(spark: SparkSession) -> None:
    result = CliRunner().invoke(audit, ["--store", "redis://localhost"])
    assert result.exit_code == EXIT_ERROR
    assert result.stderr.startswith("amqlite audit: error: bad store URL 'redis://localhost'")
    assert result.stderr.count("\n") == 1


def test_spark_submit_runs_the_job_file_unchanged(
    stores: tuple[str, str, int], tmp_path: Path
) -> None:
    """The file spark-submit ships to a cluster, run by spark-submit itself."""
    _, damaged, now = stores
    env = {
        **os.environ,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    }
    env.pop("PYSPARK_GATEWAY_PORT", None)
    proc = subprocess.run(
        [
            str(SPARK_SUBMIT),
            "--master", "local[1]",
            "--jars", DEFAULT_SQLITE_JAR,
            "--conf", "spark.ui.enabled=false",
            "--conf", "spark.driver.host=127.0.0.1",
            "--conf", "spark.driver.bindAddress=127.0.0.1",
            "--conf", "spark.sql.shuffle.partitions=2",
            str(REPO / "spark" / "audit_job.py"),
            "--store", damaged, "--group", "sequence_gap", "--now", str(now), "--json",
            "--output", str(tmp_path),
        ],
        capture_output=True, text=True, timeout=SUBMIT_TIMEOUT_S, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == EXIT_FINDINGS, proc.stderr[-2000:]
    summary = json.loads(proc.stdout)
    assert summary["counts"]["sequence_gap"] == 4
    assert summary["total"] == 4
    assert (tmp_path / "findings" / "sequence_gap").is_dir()
