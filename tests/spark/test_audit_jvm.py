"""The audit's driver JVM: its class archive (made once under the user's cache
directory, moved into place only whole, used silently or not at all) and its
lower priority while the store's statements run. With the real ``java`` and real
child processes; a few seconds in all."""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

import pyspark
import pytest

from spark.audit import jvm
from spark.audit.jvm import ArchiveState, finish_archive, plan_archive
from spark.audit.session import cluster_conf

pytestmark = pytest.mark.spark

#: A JVM that writes an archive of what ``-version`` loads: a second or two.
JAVA_S = 60.0


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv(jvm.ARCHIVE_ENV, raising=False)
    return tmp_path / "amqlite"


def _java(*options: str) -> subprocess.Popen[bytes]:
    """A JVM that, like the gateway's, exits when its stdin closes (it reads to EOF)."""
    return subprocess.Popen(
        ["java", *options, "-version"], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip


def test_first_audit_makes_the_archive_and_later_ones_use_it(cache: Path) -> None:
    archive = plan_archive()
    assert archive.state is ArchiveState.MAKING
    assert archive.tmp is not None and archive.path is not None
    assert archive.tmp.parent == cache and not archive.path.exists()
    proc = _java(*archive.java_options.split())
    assert finish_archive(archive, proc)
    assert archive.path.stat().st_size > 0 and not archive.tmp.exists()

    later = plan_archive()
    assert later.state is ArchiveState.USED and later.path == archive.path
    # -Xshare:on fails rather than run without: the archive maps.
    check = subprocess.run(
        ["java", "-Xshare:on", *later.java_options.split(), "-version"],
        capture_output=True, text=True, timeout=JAVA_S,
    )  # fmt: skip
    assert check.returncode == 0, check.stderr
    assert "warning" not in check.stderr.lower()


def test_a_jvm_that_fails_leaves_no_archive(cache: Path) -> None:
    archive = plan_archive()
    assert archive.tmp is not None and archive.path is not None
    proc = subprocess.Popen(
        ["sh", "-c", f"echo partial > {archive.tmp}; exit 3"], stdin=subprocess.PIPE
    )
    assert not finish_archive(archive, proc)
    assert not archive.path.exists() and not archive.tmp.exists()
    assert plan_archive().state is ArchiveState.MAKING  # the next audit tries again


def test_an_archive_that_does_not_fit_is_ignored_without_a_word(cache: Path) -> None:
    archive = plan_archive()
    assert archive.path is not None
    cache.mkdir(parents=True, exist_ok=True)
    # An archive of another class path (as after an upgrade under the same key).
    made = subprocess.run(
        ["java", "-Xlog:cds*=off", f"-XX:ArchiveClassesAtExit={archive.path}",
         "-cp", str(cache), "-version"],
        capture_output=True, text=True, timeout=JAVA_S,
    )  # fmt: skip
    assert made.returncode == 0 and archive.path.exists(), made.stderr
    used = plan_archive()
    assert used.state is ArchiveState.USED
    run = subprocess.run(
        ["java", *used.java_options.split(), "-cp", "/nonexistent", "-version"],
        capture_output=True, text=True, timeout=JAVA_S,
    )  # fmt: skip
    assert run.returncode == 0
    assert "cds" not in run.stderr and "warning" not in run.stderr.lower(), run.stderr


def test_switched_off_or_without_a_cache_directory_there_is_none(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(jvm.ARCHIVE_ENV, "0")
    assert plan_archive().state is ArchiveState.NONE
    assert plan_archive().java_options == ""
    monkeypatch.delenv(jvm.ARCHIVE_ENV)
    blocker = cache.parent / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    assert plan_archive().state is ArchiveState.NONE


def test_the_jvm_starts_lower_and_is_raised_back() -> None:
    if not jvm.can_lower_jvm():
        pytest.skip("this process may not raise a priority back (no CAP_SYS_NICE)")
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    started: list[subprocess.Popen[bytes]] = []

    def start() -> None:  # as SessionStarter's thread starts spark-submit
        jvm.lower_this_thread()
        started.append(subprocess.Popen(["sleep", "30"]))

    t = threading.Thread(target=start)
    t.start()
    t.join()
    child = started[0]
    try:
        assert os.getpriority(os.PRIO_PROCESS, child.pid) == mine + jvm.JVM_NICE
        assert os.getpriority(os.PRIO_PROCESS, 0) == mine  # this thread was not lowered
        jvm.raise_back(os.getpid(), mine, only_children=True)
        assert os.getpriority(os.PRIO_PROCESS, child.pid) == mine
    finally:
        child.kill()
        child.wait()


def test_a_standalone_cluster_gives_one_core_and_its_executors_the_archive(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PYSPARK_SUBMIT_ARGS", raising=False)
    monkeypatch.setenv("SPARK_CONF_DIR", str(cache.parent))  # no spark-defaults.conf
    used = jvm.ClassArchive(ArchiveState.USED, cache / "a.jsa")
    conf = cluster_conf("spark://127.0.0.1:7077", True, used)
    assert conf["spark.cores.max"] == "1"
    assert f"-XX:SharedArchiveFile={cache / 'a.jsa'}" in conf["spark.executor.extraJavaOptions"]
    assert "-XX:+UseSerialGC" in conf["spark.executor.extraJavaOptions"]
    # Spark reads every row itself (no pushed statements): all the cluster gives.
    none = jvm.ClassArchive(ArchiveState.NONE)
    assert cluster_conf("spark://127.0.0.1:7077", False, none) == {}
    assert cluster_conf("local[*]", True, used) == {}  # local: executors are the driver
    # The user's choice wins (pyspark would set the builder's over spark-submit's).
    monkeypatch.setenv("PYSPARK_SUBMIT_ARGS", "--total-executor-cores 2 pyspark-shell")
    assert "spark.cores.max" not in cluster_conf("spark://127.0.0.1:7077", True, none)
    monkeypatch.delenv("PYSPARK_SUBMIT_ARGS")
    (cache.parent / "spark-defaults.conf").write_text("spark.cores.max 4\n")
    assert "spark.cores.max" not in cluster_conf("spark://127.0.0.1:7077", True, none)


def test_a_class_path_with_a_non_empty_directory_gets_no_archive(
        cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Java 17 cannot archive such a class path; the JVM that tried printed its error
    on the audit's stdout, before its ``--json`` summary (seen with a conf directory
    holding spark-defaults.conf, as tests/spark/test_audit_cluster.py sets up)."""
    conf = tmp_path / "conf"
    conf.mkdir()
    monkeypatch.setenv("SPARK_CONF_DIR", str(conf))
    assert plan_archive().state is ArchiveState.MAKING  # empty: nothing to refuse
    (conf / "spark-defaults.conf").write_text("spark.cores.max 1\n")
    assert plan_archive().state is ArchiveState.NONE
    monkeypatch.delenv("SPARK_CONF_DIR")
    monkeypatch.setenv("SPARK_DIST_CLASSPATH", f"/nowhere/*{os.pathsep}{conf}")
    assert plan_archive().state is ArchiveState.NONE


def test_what_the_jvm_says_of_a_failed_dump_goes_to_stderr(cache: Path,
                                                           tmp_path: Path) -> None:
    """Were an archive tried on such a class path anyway, the JVM's complaint stays
    out of stdout (where the audit's JSON goes)."""
    archive = plan_archive()
    assert archive.state is ArchiveState.MAKING
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("x")
    jars = Path(str(pyspark.__file__)).parent / "jars"
    run = subprocess.run(
        ["java", *archive.java_options.split(), "-cp", f"{full}/{os.pathsep}{jars}/*",
         "org.apache.spark.deploy.SparkSubmit", "--version"],  # loads Spark, exits
        capture_output=True, text=True, timeout=JAVA_S,
    )  # fmt: skip
    assert "non-empty directory" in run.stderr
    assert "non-empty directory" not in run.stdout and "Error" not in run.stdout
