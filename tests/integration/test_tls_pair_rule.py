"""One rule for half a TLS pair, as a user meets it: ``--ssl-cert`` without ``--ssl-key``
(or the reverse) is one error line and exit status non-zero in every command family
(broker start, management CLI queue/connection/status, STOMP produce/consume), before
any file is read or any connection is tried."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.helpers.cluster import amqlite as run  # no stray AMQLITE_* settings

pytestmark = [pytest.mark.timeout(120)]

#: Neither file exists: reading either would give another error than the pair rule's.
CERT, KEY = "/nonexistent/client.pem", "/nonexistent/client.key"


def assert_pair_error(proc: subprocess.CompletedProcess[str], given: str, missing: str) -> None:
    assert proc.returncode != 0, proc.stdout
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert given in lines[0] and f"without {missing}" in lines[0], lines[0]
    assert "go together" in lines[0] and "Traceback" not in proc.stderr


HALVES = [(["--ssl-cert", CERT], "--ssl-cert", "--ssl-key"),
          (["--ssl-key", KEY], "--ssl-key", "--ssl-cert")]


@pytest.mark.parametrize(("half", "given", "missing"), HALVES)
def test_broker_start(tmp_path: Path, half: list[str], given: str, missing: str) -> None:
    proc = run("start", "--group", "tlspair", "--data-dir", str(tmp_path), "--http", "off",
               *half)
    assert_pair_error(proc, given, missing)
    assert proc.returncode == 2  # a usage error, like every other bad setting


@pytest.mark.parametrize("command", [["queue", "list"], ["connection", "list"], ["status"]])
@pytest.mark.parametrize(("half", "given", "missing"), HALVES)
def test_management_cli(command: list[str], half: list[str], given: str,
                        missing: str) -> None:
    proc = run(*command, "--url", "https://127.0.0.1:9", *half)
    assert_pair_error(proc, given, missing)
    assert proc.returncode == 1


@pytest.mark.parametrize("command", ["produce", "consume"])
@pytest.mark.parametrize(("half", "given", "missing"), HALVES)
def test_stomp_client_commands(command: str, half: list[str], given: str,
                               missing: str) -> None:
    proc = run(command, "--brokerUrl", "ssl://127.0.0.1:9", "--count", "1", *half)
    assert_pair_error(proc, given, missing)
