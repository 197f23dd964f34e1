"""One "does this pid still run, and is it ours" check (pidfile.pid_runs) behind both
the pid files of ``amqlite start`` and ``amqlite container``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from amqlite.pidfile import pid_runs, process_alive
from cli.containers import broker_runs
from tests.helpers.poll import poll


def test_a_running_process_is_ours_only_when_its_argv_says_so() -> None:
    me = os.getpid()
    assert pid_runs(me, lambda argv: True)
    assert not pid_runs(me, lambda argv: False)
    own_argv0 = Path("/proc/self/cmdline").read_bytes().split(b"\0")[0].decode()
    assert broker_runs(me, own_argv0)
    assert not broker_runs(me, "/nonexistent/config.toml")
    assert not process_alive(me)  # pytest is not `amqlite start`


def test_an_exited_child_is_not_running_even_before_it_is_reaped() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass", "start", "amqlite"])
    try:
        # Not reaped yet: a zombie, which the signal check alone would call alive.
        poll(lambda: pid_runs(child.pid, lambda argv: True), lambda alive: not alive,
             timeout=10, what="the exited child no longer counts as running")
        assert not process_alive(child.pid)
        assert not broker_runs(child.pid, "amqlite")
    finally:
        child.wait()
    assert not pid_runs(child.pid, lambda argv: True)


def test_an_amqlite_start_command_line_is_a_node() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; print('up', flush=True); sys.stdin.read()",
         "start", "--config", "/x/amqlite.toml"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        # Its own argv only once it has exec'd: right after fork it is still a copy of us.
        assert child.stdout is not None and child.stdout.readline() == b"up\n"
        assert process_alive(child.pid)
        assert broker_runs(child.pid, "/x/amqlite.toml")
    finally:
        child.communicate(b"")
