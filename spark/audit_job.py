"""The amqlite store audit: proves, or disproves, that nothing was lost, orphaned
or duplicated in a shared store, by reading it through Spark's JDBC source.

One self-contained file (standard library + pyspark only) so that a cluster
runs it unchanged: ``spark-submit spark/audit_job.py --store URL ...``; the
``amqlite audit`` command calls :func:`main` in-process.

Every read sees one snapshot of the store (``Snapshot``): on PostgreSQL the
driver's transaction exports it and every JDBC partition imports it; SQLite is
copied with the backup API in one read transaction and the copy is read. What a
live broker commits meanwhile (sends, acknowledgements, the dedup pruner) is
then wholly in the audit's view or not at all, so the checks see a state the
store really was in, and every invariant the store keeps per transaction holds.

Reads scale with the rows of the audited groups: every partition names its group
(an index on (grp, ...) is walked only within it), big groups are cut at
quantiles of the key (``StoreReader.key_predicates``), never at min/max strides.

On PostgreSQL the per-row work runs in the store, in the same snapshot, as
statements Spark runs as partitions of one job, and only rows at fault and
per-slice summaries come back: the checks an index answers (orphans, expiry, dedup
expiry) in one statement; duplicates by identity and content per group (a
group's candidates are all in its statement, which judges them); per slice of the
big tables, runs of producer sequence numbers and stale in-flight rows. Spark
merges what crosses partitions: the runs into sequence gaps (per producer and
bucket of numbers), then the counts, samples and files. On SQLite (no sha256, a
local file) every row is read and Spark runs the same checks itself.

Dedup entries past their window are judged against the group's last recorded
prune (``amq_meta``, ``DEDUP_PRUNED_PREFIX``): housekeeping that has not run yet
(a stopped broker) is reported as pending, not as a finding.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import functools
import getpass
import itertools
import json
import math
import os
import shutil
import socket
import sqlite3
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import Column, DataFrame, DataFrameReader, SparkSession, Window
from pyspark.sql import functions as F

# --------------------------------------------------------------------------- limits

#: Where Debian's libpostgresql-jdbc-java / libxerial-sqlite-jdbc-java put their jars.
DEFAULT_PG_JAR = "/usr/share/java/postgresql.jar"
DEFAULT_SQLITE_JAR = "/usr/share/java/sqlite-jdbc.jar"
PG_DRIVER = "org.postgresql.Driver"
SQLITE_DRIVER = "org.sqlite.JDBC"
#: The Debian/Ubuntu package that provides each default jar (named in the error when
#: the jar is missing, so the fix is one apt-get away).
PG_JAR_PACKAGE = "libpostgresql-jdbc-java"
SQLITE_JAR_PACKAGE = "libxerial-sqlite-jdbc-java"
#: Seconds between progress lines while a Spark stage runs (a person watching should
#: see it move; a log should not fill up).
PROGRESS_INTERVAL_S = 5.0

#: Rows per JDBC partition (one task, one connection). bench/audit_bench.py reads
#: ~50k message rows/s per connection (two shared cores): about two seconds a task.
ROWS_PER_PARTITION = 100_000
#: Upper bound on partitions per table: each is a task and a connection; past a
#: few hundred the per-task overhead dominates and the store sees a connection storm.
MAX_READ_PARTITIONS = 256
#: Rows per JDBC round trip. The PostgreSQL driver's default (0) buffers a whole
#: result in the executor; 10k narrow rows are about 1-2 MB per fetch.
JDBC_FETCH_SIZE = 10_000
#: Seconds to wait for a TCP connection to the store (PostgreSQL JDBC default: 10).
JDBC_CONNECT_TIMEOUT_S = 10
#: Server-side guards for every audit connection: one fetch may run this long...
PG_STATEMENT_TIMEOUT_MS = 300_000
#: ...and a transaction whose reader stalls (GC, lost executor) is ended by the
#: server after this long, so the audit can never pin the broker's xmin for long.
PG_IDLE_IN_TRANSACTION_TIMEOUT_MS = 60_000
#: Sort and hash memory of each audit connection: a slice of ROWS_PER_PARTITION rows
#: (about 40 bytes a row in the runs' sort) sorts in memory, and a group's hash of a
#: million identities mostly does (PostgreSQL's 4 MB default spills both to disk).
#: Per connection, and the audit runs one per Spark task slot; bench/audit_bench.py
#: gives the SQL lower bound the same.
PG_WORK_MEM = "64MB"
#: SQLite: wait this long for a writer's lock (the broker commits in short batches).
SQLITE_BUSY_TIMEOUT_MS = 10_000
#: Seconds between the keep-alive statements of the snapshot-exporting transaction:
#: a third of PG_IDLE_IN_TRANSACTION_TIMEOUT_MS, so two may be late.
SNAPSHOT_KEEPALIVE_S = PG_IDLE_IN_TRANSACTION_TIMEOUT_MS / 1000 / 3
#: A group's key quantiles are exact (ntile over its index range) up to this many rows:
#: about 0.1 s of an index-only scan and sort (0.8 s for a million bigints, 1 s for
#: a million dedup keys, bench/audit_bench.py); a sample of a few thousand rows is
#: good enough to balance partitions, which is all the cuts are for.
QUANTILE_EXACT_MAX_ROWS = 200_000
#: Above that, PostgreSQL estimates them from a block sample of about this many rows
#: per partition: a cut is then off by ~1/sqrt(1000) = 3 % of a partition.
QUANTILE_SAMPLE_ROWS_PER_PART = 1_000
#: ``amq_meta`` keys of the groups' last dedup prunes (store/housekeeping.py
#: ``dedup_pruned_key``; tests/unit/test_audit_schema.py checks the two agree).
DEDUP_PRUNED_PREFIX = "dedup_pruned:"

#: The broker reaps expired rows every housekeeping interval (5 s by default,
#: amqlite/settings.py); a minute of slack before an expired row is a finding.
EXPIRY_GRACE_MS = 60_000
#: Same slack for dedup entries older than the group's dedup window.
DEDUP_GRACE_MS = 60_000
#: A new master pages in and redelivers rows in flight under the old epoch (the
#: store does not rewrite them at activation, store/api.py ``recover``); rows it
#: has not re-taken this long after it took over are reported.
STALE_INFLIGHT_GRACE_MS = 300_000
#: A registry row is a live master when its heartbeat is this recent.
REGISTRY_LIVE_MS = 30_000
#: The same body and headers from one producer within this window, under a
#: different identity, is a content duplicate: a client that re-sent without
#: its identity after a failover does so within seconds.
DUPLICATE_CONTENT_WINDOW_MS = 60_000

#: Headers every amqlite client send carries with new values (amqlite/client/asyncclient.py):
#: left out when comparing the headers of two sends.
IDENTITY_HEADERS = ("amqlite.producerId", "amqlite.producerSeq")

#: Sequence numbers per bucket of the gap check: a producer of 100 M sends is 1,000
#: tasks of about 2 MB of numbers each, not one.
GAP_BUCKET_SEQS = 100_000

#: Sample rows per finding type in the summary and the table.
SAMPLE_ROWS = 5
#: Local runs: shuffle partitions per core (the 200 default is for clusters).
LOCAL_SHUFFLE_PARTITIONS_PER_CORE = 2
#: JVM options of the driver this process starts and of the executors (see
#: ``build_session``): the store does the heavy work, the JVMs live for one short
#: job, so the JIT's first tier only (its second compiles for minutes of steady
#: state) and one GC thread. bench/audit_bench.py: at 200,000 messages on local[*]
#: the session starts in about half the time, the audit too; at 1,000,000 on a
#: standalone master with two workers, 3.0x the SQL lower bound without, 1.7x with.
AUDIT_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
#: Rows of check input per task and per shuffle partition: Spark's per-task cost
#: (milliseconds) dwarfs a few thousand narrow rows, and half a million of them
#: (SQLite's full reads) are seconds of work in a few MB.
CHECK_ROWS_PER_TASK = 500_000

#: Set to see the traceback behind an error line.
DEBUG_ENV = "AMQLITE_AUDIT_DEBUG"

EXIT_CLEAN = 0
EXIT_FINDINGS = 1
EXIT_ERROR = 2

#: Every finding type, in report order, with what it means.
FINDINGS: dict[str, str] = {
    "duplicate_identity": "one producer message identity stored more than once",
    "duplicate_content": "same body and headers from one producer within the window, "
    "under another identity",
    "orphan_destination": "message whose destination no longer exists",
    "orphan_subscription": "pending row of a durable subscription that no longer exists",
    "orphan_topic_message": "topic message owed to no durable subscription",
    "ack_without_message": "pending (acknowledgement) row that points at no message",
    "stale_inflight": "in flight under an epoch older than the group's current one",
    "expired_unreaped": "expired message never reaped",
    "dedup_expired": "dedup entry past the group's window that its last prune left behind",
    "sequence_gap": "producer sequence numbers the store never got",
}


# --------------------------------------------------------------------------- the store's schema

#: The store tables the audit reads, the columns it reads from each, and the Spark
#: SQL type each column is read as (every read casts to it, see ``_typed``: JDBC
#: reports types per backend). A copy of ``store/schema.py``, kept here because
#: this file ships alone to spark-submit; tests/unit/test_audit_schema.py checks
#: that the two agree. A plain literal, so that the test reads it without pyspark.
STORE_COLUMNS: dict[str, dict[str, str]] = {
    "amq_meta": {"key": "string", "value": "string"},
    "amq_groups": {
        "grp": "string",
        "epoch": "bigint",
        "epoch_started_at": "bigint",
        "dedup_window_ms": "bigint",
    },
    "amq_registry": {
        "grp": "string",
        "name": "string",
        "role": "string",
        "epoch": "bigint",
        "heartbeat_at": "bigint",
    },
    "amq_destinations": {"grp": "string", "id": "bigint", "name": "string", "kind": "string"},
    "amq_subscriptions": {"grp": "string", "id": "bigint", "destination_id": "bigint"},
    "amq_messages": {
        "grp": "string",
        "id": "bigint",
        "destination_id": "bigint",
        "producer_id": "string",
        "producer_seq": "bigint",
        "dedup_key": "string",
        "expires_at": "bigint",
        "enqueued_at": "bigint",
        "inflight_epoch": "bigint",
        # > 0: a scheduled message not yet due (schema v3): owed to nobody yet.
        "deliver_at": "bigint",
        # Content, read only for rows with a producer (``_message_select``):
        "headers": "string",
        "body": "binary",
    },
    "amq_sub_pending": {
        "grp": "string",
        "sub_id": "bigint",
        "msg_id": "bigint",
        "inflight_epoch": "bigint",
    },
    "amq_dedup": {
        "grp": "string",
        "dedup_key": "string",
        "producer_id": "string",
        "producer_seq": "bigint",
        "msg_id": "bigint",
        "created_at": "bigint",
    },
}


class AuditError(Exception):
    """A problem we can explain in one line: exit code 2, no traceback."""


# --------------------------------------------------------------------------- store URL


@dataclass(frozen=True)
class StoreSource:
    """How Spark reaches the store; ``properties`` holds secrets and is never printed."""

    backend: str  # "postgresql" | "sqlite"
    jdbc_url: str
    driver: str
    default_jar: str
    description: str  # the URL without its password
    #: The Debian package that provides ``default_jar``.
    jar_package: str = ""
    #: (host, port) a TCP connection must reach (None: a file store).
    address: tuple[str, int] | None = None
    properties: dict[str, str] = field(default_factory=dict, repr=False)

    @property
    def secrets(self) -> tuple[str, ...]:
        pw = self.properties.get("password")
        return (pw,) if pw else ()


PG_SCHEMES = ("postgresql", "postgres", "postgresql+psycopg", "postgresql+psycopg2")
SQLITE_SCHEMES = ("sqlite", "sqlite+pysqlite")
#: libpq URL parameters the JDBC driver understands (name there).
PG_PARAMS = {
    "sslmode": "sslmode",
    "sslrootcert": "sslrootcert",
    "sslcert": "sslcert",
    "sslkey": "sslkey",
    "options": "options",
    "application_name": "ApplicationName",
    "connect_timeout": "connectTimeout",
}


def strip_password(url: str) -> str:
    """The URL as people may see it: any password replaced by nothing."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{parts.username or ''}@{host}" + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def parse_store_url(url: str) -> StoreSource:
    """Map the broker's store URL (SQLAlchemy form) onto a JDBC source."""
    try:
        parts = urllib.parse.urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme in SQLITE_SCHEMES:
            return _sqlite_source(url, parts)
        if scheme in PG_SCHEMES:
            return _pg_source(url, parts)
    except ValueError as exc:  # bad port, bad IPv6 literal...
        raise AuditError(f"bad store URL {strip_password(url)!r}: {exc}") from None
    raise AuditError(
        f"bad store URL {strip_password(url)!r}: expected postgresql://... or sqlite:///path"
    )


def _sqlite_source(url: str, parts: urllib.parse.SplitResult) -> StoreSource:
    # SQLAlchemy: sqlite:///relative.db, sqlite:////absolute.db
    if parts.netloc or not parts.path.startswith("/") or len(parts.path) < 2:
        raise AuditError(f"bad store URL {url!r}: expected sqlite:///path/to/amqlite.db")
    path = os.path.abspath(urllib.parse.unquote(parts.path[1:]))
    if not os.path.isfile(path):
        raise AuditError(f"SQLite store {path} does not exist")
    return StoreSource(
        backend="sqlite",
        jdbc_url=f"jdbc:sqlite:{path}",
        driver=SQLITE_DRIVER,
        default_jar=DEFAULT_SQLITE_JAR,
        jar_package=SQLITE_JAR_PACKAGE,
        description=f"sqlite:///{path}",
        # xerial: open_mode 1 = SQLITE_OPEN_READONLY; the audit never writes.
        properties={"open_mode": "1", "busy_timeout": str(SQLITE_BUSY_TIMEOUT_MS)},
    )


def _pg_source(url: str, parts: urllib.parse.SplitResult) -> StoreSource:
    host = parts.hostname
    if not host:
        raise AuditError(f"bad store URL {strip_password(url)!r}: no host (JDBC needs TCP)")
    port = parts.port or 5432
    user = urllib.parse.unquote(parts.username or "") or os.environ.get("PGUSER") or _os_user()
    password = (
        urllib.parse.unquote(parts.password)
        if parts.password is not None
        else os.environ.get("PGPASSWORD", "")
    )
    dbname = urllib.parse.unquote(parts.path.lstrip("/")) or user
    props: dict[str, str] = {
        "user": user,
        "ApplicationName": "amqlite-audit",
        "connectTimeout": str(JDBC_CONNECT_TIMEOUT_S),
    }
    guards = (
        "-c default_transaction_read_only=on"
        f" -c statement_timeout={PG_STATEMENT_TIMEOUT_MS}"
        f" -c idle_in_transaction_session_timeout={PG_IDLE_IN_TRANSACTION_TIMEOUT_MS}"
        f" -c work_mem={PG_WORK_MEM}"
        # The audit's parallelism is Spark's partitions, a connection each: a
        # statement's own workers recomputed a subquery in each of them (the content
        # check's hash aggregate ran three times over), and JIT compiled for 0.2 s
        # a statement (bench/audit_bench.py, a million messages).
        " -c max_parallel_workers_per_gather=0 -c jit=off"
    )
    props["options"] = guards
    for key, values in urllib.parse.parse_qs(parts.query, keep_blank_values=True).items():
        if key not in PG_PARAMS:
            raise AuditError(
                f"bad store URL {strip_password(url)!r}: parameter {key!r} is not supported "
                f"over JDBC (supported: {', '.join(sorted(PG_PARAMS))})"
            )
        value = values[-1]
        if key == "options":
            props["options"] = f"{value} {guards}"
        else:
            props[PG_PARAMS[key]] = value
    if password:
        props["password"] = password
    host_part = f"[{host}]" if ":" in host else host
    db = urllib.parse.quote(dbname, safe="")
    return StoreSource(
        backend="postgresql",
        jdbc_url=f"jdbc:postgresql://{host_part}:{port}/{db}",
        driver=PG_DRIVER,
        default_jar=DEFAULT_PG_JAR,
        jar_package=PG_JAR_PACKAGE,
        address=(host, port),
        description=strip_password(url),
        properties=props,
    )


def _os_user() -> str:
    """libpq's default user; containers may have no passwd entry for our uid."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "postgres"


def sql_literal(value: str) -> str:
    """A SQL string literal: both dialects double the quote."""
    return "'" + value.replace("'", "''") + "'"


# --------------------------------------------------------------------------- Spark session


def check_driver(source: StoreSource, jdbc_jar: str | None) -> list[str]:
    """The jars to give Spark, checked before a JVM starts (which takes seconds and
    would only then fail with a ClassNotFoundException). Under spark-submit the driver
    may come from ``--jars``/``--packages``, so a missing default jar is not an error
    there."""
    if jdbc_jar:
        if not os.path.isfile(jdbc_jar):
            raise AuditError(f"JDBC jar {jdbc_jar} does not exist")
        return [jdbc_jar]
    if os.path.isfile(source.default_jar):
        return [source.default_jar]
    if "PYSPARK_GATEWAY_PORT" in os.environ:  # spark-submit: its --jars may have it
        return []
    raise AuditError(
        f"the {source.backend} JDBC driver {source.default_jar} is not installed: "
        f"apt-get install {source.jar_package} (Debian/Ubuntu), or pass --jdbc-jar"
    )


def check_reachable(source: StoreSource, timeout: float = JDBC_CONNECT_TIMEOUT_S) -> None:
    """Fail early, naming host and port, when the store's server cannot be reached
    (before the JVM starts; the JDBC error would come later and vaguer)."""
    if source.address is None:
        return
    host, port = source.address
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as exc:
        reason = exc.strerror or str(exc) or type(exc).__name__
        if isinstance(exc, socket.gaierror):
            reason = f"host not found ({reason})"
        elif isinstance(exc, TimeoutError):
            reason = f"no answer within {timeout:g}s"
        raise AuditError(
            f"cannot reach the store {source.description} at {host}:{port}: {reason}"
        ) from None


class Progress:
    """Progress lines on stderr while Spark works: each phase as it starts, and the
    running stage's task counts every ``PROGRESS_INTERVAL_S`` (Spark's own console bar
    is off: it redraws one line, which a log or a captured run cannot show)."""

    def __init__(self, enabled: bool, interval: float = PROGRESS_INTERVAL_S) -> None:
        self.enabled = enabled
        self.interval = interval
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def say(self, text: str) -> None:
        if self.enabled:
            elapsed = time.monotonic() - self.started
            print(f"amqlite audit: [{elapsed:6.1f}s] {text}", file=sys.stderr, flush=True)

    def watch(self, spark: SparkSession) -> None:
        """Report running stages until ``stop``."""
        if not self.enabled or self._thread is not None:
            return
        tracker = spark.sparkContext.statusTracker()

        def run() -> None:
            while not self._stop.wait(self.interval):
                with contextlib.suppress(Exception):  # the context may be stopping
                    stages = [tracker.getStageInfo(i) for i in tracker.getActiveStageIds()]
                    infos = [i for i in stages if i is not None]
                    if infos:
                        done = sum(i.numCompletedTasks for i in infos)
                        total = sum(i.numTasks for i in infos)
                        running = sum(i.numActiveTasks for i in infos)
                        self.say(f"  {len(infos)} Spark stage(s): {done}/{total} tasks "
                                 f"done, {running} running")

        self._thread = threading.Thread(target=run, name="audit-progress", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval)


#: No progress lines (the default for ``run_audit`` called from code).
QUIET = Progress(False)


def build_session(
    master: str | None = None,
    jars: Sequence[str] = (),
    conf: dict[str, str] | None = None,
) -> SparkSession:
    """The session the job uses when nobody gave it one. Local masters stay on
    loopback with no UI: the audit is a batch job, not a service."""
    builder = SparkSession.builder.appName("amqlite-audit")
    local = master is None and "PYSPARK_GATEWAY_PORT" not in os.environ
    if master is not None:
        builder = builder.master(master)
        local = master.startswith("local")
    elif local:
        builder = builder.master("local[*]")
    settings: dict[str, str] = {
        "spark.ui.showConsoleProgress": "false",
        "spark.log.level": "ERROR",
        "spark.executor.extraJavaOptions": AUDIT_JVM_OPTIONS,
    }
    if "PYSPARK_GATEWAY_PORT" not in os.environ:  # this process starts the driver's JVM
        settings["spark.driver.extraJavaOptions"] = AUDIT_JVM_OPTIONS
    if local:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        cores = os.cpu_count() or 2
        settings.update(
            {
                "spark.ui.enabled": "false",
                "spark.driver.host": "127.0.0.1",
                "spark.driver.bindAddress": "127.0.0.1",
                "spark.sql.shuffle.partitions": str(
                    max(4, LOCAL_SHUFFLE_PARTITIONS_PER_CORE * cores)
                ),
            }
        )
    present = [j for j in jars if j]
    if present:
        settings["spark.jars"] = ",".join(present)
    settings.update(conf or {})
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


# --------------------------------------------------------------------------- one snapshot


class Snapshot:
    """One consistent view of the store, shared by every read of the audit, so that
    what a live broker commits meanwhile (sends, acks, the pruner) cannot show up
    half-done. ``source`` is what Spark reads, ``init_statement`` what each of its
    JDBC connections runs first (Spark's ``sessionInitStatement``), ``query`` a
    small query in the same view (counts, quantiles, groups)."""

    def __init__(self, source: StoreSource, init_statement: str | None, pins: str) -> None:
        self.source = source
        self.init_statement = init_statement
        #: What holding the view costs the store, for the summary.
        self.pins = pins

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    def close(self) -> None:
        """Let the view go (also after an error)."""


class PgSnapshot(Snapshot):
    """PostgreSQL: the driver's own JDBC connection opens a REPEATABLE READ READ ONLY
    transaction and exports its snapshot (``pg_export_snapshot()``); every partition
    read begins its own REPEATABLE READ transaction and imports it (``SET TRANSACTION
    SNAPSHOT``) before its SELECT. Spark runs ``sessionInitStatement`` in autocommit
    mode and only then turns autocommit off for its cursor: the explicit BEGIN keeps
    the transaction open for the read (the driver sends no BEGIN of its own while one
    is open); tests/spark/test_audit_live.py shows rows written after the export
    are not seen. The exporting transaction holds back the server's xmin (vacuum)
    until everything is read."""

    def __init__(self, spark: SparkSession, source: StoreSource) -> None:
        jvm = spark.sparkContext._jvm
        assert jvm is not None
        props = jvm.java.util.Properties()
        for key, value in source.properties.items():
            props.setProperty(key, value)
        driver: Any = jvm
        for part in source.driver.split("."):
            driver = getattr(driver, part)
        conn = driver().connect(source.jdbc_url, props)
        if conn is None:
            raise AuditError(f"the PostgreSQL driver does not take {source.jdbc_url}")
        self._conn = conn
        self._lock = threading.Lock()
        self._stop = threading.Event()
        try:
            conn.setAutoCommit(False)  # the driver sends BEGIN with the next statement
            self.query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            rows = self.query("SELECT pg_export_snapshot(), pg_is_in_recovery()")
        except Exception:
            self.close()
            raise
        snapshot_id, standby = str(rows[0][0]), bool(rows[0][1])
        init = (
            "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; "
            f"SET TRANSACTION SNAPSHOT {sql_literal(snapshot_id)}"
        )
        feedback = " (and the primary with hot_standby_feedback)"
        where = f"standby{feedback}" if standby else "primary"
        super().__init__(source, init, f"snapshot {snapshot_id}: holds back xmin on the {where}")
        threading.Thread(target=self._keep_alive, name="audit-snapshot", daemon=True).start()

    def _keep_alive(self) -> None:
        """A statement now and then so that idle_in_transaction_session_timeout (the
        guard against a stalled reader) does not end the exporting transaction while
        this driver is alive; if the driver stalls, the server ends it and the reads
        still to come fail instead of reading another view."""
        while not self._stop.wait(SNAPSHOT_KEEPALIVE_S):
            with contextlib.suppress(Exception):
                self.query("SELECT 1")

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        with self._lock:
            st = self._conn.createStatement()
            try:
                rows = []
                if st.execute(sql):  # a result set
                    rs = st.getResultSet()
                    width = rs.getMetaData().getColumnCount()
                    while rs.next():
                        rows.append(tuple(rs.getObject(i) for i in range(1, width + 1)))
                return rows
            finally:
                st.close()

    def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(Exception):
            self._conn.rollback()
        with contextlib.suppress(Exception):
            self._conn.close()


class SqliteSnapshot(Snapshot):
    """SQLite: an online backup of the file (the standard library's ``backup`` in one
    step: one read transaction, so a consistent copy while a broker writes; in WAL
    mode it does not block the writer) into a temporary directory; Spark reads the
    copy, which is removed at the end. Costs a copy's disk space for the audit."""

    def __init__(self, source: StoreSource) -> None:
        path = source.jdbc_url.removeprefix("jdbc:sqlite:")
        self._dir = tempfile.mkdtemp(prefix="amqlite-audit-")
        copy = os.path.join(self._dir, "snapshot.db")
        try:
            uri = f"file:{urllib.parse.quote(path)}?mode=ro"
            with contextlib.closing(
                sqlite3.connect(uri, uri=True, timeout=SQLITE_BUSY_TIMEOUT_MS / 1000)
            ) as src:
                self._conn = sqlite3.connect(copy, check_same_thread=False)
                src.backup(self._conn)
            self._conn.execute("PRAGMA journal_mode = DELETE")  # a plain file for xerial
        except Exception:
            self.close()
            raise
        super().__init__(
            dataclasses.replace(source, jdbc_url=f"jdbc:sqlite:{copy}"),
            None,
            f"a copy of the file in {self._dir} (removed at the end)",
        )

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in self._conn.execute(sql).fetchall()]

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._conn.close()
        shutil.rmtree(self._dir, ignore_errors=True)


def open_snapshot(spark: SparkSession, source: StoreSource) -> Snapshot:
    """The one view every read of this audit uses."""
    if source.backend == "postgresql":
        return PgSnapshot(spark, source)
    return SqliteSnapshot(source)


# --------------------------------------------------------------------------- reading


@dataclass
class TableRead:
    """What one table cost, for the summary: the rows of the audited groups and
    the partitions (statements) they were read in."""

    rows: int = 0
    partitions: int = 0


class StoreReader:
    """Spark JDBC reads of one store, restricted to the audited groups, all in one
    snapshot when one is given."""

    def __init__(
        self,
        spark: SparkSession,
        source: StoreSource,
        group: str | None,
        rows_per_partition: int,
        progress: Progress = QUIET,
        snapshot: Snapshot | None = None,
    ) -> None:
        self.progress = progress
        self.spark = spark
        self.source = snapshot.source if snapshot is not None else source
        self.described = source.description
        self.snapshot = snapshot
        self.group = group
        #: The audited groups, once known (``where_groups``).
        self.groups: list[str] = [] if group is None else [group]
        self.rows_per_partition = rows_per_partition
        self.reads: dict[str, TableRead] = {}
        #: Rows per audited group of each table, counted in the snapshot.
        self._counts: dict[str, dict[str, int]] = {}
        #: Rows each read brought back to Spark (``materialize``).
        self.returned: dict[str, int] = {}

    def where_group(self, *extra: str) -> str:
        conds = [f"grp = {sql_literal(self.group)}"] if self.group is not None else []
        conds += [c for c in extra if c]
        return (" WHERE " + " AND ".join(conds)) if conds else ""

    def where_groups(self) -> str:
        """Every read names its groups: an index on (grp, ...) is then walked only
        within them."""
        names = ", ".join(sql_literal(g) for g in self.groups) or "NULL"
        return f" WHERE grp IN ({names})"

    def _reader(self) -> DataFrameReader:
        r = (
            self.spark.read.format("jdbc")
            .option("url", self.source.jdbc_url)
            .option("driver", self.source.driver)
            .option("fetchsize", str(JDBC_FETCH_SIZE))
        )
        if self.snapshot is not None and self.snapshot.init_statement:
            r = r.option("sessionInitStatement", self.snapshot.init_statement)
        for key, value in self.source.properties.items():
            r = r.option(key, value)
        return r

    def small(self, select: str, types: dict[str, str], declared: bool = False) -> DataFrame:
        """A small table or a one-row aggregate: one statement, one partition.
        ``declared``: read the columns as ``types`` say (Spark's customSchema), for
        expressions whose type xerial's driver cannot tell before a row arrives."""
        r = self._reader().option("dbtable", f"({select}) amq_q")
        if declared:
            r = r.option("customSchema", _schema(types))
        return _typed(r.load(), types)

    def partitioned(self, name: str, select: str, types: dict[str, str], key: str) -> DataFrame:
        """A read of ``select`` (a SELECT from table ``name`` without WHERE) split by
        ``key_predicates``: each partition one group (or a few small ones) and one
        range of ``key`` holding about ``rows_per_partition`` rows."""
        predicates = self.key_predicates(name, key)
        df = self._reader().jdbc(
            self.source.jdbc_url, f"({select}) amq_t", predicates=predicates, properties={}
        )
        return _typed(df, types)

    def group_counts(self, table: str) -> dict[str, int]:
        """Rows of ``table`` per audited group, counted in the snapshot; ``reads``
        reports their total as the rows the audit covers."""
        if table not in self._counts:
            assert self.snapshot is not None, "partitioned reads need the snapshot"
            self._counts[table] = {
                str(g): int(n)
                for g, n in self.snapshot.query(
                    f"SELECT grp, COUNT(*) FROM {table}{self.where_groups()} GROUP BY grp"
                )
            }
        return self._counts[table]

    def _per_part(self, counts: dict[str, int]) -> int:
        return max(self.rows_per_partition, math.ceil(sum(counts.values()) / MAX_READ_PARTITIONS))

    def group_packs(self, table: str) -> list[list[str]]:
        """The audited groups with rows in ``table``, one group or a few small ones of
        about ``rows_per_partition`` rows together: the unit of a check that compares
        rows across a whole group (identities, contents)."""
        counts = self.group_counts(table)
        per_part = self._per_part(counts)
        packs: list[list[str]] = []
        pack: list[str] = []
        packed = 0
        for grp in sorted(counts):
            if pack and packed + counts[grp] > per_part:
                packs.append(pack)
                pack, packed = [], 0
            pack.append(grp)
            packed += counts[grp]
        return packs + ([pack] if pack else [])

    def arms(self, statements: Sequence[str], types: dict[str, str]) -> DataFrame:
        """One read of several statements, one partition each (an aggregate per slice
        cannot take Spark's WHERE from outside): a UNION ALL of them, each arm tagged
        with its number, and partition ``k`` asks for ``arm_k = k``; PostgreSQL's
        planner drops every other arm (a constant-false filter) before running any."""
        if not statements:
            return _empty(self.spark, types)
        union = " UNION ALL ".join(
            f"SELECT {k} AS arm_k, amq_a.* FROM ({sql}) amq_a" for k, sql in enumerate(statements)
        )
        df = self._reader().jdbc(
            self.source.jdbc_url,
            f"({union}) amq_t",
            predicates=[f"arm_k = {k}" for k in range(len(statements))],
            properties={},
        )
        return _typed(df, types)

    def key_predicates(self, table: str, key: str) -> list[str]:
        """WHERE clauses that split ``table`` into partitions of about
        ``rows_per_partition`` rows: rows counted per group, a big group cut at
        quantiles of ``key`` (``_quantiles``, in the snapshot), small groups
        packed together. Never min/max strides: one outlier would put every row
        into one partition."""
        assert self.snapshot is not None, "partitioned reads need the snapshot"
        counts = self.group_counts(table)
        per_part = self._per_part(counts)
        predicates: list[str] = []
        pack: list[str] = []
        packed = 0
        for grp in sorted(counts):
            n = counts[grp]
            if n > per_part:
                cuts = _quantiles(self.snapshot, table, key, grp, n, math.ceil(n / per_part))
                bounds: list[str | None] = [None, *cuts, None]
                for lo, hi in itertools.pairwise(bounds):
                    cond = [f"grp = {sql_literal(grp)}"]
                    cond += [f"{key} >= {lo}"] if lo is not None else []
                    cond += [f"{key} < {hi}"] if hi is not None else []
                    predicates.append(" AND ".join(cond))
                continue
            if pack and packed + n > per_part:
                predicates.append(f"grp IN ({', '.join(pack)})")
                pack, packed = [], 0
            pack.append(sql_literal(grp))
            packed += n
        if pack:
            predicates.append(f"grp IN ({', '.join(pack)})")
        predicates = predicates or ["1 = 0"]
        self.reads[table] = TableRead(sum(counts.values()), len(predicates))
        return predicates

    def materialize(self, reads: dict[str, DataFrame]) -> dict[str, DataFrame]:
        """Read everything now, in one Spark job (one stage of every read's
        partitions), into Spark's block store (``_settle``), so that every check
        works from the same rows and the snapshot can be let go; ``returned`` says
        how many rows each read brought back. One result, not one per read: each
        would be a job of its own."""
        columns: dict[str, str] = {}
        for df in reads.values():
            for name, kind in df.dtypes:
                columns.setdefault(name, kind)

        def widened(read: str, df: DataFrame) -> DataFrame:
            return df.select(
                F.lit(read).alias("audit_read"),
                *[F.col(c) if c in df.columns else F.lit(None).cast(t).alias(c)
                  for c, t in columns.items()],
            )  # fmt: skip

        self.progress.say(f"reading in the snapshot: {', '.join(reads)}")
        every = _settle(
            functools.reduce(DataFrame.unionByName, [widened(n, df) for n, df in reads.items()])
        )
        counts = {str(r[0]): int(r[1]) for r in every.groupBy("audit_read").count().collect()}
        self.returned = {name: counts.get(name, 0) for name in reads}
        for table, read in self.reads.items():
            parts = f"{read.partitions} partition{'s' * (read.partitions != 1)}"
            self.progress.say(f"read {read.rows} rows of {table} in {parts}")
        self.progress.say(f"{sum(self.returned.values())} rows came back to Spark")
        # The checks' tasks follow what came back, not how it was read: a store
        # without faults returns a few thousand rows from hundreds of partitions.
        return {
            name: every.where(F.col("audit_read") == name)
            .select(*df.columns)
            .coalesce(max(1, math.ceil(self.returned[name] / CHECK_ROWS_PER_TASK)))
            for name, df in reads.items()
        }



def _settle(df: DataFrame) -> DataFrame:
    """``df`` computed now and kept (memory, else local disk) with its lineage cut:
    a later query plans over a leaf, not over the reads and checks behind it
    (planning the union of every check over cached reads took seconds), and a
    lost block fails the audit instead of reading the store again after its
    snapshot was let go."""
    return df.localCheckpoint(eager=True)


def _grp_in(groups: Sequence[str], column: str = "grp") -> str:
    """``column`` is one of ``groups`` (an equality for one: the index's prefix)."""
    if len(groups) == 1:
        return f"{column} = {sql_literal(groups[0])}"
    return f"{column} IN ({', '.join(sql_literal(g) for g in groups)})"


def _quantiles(
    snapshot: Snapshot, table: str, key: str, grp: str, rows: int, parts: int
) -> list[str]:
    """SQL literals of the values of ``key`` that cut one group's rows of ``table``
    into ``parts`` about equal ranges (ascending, distinct). Exact up to
    ``QUANTILE_EXACT_MAX_ROWS`` (ntile over the (grp, key) index, one walk of the
    group's range); above, PostgreSQL takes them from a block sample
    (TABLESAMPLE SYSTEM) of about ``QUANTILE_SAMPLE_ROWS_PER_PART`` rows per part."""
    where = f"WHERE grp = {sql_literal(grp)}"
    if snapshot.source.backend == "postgresql" and rows > QUANTILE_EXACT_MAX_ROWS:
        percent = min(100.0, 100.0 * QUANTILE_SAMPLE_ROWS_PER_PART * parts / rows)
        fractions = ", ".join(f"{i / parts:.9f}" for i in range(1, parts))
        sql = (
            f"SELECT unnest(percentile_disc(ARRAY[{fractions}]::float8[]) WITHIN GROUP"
            f" (ORDER BY {key})) FROM {table} TABLESAMPLE SYSTEM ({percent:.6f})"
            f" REPEATABLE (0) {where}"
        )
        values = [r[0] for r in snapshot.query(sql)]
    else:
        sql = (
            f"SELECT MIN(k) FROM (SELECT {key} AS k, NTILE({parts}) OVER (ORDER BY {key}) AS b"
            f" FROM {table} {where}) amq_n GROUP BY b ORDER BY 1"
        )
        values = [r[0] for r in snapshot.query(sql)][1:]
    cuts: list[Any] = []
    for v in values:  # ascending in the database's own order (its collation for text)
        if v is not None and (not cuts or v != cuts[-1]):
            cuts.append(v)
    return [sql_literal(v) if isinstance(v, str) else str(int(v)) for v in cuts]


def _typed(df: DataFrame, types: dict[str, str]) -> DataFrame:
    """SQLite reports BIGINT as decimal(20,0): cast every column to what the checks expect."""
    return df.select(*[F.col(c).cast(t).alias(c) for c, t in types.items()])


#: amq_messages' content columns: not in every read (``_message_select``).
MESSAGE_CONTENT = ("headers", "body")
#: The amq_messages columns every check reads.
MESSAGE_TYPES = {
    c: t for c, t in STORE_COLUMNS["amq_messages"].items() if c not in MESSAGE_CONTENT
}


def _message_select() -> tuple[str, dict[str, str]]:
    """SQLite: every row, with what the checks need (Spark hashes bodies and
    headers: the file has no sha256)."""
    columns = STORE_COLUMNS["amq_messages"]
    types = {**MESSAGE_TYPES, "body": columns["body"], "headers": columns["headers"]}
    return f"SELECT {', '.join(types)} FROM amq_messages", types


def _pg_headers_sha(prefix: str = "") -> str:
    """The headers' sha256 without the identity headers, as ``_hash_content``
    computes it in Spark: jsonb's text is canonical (keys in one order, each once)."""
    user = " - ".join([f"{prefix}headers::jsonb", *(sql_literal(h) for h in IDENTITY_HEADERS)])
    return f"sha256(convert_to(({user})::text, 'UTF8'))"


def _hash_content(df: DataFrame) -> DataFrame:
    """Headers are compared without the producer's identity headers (every send
    carries a new sequence number) and regardless of their order."""
    has_producer = F.col("producer_id").isNotNull()
    df = df.withColumn(
        "body_sha", F.when(has_producer, F.unhex(F.sha2(F.col("body"), 256)))
    ).drop("body")
    parsed = F.from_json(F.col("headers"), "map<string,string>")
    user = F.map_filter(parsed, lambda k, _v: ~k.isin(*IDENTITY_HEADERS))
    canonical = F.coalesce(F.to_json(F.array_sort(F.map_entries(user))), F.col("headers"))
    return df.withColumn("headers_sha", F.when(has_producer, F.unhex(F.sha2(canonical, 256)))).drop(
        "headers"
    )


# --------------------------------------------------------------------------- the checks


def _finding(
    name: str, df: DataFrame, detail: Sequence[str], weight: Column | None = None
) -> DataFrame:
    """Every finding as one shape, so that all of them are counted in one pass."""
    return df.select(
        F.lit(name).alias("finding"),
        F.col("grp"),
        F.col("destination_id").cast("bigint").alias("destination_id"),
        (weight if weight is not None else F.lit(1)).cast("bigint").alias("weight"),
        F.to_json(F.struct(*[F.col(c) for c in detail])).alias("detail"),
    )


def _identity() -> Column:
    pid, seq = F.col("producer_id"), F.col("producer_seq")
    return F.coalesce(
        F.col("dedup_key"),
        F.when(pid.isNotNull() & seq.isNotNull(), F.concat_ws(":", pid, seq.cast("string"))),
    )


def check_duplicate_identity(m: DataFrame, dd: DataFrame) -> DataFrame:
    """A row is surplus when another row with its identity has a lower id, or
    when the dedup window names another message for it (that first copy was
    stored, and consumed, before this one was stored again).

    One aggregation over messages and dedup entries together finds the
    identities in question; only their (few) rows are joined back."""
    rows = m.select("grp", "id", "destination_id", _identity().alias("identity")).where(
        F.col("identity").isNotNull()
    )
    none = F.lit(None).cast("bigint")
    tagged = rows.select(
        "grp", "identity", F.col("id").alias("mid"), none.alias("did")
    ).unionByName(
        dd.where(F.col("msg_id").isNotNull()).select(
            "grp",
            F.col("dedup_key").alias("identity"),
            none.alias("mid"),
            F.col("msg_id").alias("did"),
        )
    )
    suspects = (
        tagged.groupBy("grp", "identity")
        .agg(
            F.count("mid").alias("n"),
            F.min("mid").alias("first_id"),
            F.max("did").alias("dedup_msg_id"),
        )
        .where(
            (F.col("n") > 1)
            | (
                (F.col("n") == 1)
                & F.col("dedup_msg_id").isNotNull()
                & (F.col("dedup_msg_id") != F.col("first_id"))
            )
        )
    )
    per_key = Window.partitionBy("grp", "identity")
    dup = (
        rows.join(suspects, ["grp", "identity"])
        .withColumn(
            "ghost",
            F.col("dedup_msg_id").isNotNull()
            & ~F.max(F.coalesce(F.col("id") == F.col("dedup_msg_id"), F.lit(False))).over(per_key),
        )
        .where((F.col("id") != F.col("first_id")) | F.col("ghost"))
        .select(
            "grp",
            "destination_id",
            F.col("id").alias("msg_id"),
            "identity",
            (F.col("n") + F.col("ghost").cast("int")).alias("copies"),
            F.when(F.col("ghost"), F.col("dedup_msg_id"))
            .otherwise(F.col("first_id"))
            .alias("first_msg_id"),
        )
    )
    return _finding(
        "duplicate_identity",
        dup,
        ["grp", "destination_id", "msg_id", "identity", "copies", "first_msg_id"],
    )


def check_duplicate_content(m: DataFrame) -> DataFrame:
    """Only contents seen more than once are sorted: a 64-bit hash of the key
    finds the repeats in one narrow aggregation (a collision only adds a
    candidate), and the window then runs over those rows, not the store."""
    key = ["grp", "producer_id", "body_sha", "headers_sha"]
    pm = m.where(F.col("producer_id").isNotNull() & F.col("body_sha").isNotNull()).withColumn(
        "content_hash", F.xxhash64(*key)
    )
    repeated = pm.groupBy("content_hash").count().where(F.col("count") > 1).select("content_hash")
    w = Window.partitionBy(*key).orderBy("enqueued_at", "id")
    same_identity = F.col("dedup_key").isNotNull() & F.col("dedup_key").eqNullSafe(
        F.col("prev_key")
    )
    dup = (
        pm.join(repeated, "content_hash", "left_semi")
        .withColumn("prev_at", F.lag("enqueued_at").over(w))
        .withColumn("prev_id", F.lag("id").over(w))
        .withColumn("prev_key", F.lag("dedup_key").over(w))
        .where(
            F.col("prev_at").isNotNull()
            & (F.col("enqueued_at") - F.col("prev_at") <= DUPLICATE_CONTENT_WINDOW_MS)
            & ~same_identity  # that is a duplicate_identity
        )
        .select(
            "grp",
            "destination_id",
            F.col("id").alias("msg_id"),
            "producer_id",
            "dedup_key",
            F.col("prev_id").alias("previous_msg_id"),
            F.col("prev_key").alias("previous_dedup_key"),
            (F.col("enqueued_at") - F.col("prev_at")).alias("apart_ms"),
            F.lower(F.hex("body_sha")).alias("body_sha256"),
        )
    )
    return _finding(
        "duplicate_content",
        dup,
        [
            "grp", "destination_id", "msg_id", "producer_id", "dedup_key", "previous_msg_id",
            "previous_dedup_key", "apart_ms", "body_sha256",
        ],
    )


def check_stale_inflight(
    m: DataFrame, p: DataFrame, subs: DataFrame, groups: DataFrame, now_ms: int
) -> DataFrame:
    """Queue rows carry the in-flight epoch on the message, topic deliveries on
    the pending row; both count. A group whose master took over less than the
    grace ago is still re-taking them."""
    queued = m.where(F.col("inflight_epoch").isNotNull()).select(
        "grp",
        "destination_id",
        F.col("id").alias("msg_id"),
        F.lit(None).cast("bigint").alias("sub_id"),
        "inflight_epoch",
    )
    owed = (
        p.where(F.col("inflight_epoch").isNotNull())
        .join(
            subs.select("grp", F.col("id").alias("sub_id"), "destination_id"),
            ["grp", "sub_id"],
            "left",
        )
        .select("grp", "destination_id", "msg_id", "sub_id", "inflight_epoch")
    )
    settled = F.col("epoch_started_at").isNull() | (
        F.col("epoch_started_at") <= F.lit(now_ms - STALE_INFLIGHT_GRACE_MS)
    )
    stale = (
        queued.unionByName(owed)
        .join(groups, "grp")
        .where((F.col("inflight_epoch") < F.col("epoch")) & settled)
        .withColumnRenamed("epoch", "current_epoch")
    )
    return _finding(
        "stale_inflight",
        stale,
        [
            "grp", "destination_id", "msg_id", "sub_id", "inflight_epoch", "current_epoch",
            "epoch_started_at", "live_master",
        ],
    )


#: The one result of the checks pushed into the store (``_store_checks``); ``at`` is
#: the row's enqueued_at, expires_at or created_at, as the finding needs.
STORE_CHECK_TYPES = {
    "finding": "string",
    "grp": "string",
    "destination_id": "bigint",
    "msg_id": "bigint",
    "at": "bigint",
    "dedup_key": "string",
    "producer_id": "string",
    "producer_seq": "bigint",
    "sub_id": "bigint",
}


def _groups_cte(groups: Sequence[tuple[str, int, int]]) -> str:
    """``g(grp, window_ms, pruned)``: each group's dedup window and the cut-off of its
    last recorded prune (0 when none: nothing is older)."""
    rows = ", ".join(
        f"({sql_literal(g)}, CAST({w} AS BIGINT), CAST({p} AS BIGINT))" for g, w, p in groups
    )
    return f"g (grp, window_ms, pruned) AS (VALUES {rows})"


def _store_checks(
    reader: StoreReader, groups: Sequence[tuple[str, int, int]], now_ms: int
) -> tuple[DataFrame, dict[str, tuple[int, int]]]:
    """The checks an index answers, run in the store in the snapshot, returning only
    the rows at fault: messages of destinations that are gone (the destinations
    in use found by a loose walk of ix_amq_messages_dest, one probe each), expired
    rows the reaper left (ix_amq_messages_expiry), dedup entries the last recorded
    prune left (ix_amq_dedup_age), and the orphans around pending rows (key and
    index probes). Also, per group, the overdue entries that no recorded prune
    reached: housekeeping pending, (count, oldest created_at)."""
    snap = reader.snapshot
    assert snap is not None
    names = ", ".join(sql_literal(g) for g, _, _ in groups)
    in_use = (
        f"WITH RECURSIVE {_groups_cte(groups)}, d (grp, id) AS ("
        " SELECT grp, (SELECT MIN(m.destination_id) FROM amq_messages m WHERE m.grp = g.grp)"
        " FROM g UNION ALL SELECT d.grp, (SELECT MIN(m.destination_id) FROM amq_messages m"
        " WHERE m.grp = d.grp AND m.destination_id > d.id) FROM d WHERE d.id IS NOT NULL)"
        " SELECT grp, id FROM d WHERE id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM"
        " amq_destinations x WHERE x.grp = d.grp AND x.id = d.id)"
    )
    gone = snap.query(in_use)
    overdue = f"d.created_at < {now_ms - DEDUP_GRACE_MS} - g.window_ms AND g.window_ms > 0"
    pending = {
        str(grp): (int(n), int(oldest))
        for grp, n, oldest in snap.query(
            f"WITH {_groups_cte(groups)} SELECT d.grp, COUNT(*), MIN(d.created_at)"
            f" FROM amq_dedup d JOIN g ON d.grp = g.grp WHERE {overdue}"
            " AND d.created_at >= g.pruned GROUP BY d.grp"
        )
    }
    none = "CAST(NULL AS BIGINT)"
    text = "CAST(NULL AS TEXT)"
    no_dedup = f"{text}, {text}, {none}"
    parts = [
        f"SELECT 'expired_unreaped' AS finding, grp, destination_id, id AS msg_id,"
        f" expires_at AS at, {text} AS dedup_key, {text} AS producer_id,"
        f" {none} AS producer_seq, {none} AS sub_id FROM amq_messages WHERE grp IN ({names})"
        f" AND expires_at > 0 AND expires_at < {now_ms - EXPIRY_GRACE_MS}",
        f"SELECT 'dedup_expired', d.grp, {none}, d.msg_id, d.created_at, d.dedup_key,"
        f" d.producer_id, d.producer_seq, {none} FROM amq_dedup d JOIN g ON d.grp = g.grp"
        f" WHERE {overdue} AND d.created_at < g.pruned",
        # Pending rows: of a subscription that is gone (by the primary key), pointing at
        # no message (a probe of the messages' key each); topic messages owed to nobody
        # (a probe of ix_amq_sub_pending_msg each). A scheduled topic message
        # (deliver_at > 0) is owed to nobody until a copy of it is due.
        f"SELECT 'orphan_subscription', p.grp, m.destination_id, p.msg_id, {none}, {no_dedup},"
        f" p.sub_id FROM amq_sub_pending p LEFT JOIN amq_messages m ON m.grp = p.grp"
        f" AND m.id = p.msg_id WHERE p.grp IN ({names}) AND NOT EXISTS (SELECT 1 FROM"
        " amq_subscriptions s WHERE s.grp = p.grp AND s.id = p.sub_id)",
        f"SELECT 'ack_without_message', p.grp, s.destination_id, p.msg_id, {none}, {no_dedup},"
        f" p.sub_id FROM amq_sub_pending p LEFT JOIN amq_subscriptions s ON s.grp = p.grp"
        f" AND s.id = p.sub_id WHERE p.grp IN ({names}) AND NOT EXISTS (SELECT 1 FROM"
        " amq_messages m WHERE m.grp = p.grp AND m.id = p.msg_id)",
        f"SELECT 'orphan_topic_message', m.grp, m.destination_id, m.id, m.enqueued_at,"
        f" {no_dedup}, {none} FROM amq_messages m JOIN amq_destinations t ON t.grp = m.grp"
        f" AND t.id = m.destination_id WHERE t.grp IN ({names}) AND t.kind = 'topic'"
        " AND COALESCE(m.deliver_at, 0) <= 0 AND NOT EXISTS (SELECT 1 FROM amq_sub_pending p"
        " WHERE p.grp = m.grp AND p.msg_id = m.id)",
    ]
    parts += [
        f"SELECT 'orphan_destination', grp, destination_id, id, enqueued_at, {no_dedup},"
        f" {none} FROM amq_messages WHERE grp = {sql_literal(str(grp))}"
        f" AND destination_id = {int(dest)}"
        for grp, dest in gone
    ]
    sql = f"WITH {_groups_cte(groups)} " + " UNION ALL ".join(parts)
    return reader.small(sql, STORE_CHECK_TYPES, declared=True), pending


def store_findings(sf: DataFrame, now_ms: int) -> list[DataFrame]:
    """The pushed-down checks' rows as findings, each named as it always was."""

    def rows(name: str) -> DataFrame:
        return sf.where(F.col("finding") == name)

    now = F.lit(now_ms)
    gone = rows("orphan_destination").withColumnRenamed("at", "enqueued_at")
    # The reaper takes expired rows whether in flight or not (store/sql.py
    # ``reap_expired``), so in-flight rows are no excuse.
    expired = rows("expired_unreaped").select(
        "grp", "destination_id", "msg_id", F.col("at").alias("expires_at"),
        (now - F.col("at")).alias("overdue_ms"),
    )  # fmt: skip
    old = rows("dedup_expired").select(
        "grp", "destination_id", "dedup_key", "producer_id", "producer_seq", "msg_id",
        F.col("at").alias("created_at"), (now - F.col("at")).alias("age_ms"),
    )  # fmt: skip
    expiry = ["grp", "destination_id", "msg_id", "expires_at", "overdue_ms"]
    age = ["grp", "dedup_key", "producer_id", "producer_seq", "msg_id", "created_at", "age_ms"]
    owed = ["grp", "destination_id", "sub_id", "msg_id"]
    message = ["grp", "destination_id", "msg_id", "enqueued_at"]
    unowed = rows("orphan_topic_message").withColumnRenamed("at", "enqueued_at")
    return [
        _finding("orphan_destination", gone, message),
        _finding("orphan_subscription", rows("orphan_subscription"), owed),
        _finding("orphan_topic_message", unowed, message),
        _finding("ack_without_message", rows("ack_without_message"), owed),
        _finding("expired_unreaped", expired, expiry),
        _finding("dedup_expired", old, age),
    ]


def check_sequence_gap(m: DataFrame, dd: DataFrame) -> DataFrame:
    """Sequence gaps from rows (SQLite, and hand-made rows), see
    ``check_sequence_runs``."""
    return check_sequence_runs(rows_as_runs(m, dd))


def rows_as_runs(m: DataFrame, dd: DataFrame) -> DataFrame:
    """Each sequence number of a message or dedup row as a run of one."""

    def runs(df: DataFrame, in_dedup: bool) -> DataFrame:
        return df.where(
            F.col("producer_id").isNotNull() & F.col("producer_seq").isNotNull()
        ).select(
            "grp", "producer_id", F.col("producer_seq").alias("lo"),
            F.col("producer_seq").alias("hi"), F.lit(in_dedup).alias("dd"),
        )  # fmt: skip

    return runs(m, False).unionByName(runs(dd, True))


def check_sequence_runs(runs: DataFrame) -> DataFrame:
    """A sequence number is accounted for while its message is stored or its
    identity is in the dedup window. Below a producer's oldest dedup entry a
    consumed message leaves no trace at all, so only numbers from that entry up
    are compared; a producer with no dedup entry cannot be checked. The count
    is the number of missing sequence numbers; a number present twice (message
    and dedup entry) is no gap.

    ``runs``: (grp, producer_id, lo, hi, dd) ranges of present numbers, each inside
    one bucket of ``GAP_BUCKET_SEQS`` numbers (``lo div GAP_BUCKET_SEQS``, as the
    store's ``/`` has it); ``dd`` when they come from amq_dedup. They may overlap
    (a number in a message and in its dedup entry). A hot producer is many tasks:
    holes inside a bucket by a running maximum over its runs, holes between
    buckets by a window over the buckets' (lowest, highest) pairs."""
    producer = ["grp", "producer_id"]
    floors = runs.where(F.col("dd")).groupBy(*producer).agg(F.min("lo").alias("floor"))
    judged = (
        runs.join(floors, producer)
        .where(F.col("hi") >= F.col("floor"))
        .withColumn("lo", F.greatest(F.col("lo"), F.col("floor")))
        .withColumn("bucket", F.expr(f"lo div {GAP_BUCKET_SEQS}"))
    )
    before = (
        Window.partitionBy(*producer, "bucket")
        .orderBy("lo", "hi")
        .rowsBetween(Window.unboundedPreceding, -1)
    )
    inside = judged.withColumn("prev", F.max("hi").over(before)).select(
        *producer, "prev", F.col("lo").alias("seq")
    )
    edges = judged.groupBy(*producer, "bucket").agg(
        F.min("lo").alias("seq"), F.max("hi").alias("hi")
    )
    across = edges.withColumn(
        "prev", F.lag("hi").over(Window.partitionBy(*producer).orderBy("bucket"))
    ).select(*producer, "prev", "seq")
    gaps = (
        inside.unionByName(across)
        .where(F.col("seq") - F.col("prev") > 1)
        .select(
            "grp",
            F.lit(None).cast("bigint").alias("destination_id"),
            "producer_id",
            F.col("prev").alias("after_seq"),
            F.col("seq").alias("before_seq"),
            (F.col("seq") - F.col("prev") - 1).alias("missing"),
        )
    )
    return _finding(
        "sequence_gap",
        gaps,
        ["grp", "producer_id", "after_seq", "before_seq", "missing"],
        weight=F.col("missing"),
    )


# --------------------------------------------------------------------------- pushed into PostgreSQL

#: Columns of each finding the store judges on PostgreSQL (``_identity_findings``,
#: ``_content_findings``, the slices' stale rows): what Spark's own check of the same
#: name reports, so that both backends write the same rows.
IDENTITY_FINDING = {
    "grp": "string", "destination_id": "bigint", "msg_id": "bigint", "identity": "string",
    "copies": "bigint", "first_msg_id": "bigint",
}  # fmt: skip
CONTENT_FINDING = {
    "grp": "string", "destination_id": "bigint", "msg_id": "bigint", "producer_id": "string",
    "dedup_key": "string", "previous_msg_id": "bigint", "previous_dedup_key": "string",
    "apart_ms": "bigint", "body_sha256": "string",
}  # fmt: skip
STALE_FINDING = {
    "grp": "string", "destination_id": "bigint", "msg_id": "bigint", "sub_id": "bigint",
    "inflight_epoch": "bigint", "current_epoch": "bigint", "epoch_started_at": "bigint",
    "live_master": "string",
}  # fmt: skip
#: A run of consecutive sequence numbers of one producer inside one gap bucket.
RUN_TYPES = {"grp": "string", "producer_id": "string", "lo": "bigint", "hi": "bigint"}
#: A slice of amq_messages: its runs (producer_id set) and its stale rows (msg_id set).
SLICE_TYPES = {**RUN_TYPES, **STALE_FINDING}


def _identity_sql(prefix: str = "") -> str:
    """A message's identity in SQL, as ``_identity`` has it in Spark."""
    p = prefix
    return f"COALESCE({p}dedup_key, {p}producer_id || ':' || {p}producer_seq)"


def _identity_findings(reader: StoreReader) -> DataFrame:
    """``check_duplicate_identity`` in the store, per group (small ones packed):
    the candidates are every row of an identity stored more than once (a hash
    aggregate) and every row whose identity's dedup entry names another message (a
    hash join with amq_dedup); a group's candidates are all in its statement, so it
    judges them too (a healthy store has none). The rule, as in Spark: every row
    but an identity's first is surplus, and all are when its dedup entry names a
    message that is not among them (that first copy was consumed)."""
    statements = []
    ident, m_ident = _identity_sql(), _identity_sql("m.")
    for pack in reader.group_packs("amq_messages"):
        statements.append(
            "WITH cand AS MATERIALIZED ("
            f"SELECT grp, id, destination_id, {ident} AS identity, CAST(NULL AS BIGINT) AS d"
            f" FROM amq_messages WHERE {_grp_in(pack)} AND (grp, {ident}) IN (SELECT grp,"
            f" {ident} FROM amq_messages WHERE {_grp_in(pack)} AND {ident} IS NOT NULL"
            " GROUP BY 1, 2 HAVING COUNT(*) > 1)"
            f" UNION ALL SELECT m.grp, m.id, m.destination_id, {m_ident}, d.msg_id"
            f" FROM amq_messages m JOIN amq_dedup d ON d.grp = m.grp AND d.dedup_key = {m_ident}"
            f" WHERE {_grp_in(pack, 'm.grp')} AND d.msg_id <> m.id),"
            " cand_ids AS (SELECT grp, id, MIN(destination_id) AS destination_id,"
            " MIN(identity) AS identity FROM cand GROUP BY grp, id),"
            " cand_keys AS (SELECT grp, identity, MAX(d) AS d FROM cand GROUP BY grp, identity),"
            " judged AS (SELECT r.grp, r.id, r.destination_id, r.identity, k.d,"
            " COUNT(*) OVER w AS n, MIN(r.id) OVER w AS first_id, k.d IS NOT NULL AND NOT"
            " COALESCE(BOOL_OR(r.id = k.d) OVER w, FALSE) AS ghost FROM cand_ids r JOIN cand_keys k"
            " ON k.grp = r.grp AND k.identity = r.identity"
            " WINDOW w AS (PARTITION BY r.grp, r.identity))"
            " SELECT grp, destination_id, id AS msg_id, identity,"
            " n + CASE WHEN ghost THEN 1 ELSE 0 END AS copies,"
            " CASE WHEN ghost THEN d ELSE first_id END AS first_msg_id"
            " FROM judged WHERE id <> first_id OR ghost"
        )
    return reader.arms(statements, IDENTITY_FINDING)


def _content_findings(reader: StoreReader) -> DataFrame:
    """``check_duplicate_content`` in the store, per group (small ones packed): only
    rows whose producer stored their body more than once (md5 in a hash aggregate)
    are hashed (body; headers without the identity headers) and compared with the
    previous copy of the same content."""
    statements = []
    cols = "grp, id, destination_id, producer_id, dedup_key, enqueued_at"
    for pack in reader.group_packs("amq_messages"):
        statements.append(
            f"SELECT grp, destination_id, id AS msg_id, producer_id, dedup_key,"
            " prev_id AS previous_msg_id, prev_key AS previous_dedup_key,"
            " enqueued_at - prev_at AS apart_ms, encode(body_sha, 'hex') AS body_sha256"
            f" FROM (SELECT {cols}, body_sha, LAG(enqueued_at) OVER w AS prev_at,"
            " LAG(id) OVER w AS prev_id, LAG(dedup_key) OVER w AS prev_key"
            f" FROM (SELECT {cols}, sha256(body) AS body_sha, {_pg_headers_sha()} AS headers_sha"
            f" FROM amq_messages WHERE {_grp_in(pack)} AND producer_id IS NOT NULL"
            " AND (grp, producer_id, md5(body)) IN (SELECT grp, producer_id, md5(body)"
            f" FROM amq_messages WHERE {_grp_in(pack)} AND producer_id IS NOT NULL"
            " GROUP BY 1, 2, 3 HAVING COUNT(*) > 1)) cand"
            " WINDOW w AS (PARTITION BY grp, producer_id, body_sha, headers_sha"
            " ORDER BY enqueued_at, id)) amq_x"
            f" WHERE prev_at IS NOT NULL AND enqueued_at - prev_at <= {DUPLICATE_CONTENT_WINDOW_MS}"
            " AND NOT (dedup_key IS NOT NULL AND dedup_key IS NOT DISTINCT FROM prev_key)"
        )
    return reader.arms(statements, CONTENT_FINDING)


def _runs_sql(table: str, where: str) -> str:
    """The runs of consecutive sequence numbers per producer and gap bucket among
    the rows of ``table`` that ``where`` picks (islands: a number minus its dense
    rank is constant along a run). A healthy slice is one run per producer; only
    holes (and numbers that interleave with another slice's) add runs. Sorted by
    bytes (COLLATE "C"): cheaper than the database's collation, and any one order
    does."""
    return (
        "SELECT grp, producer_id, MIN(seq) AS lo, MAX(seq) AS hi FROM (SELECT grp, producer_id,"
        f" producer_seq AS seq, producer_seq / {GAP_BUCKET_SEQS} AS b, producer_seq - DENSE_RANK()"
        f' OVER (PARTITION BY grp, producer_id COLLATE "C", producer_seq / {GAP_BUCKET_SEQS}'
        f" ORDER BY producer_seq) AS isl FROM {table} WHERE ({where})"
        " AND producer_id IS NOT NULL AND producer_seq IS NOT NULL) amq_s"
        " GROUP BY grp, producer_id, b, isl"
    )


#: A settled group as the stale checks need it: (group, current epoch, when that
#: epoch began, the live master or None).
Settled = tuple[str, int, int | None, str | None]


def _epochs_values(settled: Sequence[Settled]) -> str:
    """The settled groups as a VALUES list joined by the stale checks."""
    def text(v: str | None) -> str:
        return "CAST(NULL AS TEXT)" if v is None else f"CAST({sql_literal(v)} AS TEXT)"

    def number(v: int | None) -> str:
        return f"CAST({'NULL' if v is None else int(v)} AS BIGINT)"

    rows = ", ".join(
        f"({sql_literal(g)}, {number(e)}, {number(at)}, {text(live)})"
        for g, e, at, live in settled
    )
    return f"(VALUES {rows}) amq_e (e_grp, e_epoch, e_started, e_live)"


def _message_slices(reader: StoreReader, settled: Sequence[Settled]) -> DataFrame:
    """amq_messages cut at quantiles of its key, one statement per slice: the
    slice's runs of sequence numbers, and its rows in flight under an older epoch
    of a settled group (``check_stale_inflight``'s queue rows, judged here)."""
    none, text = "CAST(NULL AS BIGINT)", "CAST(NULL AS TEXT)"
    statements = []
    for pred in reader.key_predicates("amq_messages", "id"):
        sql = (
            f"SELECT grp, producer_id, lo, hi, {none} AS destination_id, {none} AS msg_id,"
            f" {none} AS sub_id, {none} AS inflight_epoch, {none} AS current_epoch,"
            f" {none} AS epoch_started_at, {text} AS live_master"
            f" FROM ({_runs_sql('amq_messages', pred)}) amq_r"
        )
        if settled:
            sql += (
                f" UNION ALL SELECT grp, {text}, {none}, {none}, destination_id, id, {none},"
                f" inflight_epoch, e_epoch, e_started, e_live FROM amq_messages"
                f" JOIN {_epochs_values(settled)} ON e_grp = grp"
                f" WHERE ({pred}) AND inflight_epoch < e_epoch"
            )
        statements.append(sql)
    return reader.arms(statements, SLICE_TYPES)


def _dedup_runs(reader: StoreReader) -> DataFrame:
    """amq_dedup cut at quantiles of created_at (ix_amq_dedup_age), one statement
    per slice: its runs. Quantiles, not min/max strides (one old entry made one
    stride hold every other row); and not ranges of the key: entries are stored in
    the order they were made, so a range of keys ("p1:1".."p1:5") is spread over the
    whole table and every slice read most of its pages (9.5 s of statements at a
    million entries, against 2 by created_at)."""
    preds = reader.key_predicates("amq_dedup", "created_at")
    return reader.arms([_runs_sql("amq_dedup", p) for p in preds], RUN_TYPES)


def _stale_pending(reader: StoreReader, settled: Sequence[Settled]) -> DataFrame:
    """``check_stale_inflight``'s pending rows, judged in the store: in flight under
    an older epoch of a settled group, read in slices of amq_sub_pending (Spark's
    own WHERE reaches the filter); the destination is the subscription's."""
    if not settled:
        reader.key_predicates("amq_sub_pending", "msg_id")  # what it would read, for the summary
        return _empty(reader.spark, STALE_FINDING)
    select = (
        "SELECT p.grp, s.destination_id, p.msg_id, p.sub_id, p.inflight_epoch,"
        " e_epoch AS current_epoch, e_started AS epoch_started_at, e_live AS live_master"
        f" FROM amq_sub_pending p JOIN {_epochs_values(settled)} ON e_grp = p.grp"
        " LEFT JOIN amq_subscriptions s ON s.grp = p.grp AND s.id = p.sub_id"
        " WHERE p.inflight_epoch < e_epoch"
    )
    return reader.partitioned("amq_sub_pending", select, STALE_FINDING, "msg_id")


# --------------------------------------------------------------------------- the audit


@dataclass
class StoreData:
    """What the checks work from, read in one snapshot."""

    now_ms: int
    group_names: list[str]
    #: (group, destination id): name, read by the driver.
    destination_names: dict[tuple[str, int], str]
    #: Duplicates by identity and content and stale in-flight rows, as findings:
    #: judged in the store on PostgreSQL (``_pushed_down``), by Spark's checks over
    #: every row on SQLite (``_read_rows``).
    judged: list[DataFrame]
    #: Sequence runs (grp, producer_id, lo, hi, dd), merged across slices by Spark.
    runs: DataFrame
    store_checks: DataFrame  # the rows at fault of the checks run in the store
    #: Per group, overdue dedup entries no recorded prune reached (not a finding).
    housekeeping: dict[str, dict[str, Any]]


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
        with _session_conf(spark, SMALL_DATA_SETTINGS if pushed else {}):
            data = read_store(reader, now_ms)
        snapshot.close()
        read_done = time.monotonic()
        progress.say("checking")
        settings = _check_settings(spark, sum(reader.returned.values()), pushed)
        with _session_conf(spark, settings):
            tasks = math.ceil(sum(reader.returned.values()) / CHECK_ROWS_PER_TASK)
            findings = _settle(all_findings(data).coalesce(max(1, tasks)))
            summary = _summarize(reader, data, findings)
            checked = time.monotonic()
            if output:
                progress.say(f"writing findings to {output}")
                summary["output"] = output
                summary["files"] = _write_findings(spark, findings, output, summary["counts"])
        done = time.monotonic()
        summary["duration_s"] = round(done - started, 3)
        summary["timings"] = {
            "read_s": round(read_done - started, 3),
            "check_s": round(checked - read_done, 3),
            "write_s": round(done - checked, 3),
        }
        if output:
            _write_text(spark, _join(output, "summary.json"), json.dumps(summary, indent=2) + "\n")
        progress.say("done")
        return AuditResult(summary)
    finally:
        if snapshot is not None:
            snapshot.close()
        progress.stop()


def _now_ms(reader: StoreReader) -> int:
    """The store's clock where it has one: the broker stamps rows with wall time,
    and the database is the clock both sides can see."""
    if reader.snapshot is not None and reader.source.backend == "postgresql":
        rows = reader.snapshot.query(
            "SELECT CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)"
        )
        return int(rows[0][0])
    return int(time.time() * 1000)


GROUP_TYPES = STORE_COLUMNS["amq_groups"]
REGISTRY_TYPES = STORE_COLUMNS["amq_registry"]
DESTINATION_TYPES = STORE_COLUMNS["amq_destinations"]
SUBSCRIPTION_TYPES = STORE_COLUMNS["amq_subscriptions"]
PENDING_TYPES = STORE_COLUMNS["amq_sub_pending"]
DEDUP_TYPES = STORE_COLUMNS["amq_dedup"]
META_TYPES = STORE_COLUMNS["amq_meta"]


def _select(types: dict[str, str], table: str, where: str = "") -> str:
    return f"SELECT {', '.join(types)} FROM {table}{where}"


def _last_prunes(snapshot: Snapshot) -> dict[str, tuple[int, int | None]]:
    """Per group, the last dedup prune a master recorded: (before, at), see
    ``DEDUP_PRUNED_PREFIX``. A value that does not parse is ignored (as no prune)."""
    prunes: dict[str, tuple[int, int | None]] = {}
    rows = snapshot.query(
        f"{_select(META_TYPES, 'amq_meta')} WHERE key LIKE {sql_literal(DEDUP_PRUNED_PREFIX + '%')}"
    )
    for _key, value in rows:
        with contextlib.suppress(ValueError, TypeError, KeyError, AttributeError):
            v = json.loads(str(value))
            at = v.get("at")
            prunes[str(v["grp"])] = (int(v["before"]), int(at) if at is not None else None)
    return prunes


#: The groups as the driver reads them (``_read_groups``), for Spark's stale check.
GROUP_ROW_SCHEMA = (
    "grp string, epoch bigint, epoch_started_at bigint, dedup_window_ms bigint, "
    "live_master string, dedup_pruned_before bigint, dedup_pruned_at bigint"
)


def _read_groups(
    reader: StoreReader, now_ms: int
) -> tuple[list[str], list[tuple[Any, ...]], dict[str, tuple[int, int | None]], list[Settled]]:
    """Groups, registry and the last prunes are a few rows each: read in the
    snapshot by the driver, joined there."""
    snap = reader.snapshot
    assert snap is not None
    where = reader.where_group()
    group_rows = [dict(zip(GROUP_TYPES, r, strict=True))
                  for r in snap.query(_select(GROUP_TYPES, "amq_groups", where))]
    if reader.group is not None and not group_rows:
        raise AuditError(f"group {reader.group!r} not found in {reader.described}")
    registry = [dict(zip(REGISTRY_TYPES, r, strict=True))
                for r in snap.query(_select(REGISTRY_TYPES, "amq_registry", where))]
    prunes = _last_prunes(snap)
    rows = []
    for g in group_rows:
        live = sorted(
            r["name"]
            for r in registry
            if r["grp"] == g["grp"]
            and r["role"] == "master"
            and r["epoch"] == g["epoch"]
            and (r["heartbeat_at"] or 0) >= now_ms - REGISTRY_LIVE_MS
        )
        before, at = prunes.get(g["grp"], (None, None))
        rows.append(
            (
                g["grp"],
                int(g["epoch"]),
                None if g["epoch_started_at"] is None else int(g["epoch_started_at"]),
                int(g["dedup_window_ms"] or 0),
                live[0] if live else None,
                before,
                at,
            )
        )
    names = sorted(r[0] for r in rows)
    reader.groups = names
    windows = {str(r[0]): (int(r[3]), r[5]) for r in rows}
    # Groups whose master took over more than the grace ago: their older epochs' rows
    # still in flight are stale (``check_stale_inflight`` has the same rule).
    settled: list[Settled] = [
        (str(r[0]), int(r[1]), r[2], r[4]) for r in rows
        if r[2] is None or r[2] <= now_ms - STALE_INFLIGHT_GRACE_MS
    ]  # fmt: skip
    return names, rows, windows, settled


def _driver_table(reader: StoreReader, table: str, types: dict[str, str]) -> list[tuple[Any, ...]]:
    """A small table (destinations, subscriptions: bounded by what the operators
    created, not by traffic) read by the driver in the snapshot: no Spark job."""
    assert reader.snapshot is not None
    rows = reader.snapshot.query(_select(types, table, reader.where_groups()))
    reader.reads[table] = TableRead(len(rows), 1)
    return [tuple(None if v is None else (int(v) if t == "bigint" else str(v))
                  for v, t in zip(r, types.values(), strict=True)) for r in rows]  # fmt: skip


def _pushed_down(
    reader: StoreReader, settled: Sequence[Settled]
) -> dict[str, DataFrame]:
    """PostgreSQL: each check's per-row work runs in the store, slice by slice in
    parallel partitions, and Spark receives only candidates and runs."""
    return {
        "duplicate identities": _identity_findings(reader),
        "duplicate contents": _content_findings(reader),
        "amq_messages slices": _message_slices(reader, settled),
        "amq_dedup runs": _dedup_runs(reader),
        "amq_sub_pending in flight": _stale_pending(reader, settled),
    }


def _read_rows(reader: StoreReader) -> dict[str, DataFrame]:
    """SQLite: every row of the three big tables (a local file; Spark hashes)."""
    m_sql, m_types = _message_select()
    return {
        "amq_messages": reader.partitioned("amq_messages", m_sql, m_types, "id"),
        "amq_sub_pending": reader.partitioned(
            "amq_sub_pending", _select(PENDING_TYPES, "amq_sub_pending"), PENDING_TYPES, "msg_id"
        ),
        # The primary key (grp, dedup_key) spreads evenly; created_at does not (one old
        # entry made one stride hold every other row).
        "amq_dedup": reader.partitioned(
            "amq_dedup", _select(DEDUP_TYPES, "amq_dedup"), DEDUP_TYPES, "dedup_key"
        ),
    }


def _check_inputs(
    pg: bool, reads: dict[str, DataFrame], subs: list[tuple[Any, ...]],
    groups: list[tuple[Any, ...]], now_ms: int,
) -> tuple[list[DataFrame], DataFrame]:
    """(findings of the checks judged whole, sequence runs) from ``_pushed_down``'s
    reads (judged in the store: only a projection here) or ``_read_rows``' (every
    row: Spark's checks)."""
    if not pg:
        m, dd, p = reads["amq_messages"], reads["amq_dedup"], reads["amq_sub_pending"]
        spark = m.sparkSession
        subs_df = spark.createDataFrame(subs, _schema(SUBSCRIPTION_TYPES))
        groups_df = spark.createDataFrame(groups, GROUP_ROW_SCHEMA)
        return [
            check_duplicate_identity(m, dd),
            check_duplicate_content(_hash_content(m)),
            check_stale_inflight(m, p, subs_df, groups_df, now_ms),
        ], rows_as_runs(m, dd)
    slices = reads["amq_messages slices"]
    run_cols = ["grp", "producer_id", "lo", "hi"]
    runs = slices.where(F.col("producer_id").isNotNull()).select(
        *run_cols, F.lit(False).alias("dd")
    ).unionByName(reads["amq_dedup runs"].select(*run_cols, F.lit(True).alias("dd")))
    stale = slices.where(F.col("msg_id").isNotNull()).select(*STALE_FINDING).unionByName(
        reads["amq_sub_pending in flight"]
    )
    return [
        _finding("duplicate_identity", reads["duplicate identities"], list(IDENTITY_FINDING)),
        _finding("duplicate_content", reads["duplicate contents"], list(CONTENT_FINDING)),
        _finding("stale_inflight", stale, list(STALE_FINDING)),
    ], runs


def read_store(reader: StoreReader, now_ms: int | None) -> StoreData:
    """Every read, all in the reader's one snapshot and in one Spark job: a live
    broker's writes are either wholly in it or not at all, so their order does
    not matter."""
    now = now_ms if now_ms is not None else _now_ms(reader)
    group_names, groups, windows, settled = _read_groups(reader, now)
    dests = _driver_table(reader, "amq_destinations", DESTINATION_TYPES)
    subs = _driver_table(reader, "amq_subscriptions", SUBSCRIPTION_TYPES)
    pg = reader.source.backend == "postgresql"
    reads = _pushed_down(reader, settled) if pg else _read_rows(reader)
    housekeeping: dict[str, dict[str, Any]] = {}
    if group_names:
        cte = [(g, w, before or 0) for g, (w, before) in sorted(windows.items())]
        reads["store checks"], pending = _store_checks(reader, cte, now)
        prunes = _last_prunes(reader.snapshot) if reader.snapshot is not None else {}
        housekeeping = {
            g: {
                "dedup_entries_past_window": n,
                "oldest_created_at": oldest,
                "last_prune_at": prunes[g][1] if g in prunes else None,
            }
            for g, (n, oldest) in pending.items()
        }
    else:
        reads["store checks"] = _empty(reader.spark, STORE_CHECK_TYPES)
    cached = reader.materialize(reads)
    judged, runs = _check_inputs(pg, cached, subs, groups, now)
    names = {(str(r[0]), int(r[1])): str(r[2]) for r in dests}
    return StoreData(now, group_names, names, judged, runs, cached["store checks"], housekeeping)


def _empty(spark: SparkSession, types: dict[str, str]) -> DataFrame:
    """No rows and no partitions (``createDataFrame([])`` has a task per core)."""
    return spark.createDataFrame(spark.sparkContext.emptyRDD(), _schema(types))


def _schema(types: dict[str, str]) -> str:
    return ", ".join(f"{c} {t}" for c, t in types.items())


def all_findings(d: StoreData) -> DataFrame:
    """Every check, as one DataFrame of one shape."""
    checks = [
        *d.judged,
        check_sequence_runs(d.runs),
        *store_findings(d.store_checks, d.now_ms),
    ]
    findings = checks[0]
    for df in checks[1:]:
        findings = findings.unionByName(df)
    return findings


@contextlib.contextmanager
def _session_conf(spark: SparkSession, settings: dict[str, str]) -> Iterator[None]:
    """SQL settings for the audit's queries, restored after (the session may be
    somebody else's)."""
    before = {key: spark.conf.get(key, None) for key in settings}
    for key, value in settings.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, old in before.items():
            if old is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, old)


#: Spark settings for queries over candidates (a few thousand rows on a healthy
#: store): one job per action, compiled as little as possible. Adaptive execution
#: and broadcast joins each run a job per shuffle or per broadcast, and whole-stage
#: code generation compiles a class per stage; on a cold JVM each costs more than
#: the rows (bench/audit_bench.py at 200,000 messages: 24 jobs an audit before, 3).
SMALL_DATA_SETTINGS = {
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.autoBroadcastJoinThreshold": "-1",
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.constraintPropagation.enabled": "false",
}


def _check_settings(spark: SparkSession, rows: int, small: bool) -> dict[str, str]:
    """The checks' shuffles sized to their input (a clean store's candidates fit in
    one partition), never more than the session's setting. ``small``: the checks
    see candidates only (PostgreSQL), so no whole-stage code generation: compiling
    a class per stage costs a cold JVM more than interpreting a few thousand rows
    (bench/audit_bench.py: about half the checks' time at 200,000 messages)."""
    key = "spark.sql.shuffle.partitions"
    wanted = max(1, math.ceil(rows / CHECK_ROWS_PER_TASK))
    settings = {key: str(min(int(spark.conf.get(key) or wanted), wanted))}
    if small:
        settings.update(SMALL_DATA_SETTINGS)
    return settings


def _summarize(reader: StoreReader, d: StoreData, findings: DataFrame) -> dict[str, Any]:
    """Totals per finding, group and destination, and a few sample rows: the only
    things that come back to the driver, and they are bounded by the number of
    destinations, not of messages."""
    names = d.destination_names
    none = F.lit(None)
    totals = findings.groupBy("finding", "grp", "destination_id").agg(
        F.sum("weight").alias("count"), F.count(F.lit(1)).alias("rows"),
    ).select("finding", "grp", "destination_id", "count", "rows",
             none.cast("string").alias("detail"), none.cast("int").alias("n"))  # fmt: skip
    w = Window.partitionBy("finding").orderBy("grp", "destination_id", "detail")
    sampled = (
        findings.withColumn("n", F.row_number().over(w))
        .where(F.col("n") <= SAMPLE_ROWS)
        .select("finding", "grp", "destination_id", none.cast("bigint").alias("count"),
                none.cast("bigint").alias("rows"), "detail", "n")
    )  # fmt: skip
    # Totals and samples in one action: each Spark job costs more than these rows.
    collected = totals.unionByName(sampled).collect()
    by_dest = sorted(
        (
            {
                "finding": r["finding"],
                "group": r["grp"],
                "destination": _destination_label(
                    r["destination_id"], names.get((r["grp"], r["destination_id"]))
                ),
                "destination_id": r["destination_id"],
                "count": int(r["count"]),
                "rows": int(r["rows"]),
            }
            for r in collected
            if r["n"] is None
        ),
        key=lambda x: (list(FINDINGS).index(x["finding"]), x["group"], x["destination"]),
    )
    counts = {name: 0 for name in FINDINGS}
    for row in by_dest:
        counts[row["finding"]] += row["count"]
    samples: dict[str, list[dict[str, Any]]] = {}
    for r in sorted((r for r in collected if r["n"] is not None),
                    key=lambda r: (r["finding"], r["n"])):  # fmt: skip
        samples.setdefault(r["finding"], []).append(json.loads(r["detail"]))
    total = sum(counts.values())
    return {
        "tool": "amqlite-audit",
        "store": reader.described,
        "backend": reader.source.backend,
        "group": reader.group,
        "groups": d.group_names,
        "now_ms": d.now_ms,
        "audited_at": dt.datetime.fromtimestamp(d.now_ms / 1000, dt.UTC).isoformat(),
        "duration_s": None,
        "reads": {k: {"rows": v.rows, "partitions": v.partitions} for k, v in reader.reads.items()},
        "rows_read": sum(v.rows for v in reader.reads.values()),
        #: Rows each read brought back to Spark: on PostgreSQL only candidates and runs.
        "returned": dict(reader.returned),
        "snapshot": reader.snapshot.pins if reader.snapshot is not None else None,
        "housekeeping_pending": {g: d.housekeeping[g] for g in sorted(d.housekeeping)},
        "limits": {
            "expiry_grace_ms": EXPIRY_GRACE_MS,
            "dedup_grace_ms": DEDUP_GRACE_MS,
            "stale_inflight_grace_ms": STALE_INFLIGHT_GRACE_MS,
            "duplicate_content_window_ms": DUPLICATE_CONTENT_WINDOW_MS,
            "rows_per_partition": reader.rows_per_partition,
            "fetch_size": JDBC_FETCH_SIZE,
        },
        "clean": total == 0,
        "total": total,
        "counts": counts,
        "findings": by_dest,
        "samples": {k: samples[k] for k in FINDINGS if k in samples},
        "output": None,
        "files": {},
    }


def _write_findings(
    spark: SparkSession, findings: DataFrame, output: str, counts: dict[str, int]
) -> dict[str, str]:
    """All finding rows in one write, as JSON lines, one folder per finding type
    (Spark names them finding=<type>; renamed to <type>). A rerun into the same
    directory leaves no rows of the previous run behind."""
    folder = _join(output, "findings")
    _remove_tree(spark, folder)
    _make_dirs(spark, output)
    if not any(counts.values()):
        return {}
    findings.select("finding", "detail").write.partitionBy("finding").text(folder)
    files = {}
    for name, count in counts.items():
        if count:
            _rename(spark, _join(folder, f"finding={name}"), _join(folder, name))
            files[name] = f"findings/{name}"
    return files


def _destination_label(destination_id: int | None, name: str | None) -> str:
    if destination_id is None:
        return "-"
    return name if name is not None else f"#{destination_id} (gone)"


# --------------------------------------------------------------------------- output


def _is_local(path: str) -> bool:
    scheme = urllib.parse.urlsplit(path).scheme
    return scheme in ("", "file")


def _local(path: str) -> str:
    return urllib.parse.urlsplit(path).path if path.startswith("file:") else path


def _join(base: str, rel: str) -> str:
    return base.rstrip("/") + "/" + rel


def _hadoop_path(spark: SparkSession, path: str) -> tuple[Any, Any]:
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    hpath = jvm.org.apache.hadoop.fs.Path(path)
    return hpath.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()), hpath


def _remove_tree(spark: SparkSession, path: str) -> None:
    if _is_local(path):
        shutil.rmtree(_local(path), ignore_errors=True)
    else:  # HDFS, S3...: through Hadoop's FileSystem, where Spark writes too.
        fs, hpath = _hadoop_path(spark, path)
        fs.delete(hpath, True)


def _make_dirs(spark: SparkSession, path: str) -> None:
    if _is_local(path):
        os.makedirs(_local(path), exist_ok=True)
    else:
        fs, hpath = _hadoop_path(spark, path)
        fs.mkdirs(hpath)


def _rename(spark: SparkSession, src: str, dst: str) -> None:
    if _is_local(src):
        os.replace(_local(src), _local(dst))
    else:
        fs, hsrc = _hadoop_path(spark, src)
        _, hdst = _hadoop_path(spark, dst)
        if not fs.rename(hsrc, hdst):
            raise AuditError(f"could not rename {src} to {dst}")


def _write_text(spark: SparkSession, path: str, text: str) -> None:
    if _is_local(path):
        with open(_local(path), "w", encoding="utf-8") as f:
            f.write(text)
        return
    fs, hpath = _hadoop_path(spark, path)
    stream = fs.create(hpath, True)
    try:
        stream.write(bytearray(text.encode("utf-8")))
    finally:
        stream.close()


def render_table(summary: dict[str, Any]) -> str:
    """The report for people: what was read, one line per finding per group and
    destination, a few sample rows, and the verdict."""
    out: list[str] = []
    reads = ", ".join(
        f"{name} {r['rows']:,} rows/{r['partitions']} part" for name, r in summary["reads"].items()
    )
    groups = ", ".join(summary["groups"]) or "(none)"
    out.append(f"amqlite audit of {summary['store']}  groups: {groups}")
    out.append(f"read {reads}; took {summary['duration_s']:.1f} s")
    out.append("")
    rows = [
        (d["finding"], d["group"], d["destination"], f"{d['count']:,}") for d in summary["findings"]
    ]
    if rows:
        head = ("FINDING", "GROUP", "DESTINATION", "COUNT")
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
        fmt = "  ".join(f"{{:<{w}}}" for w in widths[:-1]) + f"  {{:>{widths[-1]}}}"
        out.append(fmt.format(*head))
        out.extend(fmt.format(*r) for r in rows)
        out.append("")
        out.append(f"samples (up to {SAMPLE_ROWS} per finding):")
        for name, sample in summary["samples"].items():
            out.append(f"  {name}: {FINDINGS[name]}")
            out.extend(f"    {json.dumps(s, sort_keys=True)}" for s in sample)
        out.append("")
        out.extend(_pending_lines(summary))
        kinds = sum(1 for c in summary["counts"].values() if c)
        out.append(f"FOUND {summary['total']:,} in {kinds} finding type(s)")
    else:
        out.extend(_pending_lines(summary))
        out.append("clean: no duplicates, orphans, stale state or sequence gaps found")
    if summary["files"]:
        out.append(f"rows written under {summary['output']}")
    return "\n".join(out)


def _pending_lines(summary: dict[str, Any]) -> list[str]:
    """Housekeeping that has not run yet, per group: not a finding, said anyway."""
    out = []
    for grp, p in summary.get("housekeeping_pending", {}).items():
        last = p["last_prune_at"]
        when = (
            "no prune recorded"
            if last is None
            else f"last prune {dt.datetime.fromtimestamp(last / 1000, dt.UTC):%Y-%m-%d %H:%M:%S}Z"
        )
        out.append(
            f"housekeeping pending (not a finding): group {grp}: "
            f"{p['dedup_entries_past_window']:,} dedup entries past the window ({when})"
        )
    return out + ([""] if out else [])


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


if __name__ == "__main__":
    sys.exit(main())
