"""Pid files of foreground nodes, so ``amqlite stop`` and ``amqlite status`` find a node
started with ``amqlite start`` without a management API or registry (as ``activemq
stop|status`` find theirs through ``data/activemq.pid``).

Nodes of one group on one host may share a data directory (the embedded store's HA),
so there is one file per node: ``<data_dir>/amqlite-<name>.pid``, a line of JSON.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

PREFIX = "amqlite-"
SUFFIX = ".pid"
#: Characters kept from a node name in the file name; others become "_".
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


@dataclass
class PidInfo:
    pid: int
    name: str
    group: str
    stomp: str
    http: str | None = None
    #: The node's users file (absolute), so ``amqlite user`` knows whom to tell of a change.
    users_file: str | None = None
    path: str = ""

    @property
    def alive(self) -> bool:
        return process_alive(self.pid)


def pid_path(data_dir: str | Path, name: str) -> Path:
    return Path(data_dir) / f"{PREFIX}{_UNSAFE.sub('_', name)}{SUFFIX}"


def write(info: PidInfo, data_dir: str | Path) -> Path:
    """Write (or rewrite, e.g. once the HTTP URL is known) this node's pid file."""
    path = pid_path(data_dir, info.name)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    data = {k: v for k, v in asdict(info).items() if k != "path"}
    tmp.write_text(json.dumps(data) + "\n")
    os.replace(tmp, path)
    return path


def remove(data_dir: str | Path, name: str) -> None:
    """Remove this process's pid file (not one a later node of that name wrote)."""
    path = pid_path(data_dir, name)
    info = _read(path)
    if info is not None and info.pid == os.getpid():
        with contextlib.suppress(OSError):
            path.unlink()


def _read(path: Path) -> PidInfo | None:
    try:
        data = json.loads(path.read_text())
        return PidInfo(pid=int(data["pid"]), name=str(data["name"]), group=str(data["group"]),
                       stomp=str(data.get("stomp", "")), http=data.get("http"),
                       users_file=data.get("users_file"), path=str(path))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def read_all(data_dir: str | Path) -> list[PidInfo]:
    """Every readable pid file in ``data_dir``, by name."""
    try:
        paths = sorted(Path(data_dir).glob(f"{PREFIX}*{SUFFIX}"))
    except OSError:
        return []
    return [i for i in map(_read, paths) if i is not None]


def pid_runs(pid: int, is_ours: Callable[[list[str]], bool]) -> bool:
    """True if ``pid`` runs (a zombie, dead but not reaped by a parent that started it,
    does not) and ``is_ours(its argv)`` says it is the program we look for, so a pid
    reused by another program is not taken for it. The one liveness check of pid files
    (``amqlite stop|status``) and containers (``amqlite container``)."""
    if Path("/proc/self").exists():
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            return False
        state = stat.rsplit(")", 1)[-1].split()[0]
        return state not in ("Z", "X") and is_ours(cmdline.split("\0"))
    try:  # no procfs (macOS): the signal check is all we have
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: cannot tell, do not claim it is gone
    return True


def _is_node(argv: list[str]) -> bool:
    """``amqlite start ...`` or ``python -m cli start ...``."""
    return "start" in argv and (any("amqlite" in a for a in argv) or "cli" in argv)


def process_alive(pid: int) -> bool:
    """True when ``pid`` runs and is an amqlite node (a reused pid is not ours)."""
    return pid_runs(pid, _is_node)


#: How often ``stop_process`` looks whether the process is gone (s).
STOP_POLL = 0.05


def stop_process(pid: int, running: Callable[[], bool], timeout: float, *,
                 kill: bool = False) -> bool:
    """SIGTERM ``pid`` (SIGCONT first: a paused process cannot handle SIGTERM), or
    SIGKILL with ``kill``; then wait up to ``timeout`` s for ``running()`` (the caller's
    check that it is still the process meant) to turn false. True when it did. The one
    stop of ``amqlite stop`` and ``amqlite container stop``."""
    with contextlib.suppress(ProcessLookupError):
        if kill:
            os.kill(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while running():
        if time.monotonic() >= deadline:
            return False
        time.sleep(STOP_POLL)
    return True
