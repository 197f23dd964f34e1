"""The amqlite store audit's entry point: ``spark-submit spark/audit_job.py
--store URL ...`` (the ``amqlite audit`` command calls :func:`main` in-process).

The job itself is the package ``spark.audit`` (see its docstring for the rooms);
this module re-exports what the tests, the bench and the CLI use. Run as a file,
Python puts ``spark/`` first on ``sys.path``, not the directory holding the
``spark`` package, so the latter is added here. Only the driver imports the
package: the checks are Spark SQL, executors run no Python of it.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file by spark-submit or python
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from spark.audit.checks import check_sequence_gap
from spark.audit.limits import (
    DEDUP_GRACE_MS,
    DEFAULT_PG_JAR,
    DEFAULT_SQLITE_JAR,
    DUPLICATE_CONTENT_WINDOW_MS,
    EXIT_CLEAN,
    EXIT_ERROR,
    EXIT_FINDINGS,
    EXPIRY_GRACE_MS,
    FINDINGS,
    GAP_BUCKET_SEQS,
    PG_IDLE_IN_TRANSACTION_TIMEOUT_MS,
    PG_JAR_PACKAGE,
    PG_STATEMENT_TIMEOUT_MS,
    PG_WORK_MEM,
    ROWS_PER_PARTITION,
    SQLITE_JAR_PACKAGE,
    STALE_INFLIGHT_GRACE_MS,
    STORE_COLUMNS,
)
from spark.audit.reader import StoreReader
from spark.audit.run import main, run_audit
from spark.audit.session import build_session
from spark.audit.snapshot import open_snapshot
from spark.audit.source import parse_store_url

__all__ = [
    "DEDUP_GRACE_MS",
    "DEFAULT_PG_JAR",
    "DEFAULT_SQLITE_JAR",
    "DUPLICATE_CONTENT_WINDOW_MS",
    "EXIT_CLEAN",
    "EXIT_ERROR",
    "EXIT_FINDINGS",
    "EXPIRY_GRACE_MS",
    "FINDINGS",
    "GAP_BUCKET_SEQS",
    "PG_IDLE_IN_TRANSACTION_TIMEOUT_MS",
    "PG_JAR_PACKAGE",
    "PG_STATEMENT_TIMEOUT_MS",
    "PG_WORK_MEM",
    "ROWS_PER_PARTITION",
    "SQLITE_JAR_PACKAGE",
    "STALE_INFLIGHT_GRACE_MS",
    "STORE_COLUMNS",
    "StoreReader",
    "build_session",
    "check_sequence_gap",
    "main",
    "open_snapshot",
    "parse_store_url",
    "run_audit",
]

if __name__ == "__main__":
    sys.exit(main())
