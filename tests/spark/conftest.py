"""One local Spark session for every Spark test: starting a JVM costs seconds,
and the machine's two cores are shared."""

from __future__ import annotations

import contextlib
import io
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from pyspark.sql import SparkSession

from spark.audit_job import DEFAULT_PG_JAR, DEFAULT_SQLITE_JAR, build_session, main
from tests.helpers.servers import PostgresServer
from tests.spark.seed import create_store

#: Two cores for the whole machine; four shuffle partitions are plenty for test data.
TEST_MASTER = "local[2]"
TEST_SHUFFLE_PARTITIONS = "4"


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = build_session(
        TEST_MASTER,
        [DEFAULT_PG_JAR, DEFAULT_SQLITE_JAR],
        {"spark.sql.shuffle.partitions": TEST_SHUFFLE_PARTITIONS},
    )
    try:
        yield session
    finally:
        session.stop()


@dataclass
class Run:
    """One audit run: exit code, what it printed, and what it wrote."""

    code: int
    stdout: str
    stderr: str
    output: str | None

    @property
    def summary(self) -> dict[str, Any]:
        assert self.output is not None
        with open(os.path.join(self.output, "summary.json"), encoding="utf-8") as f:
            return json.load(f)

    def finding_rows(self, finding: str) -> list[dict[str, Any]]:
        """Every row the job wrote for one finding type (Spark's part files)."""
        assert self.output is not None
        folder = os.path.join(self.output, "findings", finding)
        rows: list[dict[str, Any]] = []
        for name in sorted(os.listdir(folder)):
            if name.startswith("part-"):
                with open(os.path.join(folder, name), encoding="utf-8") as f:
                    rows += [json.loads(line) for line in f if line.strip()]
        return rows

    def counts_by_group(self) -> dict[str, dict[str, int]]:
        got: dict[str, dict[str, int]] = {}
        for row in self.summary["findings"]:
            per = got.setdefault(row["group"], {})
            per[row["finding"]] = per.get(row["finding"], 0) + row["count"]
        return got


def run_audit(argv: list[str], output: str | None = None) -> Run:
    """``main`` in this process (it reuses the session fixture's Spark)."""
    args = list(argv) + (["--output", output] if output else [])
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(args)
    return Run(code, out.getvalue(), err.getvalue(), output)


def pg_store(server: PostgresServer, damaged: bool) -> tuple[str, int]:
    """A new database on ``server`` seeded by tests/spark/seed.py: (URL, its now)."""
    url = server.create_database()
    now = int(time.time() * 1000)
    create_store(url, now, damaged=damaged)
    return url, now
