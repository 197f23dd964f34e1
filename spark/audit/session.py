"""The Spark session the audit runs in, its progress line, and the settings it
scopes to each phase (reading, checking).
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import threading
import time
from collections.abc import Iterator, Sequence

from pyspark import SparkContext
from pyspark.sql import SparkSession

from spark.audit.jvm import (
    ArchiveState,
    ClassArchive,
    can_lower_jvm,
    finish_archive,
    lower_this_thread,
    plan_archive,
    raise_back,
)
from spark.audit.limits import (
    AUDIT_JVM_OPTIONS,
    CHECK_ROWS_PER_TASK,
    LOCAL_SHUFFLE_PARTITIONS_PER_CORE,
    PROGRESS_INTERVAL_S,
    PUSHED_CLUSTER_CORES,
)


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
    driver_options: str = "",
) -> SparkSession:
    """The session the job uses when nobody gave it one. Local masters stay on
    loopback with no UI: the audit is a batch job, not a service. ``driver_options``:
    more options of the driver's JVM when this process starts it (its class archive)."""
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
        settings["spark.driver.extraJavaOptions"] = f"{AUDIT_JVM_OPTIONS} {driver_options}".strip()
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


def cluster_conf(master: str | None, pushed: bool, archive: ClassArchive) -> dict[str, str]:
    """What the audit asks of a standalone cluster (``spark://``): its executors map
    the driver's class archive (on the driver's machine they have its class path; on
    another the path names nothing and is ignored), and, when the store runs the
    statements (``pushed``) and the user chose no cores, ``PUSHED_CLUSTER_CORES``:
    the checks see only the returned rows, and every executor more is a JVM more."""
    if master is None or not master.startswith("spark://"):
        return {}
    conf: dict[str, str] = {}
    if archive.state is ArchiveState.USED:
        conf["spark.executor.extraJavaOptions"] = f"{AUDIT_JVM_OPTIONS} {archive.java_options}"
    if pushed and not _user_sets(CORES_KEYS):
        conf["spark.cores.max"] = str(PUSHED_CLUSTER_CORES)
    return conf


class SessionStarter:
    """A Spark session started in a thread, so that the driver's work in the store
    (``spark.audit.pool``) runs while the JVM, and on a cluster the executors, start.
    ``get`` waits for it; ``stop`` stops it (after waiting for a start in progress).
    The driver's JVM maps the saved class archive, or makes it (``spark.audit.jvm``).
    ``pushed``: the store's statements run meanwhile and Spark gets only their rows,
    so the JVM starts at a lower priority (``JVM_NICE``) until ``raise_priority``,
    and a standalone cluster gives it ``PUSHED_CLUSTER_CORES``."""

    def __init__(
        self, master: str | None, jars: Sequence[str], conf: dict[str, str] | None = None,
        pushed: bool = False,
    ) -> None:
        self._session: SparkSession | None = None
        self._error: BaseException | None = None
        self.seconds = 0.0
        own_jvm = "PYSPARK_GATEWAY_PORT" not in os.environ
        self.archive = plan_archive() if own_jvm else ClassArchive(ArchiveState.NONE)
        #: The nice value to give the JVM back (``raise_priority``); None: not lowered.
        self._nice: int | None = os.getpriority(os.PRIO_PROCESS, 0) if (
            pushed and own_jvm and can_lower_jvm()) else None  # fmt: skip
        conf = {**cluster_conf(master, pushed and own_jvm, self.archive), **(conf or {})}
        self._nice_lock = threading.Lock()

        def start() -> None:
            started = time.monotonic()
            try:
                if self._nice is not None:
                    lower_this_thread()
                self._session = build_session(master, jars, conf, self.archive.java_options)
            except BaseException as exc:  # raised by get()
                self._error = exc
            self.seconds = time.monotonic() - started

        self._thread = threading.Thread(target=start, name="audit-spark-start", daemon=True)
        self._thread.start()

    def get(self) -> SparkSession:
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._session is not None
        return self._session

    def raise_priority(self) -> None:
        """The JVM back to this process's priority: the store's statements are done,
        and the JVM is what the audit waits for now."""
        with self._nice_lock:
            if self._nice is None:
                return
            # The starting thread first (what it starts later inherits it), then what
            # it started: the JVM (and, while it starts, the launcher's).
            if self._thread.native_id is not None:
                raise_back(self._thread.native_id, self._nice, tree=False)
            raise_back(os.getpid(), self._nice, only_children=True)
            self._nice = None

    def stop(self) -> bool:
        """Stop the session; when its JVM makes the class archive, end the JVM and
        save the archive (a new session in this process starts a JVM of its own).
        Whether an archive was saved."""
        self._thread.join()
        if self._session is None:
            return False
        self._session.stop()
        if self.archive.state is not ArchiveState.MAKING:
            return False
        gateway = SparkContext._gateway
        proc = getattr(gateway, "proc", None)
        with contextlib.suppress(Exception):  # py4j's own shutdown: best effort
            gateway.shutdown()  # type: ignore[union-attr]
        SparkContext._gateway = None
        SparkContext._jvm = None
        return finish_archive(self.archive, proc)


#: How a user gives the audit's application its cores on a standalone cluster.
CORES_KEYS = ("spark.cores.max", "--total-executor-cores")


def _user_sets(keys: Sequence[str]) -> bool:
    """Whether the spark-submit arguments pyspark passes (``PYSPARK_SUBMIT_ARGS``) or
    spark-defaults.conf name any of ``keys``: the builder's settings would override
    them (pyspark sets its conf on the JVM's after the JVM starts)."""
    import pyspark

    text = os.environ.get("PYSPARK_SUBMIT_ARGS", "")
    conf_dir = os.environ.get("SPARK_CONF_DIR") or os.path.join(
        os.environ.get("SPARK_HOME") or os.path.dirname(pyspark.__file__), "conf"
    )
    defaults = os.path.join(conf_dir, "spark-defaults.conf")
    with contextlib.suppress(OSError), open(defaults, encoding="utf-8") as f:
        text += "\n" + "\n".join(
            line for line in f.read().splitlines() if not line.lstrip().startswith("#")
        )
    return any(key in text for key in keys)


@contextlib.contextmanager
def session_conf(spark: SparkSession, settings: dict[str, str]) -> Iterator[None]:
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
#: The expressions too are interpreted (``NO_CODEGEN``): without it every projection,
#: predicate and ordering is a class Janino compiles and the JVM loads, in the driver
#: and in each executor. An internal Spark setting (Spark's own tests switch between
#: its modes; every check's interpreted path is Spark's own ``eval``), read per query,
#: so only these queries have it. bench/audit_bench.py at 1,000,000 messages, A/B on
#: one store: the executors' CPU 3.5-3.9 s -> 2.7-2.8 s on a standalone cluster,
#: 1.44-1.53x the SQL bound -> 1.36-1.43x; on local[*] 1.27-1.31x -> 1.21-1.24x.
SMALL_DATA_SETTINGS = {
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.autoBroadcastJoinThreshold": "-1",
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
    "spark.sql.constraintPropagation.enabled": "false",
}


def check_settings(spark: SparkSession, rows: int, small: bool) -> dict[str, str]:
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
