"""A node serves only while it holds the lock (issue 22), with real `amqlite start` processes.

The late node ("late") acquires the lock first and is held in its activation by the
test-only gate (AMQLITE_TEST_GATE, amqlite.activation): just before its claim's statement,
as a claim stuck in the database would be, or just before its last proof of the lock. The
test then takes the lock away (its PostgreSQL lock session ended, the process paused past
its lease or its ZooKeeper session, its lock file removed), waits until the other node
("other") serves, and opens the gate. The late node must never serve or say master: its
STOMP port stays closed and its registry entry never says master for the whole test (a
watcher thread polls both), its log has no "master of group"; the store refuses its stale
claim (no activation row of it, the epoch stays the other's), the other node is not fenced
and keeps serving; the late node exits 3, or waits as slave again with --rejoin.

Every wait polls a log line, a port or a row with a deadline; nothing sleeps to synchronise.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from amqlite.activation import TEST_GATE_ENV
from amqlite.node import EXIT_DEMOTED
from amqlite.registry import RegistryError, read_members
from tests.helpers.broker_proc import (
    BrokerFactory,
    BrokerProcess,
    open_client,
    send_with_receipt,
    unique,
)
from tests.helpers.cluster import sql
from tests.helpers.pg_ha import PgGroup, wait_log
from tests.helpers.servers import PostgresServer, ZooKeeperServer

pytestmark = pytest.mark.integration

#: Lease of the PostgreSQL pause test (s): the paused node loses the lock after it.
SHORT_LEASE = "1.5"
#: ZooKeeper session timeout of the pause test (s).
ZK_SESSION_TIMEOUT = "2"
#: Deadline of every wait for a node's log line, port or exit.
WAIT = 60.0
#: How often the watcher looks at the late node's port and registry entry (s).
WATCH_INTERVAL = 0.02
#: What a node logs once it serves, and only then (amqlite.node).
MASTER_LINE = "master of group"
#: What the late node logs when the store refuses its claim (amqlite.activation).
REFUSED_LINE = "claim refused"
#: What it logs when it gives up the activation (amqlite.node).
ABORTED_LINE = "lock lost while activating"


class Watcher(threading.Thread):
    """Polls one node's STOMP port and registry entry until stopped; remembers whether
    it ever accepted a connection or was registered as master."""

    def __init__(self, broker: BrokerProcess, registry_url: str, group: str) -> None:
        super().__init__(daemon=True)
        self.broker = broker
        self.registry_url = registry_url
        self.group = group
        self.served = False
        self.announced: list[str] = []
        self.looks = 0
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.wait(WATCH_INTERVAL):
            if self.broker.is_serving():
                self.served = True
            try:
                members = read_members(self.registry_url, self.group)
            except RegistryError:
                continue
            self.looks += 1
            self.announced += [f"{m.role} epoch {m.epoch}" for m in members
                               if m.name == self.broker.name and m.role == "master"]

    def finish(self) -> None:
        """Stop and assert the node never served nor was registered as master."""
        self._done.set()
        self.join(WAIT)
        assert self.looks > 0, "the registry was never read"
        assert not self.served, f"{self.broker.name} opened its STOMP port"
        assert not self.announced, f"{self.broker.name} registered as master: {self.announced}"


@pytest.fixture
def ha(broker_factory: BrokerFactory, postgres_server: PostgresServer,
       pg_url: str) -> Iterator[PgGroup]:
    yield PgGroup(broker_factory, postgres_server, pg_url)


@pytest.fixture
def gate(tmp_path: Path) -> Path:
    """The file whose creation lets the late node's activation go on."""
    return tmp_path / "gate"


def start_node(factory: BrokerFactory, name: str, group: str, args: list[str],
               env: dict[str, str], gate: tuple[str, Path] | None = None,
               data_dir: Path | None = None) -> BrokerProcess:
    """Start a node; with ``gate`` (point, file) wait until its activation waits there."""
    env = {"AMQLITE_LOCK_KEEPALIVE": "0.5", "AMQLITE_LOCK_POLL_INTERVAL": "0.1", **env}
    if gate is not None:
        env[TEST_GATE_ENV] = f"{gate[0]}:{gate[1]}"
    node = factory.new(name=name, group=group, env=env, extra_args=args,
                       data_dir=data_dir).start()
    if gate is not None:
        node.wait_log(f"test gate: activation waits at '{gate[0]}'", WAIT)
    else:
        node.wait_log("waiting for the lock", WAIT)
    return node


def pg_node(ha: PgGroup, name: str, *, rejoin: bool,
            gate: tuple[str, Path] | None = None) -> BrokerProcess:
    args = ["--store", ha.url, "--locker", ha.url, *(["--rejoin"] if rejoin else [])]
    node = start_node(ha.factory, name, ha.group, args, ha.env, gate)
    ha.brokers.append(node)
    return node


def takes_over(other: BrokerProcess) -> None:
    """Wait until ``other`` serves and says so."""
    other.wait_serving(WAIT)
    other.wait_log(MASTER_LINE, WAIT)


def assert_never_master(late: BrokerProcess) -> str:
    log = late.log_text()
    assert MASTER_LINE not in log and "serving stomp" not in log, late.log_tail()
    assert ABORTED_LINE in log, late.log_tail()
    return log


def assert_still_serving(other: BrokerProcess) -> None:
    """The node that took over was not fenced: it confirms a persistent SEND."""
    client = open_client(other.port)
    try:
        send_with_receipt(client.conn, f"/queue/{unique('after')}", "still master",
                          headers={"persistent": "true"})
    finally:
        client.close()
    assert "DEMOTED" not in other.log_text(), other.log_tail()


def wait_exit_demoted(late: BrokerProcess) -> None:
    assert late.wait_exit(WAIT) == EXIT_DEMOTED, late.log_tail()


@pytest.mark.timeout(180)
def test_claim_after_the_lock_was_given_up_is_refused(ha: PgGroup, gate: Path) -> None:
    """The issue's sequence: the late node logs "giving the lock up" (its lock session
    ended), the other node claims the next epoch, then the late node's claim of the epoch
    it read comes: the store refuses it; the late node exits 3 and never says master."""
    late = pg_node(ha, "late", rejoin=False, gate=("claim", gate))
    watcher = Watcher(late, ha.url, ha.group)
    watcher.start()
    other = pg_node(ha, "other", rejoin=True)
    ha.sql(f"SELECT pg_terminate_backend({ha.lock_backend_pid(late)})")
    wait_log(late, "giving the lock up")
    takes_over(other)
    epoch = ha.epoch()
    gate.touch()
    wait_exit_demoted(late)
    log = assert_never_master(late)
    assert REFUSED_LINE in log and f"it is at epoch {epoch}" in log, late.log_tail()
    watcher.finish()
    assert ha.epoch() == epoch
    assert [a[1] for a in ha.activations()] == ["other"]
    assert ha.lock_holders() == [ha.lock_name(other)]
    assert_still_serving(other)


@pytest.mark.timeout(180)
def test_node_paused_before_its_claim_never_serves(ha: PgGroup, gate: Path) -> None:
    """SIGSTOP the late node right before its claim: its lease runs out, the other node
    ends its lock session and takes over. SIGCONT with the gate open: the late claim is
    refused, the late node exits 3 without serving."""
    ha.env["AMQLITE_LOCK_LEASE"] = SHORT_LEASE
    late = pg_node(ha, "late", rejoin=False, gate=("claim", gate))
    watcher = Watcher(late, ha.url, ha.group)
    watcher.start()
    other = pg_node(ha, "other", rejoin=True)
    late.pause()
    try:
        takes_over(other)
        wait_log(other, "ended the lock session")  # the lease, not a crash
        epoch = ha.epoch()
        gate.touch()
    finally:
        late.resume()
    wait_exit_demoted(late)
    assert REFUSED_LINE in assert_never_master(late), late.log_tail()
    watcher.finish()
    assert ha.epoch() == epoch
    assert [a[1] for a in ha.activations()] == ["other"]
    assert_still_serving(other)


@pytest.mark.timeout(180)
def test_lock_lost_before_the_listener_opens_returns_to_slave(ha: PgGroup, gate: Path) -> None:
    """The late node claimed its epoch and waits right before its last proof; its lock
    session ends and the other node claims the next epoch. The late node does not open its
    port, goes back to waiting as slave (--rejoin), and takes over properly later."""
    late = pg_node(ha, "late", rejoin=True, gate=("listen", gate))
    claimed = ha.epoch()
    assert [a[1] for a in ha.activations()] == ["late"]
    watcher = Watcher(late, ha.url, ha.group)
    watcher.start()
    other = pg_node(ha, "other", rejoin=True)
    mark = len(late.log_text())
    ha.sql(f"SELECT pg_terminate_backend({ha.lock_backend_pid(late)})")
    takes_over(other)
    assert ha.epoch() == claimed + 1
    gate.touch()
    late.wait_log(f"{ABORTED_LINE} \\(before listening", WAIT, since=mark)
    late.wait_log("slave of group .* waiting for the lock", WAIT, since=mark)
    assert_never_master(late)
    watcher.finish()
    assert late.alive and not late.is_serving()
    assert_still_serving(other)
    # Back as slave for real: it takes over (the gate is open) when the other node goes.
    other.kill()
    late.wait_serving(WAIT)
    assert ha.epoch() == claimed + 2
    assert [a[1] for a in ha.activations()] == ["late", "other", "late"]


@pytest.mark.timeout(180)
def test_file_lock_replaced_before_the_claim(broker_factory: BrokerFactory, gate: Path) -> None:
    """Embedded SQLite store and file lock: the lock file is removed under the late node
    (what the file locker's keepalive guards against); the other node locks the new file
    and claims. The late claim is refused; the late node exits 3 without serving."""
    shared = broker_factory.data_dir("shared")
    group = unique("file")
    late = start_node(broker_factory, "late", group, [], {}, ("claim", gate), shared)
    db = shared.resolve() / "amqlite.db"
    store_url = f"sqlite:///{db}"
    watcher = Watcher(late, store_url, group)
    watcher.start()
    other = start_node(broker_factory, "other", group, ["--rejoin"], {}, None, shared)
    os.unlink(shared / "amqlite.lock")
    takes_over(other)
    gate.touch()
    wait_exit_demoted(late)
    log = assert_never_master(late)
    assert REFUSED_LINE in log and "removed or replaced" in log, late.log_tail()
    watcher.finish()
    with contextlib.closing(sqlite3.connect(db)) as conn:
        rows = conn.execute("SELECT node FROM amq_activations WHERE grp = ?", (group,))
        assert rows.fetchall() == [("other",)]
    assert_still_serving(other)


@pytest.mark.timeout(180)
def test_zookeeper_session_lost_before_the_claim(
        broker_factory: BrokerFactory, pg_url: str, zookeeper_server: ZooKeeperServer,
        gate: Path) -> None:
    """ZooKeeper locker: the late node is paused past its session timeout right before
    its claim; its lock node goes, the other node takes the lock and claims. The late
    claim is refused; the late node exits 3 without serving."""
    zk_url = f"zk://{zookeeper_server.hosts}/{unique('amqact')}"
    group = unique("zk")
    args = ["--store", pg_url, "--locker", zk_url]
    env = {"AMQLITE_ZK_SESSION_TIMEOUT": ZK_SESSION_TIMEOUT}
    late = start_node(broker_factory, "late", group, args, env, ("claim", gate))
    watcher = Watcher(late, zk_url, group)
    watcher.start()
    other = start_node(broker_factory, "other", group, [*args, "--rejoin"], env)
    late.pause()
    try:
        takes_over(other)
        gate.touch()
    finally:
        late.resume()
    wait_exit_demoted(late)
    assert REFUSED_LINE in assert_never_master(late), late.log_tail()
    watcher.finish()
    assert sql(pg_url, "SELECT node FROM amq_activations WHERE grp = %s", group) == [
        ("other",)]
    assert_still_serving(other)
