"""The driver JVM's class archive (Java's AppCDS): the classes an audit loads, parsed
and verified once, saved under the user's cache directory and mapped by every later
audit's JVM instead of read from Spark's jars again.

bench/audit_bench.py: a JVM started with it spends about 3 CPU seconds less on
Spark's start, which on a 2-core machine is time PostgreSQL's statements get back.
The archive is made by the first audit that finds none (its JVM writes it when it
exits, ``-XX:ArchiveClassesAtExit``, so that one audit waits for the writing) and
only ever moved into place whole: the JVM crashes on a truncated archive, and says
nothing (``-Xlog:cds*=off``) and goes without on one that does not fit it.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pyspark

#: Set to 0 to start the JVM without the archive (and never make one).
ARCHIVE_ENV = "AMQLITE_AUDIT_JVM_ARCHIVE"
#: How long the audit that makes the archive waits for its JVM to write it and
#: exit (s): about 158 MB, 10-17 s on a loaded 2-core machine (bench/README.md).
ARCHIVE_WRITE_TIMEOUT_S = 120.0
#: Unfinished archives (of an audit that was killed meanwhile) older than this are
#: removed by the next audit that looks (s).
STALE_TMP_S = 3600.0
#: Keeps the JVM quiet about archives: a warning per class it cannot archive while
#: writing, one line when an archive does not fit (it then runs without).
QUIET_CDS = "-Xlog:cds*=off"
#: What the JVM itself prints (a failed archive dump: "Error occurred during
#: initialization of VM") goes to stderr, never into the audit's ``--json`` stdout.
VM_OUTPUT_TO_STDERR = "-XX:+DisplayVMOutputToStderr"


class ArchiveState(enum.Enum):
    NONE = "none"  # not used: switched off, no cache directory, or no java found
    USED = "used"  # a saved archive is mapped
    MAKING = "making"  # none yet: this JVM writes one when it exits


@dataclass
class ClassArchive:
    state: ArchiveState
    path: Path | None = None  # the saved archive (used, or to be moved there)
    tmp: Path | None = None  # where this JVM writes it (MAKING)

    @property
    def java_options(self) -> str:
        if self.state is ArchiveState.USED:
            return f"{QUIET_CDS} {VM_OUTPUT_TO_STDERR} -XX:SharedArchiveFile={self.path}"
        if self.state is ArchiveState.MAKING:
            return f"{QUIET_CDS} {VM_OUTPUT_TO_STDERR} -XX:ArchiveClassesAtExit={self.tmp}"
        return ""


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "amqlite"


def _java() -> Path | None:
    """The java spark-class runs: ``$JAVA_HOME/bin/java``, else the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    found = os.path.join(home, "bin", "java") if home else shutil.which("java")
    return Path(found).resolve() if found and os.path.exists(found) else None


def archive_key(java: Path) -> str:
    """Which JVM and which Spark an archive is for: the java binary (its resolved path
    names the JDK) and its library's size and time (an update of the same JDK), and
    pyspark's version and place (the jars on the class path). Without starting a JVM."""
    libjvm = next(iter(sorted(java.parent.parent.glob("lib/*/libjvm.so"))), java)
    st = libjvm.stat()
    facts = f"{java}|{st.st_size}|{st.st_mtime_ns}|{pyspark.__version__}|{pyspark.__file__}"
    return hashlib.sha256(facts.encode()).hexdigest()[:16]


def _class_path_dirs() -> list[Path]:
    """The directories spark-class puts on the JVM's class path: Spark's conf directory
    (``SPARK_CONF_DIR``, else ``$SPARK_HOME/conf``, else pyspark's), Hadoop's and
    YARN's when set, and the directories of ``SPARK_DIST_CLASSPATH``."""
    home = os.environ.get("SPARK_HOME") or os.path.dirname(pyspark.__file__)
    named = [os.environ.get("SPARK_CONF_DIR") or os.path.join(home, "conf"),
             os.environ.get("HADOOP_CONF_DIR"), os.environ.get("YARN_CONF_DIR"),
             *os.environ.get("SPARK_DIST_CLASSPATH", "").split(os.pathsep)]
    return [Path(d) for d in named if d and not d.endswith("*") and os.path.isdir(d)]


def _archivable() -> bool:
    """Java 17 archives no class path with a non-empty directory on it: dumping fails
    when the JVM exits ("Cannot have non-empty directory in paths") and a saved
    archive would not map. A Spark conf directory with a spark-defaults.conf in it
    (the usual way to configure a cluster) is one, so such setups go without."""
    for d in _class_path_dirs():
        with contextlib.suppress(OSError):
            if any(d.iterdir()):
                return False
    return True


def plan_archive() -> ClassArchive:
    """Use the saved archive, or make one; ``NONE`` when that cannot be (never an error)."""
    if os.environ.get(ARCHIVE_ENV, "1") == "0" or not _archivable():
        return ClassArchive(ArchiveState.NONE)
    try:
        java = _java()
        if java is None:
            return ClassArchive(ArchiveState.NONE)
        cache = _cache_dir()
        key = archive_key(java)
        path = cache / f"audit-jvm-{pyspark.__version__}-{key}.jsa"
        if path.is_file() and path.stat().st_size > 0:
            return ClassArchive(ArchiveState.USED, path)
        cache.mkdir(parents=True, exist_ok=True)
        for old in cache.glob(f"{path.name}.*.tmp"):
            with contextlib.suppress(OSError):
                if time.time() - old.stat().st_mtime > STALE_TMP_S:
                    old.unlink()
        tmp = cache / f"{path.name}.{os.getpid()}.tmp"
        if not os.access(cache, os.W_OK):
            return ClassArchive(ArchiveState.NONE)
        return ClassArchive(ArchiveState.MAKING, path, tmp)
    except (OSError, RuntimeError):  # RuntimeError: Path.home() without a home
        return ClassArchive(ArchiveState.NONE)


def finish_archive(archive: ClassArchive, proc: subprocess.Popen[bytes] | None) -> bool:
    """After the session stopped: end the JVM (its stdin closed, as when Python exits),
    wait for it to write the archive, and move the archive into place if it exited
    cleanly. Whether an archive was saved."""
    if archive.state is not ArchiveState.MAKING or proc is None:
        return False
    assert archive.tmp is not None and archive.path is not None
    try:
        if proc.stdin is not None:
            proc.stdin.close()
        code = proc.wait(timeout=ARCHIVE_WRITE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return False  # still writing: left for STALE_TMP_S, never moved half-written
    try:
        if code == 0 and archive.tmp.is_file() and archive.tmp.stat().st_size > 0:
            os.replace(archive.tmp, archive.path)
            return True
        archive.tmp.unlink(missing_ok=True)
    except OSError:
        pass
    return False


#: How much lower the driver's JVM runs than the store's statements while they run
#: (nice): its start and warm-up only fill time the audit waits anyway, and on a
#: machine of few cores each CPU second it takes is one PostgreSQL waits for.
JVM_NICE = 10
#: Set to how much lower instead (0: not lowered).
NICE_ENV = "AMQLITE_AUDIT_JVM_NICE"


def _nice_step() -> int:
    try:
        return max(0, int(os.environ.get(NICE_ENV, JVM_NICE)))
    except ValueError:
        return JVM_NICE


def _try_renice_back() -> bool:
    """Whether this process may raise a thread's priority back (root, CAP_SYS_NICE or
    RLIMIT_NICE): a probe thread lowers its own by one and raises it again."""
    result: list[bool] = []

    def probe() -> None:
        here = os.getpriority(os.PRIO_PROCESS, 0)
        os.setpriority(os.PRIO_PROCESS, 0, here + 1)  # Linux: this thread only
        try:
            os.setpriority(os.PRIO_PROCESS, 0, here)
            result.append(True)
        except OSError:
            result.append(False)

    t = threading.Thread(target=probe, name="audit-nice-probe")
    t.start()
    t.join()
    return bool(result and result[0])


def can_lower_jvm() -> bool:
    """Lowering the JVM's priority only when it can be raised again once the rows are
    back (otherwise a loaded machine would starve the checks), and only on Linux,
    where a thread's nice value is its own and what it starts inherits it."""
    return _nice_step() > 0 and sys.platform.startswith("linux") and _try_renice_back()


def lower_this_thread() -> None:
    """Called in the thread that starts the JVM: the JVM inherits it."""
    os.setpriority(os.PRIO_PROCESS, 0, os.getpriority(os.PRIO_PROCESS, 0) + _nice_step())


def raise_back(pid: int, to: int, tree: bool = True, only_children: bool = False) -> None:
    """Every thread of ``pid`` (and with ``tree`` of its descendants) back to nice
    ``to``; threads they start after inherit it. ``only_children``: not ``pid``'s own
    threads. Best effort: a thread or process may end meanwhile."""
    if not only_children:
        try:
            tids = [int(t.name) for t in Path(f"/proc/{pid}/task").iterdir()]
        except OSError:
            tids = [pid]
        for tid in tids:
            with contextlib.suppress(OSError):
                if os.getpriority(os.PRIO_PROCESS, tid) > to:
                    os.setpriority(os.PRIO_PROCESS, tid, to)
    if tree:
        for child in _children(pid):
            raise_back(child, to)


def _children(pid: int) -> list[int]:
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError, ValueError):
                found += [int(c) for c in (task / "children").read_text().split()]
    return found
