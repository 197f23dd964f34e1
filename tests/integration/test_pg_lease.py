"""A paused master loses the PostgreSQL lock in bounded time (issue 12, class 8), end to end:
three `amqlite start` processes on one PostgreSQL store and locker, stomp.py clients.

SIGSTOP keeps the master's lock session alive (its kernel answers TCP keepalives), so only
the lease can end it: a slave must see the lease run out by the database clock, end the
master's session and take over within 5 s; the woken master must demote and write nothing.
A busy master with a short lease must not be taken over."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

import pytest

from tests.helpers.broker_proc import (
    BrokerFactory,
    BrokerProcess,
    open_client,
    send_many,
    send_with_receipt,
    unique,
)
from tests.helpers.pg_ha import (
    PgGroup,
    Producer,
    drain_queue,
    new_since,
    wait_log,
)
from tests.helpers.servers import PostgresServer
from tests.integration.test_pg_ha import (
    assert_deposed_silent,
    finish_and_verify,
    progress,
    send_stale,
    start_producers,
)

pytestmark = pytest.mark.integration

#: The issue's bound: SIGSTOP of the master to the first RECEIPT from its successor.
PAUSED_TAKEOVER_LIMIT = 5.0
#: How long the probe keeps trying before the test fails with the logs.
PROBE_TIMEOUT = 30.0
#: CONNECT deadline of one probe attempt: a paused broker's kernel still accepts TCP.
PROBE_CONNECT_TIMEOUT = 1.0
#: Short lease for the no-false-takeover test: renewed every 0.5 s.
SHORT_LEASE = "1.5"
#: How long the busy master is watched.
LOAD_SECONDS = 10.0
#: Producers of the busy test (each ~100 persistent messages/s with receipts).
LOAD_PRODUCERS = 4


@pytest.fixture
def ha(broker_factory: BrokerFactory, postgres_server: PostgresServer,
       pg_url: str) -> Iterator[PgGroup]:
    yield PgGroup(broker_factory, postgres_server, pg_url)


def first_receipt(brokers: Sequence[BrokerProcess], queue: str) -> tuple[BrokerProcess, float]:
    """Send a persistent probe with a receipt to whichever of `brokers` serves, until one
    confirms it; return that broker and time.monotonic() of the RECEIPT."""
    deadline = time.monotonic() + PROBE_TIMEOUT
    while time.monotonic() < deadline:
        for b in brokers:
            if not b.is_serving():
                continue
            try:
                client = open_client(b.port, timeout=PROBE_CONNECT_TIMEOUT)
            except Exception:  # refused or no CONNECTED yet: try the next one
                continue
            try:
                send_with_receipt(client.conn, queue, "probe", headers={"persistent": "true"},
                                  timeout=PROBE_TIMEOUT)
                return b, time.monotonic()
            except AssertionError:
                continue
            finally:
                client.close()
        time.sleep(0.02)  # poll period while nobody serves yet
    raise AssertionError(f"no RECEIPT from {[b.name for b in brokers]} within {PROBE_TIMEOUT}s\n"
                         + "\n".join(b.log_tail(40) for b in brokers))


@pytest.mark.timeout(180)
def test_paused_master_is_taken_over_within_five_seconds(ha: PgGroup) -> None:
    """SIGSTOP the master under producers: a slave ends its lock session once the lease ran
    out and confirms a persistent SEND within 5 s. A message receipted before the pause is
    consumed exactly once from the new master. SIGCONT: the old master demotes, sends no
    RECEIPT for the frames queued on its socket and stores none of them."""
    old = ha.start()
    queue = f"/queue/{unique('lease')}"
    producers = start_producers(ha, queue)
    stale_client = open_client(old.port)
    stale_queue = f"/queue/{unique('stale')}"
    send_many(stale_client, stale_queue, ["before-pause"])
    old_epoch = ha.epoch()
    mark = len(old.log_text())
    others = [b for b in ha.brokers if b is not old]
    old.pause()
    try:
        paused_at = time.monotonic()
        probe_queue = f"/queue/{unique('probe')}"
        new, receipt_at = first_receipt(others, probe_queue)
        took = receipt_at - paused_at
        print(f"\nSIGSTOP of the master to the first RECEIPT from {new.name}: {took:.2f}s")
        assert took <= PAUSED_TAKEOVER_LIMIT, f"takeover took {took:.2f}s"
        assert "lease ran out" in new_since(new, 0) or any(
            "lease ran out" in b.log_text() for b in others), "not taken over by the lease"
        new_epoch = ha.epoch()
        assert new_epoch > old_epoch
        progress(producers)
        send_stale(stale_client, stale_queue)
    finally:
        old.resume()
    wait_log(old, "DEMOTED", mark, timeout=15)
    master = assert_deposed_silent(ha, old, new, new_epoch, stale_client, "woken")
    drained = drain_queue(master.port, stale_queue, 1)
    assert [f.body for f in drained] == ["before-pause"]
    assert [f.body for f in drain_queue(master.port, probe_queue, 1)] == ["probe"]
    acts = ha.activations()
    assert [a[0] for a in acts][-2:] == [old_epoch, new_epoch] and acts[-1][1] == new.name, acts
    finish_and_verify(ha, producers, queue)


@pytest.mark.timeout(180)
def test_busy_master_with_a_short_lease_is_not_taken_over(ha: PgGroup) -> None:
    """Steady persistent load for 10 s with a 1.5 s lease: the lease is renewed from its own
    thread and connection, so the master keeps it: no other node serves, the epoch stays."""
    ha.env["AMQLITE_LOCK_LEASE"] = SHORT_LEASE
    master = ha.start()
    queue = f"/queue/{unique('busy')}"
    producers: list[Producer] = start_producers(ha, queue, count=LOAD_PRODUCERS)
    epoch = ha.epoch()
    mark = len(master.log_text())
    others = [b for b in ha.brokers if b is not master]
    start = time.monotonic()
    before = sum(p.receipt_count() for p in producers)
    while time.monotonic() - start < LOAD_SECONDS:
        assert not ha.serving(others), "a slave took over from a busy master"
        assert master.alive
        time.sleep(0.1)  # sampling period of the check
    done = sum(p.receipt_count() for p in producers) - before
    print(f"\n{done / LOAD_SECONDS:.0f} receipted messages/s for {LOAD_SECONDS:g}s"
          f" with lock_lease={SHORT_LEASE}")
    assert done > 0
    assert ha.epoch() == epoch
    log = new_since(master, mark)
    assert "DEMOTED" not in log and "lease" not in log, log[-2000:]
    for b in others:
        assert "ended the lock session" not in b.log_text(), b.log_tail(20)
    finish_and_verify(ha, producers, queue)
