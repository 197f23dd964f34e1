"""A ZooKeeper ensemble whose leader dies under load (issue 22): no takeover, nothing lost.

Three real ZooKeeper servers (``QuorumPeerMain``, tests/helpers/zk_ensemble.py) and two
amqlite nodes of one group on a PostgreSQL store, locked with
``--locker zk://s1,s2,s3/amqlite``. A producer sends persistent messages with RECEIPTs
while the ZooKeeper leader is SIGKILLed. ZooKeeper elects a new leader among the two
survivors; every client connection of the ensemble is dropped meanwhile (followers stop
serving until they follow someone again), so the master's lock connection is SUSPENDED
and it pauses dispatch and writes. Its session survives the election (the new leader
renews every session), so it reconnects to a survivor within the session timeout and
carries on:

* the same node serves throughout, the other never serves, watched until past the
  moment the master's session would have expired (a takeover would come then); the
  store's epoch and its holder do not change, the master logs no second activation and
  no demotion, the registry lists the same master and slave;
* the master logs SUSPENDED (pausing) and then resuming on the same lock node;
* the producer's connection stays up and it gets RECEIPTs again once the new leader is
  elected; the pause (the longest time without a RECEIPT) is measured and printed, and
  must be shorter than the session timeout;
* every SEND gets its RECEIPT in the end, and the drained queue holds every one of
  them exactly once.
"""

from __future__ import annotations

import collections
import itertools
import re
import threading
import time
from collections.abc import Iterator
from datetime import datetime

import pytest
import stomp
from stomp.utils import Frame

from amqlite.registry import read_cluster
from tests.helpers.broker_proc import (
    BrokerFactory,
    BrokerProcess,
    Client,
    ClientPool,
    LoadProducer,
    unique,
    wait_one_serving,
)
from tests.helpers.cluster import sql
from tests.helpers.poll import poll
from tests.helpers.zk_ensemble import ZooKeeperEnsemble, running_ensemble

pytestmark = pytest.mark.integration

#: The nodes' ZooKeeper session (s): amqlite's default, what the README advises for an
#: ensemble; the election plus a reconnect must fit inside it.
SESSION_TIMEOUT = 4.0
#: RECEIPTs before the leader is killed (the load is going) and after the new leader
#: is elected (the load goes on).
RECEIPTS_BEFORE = 200
RECEIPTS_AFTER = 200
#: Unconfirmed SENDs a producer keeps in flight.
WINDOW = 16
#: How long after the kill the load and the watch go on (s): past the moment the
#: master's session would have expired had it not survived the election (a slave
#: would take over then), with a margin.
OBSERVE_AFTER_KILL = SESSION_TIMEOUT + 1.0
#: How often the watch looks at who serves (s).
WATCH_INTERVAL = 0.05
WAIT = 30.0

MASTER_LINE = r"master of group \S+ \(epoch (\d+)\), serving stomp"
SUSPENDED_LINE = "lock connection suspended; pausing dispatch and writes"
RESUMED_LINE = "lock confirmed again; resuming"


@pytest.fixture
def zk_ensemble() -> Iterator[ZooKeeperEnsemble]:
    """Three ZooKeeper servers of the test's own (one of them gets killed)."""
    with running_ensemble(3) as ensemble:
        yield ensemble


class ReceiptTimes(stomp.ConnectionListener):
    """When each RECEIPT arrived (a second listener next to the client's collector)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.times: list[float] = []

    def on_receipt(self, frame: Frame) -> None:
        with self.lock:
            self.times.append(time.monotonic())

    def snapshot(self) -> list[float]:
        with self.lock:
            return list(self.times)


class ReceiptProducer(LoadProducer):
    """A ``LoadProducer`` that also notes when each RECEIPT arrived."""

    WINDOW = WINDOW

    def __init__(self, client: Client, queue: str, tag: str) -> None:
        super().__init__(client, queue, tag)
        self.timing = ReceiptTimes()
        client.conn.set_listener("receipt-times", self.timing)

    def receipts_after(self, moment: float) -> int:
        return sum(1 for t in self.timing.snapshot() if t > moment)


class ServingWatch(threading.Thread):
    """Samples who accepts STOMP connections until stopped: records every sample in
    which the master does not, or another broker does."""

    def __init__(self, master: BrokerProcess, others: list[BrokerProcess]) -> None:
        super().__init__(name="serving-watch", daemon=True)
        self.master, self.others = master, others
        self.done = threading.Event()
        self.samples: list[float] = []
        self.master_gone: list[float] = []
        self.others_serving: list[tuple[float, str]] = []

    def run(self) -> None:
        while not self.done.is_set():
            now = time.monotonic()
            if not self.master.is_serving():
                self.master_gone.append(now)
            self.others_serving += [(now, b.name) for b in self.others if b.is_serving()]
            self.samples.append(now)
            self.done.wait(WATCH_INTERVAL)

    def last_sample(self) -> float:
        """When the latest look began (0 before the first)."""
        return self.samples[-1] if self.samples else 0.0

    def finish(self) -> None:
        self.done.set()
        self.join(10)


def epoch_row(store: str, group: str) -> tuple[int, str]:
    rows = sql(store, "SELECT epoch, master FROM amq_groups WHERE grp = %s", group)
    assert len(rows) == 1, rows
    return int(rows[0][0]), str(rows[0][1])


def longest_gap(times: list[float], after: float) -> tuple[float, float]:
    """The longest interval between consecutive RECEIPTs that ends after ``after``, and
    when it ended."""
    times = sorted(times)
    best = (0.0, after)
    for prev, nxt in itertools.pairwise(times):
        if nxt > after and nxt - prev > best[0]:
            best = (nxt - prev, nxt)
    return best


def logged_at(text: str, line: str) -> float:
    """When (epoch seconds, from the log's timestamp) ``line`` was first logged."""
    stamp = re.search(r"^(\S+ \S+) .*" + re.escape(line), text, re.MULTILINE)
    assert stamp is not None, f"not logged: {line}"
    return datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()


def connected_ports(text: str) -> set[int]:
    """The ZooKeeper ports a node's kazoo clients (lock and registry) connected to."""
    return {int(p) for p in re.findall(r"kazoo\.client: Connecting to \S+?:(\d+)", text)}


def drain(client: Client, queue: str, expected: int) -> list[str]:
    """Consume until ``expected`` messages came and then nothing more for a second."""
    client.subscribe(queue)
    client.listener.wait_for(lambda: client.listener.count() >= expected, WAIT)
    assert client.listener.wait_quiet(1.0, WAIT), "the queue never went quiet"
    return client.listener.bodies()


@pytest.mark.timeout(180)
def test_zookeeper_leader_killed_under_load_no_takeover_nothing_lost(
        zk_ensemble: ZooKeeperEnsemble, pg_url: str, broker_factory: BrokerFactory,
        clients: ClientPool) -> None:
    began = time.monotonic()
    zk_url = f"zk://{zk_ensemble.hosts}/amqlite"
    group = unique("zkens")
    env = {"AMQLITE_ZK_SESSION_TIMEOUT": str(SESSION_TIMEOUT)}
    nodes = [broker_factory.new(name=n, group=group, env=env,
                                extra_args=["--store", pg_url, "--locker", zk_url]).start()
             for n in ("ens-a", "ens-b")]
    master, _ = wait_one_serving(nodes)
    slave = next(b for b in nodes if b is not master)
    slave.wait_log(r"slave of group \S+, waiting for the lock", WAIT)
    poll(lambda: read_cluster(zk_url, group),
         lambda v: bool(v) and v[0].masters == [master.name] and v[0].slaves == [slave.name],
         timeout=WAIT, what="the registry lists one master and one slave")
    epoch_before = epoch_row(pg_url, group)
    master.wait_log(MASTER_LINE)
    first_line = re.search(MASTER_LINE, master.log_text())
    assert first_line is not None and int(first_line.group(1)) == epoch_before[0]
    assert epoch_before[1] == master.name

    queue = f"/queue/{unique('zkens')}"
    producer = ReceiptProducer(clients(master.port), queue, "p")
    watch = ServingWatch(master, [slave])
    watch.start()
    producer.start()
    try:
        poll(lambda: len(producer.confirmed()), lambda n: n >= RECEIPTS_BEFORE,
             timeout=WAIT, what=f"{RECEIPTS_BEFORE} RECEIPTs before the kill",
             give_up=lambda: not producer.is_alive())

        old_leader = zk_ensemble.leader()
        survivors = [m for m in zk_ensemble.members if m is not old_leader]
        master_log_at_kill = len(master.log_text())
        killed_at = time.monotonic()
        zk_ensemble.kill(old_leader)
        new_leader, election = zk_ensemble.wait_quorum(survivors, timeout=WAIT)
        elected_at = killed_at + election
        print(f"\nZooKeeper server {old_leader.myid} (leader) SIGKILLed; server "
              f"{new_leader.myid} leads after {election:.3f}s")

        poll(lambda: producer.receipts_after(elected_at), lambda n: n >= RECEIPTS_AFTER,
             timeout=WAIT, what=f"{RECEIPTS_AFTER} RECEIPTs after the new leader",
             give_up=lambda: not producer.is_alive(),
             context=lambda: f"{master.log_tail()}\n{zk_ensemble.log_tails()}")
        # The load goes on, watched, until both a RECEIPT and a look at who serves come
        # after the moment a takeover would have happened.
        late = killed_at + OBSERVE_AFTER_KILL
        poll(lambda: producer.receipts_after(late) and watch.last_sample() > late,
             timeout=WAIT, what=f"a RECEIPT and a watch sample {OBSERVE_AFTER_KILL}s after "
             "the kill", give_up=lambda: not producer.is_alive(), context=master.log_tail)
    finally:
        producer.finish()
        watch.finish()

    assert not producer.is_alive(), "the producer did not stop"
    assert producer.error is None, f"the producer failed: {producer.error!r}"
    assert not producer.client.listener.disconnected, "the producer's connection dropped"
    assert not producer.client.listener.errors, producer.client.listener.error_texts()
    # Every SEND in flight when the producer stopped gets its RECEIPT too.
    sent = set(producer.sent)
    poll(producer.confirmed, lambda got: got == sent, timeout=WAIT,
         what="a RECEIPT for every SEND")

    # The master paused (every client of the ensemble is cut off while it elects) and
    # resumed on the same session: SUSPENDED, then the lock confirmed again.
    master.wait_log(re.escape(SUSPENDED_LINE), WAIT, since=master_log_at_kill)
    master.wait_log(re.escape(SUSPENDED_LINE) + "(?s:.*)" + re.escape(RESUMED_LINE), WAIT,
                    since=master_log_at_kill)
    since_kill = master.log_text()[master_log_at_kill:]
    paused_in_log = logged_at(since_kill, RESUMED_LINE) - logged_at(since_kill, SUSPENDED_LINE)
    pause, resumed_at = longest_gap(producer.timing.snapshot(), killed_at)
    own_server = old_leader.client_port in connected_ports(master.log_text()[:master_log_at_kill])
    print(f"master {master.name} was connected to "
          f"{'the killed leader' if own_server else 'a follower'}; paused {paused_in_log:.3f}s "
          f"by its log (SUSPENDED to resuming)")
    print(f"pause without RECEIPTs: {pause:.3f}s, RECEIPTs again {resumed_at - killed_at:.3f}s "
          f"after the kill ({resumed_at - elected_at:+.3f}s from the election seen by srvr)")
    assert pause < SESSION_TIMEOUT, f"no RECEIPT for {pause:.3f}s"

    # No takeover: the same node served throughout, under the same epoch.
    assert watch.samples and watch.samples[0] < killed_at, "the watch began after the kill"
    assert not watch.others_serving, f"another node served: {watch.others_serving[:5]}"
    assert not watch.master_gone, f"the master stopped accepting {len(watch.master_gone)} times"
    assert master.alive and slave.alive, (master, slave)
    assert len(re.findall(MASTER_LINE, master.log_text())) == 1, master.log_tail()
    assert not re.search(MASTER_LINE, slave.log_text()), slave.log_tail()
    assert "acquired zookeeper lock" not in slave.log_text(), slave.log_tail()
    assert "DEMOTED" not in master.log_text(), master.log_tail()
    assert "lock lost" not in master.log_text(), master.log_tail()
    assert epoch_row(pg_url, group) == epoch_before, "mastership moved"
    poll(lambda: read_cluster(zk_url, group),
         lambda v: bool(v) and v[0].masters == [master.name] and v[0].slaves == [slave.name],
         timeout=WAIT, what="the registry still lists the same master and slave")

    # Every receipted message is delivered exactly once.
    bodies = drain(clients(master.port), queue, len(sent))
    twice = [b for b, n in collections.Counter(bodies).items() if n > 1]
    assert not twice, f"{len(twice)} delivered twice: {twice[:20]}"
    assert not set(bodies) - sent, "messages nobody sent"
    lost = sent - set(bodies)
    assert not lost, f"{len(lost)} receipted messages lost: {sorted(lost)[:20]}"
    print(f"{len(sent)} messages sent and receipted, {len(bodies)} delivered once each; "
          f"test body {time.monotonic() - began:.1f}s")
