"""Process plumbing the benchmarks share: one server in its own process group with a
log file, and what a process tree costs (CPU, RSS, per thread) read from /proc, since
the venv has no psutil. bench/peers.py and bench/rabbitmq.py build the brokers on it."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any, Protocol

#: ActiveMQ needs ~5-10 s to boot its Spring context; RabbitMQ ~5-15 s.
START_TIMEOUT = 120.0
STOP_TIMEOUT = 30.0

def tree_pids(pid: int) -> list[int]:
    """``pid`` and its descendants, from /proc (no psutil in the venv)."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def tree_rss_bytes(pid: int) -> int:
    """Resident memory of a process tree (a JVM, or beam plus its helpers)."""
    total = 0
    for p in tree_pids(pid):
        with contextlib.suppress(OSError, ValueError, IndexError), \
                open(f"/proc/{p}/statm") as f:
            total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return total


def tree_cpu_seconds(pid: int, reaped: bool = False) -> float:
    """User + system CPU of a running process tree, for 'what did the broker cost';
    ``reaped``: with the children ``pid`` has waited for (PostgreSQL's ended
    autovacuum workers and sessions), which the tree no longer shows."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for p in tree_pids(pid):
        with contextlib.suppress(OSError, ValueError, IndexError):
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
            if reaped and p == pid:
                total += int(fields[13]) + int(fields[14])  # cutime, cstime
    return total / ticks


def thread_cpu_seconds(pid: int) -> dict[int, float]:
    """User + system CPU of each thread of one process, by thread id (the main
    thread's id is ``pid``): which of amqlite's threads (event loop, committer)
    spent a run's CPU."""
    ticks = os.sysconf("SC_CLK_TCK")
    out: dict[int, float] = {}
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                out[int(tid)] = (int(fields[11]) + int(fields[12])) / ticks
    return out


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


class Stoppable(Protocol):
    """What a PeerSet stops when a run ends: a process, or a cluster of them."""

    def stop(self) -> None: ...


class PeerProcess:
    """One server process in its own process group, with a log file."""

    def __init__(self, tmp: Path, name: str) -> None:
        self.tmp = tmp
        self.name = name
        self.log = tmp / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def _spawn(self, cmd: list[str], env: dict[str, str] | None = None,
               cwd: Path | None = None) -> None:
        self.log_offset = self.log.stat().st_size if self.log.exists() else 0
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=env, cwd=cwd,
                                         start_new_session=True)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_port(self, port: int, timeout: float = START_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"{self.name} exited: see {self.log}\n{self.tail()}")
            if port_open(port):
                return
            time.sleep(0.05)
        raise TimeoutError(f"{self.name} did not open port {port}: see {self.log}")

    def wait_log(self, text: bytes, timeout: float = START_TIMEOUT) -> None:
        """Until the log written since the last start contains ``text``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"{self.name} exited: see {self.log}\n{self.tail()}")
            if text in self.log.read_bytes()[self.log_offset:]:
                return
            time.sleep(0.02)
        raise TimeoutError(f"{self.name} never logged {text!r}: see {self.log}")

    def wait_standing_by(self, timeout: float = START_TIMEOUT) -> None:
        """Until this node, started while another holds the lock, waits for it."""
        self.wait_log(self.STANDBY_LOG_LINE, timeout)

    #: What a node logs when it starts waiting for the lock as a slave.
    STANDBY_LOG_LINE = b""

    def tail(self, n: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def kill(self) -> None:
        """SIGKILL the whole process group: what a crash looks like."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def terminate(self) -> None:
        """SIGTERM to the process group, if it still runs: asks for a clean stop."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)

    def wait_stopped(self, timeout: float = STOP_TIMEOUT) -> None:
        """Until the process exits, at most ``timeout`` seconds."""
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after STOP_TIMEOUT; always reaps the group."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.terminate()
            self.wait_stopped()
        self.kill()


def dpkg_version(package: str) -> str:
    try:
        out = subprocess.run(["dpkg-query", "-W", "-f=${Version}", package],
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or "not installed"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


class CpuMeter:
    """What a run cost the machine's other processes: the broker's process trees (one
    per cluster node, summed), its store's (amqlite's PostgreSQL) and, for a
    one-process broker, its CPU by thread. ``start()`` before the run, ``stop()`` after."""

    def __init__(self, broker_pids: tuple[int, ...], store_pid: int | None) -> None:
        self.broker_pids, self.store_pid = broker_pids, store_pid
        self.nodes0: list[float] = []
        self.store0 = 0.0
        self.threads0: dict[int, float] = {}

    def _nodes(self) -> list[float]:
        return [tree_cpu_seconds(p) for p in self.broker_pids]

    def start(self) -> None:
        self.nodes0 = self._nodes()
        self.store0 = tree_cpu_seconds(self.store_pid) if self.store_pid else 0.0
        if len(self.broker_pids) == 1:
            self.threads0 = thread_cpu_seconds(self.broker_pids[0])

    def stop(self) -> dict[str, Any]:
        """``broker_cpu_s``, ``broker_rss_mb``, ``store_cpu_s`` (each when known) and
        the thread or node split, whose per-message form ``per_message`` makes."""
        out: dict[str, Any] = {}
        if self.broker_pids:
            nodes = [b - a for a, b in zip(self.nodes0, self._nodes(), strict=True)]
            out["broker_cpu_s"] = round(sum(nodes), 2)
            out["broker_rss_mb"] = round(
                sum(tree_rss_bytes(p) for p in self.broker_pids) / 2**20, 1)
            if len(nodes) > 1:
                out["_nodes"] = nodes
            else:
                out["_threads"] = thread_cpu_seconds(self.broker_pids[0])
        if self.store_pid:
            out["store_cpu_s"] = round(tree_cpu_seconds(self.store_pid) - self.store0, 2)
        return out

    def per_message(self, spent: dict[str, Any], msgs: int) -> dict[str, Any]:
        """``spent`` (from ``stop()``) with its split made per message:
        ``broker_nodes_us_per_msg`` for a cluster, ``broker_threads_us_per_msg``
        (amqlite's event loop, group committer, rest) for one process."""
        out = {k: v for k, v in spent.items() if not k.startswith("_")}
        if not msgs:
            return out
        if "_nodes" in spent:
            out["broker_nodes_us_per_msg"] = [round(1e6 * v / msgs, 1)
                                              for v in spent["_nodes"]]
        if "_threads" in spent:
            out["broker_threads_us_per_msg"] = split_threads(
                self.broker_pids[0], self.threads0, spent["_threads"], msgs)
        return out


def split_threads(pid: int, before: dict[int, float], after: dict[int, float],
                  msgs: int) -> dict[str, float]:
    """The broker's CPU per message by thread: its main thread (amqlite's event
    loop), its busiest other thread (amqlite's group committer) and the rest."""
    spent = {tid: after[tid] - before.get(tid, 0.0) for tid in after}
    main_s = spent.pop(pid, 0.0)
    others = sorted(spent.values(), reverse=True)
    busiest = others[0] if others else 0.0
    rest = sum(others[1:])
    return {k: round(1e6 * v / msgs, 1)
            for k, v in (("main", main_s), ("busiest_other", busiest), ("rest", rest))}
