"""Shared-store master/slave with the embedded default (SQLite + file lock): two brokers on
one data directory. The promise under test: a persistent message whose RECEIPT the client
got is never lost and never stored twice, whatever happens to the master."""

from __future__ import annotations

import collections
import signal
import threading
import time

import pytest
from stomp.utils import Frame

from tests.helpers.broker_proc import (
    BrokerFactory,
    BrokerProcess,
    Client,
    ClientPool,
    LoadProducer,
    never_serves,
    open_client,
    send_many,
    start_pair,
    unique,
)
from tests.helpers.poll import poll

pytestmark = pytest.mark.integration

#: Upper bound for a takeover after SIGKILL; the file lock is freed by the kernel at once.
CRASH_TAKEOVER_LIMIT = 5.0
GRACEFUL_TAKEOVER_LIMIT = 1.0


def take_over(old: BrokerProcess, new: BrokerProcess, how: str) -> float:
    """Kill (SIGKILL) or stop (SIGTERM) the master; return seconds until the slave serves."""
    start = time.monotonic()
    if how == "kill":
        old.kill()
    else:
        old.send_signal(signal.SIGTERM)
    new.wait_serving(timeout=30)
    took = time.monotonic() - start
    print(f"\ntakeover after {'SIGKILL' if how == 'kill' else 'SIGTERM'}: {took:.3f}s "
          f"({old.name} -> {new.name})")
    return took


def drain(client: Client, queue: str, expected: int, quiet: float = 1.0,
          timeout: float = 60.0) -> list[Frame]:
    """Consume until at least `expected` messages came and then nothing more for `quiet` s."""
    client.subscribe(queue)
    client.listener.wait_for(lambda: client.listener.count() >= expected, timeout)
    assert client.listener.wait_quiet(quiet, timeout), "queue never went quiet"
    return client.listener.snapshot()


def duplicates(bodies: list[str]) -> list[str]:
    """Bodies are unique per send, so a repeated body is a message stored/delivered twice."""
    return [b for b, n in collections.Counter(bodies).items() if n > 1]


@pytest.mark.timeout(120)
def test_master_crash_slave_takes_over_without_losing_receipted(
        broker_factory: BrokerFactory, clients: ClientPool) -> None:
    """Exactly one of two brokers serves; after SIGKILL of the master the other takes over
    and every receipted message arrives exactly once, except that messages delivered but
    not acknowledged before the crash may arrive again, and then flagged redelivered:true."""
    master, slave = start_pair(broker_factory)
    assert never_serves(slave, 1.0), f"slave {slave} opened its port or died"
    assert master.is_serving(), "two masters? the first one stopped serving"
    assert "master" in master.log_text().lower(), master.log_tail()

    queue = f"/queue/{unique('ha')}"
    sent = [f"msg-{i:03d}" for i in range(200)]
    send_many(clients(master.port), queue, sent, {"persistent": "true"})

    consumer = clients(master.port)
    consumer.subscribe(queue, ack="client-individual",
                       headers={"activemq.prefetchSize": "50"})
    first = consumer.listener.wait_messages(50)[:50]
    for msg in first[:30]:
        consumer.ack(msg)  # with RECEIPT: these acknowledgements are durable
    acked = {m.body for m in first[:30]}

    took = take_over(master, slave, "kill")
    assert took < CRASH_TAKEOVER_LIMIT, f"takeover took {took:.1f}s"
    assert consumer.listener.wait_for(lambda: consumer.listener.disconnected), \
        "consumer not disconnected by the crash"
    seen_before = consumer.listener.bodies()
    assert not duplicates(seen_before), f"duplicate deliveries before the crash: " \
                                        f"{duplicates(seen_before)}"

    remaining = set(sent) - acked
    after = drain(clients(slave.port), queue, len(remaining))
    bodies_after = [m.body for m in after]
    assert not duplicates(bodies_after), f"stored/delivered twice: {duplicates(bodies_after)}"
    assert not (set(bodies_after) - set(sent)), "messages nobody sent"
    assert not (set(bodies_after) & acked), \
        f"acknowledged messages came back: {sorted(set(bodies_after) & acked)}"
    lost = remaining - set(bodies_after)
    assert not lost, f"{len(lost)} receipted messages lost: {sorted(lost)[:20]}"
    unflagged = [m.body for m in after
                 if m.body in seen_before and m.headers.get("redelivered") != "true"]
    assert not unflagged, f"seen before the crash but not flagged redelivered: {unflagged}"


@pytest.mark.timeout(150)
def test_kill_during_group_commit_loses_no_receipted_message(
        broker_factory: BrokerFactory, clients: ClientPool) -> None:
    """SIGKILL lands while 8 producers keep group commits in flight: after the takeover
    every RECEIPTed message is in the queue, and no message is stored twice."""
    master, slave = start_pair(broker_factory)
    queue = f"/queue/{unique('load')}"
    stop = threading.Event()
    producers = []
    for i in range(8):
        client = open_client(master.port)
        clients.clients.append(client)
        producers.append(LoadProducer(client, queue, f"p{i}", stop))
    for p in producers:
        p.start()

    def confirmed() -> int:
        return sum(len(p.client.listener.receipts) for p in producers)

    poll(confirmed, lambda receipts: receipts >= 100, timeout=30,
         what="load got going (100 receipts)")
    stop.wait(1.5)  # let the load run ~1.5 s more: the kill must hit mid-commit

    took = take_over(master, slave, "kill")
    stop.set()
    for p in producers:
        p.join(15)
        assert not p.is_alive(), f"{p.name} did not stop after the crash"
        assert p.error is None, f"{p.name} failed: {p.error!r}"

    sent = {b for p in producers for b in p.sent}
    receipted = set().union(*(p.confirmed() for p in producers))
    after = [m.body for m in drain(clients(slave.port), queue, len(receipted), quiet=1.5,
                                   timeout=90)]
    print(f"sent {len(sent)}, receipted {len(receipted)}, found {len(after)} after the "
          f"takeover ({took:.3f}s)")
    assert not duplicates(after), f"stored twice: {duplicates(after)[:20]}"
    assert not (set(after) - sent), "messages nobody sent"
    lost = receipted - set(after)
    assert not lost, f"{len(lost)} receipted messages lost: {sorted(lost)[:20]}"


@pytest.mark.timeout(90)
def test_graceful_stop_hands_over_within_one_second(broker_factory: BrokerFactory,
                                                    clients: ClientPool) -> None:
    """SIGTERM releases the lock at once: the slave serves within 1 s, the old master exits
    cleanly, and every receipted message is there exactly once, in order."""
    master, slave = start_pair(broker_factory)
    queue = f"/queue/{unique('graceful')}"
    sent = [f"g-{i:02d}" for i in range(50)]
    producer = clients(master.port)
    send_many(producer, queue, sent, {"persistent": "true"})
    producer.close()

    took = take_over(master, slave, "term")
    assert master.wait_exit(15) == 0, master.log_tail()
    assert took <= GRACEFUL_TAKEOVER_LIMIT, f"graceful takeover took {took:.2f}s"

    after = [m.body for m in drain(clients(slave.port), queue, len(sent))]
    assert after == sent


@pytest.mark.timeout(90)
def test_resend_after_failover_is_not_stored_twice(broker_factory: BrokerFactory,
                                                   clients: ClientPool) -> None:
    """A client that re-sends with the same producer identity after a crash (because it
    could not know whether the first SEND was stored) gets a RECEIPT but no duplicate:
    the dedup window lives in the shared store, not in the dead master's memory."""
    master, slave = start_pair(broker_factory)
    queue = f"/queue/{unique('dedup-ha')}"
    producer_id = unique("producer")

    def identity(seq: int) -> dict[str, str]:
        return {"amqlite.producerId": producer_id, "amqlite.producerSeq": str(seq),
                "persistent": "true"}

    producer = clients(master.port)
    for seq in range(1, 4):
        producer.send(queue, f"d-{seq}", identity(seq))

    take_over(master, slave, "kill")
    again = clients(slave.port)
    for seq in range(1, 5):  # 1-3 are re-sends, 4 is new
        again.send(queue, f"d-{seq}", identity(seq))

    after = [m.body for m in drain(clients(slave.port), queue, 4)]
    assert after == ["d-1", "d-2", "d-3", "d-4"]
