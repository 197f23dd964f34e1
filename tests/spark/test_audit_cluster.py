"""Issue 15, "audit tells late and vaguely", with real processes:

* a missing JDBC driver is reported before any JVM starts, naming the Debian package;
* an unreachable store is reported with its host and port;
* the audit runs on a Spark standalone cluster (a master and a worker process from
  pyspark's own distribution, on loopback) with ``--master spark://...``, finds exactly
  what it finds locally, and shows progress while Spark works.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pyspark
import pytest

from spark.audit_job import (
    EXIT_ERROR,
    EXIT_FINDINGS,
    PG_JAR_PACKAGE,
    SQLITE_JAR_PACKAGE,
)
from tests.helpers.poll import poll
from tests.helpers.servers import free_port
from tests.spark.seed import create_store
from tests.spark.test_audit_sqlite import DAMAGE

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]
HOST = "127.0.0.1"
#: pyspark's own launcher for Spark's JVM classes (the pip package has no start-*.sh).
SPARK_CLASS = Path(pyspark.__file__).parent / "bin" / "spark-class"
#: A master or worker JVM starts in a few seconds; this leaves room for busy cores.
DAEMON_START_S = 45.0
#: The whole audit on the cluster: driver JVM, executor JVM, the job. About 40 s on an
#: idle two-core machine; measured at 110 s with a load average of 10, so the bound is
#: generous (as the spark-submit test's): it bounds a hang, not the speed (s).
CLUSTER_AUDIT_S = 240.0
#: spark-defaults.conf for the audit's driver: Spark's 200 shuffle partitions are 200
#: tasks per shuffle for a few hundred rows (build_session sets this only for local[*]).
CLUSTER_DEFAULTS = "spark.sql.shuffle.partitions 4\nspark.ui.enabled false\n"
#: An error found before the JVM: python start-up and the check only (s).
EARLY_ERROR_S = 20.0
#: Cores and memory the worker offers: enough for one executor of Spark's defaults.
WORKER_CORES = "2"
WORKER_MEMORY = "1g"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_"))}
    env.update({
        "SPARK_LOCAL_IP": HOST,  # every JVM binds and advertises loopback only
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_NO_DAEMONIZE": "1",
    })
    return env


def _audit(*args: str, timeout: float, python: str = "",
           conf_dir: Path | None = None) -> subprocess.CompletedProcess[str]:
    argv = ([sys.executable, "-c", python, *args] if python
            else [sys.executable, "-m", "cli", "audit", *args])
    env = _env()
    if conf_dir is not None:
        env["SPARK_CONF_DIR"] = str(conf_dir)
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def test_missing_jdbc_driver_named_before_any_jvm(tmp_path: Path) -> None:
    db = tmp_path / "amqlite.db"
    create_store(f"sqlite:///{db}", int(time.time() * 1000), damaged=False)
    # The job's default jar path pointed at nothing, as on a machine without the package.
    python = ("import sys; import spark.audit_job as a; import spark.audit.source as s; "
              "s.DEFAULT_SQLITE_JAR = '/nonexistent/sqlite-jdbc.jar'; "
              "sys.exit(a.main(sys.argv[1:]))")
    started = time.monotonic()
    result = _audit("--store", f"sqlite:///{db}", timeout=EARLY_ERROR_S * 3, python=python)
    assert result.returncode == EXIT_ERROR, result.stderr
    assert result.stderr.count("\n") == 1, result.stderr  # one line, no JVM chatter
    assert "/nonexistent/sqlite-jdbc.jar is not installed" in result.stderr
    assert f"apt-get install {SQLITE_JAR_PACKAGE}" in result.stderr
    assert time.monotonic() - started < EARLY_ERROR_S
    assert PG_JAR_PACKAGE == "libpostgresql-jdbc-java"  # the name the PostgreSQL case gives


def test_unreachable_store_names_host_and_port() -> None:
    port = free_port()
    result = _audit("--store", f"postgresql://amq:secret@{HOST}:{port}/amqlite",
                    timeout=EARLY_ERROR_S * 3)
    assert result.returncode == EXIT_ERROR, result.stderr
    line = result.stderr.strip()
    assert line.startswith("amqlite audit: error: cannot reach the store"), line
    assert f"at {HOST}:{port}" in line, line
    assert "secret" not in line


def _wait_for_line(log: Path, text: str, proc: subprocess.Popen[bytes], what: str) -> None:
    """Poll the daemon's log for ``text``; fail at the deadline or at once if it exited."""
    poll(lambda: text in log.read_text(errors="replace"), timeout=DAEMON_START_S,
         what=f"{what} ready", interval=0.2, give_up=lambda: proc.poll() is not None,
         context=lambda: log.read_text(errors="replace")[-3000:])


class Cluster(NamedTuple):
    url: str  # spark://host:port of the master
    work_dir: Path  # the worker's: one directory per application that ran an executor


@pytest.fixture(scope="module")
def standalone_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A Spark standalone master and one worker on loopback, shared by the module's
    audits (two JVMs to start: about 10 s each time)."""
    tmp_path = tmp_path_factory.mktemp("spark-cluster")
    (tmp_path / "w").mkdir()
    port, ui, worker_ui = free_port(), free_port(), free_port()
    url = f"spark://{HOST}:{port}"
    env = {**_env(), "SPARK_LOG_DIR": str(tmp_path), "SPARK_WORKER_DIR": str(tmp_path / "w")}
    procs: list[subprocess.Popen[bytes]] = []
    try:
        master_log = tmp_path / "master.log"
        with open(master_log, "wb") as out:
            procs.append(subprocess.Popen(
                [str(SPARK_CLASS), "org.apache.spark.deploy.master.Master",
                 "--host", HOST, "--port", str(port), "--webui-port", str(ui)],
                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True))
        _wait_for_line(master_log, "I have been elected leader", procs[0], "master")
        worker_log = tmp_path / "worker.log"
        with open(worker_log, "wb") as out:
            procs.append(subprocess.Popen(
                [str(SPARK_CLASS), "org.apache.spark.deploy.worker.Worker", url,
                 "--host", HOST, "--cores", WORKER_CORES, "--memory", WORKER_MEMORY,
                 "--webui-port", str(worker_ui), "--work-dir", str(tmp_path / "w")],
                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True))
        _wait_for_line(master_log, "Registering worker", procs[0], "worker registration")
        yield Cluster(url, tmp_path / "w")
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in reversed(procs):
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.mark.timeout(400)
@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_audit_on_a_standalone_cluster(
    standalone_cluster: Cluster, tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    """SQLite: Spark reads every row on the executor. PostgreSQL: the driver runs the
    store's statements while the executor starts and hands Spark what they returned
    (the executor runs no Python of the audit)."""
    master, work_dir = standalone_cluster
    apps_before = set(work_dir.iterdir())
    now = int(time.time() * 1000)
    if backend == "sqlite":
        store = f"sqlite:///{tmp_path / 'amqlite.db'}"
    else:
        store = request.getfixturevalue("postgres_server").create_database()
    create_store(store, now, damaged=True)
    out = tmp_path / "out"
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "spark-defaults.conf").write_text(CLUSTER_DEFAULTS)
    result = _audit("--store", store, "--now", str(now), "--master",
                    master, "--output", str(out), "--json", "--progress",
                    timeout=CLUSTER_AUDIT_S, conf_dir=conf)
    assert result.returncode == EXIT_FINDINGS, result.stderr[-3000:]
    summary = json.loads(result.stdout)
    got: dict[str, dict[str, int]] = {}
    for row in summary["findings"]:
        per = got.setdefault(row["group"], {})
        per[row["finding"]] = per.get(row["finding"], 0) + row["count"]
    assert got == {finding: {finding: d.count} for finding, (_, d) in DAMAGE.items()}
    progress = [line for line in result.stderr.splitlines()
                if line.startswith("amqlite audit: [")]
    assert any(f"starting Spark ({master})" in line for line in progress), progress
    assert any("read " in line and "rows of amq_messages" in line for line in progress)
    if backend == "postgresql":
        assert summary["pushed"]["run_by"] == "driver", summary["pushed"]
        assert any("statements in the store on" in line for line in progress), progress
    assert progress[-1].endswith("done"), progress
    # The executor ran on the worker: this audit's application directory is in its work
    # dir.
    assert set(work_dir.iterdir()) - apps_before, "no executor ran on the worker"
