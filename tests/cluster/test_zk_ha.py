"""High availability on ZooKeeper + PostgreSQL (issue 4): three real brokers of one group
with `--locker zk://... --store postgresql://...`.

* SIGKILL the master: a slave serves within the session timeout plus one second.
* SIGSTOP the master past its session timeout, then SIGCONT: it demotes and commits
  nothing (no RECEIPT, no row), while the slave that took over serves.
* Stop ZooKeeper for less than the session timeout: the master pauses (no RECEIPT while
  ZooKeeper is away), resumes when it returns, and no second broker ever serves.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from amqlite.node import EXIT_DEMOTED
from amqlite.registry import read_cluster
from tests.client.blackhole import TcpProxy
from tests.helpers.broker_proc import (
    BrokerFactory,
    BrokerProcess,
    ClientPool,
    assert_broker_serves,
    unique,
    wait_one_serving,
)
from tests.helpers.cluster import sql
from tests.helpers.poll import poll
from tests.helpers.servers import ZooKeeperServer

pytestmark = pytest.mark.integration

#: AMQLITE_ZK_SESSION_TIMEOUT for the crash and pause tests (s), as the issue asks.
SESSION_TIMEOUT = 2.0
#: "a slave takes over within the session timeout plus one second".
TAKEOVER_LIMIT = SESSION_TIMEOUT + 1.0
#: Session timeout for the ZooKeeper outage (s): stopping and restarting the ZooKeeper
#: JVM takes a few seconds on a busy two-core machine and must fit inside it (the test
#: server allows up to 20 s).
OUTAGE_SESSION_TIMEOUT = 15.0
#: How long a SEND must stay without RECEIPT while ZooKeeper is away (s).
NO_RECEIPT_WINDOW = 1.0
#: Frames sent to a paused (SIGSTOPped) master, before and after the takeover.
PAUSED_SENDS = 5
#: How often the outage test looks at who serves (s).
WATCH_INTERVAL = 0.02
WAIT = 30.0


def start_group(factory: BrokerFactory, store: str, zk_url: str, session_timeout: float,
                ) -> tuple[str, list[BrokerProcess], BrokerProcess]:
    """Three brokers of a new group; waits for one master and two registered slaves."""
    group = unique("ha")
    env = {"AMQLITE_ZK_SESSION_TIMEOUT": str(session_timeout)}
    brokers = [factory.new(name=n, group=group, env=env,
                           extra_args=["--store", store, "--locker", zk_url]).start()
               for n in ("zk-a", "zk-b", "zk-c")]
    master, took = wait_one_serving(brokers)
    print(f"\nfirst master {master.name} after {took:.3f}s")
    poll(lambda: read_cluster(zk_url, group),
         lambda v: bool(v) and v[0].masters == [master.name] and len(v[0].slaves) == 2,
         timeout=WAIT, what="one master and two slaves registered")
    return group, brokers, master


def epoch_row(store: str, group: str) -> tuple[int, str]:
    rows = sql(store, "SELECT epoch, master FROM amq_groups WHERE grp = %s", group)
    assert len(rows) == 1, rows
    return int(rows[0][0]), str(rows[0][1])


def stored_bodies(store: str, group: str) -> list[str]:
    return [bytes(b).decode() for (b,) in
            sql(store, "SELECT body FROM amq_messages WHERE grp = %s", group)]


@pytest.mark.timeout(180)
def test_sigkill_master_slave_takes_over_within_session_timeout(
        broker_factory: BrokerFactory, clients: ClientPool, pg_url: str,
        zookeeper_server: ZooKeeperServer) -> None:
    zk_url = f"zk://{zookeeper_server.hosts}/{unique('amqha')}"
    group, brokers, master = start_group(broker_factory, pg_url, zk_url, SESSION_TIMEOUT)
    queue = f"/queue/{unique('kill')}"
    clients(master.port).send(queue, "before-crash", {"persistent": "true"})
    epoch_before, _ = epoch_row(pg_url, group)

    start = time.monotonic()
    master.kill()
    new, _ = wait_one_serving([b for b in brokers if b is not master], timeout=WAIT)
    took = time.monotonic() - start
    print(f"takeover after SIGKILL: {took:.3f}s ({master.name} -> {new.name}); "
          f"limit {TAKEOVER_LIMIT}s")
    assert took <= TAKEOVER_LIMIT, f"takeover took {took:.3f}s"
    epoch, holder = epoch_row(pg_url, group)
    assert epoch > epoch_before and holder == new.name
    poll(lambda: read_cluster(zk_url, group),
         lambda v: v[0].masters == [new.name] and master.name not in v[0].slaves,
         timeout=SESSION_TIMEOUT + 2.0, what="registry shows the new master only")
    consumer = clients(new.port)
    consumer.subscribe(queue)
    assert consumer.listener.wait_messages(1)[0].body == "before-crash"


@pytest.fixture
def zk_admin(zookeeper_server: ZooKeeperServer) -> Iterator[KazooClient]:
    with zookeeper_server.admin() as client:
        yield client


def master_rewrite(admin: KazooClient, entry: str, written_before: int) -> list[dict]:
    """The master entry at ``entry`` if it was written after ``written_before`` (an
    mzxid), else nothing."""
    try:
        data, stat = admin.get(entry)
    except NoNodeError:
        return []
    member = json.loads(data)
    return [member] if stat.mzxid != written_before and member["role"] == "master" else []


@pytest.mark.timeout(180)
def test_paused_master_demotes_and_commits_nothing(
        broker_factory: BrokerFactory, clients: ClientPool, pg_url: str,
        zookeeper_server: ZooKeeperServer, zk_admin: KazooClient) -> None:
    zk_url = f"zk://{zookeeper_server.hosts}/{unique('amqha')}"
    group, brokers, old = start_group(broker_factory, pg_url, zk_url, SESSION_TIMEOUT)
    queue = f"/queue/{unique('pause')}"
    client = clients(old.port)
    client.send(queue, "before-pause", {"persistent": "true"})
    epoch_before, _ = epoch_row(pg_url, group)

    def send_unconfirmed(prefix: str) -> list[str]:
        """SENDs asking for RECEIPTs, without waiting: they queue in the paused
        master's socket."""
        receipts = []
        for i in range(PAUSED_SENDS):
            receipt = unique(f"r-{prefix}")
            client.conn.send(queue, f"{prefix}-{i}", headers={"persistent": "true",
                                                             "receipt": receipt})
            receipts.append(receipt)
        return receipts

    # The znode of its master entry, and its last write (mzxid) before the pause.
    entry = f"{urlsplit(zk_url).path}/groups/{group}/members/{old.name}"
    written_before = zk_admin.exists(entry).mzxid
    old.pause()
    paused_at = time.monotonic()
    receipts = send_unconfirmed("paused")
    new, _ = wait_one_serving([b for b in brokers if b is not old], timeout=WAIT)
    print(f"{new.name} took over {time.monotonic() - paused_at:.3f}s after SIGSTOP")
    epoch, holder = epoch_row(pg_url, group)
    assert epoch > epoch_before and holder == new.name
    receipts += send_unconfirmed("late")

    # Resume the deposed master; while it still runs, the registry must never list it
    # as master again, and it must not write a master entry again. The entry it wrote
    # before the pause may outlive the lock for a moment: the registry has a ZooKeeper
    # session of its own, which can expire a tick after the lock's, or not at all when
    # the node resumes in between. Readers list that entry as stale (a superseded
    # epoch) until the node demotes and rewrites it as a slave's; it is no new write.
    old.resume()
    stale_views, rewrites = [], []
    while old.alive:
        views = read_cluster(zk_url, group)
        if views and old.name in views[0].masters:
            stale_views.append(views[0])
        rewrites += master_rewrite(zk_admin, entry, written_before)
    code = old.wait_exit(WAIT)
    assert code == EXIT_DEMOTED, f"deposed master exited {code}\n{old.log_tail()}"
    assert "DEMOTED" in old.log_text()
    assert not stale_views, f"the deposed master was listed as master again: {stale_views}"
    assert not rewrites, f"the deposed master wrote its master entry again: {rewrites}"

    got = client.listener.receipts & set(receipts)
    assert not got, f"the deposed master confirmed {len(got)} SENDs"
    bodies = stored_bodies(pg_url, group)
    leaked = [b for b in bodies if b.startswith(("paused-", "late-"))]
    assert not leaked, f"the deposed master committed {leaked}"
    assert bodies.count("before-pause") == 1
    assert epoch_row(pg_url, group) == (epoch, new.name), "mastership moved again"
    assert_broker_serves(new.port)
    views = read_cluster(zk_url, group)
    assert views[0].masters == [new.name] and old.name not in views[0].slaves


class ServingWatch(threading.Thread):
    """Samples which brokers accept connections until stopped; records every sample in
    which more than one does, or in which one other than ``master`` does."""

    def __init__(self, brokers: list[BrokerProcess], master: BrokerProcess) -> None:
        super().__init__(name="serving-watch", daemon=True)
        self.brokers, self.master = brokers, master
        self.done = threading.Event()
        self.samples = 0
        self.violations: list[list[str]] = []

    def run(self) -> None:
        while not self.done.is_set():
            serving = [b.name for b in self.brokers if b.is_serving()]
            self.samples += 1
            if len(serving) > 1 or any(n != self.master.name for n in serving):
                self.violations.append(serving)
            self.done.wait(WATCH_INTERVAL)

    def finish(self) -> None:
        self.done.set()
        self.join(10)


@pytest.fixture
def zk_gate(private_zookeeper: ZooKeeperServer) -> Iterator[TcpProxy]:
    """The brokers reach ZooKeeper through a proxy cut while it restarts and reopened
    once it serves again. Why: ZooKeeper 3.8.0 (Debian's) listens before its database
    is loaded, and a client connection it closes in that window hits a
    NullPointerException in the close path and is left open unanswered (ZOOKEEPER-5051);
    kazoo then waits the session timeout / hosts for the handshake and the master
    demotes (a CI run; one run of 19 under load). Not what this test is about."""
    with TcpProxy(private_zookeeper.port, "zk") as proxy:
        yield proxy


@pytest.mark.timeout(240)
def test_zookeeper_outage_pauses_the_master_without_a_second_master(
        broker_factory: BrokerFactory, clients: ClientPool, pg_url: str,
        private_zookeeper: ZooKeeperServer, zk_gate: TcpProxy, tmp_path: Path) -> None:
    zk, gate = private_zookeeper, zk_gate
    zk_url = f"zk://127.0.0.1:{gate.port}/amqha"
    group, brokers, master = start_group(broker_factory, pg_url, zk_url,
                                         OUTAGE_SESSION_TIMEOUT)
    queue = f"/queue/{unique('outage')}"
    client = clients(master.port)
    client.send(queue, "before-outage", {"persistent": "true"})
    epoch_before = epoch_row(pg_url, group)
    watch = ServingWatch(brokers, master)
    watch.start()
    try:
        down_at = time.monotonic()
        gate.cut()
        zk.stop()
        master.wait_log(r"suspended; pausing dispatch and writes", WAIT)
        receipt = unique("r-outage")
        client.conn.send(queue, "during-outage", headers={"persistent": "true",
                                                          "receipt": receipt})
        has_receipt: Callable[[], bool] = lambda: receipt in client.listener.receipts  # noqa: E731
        assert client.listener.holds_for(lambda: not has_receipt(), NO_RECEIPT_WINDOW), \
            "a SEND was confirmed while ZooKeeper was away"
        zk.start()
        gate.reopen()
        outage = time.monotonic() - down_at
        print(f"ZooKeeper was away for {outage:.3f}s (session timeout "
              f"{OUTAGE_SESSION_TIMEOUT}s)")
        assert outage < OUTAGE_SESSION_TIMEOUT, "the outage outlasted the session: no test"
        assert client.listener.wait_for(has_receipt, WAIT), \
            f"no RECEIPT after ZooKeeper came back\n{master.log_tail()}"
        master.wait_log(r"lock confirmed again; resuming", WAIT)
    finally:
        watch.finish()
    assert watch.samples > 10
    assert not watch.violations, f"a second broker served: {watch.violations[:5]}"
    assert all(b.alive for b in brokers), [b for b in brokers if not b.alive]
    assert "DEMOTED" not in master.log_text()
    assert epoch_row(pg_url, group) == epoch_before, "mastership moved during the outage"
    bodies = stored_bodies(pg_url, group)
    assert bodies.count("before-outage") == 1 and bodies.count("during-outage") == 1
    client.send(queue, "after-outage", {"persistent": "true"})
    views = read_cluster(zk_url, group)
    assert views[0].masters == [master.name] and len(views[0].slaves) == 2
