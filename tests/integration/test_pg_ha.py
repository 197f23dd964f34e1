"""PostgreSQL HA, end to end (issue 3): three `amqlite start` processes of one group share a
PostgreSQL store and elect their master with an advisory lock, while stomp.py producers send
persistent messages with receipts. We SIGKILL, SIGTERM, SIGSTOP the master, terminate its
lock session and restart PostgreSQL. After each: exactly one master (ports and pg_locks),
every receipted message stored once and delivered once, and nothing in the store written
from a stale epoch. A deposed master must commit nothing."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator

import pytest

from tests.helpers.broker_proc import (
    BrokerFactory,
    BrokerProcess,
    Client,
    open_client,
    send_many,
    unique,
)
from tests.helpers.pg_ha import (
    PgGroup,
    Producer,
    assert_delivered_once,
    drain_queue,
    new_since,
    resend_receipted,
    wait_log,
)
from tests.helpers.servers import PostgresServer

pytestmark = pytest.mark.integration

#: A slave waits inside pg_advisory_lock, so it is granted the lock the moment the master's
#: session ends; activation is a few queries. A crash takeover beyond this is a regression.
CRASH_TAKEOVER_LIMIT = 10.0
#: SIGTERM releases the lock at once: a hand-over is one activation, well under this.
GRACEFUL_TAKEOVER_LIMIT = 5.0
#: Messages each producer must get receipted on a new master before the next failure.
PROGRESS = 20


@pytest.fixture
def ha(broker_factory: BrokerFactory, postgres_server: PostgresServer,
       pg_url: str) -> Iterator[PgGroup]:
    """A 3-node group on this test's own database; PostgreSQL is up again afterwards."""
    group = PgGroup(broker_factory, postgres_server, pg_url)
    try:
        yield group
    finally:
        try:
            postgres_server.psql("SELECT 1")
        except subprocess.CalledProcessError:
            postgres_server.start()


def start_producers(ha: PgGroup, queue: str, count: int = 2) -> list[Producer]:
    producers = [Producer(lambda: [b.port for b in ha.brokers], queue) for _ in range(count)]
    for p in producers:
        p.start()
    for p in producers:
        p.wait_receipts(PROGRESS)
    return producers


def progress(producers: list[Producer]) -> None:
    """Each producer gets more receipts: the current master really commits."""
    for p in producers:
        p.wait_receipts(p.receipt_count() + PROGRESS)


def finish_and_verify(ha: PgGroup, producers: list[Producer], queue: str) -> None:
    """Stop the producers (all they sent receipted), then check exactly one master, the
    store (once each, no stale-epoch write) and a full drain (delivered once each)."""
    keys: set[str] = set()
    for p in producers:
        keys |= p.finish()
    master, _ = ha.wait_one_master()
    ha.assert_store_consistent(keys, master)
    frames = drain_queue(master.port, queue, len(keys))
    assert_delivered_once(frames, keys)
    left = ha.scalar(f"SELECT count(*) FROM amq_messages WHERE grp = '{ha.group}'")
    assert left == "0", f"{left} message rows left after every delivery was acked"
    print(f"\n{len(keys)} messages receipted, {sum(p.resent for p in producers)} re-sent "
          f"after failovers, {sum(p.connects for p in producers)} producer connections")


def send_stale(client: Client, queue: str) -> None:
    """20 persistent SENDs with receipts (producer 'stale') from a client of a paused
    master: they wait in its socket buffer for it to wake."""
    for i in range(20):
        client.conn.send(queue, f"stale-{i}", headers={
            "receipt": f"r-stale-{i}", "persistent": "true",
            "amqlite.producerId": "stale", "amqlite.producerSeq": str(i)})


def assert_deposed_silent(ha: PgGroup, old: BrokerProcess, new: BrokerProcess,
                          new_epoch: int, stale_client: Client, who: str) -> BrokerProcess:
    """After SIGCONT of ``old`` (deposed by ``new`` at ``new_epoch``): it disconnected
    ``stale_client``, sent no RECEIPT for send_stale's frames and stored none of them;
    ``new`` is still the one master at its epoch. Returns the master."""
    listener = stale_client.listener
    assert listener.wait_for(lambda: listener.disconnected, 15), \
        "the deposed master did not disconnect its client"
    got = sorted(r for r in listener.receipts if r.startswith("r-stale-"))
    assert not got, f"the {who} master sent RECEIPTs after losing the lock: {got}"
    master, _ = ha.wait_one_master()
    assert master is new and old.alive and ha.epoch() == new_epoch
    stored = ha.scalar(f"SELECT count(*) FROM amq_messages WHERE grp = '{ha.group}'"
                       " AND producer_id = 'stale'")
    assert stored == "0", f"the {who} master committed {stored} messages"
    return master


def restart_as_slave(ha: PgGroup, broker: BrokerProcess) -> None:
    """Start a stopped node again and wait until it waits for the lock."""
    mark = len(broker.log_text())
    broker.start()
    wait_log(broker, "waiting for the lock", mark)


@pytest.mark.timeout(240)
def test_sigkill_master_five_times(ha: PgGroup) -> None:
    """SIGKILL the master 5 times under continuous producers: each time exactly one other
    node takes over within CRASH_TAKEOVER_LIMIT, the killed one comes back as slave, and
    at the end every receipted message is stored once and delivered once."""
    master = ha.start()
    queue = f"/queue/{unique('kill')}"
    producers = start_producers(ha, queue)
    takeovers: list[float] = []
    for _ in range(5):
        epoch = ha.epoch()
        killed_at = time.monotonic()
        master.kill()
        new, _ = ha.wait_one_master()
        takeovers.append(ha.first_seen - killed_at)
        assert new is not master
        assert ha.epoch() > epoch, "the new master did not bump the epoch"
        resend_receipted(new.port, queue, producers)
        progress(producers)
        restart_as_slave(ha, master)
        master = new
    print("\ntakeover after SIGKILL (s): " + ", ".join(f"{t:.3f}" for t in takeovers))
    assert max(takeovers) < CRASH_TAKEOVER_LIMIT, takeovers
    finish_and_verify(ha, producers, queue)
    assert len(ha.activations()) == 6


@pytest.mark.timeout(120)
def test_sigterm_master_hands_over(ha: PgGroup) -> None:
    """A graceful stop exits 0, releases the lock at once (fast takeover), records the end of
    its activation, and loses nothing."""
    master = ha.start()
    queue = f"/queue/{unique('term')}"
    producers = start_producers(ha, queue)
    old_epoch = ha.epoch()
    master.send_signal(signal.SIGTERM)
    new, took = ha.wait_one_master()
    print(f"\ntakeover after SIGTERM: {took:.3f}s")
    code = master.wait_exit(15)
    assert code == 0, f"graceful stop exited {code}"
    assert took < GRACEFUL_TAKEOVER_LIMIT, f"graceful hand-over took {took:.3f}s"
    assert new is not master
    ended = {a[0]: a[3] for a in ha.activations()}
    assert ended[old_epoch], "graceful stop did not record the end of its activation"
    progress(producers)
    restart_as_slave(ha, master)
    finish_and_verify(ha, producers, queue)


@pytest.mark.timeout(120)
def test_lock_session_terminated(ha: PgGroup) -> None:
    """pg_terminate_backend on the master's lock session: the master demotes (DEMOTED, and
    rejoins as slave), exactly one master follows at a higher epoch, and no write of the
    old epoch lands after it."""
    master = ha.start()
    queue = f"/queue/{unique('term-be')}"
    producers = start_producers(ha, queue)
    old_epoch = ha.epoch()
    mark = len(master.log_text())
    pid = ha.lock_backend_pid(master)
    terminated_at = time.monotonic()
    assert ha.scalar(f"SELECT pg_terminate_backend({pid})") == "t"
    wait_log(master, "DEMOTED", mark, timeout=10)
    wait_log(master, "waiting for the lock", mark, timeout=10)
    assert master.alive, "a --rejoin node exited after demotion"
    new, _ = ha.wait_one_master()
    print(f"\nmaster after pg_terminate_backend: {new.name} (the old one was {master.name}), "
          f"serving alone {ha.first_seen - terminated_at:.3f}s after the termination")
    assert ha.epoch() > old_epoch
    progress(producers)
    finish_and_verify(ha, producers, queue)


@pytest.mark.timeout(120)
def test_paused_master_keeps_lock_and_resumes(ha: PgGroup) -> None:
    """With the PostgreSQL locker a master SIGSTOPped for less than its lease keeps its lock
    session (its kernel still answers TCP), so nobody takes over and there is no split brain;
    on SIGCONT it carries on at the same epoch, and the producers' re-sends are deduplicated.
    (A pause past the lease: tests/integration/test_pg_lease.py.)"""
    ha.env["AMQLITE_LOCK_LEASE"] = "15"  # well past the 4 s pause and the renewal after it
    master = ha.start()
    queue = f"/queue/{unique('pause')}"
    producers = start_producers(ha, queue)
    epoch = ha.epoch()
    mark = len(master.log_text())
    master.pause()
    try:
        others = [b for b in ha.brokers if b is not master]
        end = time.monotonic() + 4.0  # 8 keepalive periods, far beyond a slave's reaction
        while time.monotonic() < end:
            assert not ha.serving(others), "a slave took over from a paused master"
            assert ha.lock_holders() == [ha.lock_name(master)]
            time.sleep(0.1)
    finally:
        master.resume()
    new, _ = ha.wait_one_master()
    assert new is master and ha.epoch() == epoch
    progress(producers)
    assert "DEMOTED" not in new_since(master, mark)
    finish_and_verify(ha, producers, queue)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("mode", ["busy", "late-news"])
def test_paused_master_deposed_commits_nothing(ha: PgGroup, mode: str) -> None:
    """Real split brain: pause the master, terminate its lock session so a slave takes over
    and bumps the epoch, send to the new master, then SIGCONT the old one. It must demote and
    commit nothing: messages queued on its sockets get no RECEIPT and are not stored, its
    client is disconnected, and the activations show the epochs in order.

    busy: producers run through it all (they stall on the paused master, fail over and
    re-send with the same identity); the pause may catch the master inside a store
    transaction. late-news: a 30 s keepalive, so the old master learns of the lost lock too
    late, and it is paused while idle: only the fence can stop its writes."""
    late = mode == "late-news"
    if late:
        ha.keepalive = "30"
        ha.env["AMQLITE_HOUSEKEEPING_INTERVAL"] = "3600"  # no fenced housekeeping mid-pause
        # No lease either: its keeper would notice the pause on waking and hold the writes
        # back before the fence is ever tried (tests/integration/test_pg_lease.py).
        ha.env["AMQLITE_LOCK_LEASE"] = "0"
    old = ha.start()
    queue = f"/queue/{unique('split')}"
    producers = start_producers(ha, queue)
    stale_client = open_client(old.port)
    stale_queue = f"/queue/{unique('stale')}"
    send_many(stale_client, stale_queue, ["before-pause"])
    if late:
        for p in producers:
            p.finish()  # the old master's committer goes idle
    old_epoch = ha.epoch()
    pid = ha.lock_backend_pid(old)
    mark = len(old.log_text())
    old.pause()
    try:
        terminated_at = time.monotonic()
        assert ha.scalar(f"SELECT pg_terminate_backend({pid})") == "t"
        others = [b for b in ha.brokers if b is not old]
        # A paused node's kernel still accepts TCP on its port: judge the others only.
        new, _ = ha.wait_one_master(brokers=others, timeout=90)
        print(f"\n{mode}: takeover from a paused master whose lock session ended: "
              f"{ha.first_seen - terminated_at:.3f}s")
        new_epoch = ha.epoch()
        assert new_epoch > old_epoch
        if late:
            producers += start_producers(ha, queue)
        else:
            progress(producers)
        send_stale(stale_client, stale_queue)
    finally:
        old.resume()
    wait_log(old, "DEMOTED", mark, timeout=15)
    if late:
        assert "is no longer at epoch" in new_since(old, mark), "demoted, but not by the fence"
    master = assert_deposed_silent(ha, old, new, new_epoch, stale_client, "deposed")
    before = ha.scalar(f"SELECT count(*) FROM amq_messages WHERE grp = '{ha.group}'"
                       " AND body = convert_to('before-pause', 'UTF8')")
    assert before == "1", "the message receipted before the pause is gone"
    acts = ha.activations()
    assert [a[0] for a in acts][-2:] == [old_epoch, new_epoch] and acts[-1][1] == new.name, acts
    progress(producers[-2:])
    # finish_and_verify counts only the producers' messages: take the stale queue away.
    drained = drain_queue(master.port, stale_queue, 1)
    assert [f.body for f in drained] == ["before-pause"]
    finish_and_verify(ha, producers, queue)


@pytest.mark.timeout(180)
def test_postgres_restart(ha: PgGroup) -> None:
    """Restart PostgreSQL under load: the master demotes (or pauses), its clients are
    disconnected rather than left waiting for receipts that cannot come, and once the
    database is back a master serves again by itself with nothing lost or doubled."""
    master = ha.start()
    queue = f"/queue/{unique('pgrestart')}"
    producers = start_producers(ha, queue)
    watcher = open_client(master.port)
    marks = {b.name: len(b.log_text()) for b in ha.brokers}
    start = time.monotonic()
    ha.server.restart()
    restarted = time.monotonic() - start
    listener = watcher.listener
    assert listener.wait_for(lambda: listener.disconnected, 20), \
        "the master kept its clients connected through a store outage"
    log = new_since(master, marks[master.name])
    assert "DEMOTED" in log or "pausing" in log, f"no demotion or pause:\n{master.log_tail(40)}"
    new, _ = ha.wait_one_master(timeout=60)
    print(f"\nPostgreSQL restart took {restarted:.2f}s; a master ({new.name}, was "
          f"{master.name}) served alone {ha.first_seen - start - restarted:.2f}s after it")
    assert all(b.alive for b in ha.brokers), "a --rejoin node exited after the outage"
    resend_receipted(new.port, queue, producers)
    progress(producers)
    finish_and_verify(ha, producers, queue)

