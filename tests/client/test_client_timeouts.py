"""Issue 15, "Client commands that never end": connecting is bounded by what the user
asked for, against real broker processes.

* a broker that hangs on connect (a listener that accepts nothing) costs the next broker of
  a ``failover:`` list the head start, not the 30 s ``connectionTimeout``;
* a refused login through ``failover:`` is final, as through ``tcp://``;
* ``consume --timeout`` bounds connecting and discovery (a dead ZooKeeper, an unknown
  group), without kazoo's log lines;
* ``consume --durable`` without ``--client-id`` fails before connecting.
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from amqlite.client import AsyncClient, ConnectionFailedError
from amqlite.client.failover import ATTEMPT_HEAD_START_S
from amqlite.client.uri import DEFAULT_CONNECTION_TIMEOUT_MS
from tests.helpers.broker_proc import REPO_ROOT, BrokerFactory, amqlite_command, password_hash
from tests.helpers.client import async_test, within
from tests.helpers.servers import free_port

pytestmark = pytest.mark.integration

HOST = "127.0.0.1"
#: The handshake with a real broker on shared, busy cores may take this long (s) on top of
#: the head start; still far below connectionTimeout (30 s), which is what is shown.
HANDSHAKE_ALLOWANCE_S = 8.0
#: A CLI run that must end: python start-up, one ZooKeeper connect attempt (5 s in the
#: registry reader) and the --timeout, with room for busy cores (s).
CLI_DEADLINE_S = 60.0
#: The --timeout given to consume in these tests (s).
CONSUME_TIMEOUT_S = 2.0


@pytest.fixture
def silent_listener() -> Iterator[int]:
    """A port whose kernel completes TCP handshakes but whose owner never accepts nor
    answers: what a broker behind a partition, or a hung one, looks like to a client."""
    sock = socket.socket()
    sock.bind((HOST, 0))
    sock.listen(16)
    try:
        yield sock.getsockname()[1]
    finally:
        sock.close()


def _cli(*args: str, timeout: float = CLI_DEADLINE_S) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*amqlite_command(), *args], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


@async_test
async def test_failover_skips_a_broker_that_hangs_on_connect(
    broker_factory: BrokerFactory, silent_listener: int
) -> None:
    broker = broker_factory.start(name="alive")
    url = (f"failover:(tcp://{HOST}:{silent_listener},tcp://{HOST}:{broker.port})"
           "?randomize=false")
    client = AsyncClient(url)
    started = time.monotonic()
    try:
        await within(client.connect(), timeout=DEFAULT_CONNECTION_TIMEOUT_MS / 1000)
        took = time.monotonic() - started
        assert client.connected_uri is not None and client.connected_uri.port == broker.port
        assert took < ATTEMPT_HEAD_START_S + HANDSHAKE_ALLOWANCE_S, took
    finally:
        await client.disconnect()


@async_test
async def test_refused_login_through_failover_is_final(
    broker_factory: BrokerFactory, tmp_path: Path
) -> None:
    users = tmp_path / "users.toml"
    users.write_text(f'[users]\nalice = "{password_hash("right")}"\n')
    broker = broker_factory.start(name="auth", env={"AMQLITE_USERS_FILE": str(users)})
    # Unlimited startup attempts with a short delay: a retried refusal would never end.
    url = f"failover:(tcp://{HOST}:{broker.port})?initialReconnectDelay=10"
    client = AsyncClient(url, login="alice", passcode="wrong")
    with pytest.raises(ConnectionFailedError, match=r"authentication failed.*final"):
        await within(client.connect(), timeout=HANDSHAKE_ALLOWANCE_S * 2)
    assert client.closed


def test_consume_timeout_bounds_discovery_of_a_dead_zookeeper() -> None:
    dead = free_port()
    started = time.monotonic()
    result = _cli("consume", "--brokerUrl", f"discovery:zk://{HOST}:{dead}/amqlite",
                  "--timeout", str(CONSUME_TIMEOUT_S))
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("amqlite: error: no connection to discovery:zk://"), lines
    assert "within --timeout 2s" in lines[-1]
    assert not any("kazoo" in line.lower() or "Traceback" in line for line in lines), lines
    assert time.monotonic() - started < CLI_DEADLINE_S


def test_consume_timeout_bounds_discovery_of_an_unknown_group(
    broker_factory: BrokerFactory,
) -> None:
    broker = broker_factory.start(name="known")
    store = f"sqlite:///{(broker.data_dir / 'amqlite.db').resolve()}"
    result = _cli("consume", "--brokerUrl", f"discovery:{store}?group=nosuch",
                  "--timeout", str(CONSUME_TIMEOUT_S))
    assert result.returncode == 1, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("amqlite: error: no connection to discovery:sqlite"), last
    assert "found no broker" in last, last


def test_consume_durable_without_client_id_fails_before_connecting(
    silent_listener: int,
) -> None:
    # A connect attempt to the silent listener would hang for connectionTimeout (30 s).
    started = time.monotonic()
    result = _cli("consume", "--brokerUrl", f"tcp://{HOST}:{silent_listener}",
                  "--destination", "topic://news", "--durable", "sub1",
                  timeout=DEFAULT_CONNECTION_TIMEOUT_MS / 1000 - 5)
    assert result.returncode == 2, result.stderr
    assert "--durable needs --client-id" in result.stderr
    assert time.monotonic() - started < DEFAULT_CONNECTION_TIMEOUT_MS / 1000
