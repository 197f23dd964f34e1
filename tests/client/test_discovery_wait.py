"""Issue 27: discovery through a registry that is down says what it waits for, and
``produce``/``consume --timeout`` give up with one line and exit 1."""

from __future__ import annotations

import signal
import subprocess
import time

import pytest

from amqlite.client.discovery import discovery_agent, waiting_for
from tests.helpers.broker_proc import REPO_ROOT, amqlite_command, cli_env
from tests.helpers.cluster import amqlite
from tests.helpers.servers import free_port


@pytest.mark.parametrize("url, agent", [
    ("discovery:zk://h:1/amqlite?group=g", "discovery:zk://h:1/amqlite?group=g"),
    ("failover:(discovery:(zk://a:1,b:2/amqlite)?group=o)?maxReconnectAttempts=3",
     "discovery:(zk://a:1,b:2/amqlite)?group=o"),
    ("failover:(tcp://127.0.0.1:61613)", None),
])
def test_discovery_agent_is_found_in_a_client_url(url: str, agent: str | None) -> None:
    assert discovery_agent(url) == agent


def test_waiting_line_names_group_and_registry_without_password() -> None:
    line = waiting_for("discovery:postgresql://amq:secret@db/amqlite?group=orders")
    assert line is not None
    assert "'orders'" in line and "db/amqlite" in line and "secret" not in line
    assert waiting_for("tcp://127.0.0.1:61613") is None


@pytest.mark.parametrize("command", ["produce", "consume"])
def test_dead_zookeeper_discovery_says_so_and_gives_up_after_timeout(command: str) -> None:
    url = f"discovery:zk://127.0.0.1:{free_port()}/amqlite?group=g"
    started = time.monotonic()
    result = amqlite(command, "--broker-url", url, "--count", "1", "--timeout", "2")
    elapsed = time.monotonic() - started
    assert result.returncode == 1, result.stderr
    assert "waiting for a broker of group 'g'" in result.stderr, result.stderr
    errors = [ln for ln in result.stderr.splitlines() if ln.startswith("amqlite: error:")]
    assert len(errors) == 1 and "--timeout 2s" in errors[0], result.stderr
    assert "Traceback" not in result.stderr
    assert elapsed < 8, result.stderr


def test_produce_help_documents_timeout() -> None:
    result = amqlite("produce", "--help")
    assert result.returncode == 0 and "--timeout" in result.stdout


def test_interrupted_consume_exits_130_with_its_summary() -> None:
    """The README's exit-code table: 130 after Ctrl-C (here, while discovery waits)."""
    url = f"discovery:zk://127.0.0.1:{free_port()}/amqlite?group=g"
    proc = subprocess.Popen([*amqlite_command(), "consume", "--broker-url", url],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=cli_env(None), cwd=REPO_ROOT)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()  # the waiting line: it has started waiting
        assert "waiting for a broker" in line, line
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "consumed 0" in out and "Traceback" not in err
