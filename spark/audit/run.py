"""Running the audit: ``run_audit`` (read, check, summarize, write) and the
command line (``main``), whose errors are one line and an exit code.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import json
import math
import os
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import SparkSession

from spark.audit.data import StorePlan, all_findings, plan_store, read_store
from spark.audit.jvm import ArchiveState
from spark.audit.limits import (
    CHECK_ROWS_PER_TASK,
    DEBUG_ENV,
    EXIT_CLEAN,
    EXIT_ERROR,
    EXIT_FINDINGS,
    MIN_SQL_CONNECTIONS,
    ROWS_PER_PARTITION,
    AuditError,
)
from spark.audit.pool import PushedRead, StatementPool
from spark.audit.reader import StoreReader, settle
from spark.audit.report import join_path, render_table, summarize, write_findings, write_text_file
from spark.audit.session import (
    QUIET,
    SMALL_DATA_SETTINGS,
    Progress,
    SessionStarter,
    check_settings,
    session_conf,
)
from spark.audit.snapshot import Snapshot, open_snapshot, psycopg_installed
from spark.audit.source import StoreSource, check_driver, check_reachable, parse_store_url


@dataclass
class AuditResult:
    summary: dict[str, Any]

    @property
    def clean(self) -> bool:
        return bool(self.summary["clean"])


def sql_connections() -> int:
    """The pool's connections: one per core of this machine and one more (as
    PostgreSQL's own parallel query, a leader and its workers, keeps a core busy
    while another process waits on a fetch), at least ``MIN_SQL_CONNECTIONS``."""
    return max(MIN_SQL_CONNECTIONS, (os.cpu_count() or 1) + 1)


def _plan(
    spark: SparkSession | SessionStarter,
    source: StoreSource,
    group: str | None,
    rows_per_partition: int,
    now_ms: int | None,
    progress: Progress,
    connections: int,
) -> tuple[SparkSession, Snapshot, StoreReader, StorePlan]:
    """Open the snapshot, plan the reads and, on PostgreSQL with psycopg, run the
    pushed statements in the driver while the session starts; then the session."""
    if source.backend == "postgresql" and psycopg_installed():
        snapshot = open_snapshot(None, source)
        try:
            reader = StoreReader(None, source, group, rows_per_partition, progress, snapshot)
            plan = plan_store(reader, now_ms)
            pool = StatementPool(source, snapshot.snapshot_id, plan.pushed, connections, progress)
            if isinstance(spark, SessionStarter):  # the JVM's priority back once the store is done
                _raise_when_done(spark, pool)
            session = spark.get() if isinstance(spark, SessionStarter) else spark
            progress.watch(session)
            spark_up = time.monotonic() - pool.started
            primed = pool.running() and _prime(session, reader, plan, pool, progress)
            pool.wait()
            for table, read in reader.reads.items():
                parts = f"{read.partitions} statement{'s' * (read.partitions != 1)}"
                progress.say(f"read {read.rows} rows of {table} in {parts}")
            reader.pushed = {
                "run_by": "driver", "statements": pool.statements,
                "connections": pool.connections, "seconds": round(pool.seconds, 3),
                "spark_ready_after_s": round(spark_up, 3), "spark_warmed_up": primed,
                # Reads over DRIVER_READ_MAX_ROWS: Spark's partitions read them.
                "left_to_spark": sorted(n for n, r in plan.pushed.items() if r.rows is None),
            }  # fmt: skip
        except BaseException:
            snapshot.close()
            raise
    else:
        if isinstance(spark, SessionStarter):
            spark.raise_priority()
        session = spark.get() if isinstance(spark, SessionStarter) else spark
        progress.watch(session)
        snapshot = open_snapshot(session, source)
        try:
            reader = StoreReader(session, source, group, rows_per_partition, progress, snapshot)
            plan = plan_store(reader, now_ms)
        except BaseException:
            snapshot.close()
            raise
    reader.spark = session
    return session, snapshot, reader, plan


def _raise_when_done(starter: SessionStarter, pool: StatementPool) -> None:
    """The JVM's priority back as soon as the store's statements are done, even while
    the audit still waits for the session to start."""

    def wait() -> None:
        pool.wait_done()
        starter.raise_priority()

    threading.Thread(target=wait, name="audit-jvm-priority", daemon=True).start()


#: How often the warm-up's waiter looks whether the store is done (s).
PRIME_POLL_S = 0.1
#: Spark's job group of the warm-up (``_prime``), cancelled when the store is done.
PRIME_JOB_GROUP = "amqlite-audit-warm-up"


def _prime(
    session: SparkSession, reader: StoreReader, plan: StorePlan, pool: StatementPool,
    progress: Progress,
) -> bool:
    """While the store's statements still run: the checks once over a row of nulls
    per read, discarded, so that the JVM (and a cluster's executors) have loaded,
    planned and run their kind before the real rows arrive (a cold JVM spends
    seconds on that, the rows milliseconds). Cancelled when the statements are
    done first: it may only fill time the audit waits anyway. Whether it ran to
    its end."""
    progress.say("warming Spark up while the store works")
    fake = dataclasses.replace(plan, pushed={
        name: PushedRead(read.statements, read.types, list(read.types), [(None,) * len(read.types)])
        for name, read in plan.pushed.items()
    })  # fmt: skip
    dry = copy.copy(reader)
    dry.spark, dry.returned = session, {}
    sc = session.sparkContext
    stop = threading.Event()

    def run() -> None:
        sc.setJobGroup(PRIME_JOB_GROUP, "warm-up", interruptOnCancel=True)
        with contextlib.suppress(Exception):  # cancelled, or whatever: it is discarded
            data = read_store(dry, fake)
            if not stop.is_set():  # each action is a job; none once the store is done
                findings = settle(all_findings(data).coalesce(1))
            if not stop.is_set():
                summarize(dry, data, findings)

    warm = threading.Thread(target=run, name="audit-warm-up", daemon=True)
    with session_conf(session, check_settings(session, 0, True)):
        warm.start()
        while warm.is_alive() and not pool.wait_done(PRIME_POLL_S):
            pass
    if not warm.is_alive():
        return True
    # Not waited for: its job is cancelled, and it starts no other.
    stop.set()
    sc.cancelJobGroup(PRIME_JOB_GROUP)
    progress.say("the store finished first: warm-up cancelled")
    return False


def run_audit(
    spark: SparkSession | SessionStarter,
    source: StoreSource,
    group: str | None = None,
    output: str | None = None,
    rows_per_partition: int = ROWS_PER_PARTITION,
    now_ms: int | None = None,
    progress: Progress = QUIET,
    connections: int | None = None,
) -> AuditResult:
    """Read everything in one snapshot (let go as soon as it is read), check,
    count in one pass, then write rows only for the findings that have any.
    ``spark`` may still be starting (``SessionStarter``): on PostgreSQL the store's
    statements run meanwhile, on ``connections`` connections (``sql_connections``)."""
    started = time.monotonic()
    snapshot: Snapshot | None = None
    try:
        progress.say(f"reading {source.description}")
        spark, snapshot, reader, plan = _plan(
            spark, source, group, rows_per_partition, now_ms, progress,
            connections or sql_connections(),
        )  # fmt: skip
        pushed = source.backend == "postgresql"
        with session_conf(spark, SMALL_DATA_SETTINGS if pushed else {}):
            data = read_store(reader, plan)
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
        summary["pushed"] = reader.pushed
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
    starter: SessionStarter | None = None
    try:
        if args.rows_per_partition < 1:
            raise AuditError("--rows-per-partition must be at least 1")
        source = parse_store_url(args.store)
        secrets = source.secrets
        shown = args.progress if args.progress is not None else sys.stderr.isatty()
        progress = Progress(shown)
        spark: SparkSession | SessionStarter | None = SparkSession.getActiveSession()
        if spark is None:
            jars = check_driver(source, args.jdbc_jar)
            check_reachable(source)
            progress.say(f"starting Spark ({args.master or 'local[*]'})")
            # Whether the store's statements run (``_plan``): Spark then gets few rows.
            pushed = source.backend == "postgresql" and psycopg_installed()
            spark = starter = SessionStarter(args.master, jars, pushed=pushed)
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
        if starter is not None:
            if starter.archive.state is ArchiveState.MAKING:
                progress.say("saving the JVM's class archive for the next audits (once)")
            starter.stop()
    if args.json:
        print(json.dumps(result.summary, indent=2))
    else:
        print(render_table(result.summary))
    return EXIT_CLEAN if result.clean else EXIT_FINDINGS
