"""Running the audit: ``run_audit`` (read, check, summarize, write) and the
command line (``main``), whose errors are one line and an exit code.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import SparkSession

from spark.audit.data import all_findings, read_store
from spark.audit.limits import (
    CHECK_ROWS_PER_TASK,
    DEBUG_ENV,
    EXIT_CLEAN,
    EXIT_ERROR,
    EXIT_FINDINGS,
    ROWS_PER_PARTITION,
    AuditError,
)
from spark.audit.reader import StoreReader, settle
from spark.audit.report import join_path, render_table, summarize, write_findings, write_text_file
from spark.audit.session import (
    QUIET,
    SMALL_DATA_SETTINGS,
    Progress,
    build_session,
    check_settings,
    session_conf,
)
from spark.audit.snapshot import Snapshot, open_snapshot
from spark.audit.source import StoreSource, check_driver, check_reachable, parse_store_url


@dataclass
class AuditResult:
    summary: dict[str, Any]

    @property
    def clean(self) -> bool:
        return bool(self.summary["clean"])


def run_audit(
    spark: SparkSession,
    source: StoreSource,
    group: str | None = None,
    output: str | None = None,
    rows_per_partition: int = ROWS_PER_PARTITION,
    now_ms: int | None = None,
    progress: Progress = QUIET,
) -> AuditResult:
    """Read everything in one snapshot (let go as soon as it is read), check,
    count in one pass, then write rows only for the findings that have any."""
    started = time.monotonic()
    progress.watch(spark)
    snapshot: Snapshot | None = None
    try:
        progress.say(f"reading {source.description}")
        snapshot = open_snapshot(spark, source)
        reader = StoreReader(spark, source, group, rows_per_partition, progress, snapshot)
        pushed = source.backend == "postgresql"
        with session_conf(spark, SMALL_DATA_SETTINGS if pushed else {}):
            data = read_store(reader, now_ms)
        snapshot.close()
        read_done = time.monotonic()
        progress.say("checking")
        settings = check_settings(spark, sum(reader.returned.values()), pushed)
        with session_conf(spark, settings):
            tasks = math.ceil(sum(reader.returned.values()) / CHECK_ROWS_PER_TASK)
            findings = settle(all_findings(data).coalesce(max(1, tasks)))
            summary = summarize(reader, data, findings)
            checked = time.monotonic()
            if output:
                progress.say(f"writing findings to {output}")
                summary["output"] = output
                summary["files"] = write_findings(spark, findings, output, summary["counts"])
        done = time.monotonic()
        summary["duration_s"] = round(done - started, 3)
        summary["timings"] = {
            "read_s": round(read_done - started, 3),
            "check_s": round(checked - read_done, 3),
            "write_s": round(done - checked, 3),
        }
        if output:
            text = json.dumps(summary, indent=2) + "\n"
            write_text_file(spark, join_path(output, "summary.json"), text)
        progress.say("done")
        return AuditResult(summary)
    finally:
        if snapshot is not None:
            snapshot.close()
        progress.stop()


# --------------------------------------------------------------------------- entry point


class _ArgError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    """argparse exits on a bad argument; we owe the caller exit code 2 and one line."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise _ArgError(message)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="amqlite audit",
        description="Audit an amqlite store for lost, orphaned and duplicated messages. "
        "Exit 0: clean; 1: findings; 2: error.",
    )
    p.add_argument("--store", required=True, help="postgresql://... or sqlite:///path")
    p.add_argument("--group", default=None, help="audit one group (default: all)")
    p.add_argument(
        "--master", default=None, help="Spark master (default: spark-submit's, else local[*])"
    )
    p.add_argument(
        "--output",
        default=None,
        help="directory for summary.json and findings/<type>/ (JSON lines)",
    )
    p.add_argument("--json", action="store_true", help="print the JSON summary, not a table")
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress lines on stderr while Spark works (default: when stderr is a terminal)",
    )
    p.add_argument(
        "--jdbc-jar", default=None, help="JDBC driver jar (default: Debian's, for the store's kind)"
    )
    p.add_argument(
        "--rows-per-partition",
        type=int,
        default=ROWS_PER_PARTITION,
        help=f"rows per JDBC read partition (default {ROWS_PER_PARTITION})",
    )
    p.add_argument(
        "--now",
        type=int,
        default=None,
        metavar="MS",
        help="judge expiry and ages as of this time, ms since the Unix epoch "
        "(default: the store's clock)",
    )
    return p


def _root_message(exc: BaseException, secrets: Sequence[str]) -> str:
    """The innermost Java cause's first line: that is what the user can act on."""
    java = getattr(exc, "java_exception", None) or getattr(exc, "_origin", None)
    msg = ""
    if java is not None:
        try:
            cause = java
            while cause.getCause() is not None and cause.getCause() != cause:
                cause = cause.getCause()
            msg = cause.toString() if cause.getMessage() is None else str(cause.getMessage())
            if "ClassNotFoundException" in cause.getClass().getName():
                msg = f"JDBC driver class not found ({msg}): install it or pass --jdbc-jar"
        except Exception:
            msg = ""
    if not msg:
        msg = str(exc) if isinstance(exc, AuditError) else f"{type(exc).__name__}: {exc}"
    line = next((s.strip() for s in msg.splitlines() if s.strip()), type(exc).__name__)
    for s in secrets:
        line = line.replace(s, "***")
    return line


def main(argv: Sequence[str] | None = None) -> int:
    """Run the audit; 0 clean, 1 findings, 2 error (one line on stderr)."""
    try:
        args = _parser().parse_args(list(argv) if argv is not None else sys.argv[1:])
    except _ArgError as exc:
        print(f"amqlite audit: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    secrets: Sequence[str] = ()
    spark: SparkSession | None = None
    owned = False
    try:
        if args.rows_per_partition < 1:
            raise AuditError("--rows-per-partition must be at least 1")
        source = parse_store_url(args.store)
        secrets = source.secrets
        shown = args.progress if args.progress is not None else sys.stderr.isatty()
        progress = Progress(shown)
        spark = SparkSession.getActiveSession()
        if spark is None:
            jars = check_driver(source, args.jdbc_jar)
            check_reachable(source)
            progress.say(f"starting Spark ({args.master or 'local[*]'})")
            spark = build_session(args.master, jars)
            owned = True
        else:
            check_reachable(source)
        result = run_audit(
            spark, source, args.group, args.output, args.rows_per_partition, args.now,
            progress,
        )
    except Exception as exc:  # AuditError, JDBC and Spark failures alike: one line
        if os.environ.get(DEBUG_ENV):
            raise
        print(f"amqlite audit: error: {_root_message(exc, secrets)}", file=sys.stderr)
        return EXIT_ERROR
    finally:
        if owned and spark is not None:
            spark.stop()
    if args.json:
        print(json.dumps(result.summary, indent=2))
    else:
        print(render_table(result.summary))
    return EXIT_CLEAN if result.clean else EXIT_FINDINGS
