"""Queues, topics and message headers through a real broker with the real stomp.py client."""

from __future__ import annotations

import time

import pytest

from tests.helpers.broker_fixtures import store_args
from tests.helpers.broker_proc import (
    BrokerFactory,
    BrokerProcess,
    ClientPool,
    unique,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


@pytest.fixture(scope="module")
def broker(module_factory: BrokerFactory) -> BrokerProcess:
    """One broker for the module's tests; each test uses its own destinations."""
    return module_factory.start(name="qt")


def test_queue_send_and_receive(broker: BrokerProcess, clients: ClientPool) -> None:
    """The basic path: what a producer sends to a queue reaches its subscriber intact."""
    queue = f"/queue/{unique('basic')}"
    consumer = clients(broker.port)
    sub_id = consumer.subscribe(queue)
    producer = clients(broker.port)
    producer.send(queue, "hello, queue", {"x-custom": "42"})

    [msg] = consumer.listener.wait_messages(1)
    assert msg.body == "hello, queue"
    assert msg.headers["destination"] == queue
    assert msg.headers["subscription"] == sub_id
    assert msg.headers["x-custom"] == "42"
    assert msg.headers.get("message-id")


def test_two_consumers_on_one_queue_share_the_messages(broker: BrokerProcess,
                                                       clients: ClientPool) -> None:
    """Competing consumers: every message goes to exactly one of them, and both get work."""
    queue = f"/queue/{unique('compete')}"
    first, second = clients(broker.port), clients(broker.port)
    first.subscribe(queue)
    second.subscribe(queue)
    producer = clients(broker.port)
    sent = [f"job-{i}" for i in range(20)]
    for body in sent:
        producer.send(queue, body)


    def both() -> int:
        return first.listener.count() + second.listener.count()

    assert first.listener.wait_for(lambda: both() >= len(sent)), f"only {both()} delivered"
    # No straggling duplicate may follow: hold the total steady for a moment.
    assert first.listener.holds_for(lambda: both() == len(sent), 0.5), "extra deliveries"
    got_first, got_second = first.listener.bodies(), second.listener.bodies()
    assert sorted(got_first + got_second) == sorted(sent), "each message exactly once"
    assert got_first and got_second, f"one consumer starved: {len(got_first)}/{len(got_second)}"


def test_topic_every_subscriber_gets_every_message(broker: BrokerProcess,
                                                   clients: ClientPool) -> None:
    """Publish/subscribe: each topic subscriber sees the whole stream, in order."""
    topic = f"/topic/{unique('fanout')}"
    subscribers = [clients(broker.port) for _ in range(3)]
    for sub in subscribers:
        sub.subscribe(topic)
    producer = clients(broker.port)
    sent = [f"news-{i}" for i in range(10)]
    for body in sent:
        producer.send(topic, body)

    for sub in subscribers:
        sub.listener.wait_messages(len(sent))
        assert sub.listener.holds_for(lambda s=sub: s.listener.count() == len(sent), 0.3)
        assert sub.listener.bodies() == sent


def test_persistent_messages_survive_broker_restart(broker_factory: BrokerFactory,
                                                    clients: ClientPool) -> None:
    """A receipted persistent message is in the store: a restarted broker still has it."""
    node = broker_factory.start(name="restart")
    queue = f"/queue/{unique('durable')}"
    producer = clients(node.port)
    sent = [f"keep-{i}" for i in range(5)]
    for body in sent:
        producer.send(queue, body, {"persistent": "true"})
    producer.close()

    assert node.terminate() == 0, node.log_tail()
    node.start().wait_serving()

    consumer = clients(node.port)
    consumer.subscribe(queue)
    consumer.listener.wait_messages(len(sent))
    assert consumer.listener.holds_for(lambda: consumer.listener.count() == len(sent), 0.5)
    assert consumer.listener.bodies() == sent


def test_higher_priority_waiting_messages_delivered_first(broker: BrokerProcess,
                                                          clients: ClientPool) -> None:
    """Among waiting messages the highest priority goes first; equal priorities stay FIFO."""
    queue = f"/queue/{unique('prio')}"
    producer = clients(broker.port)
    for body, prio in [("p1", 1), ("p5-a", 5), ("p9", 9), ("p0", 0), ("p5-b", 5)]:
        producer.send(queue, body, {"priority": str(prio)})

    consumer = clients(broker.port)
    consumer.subscribe(queue)
    consumer.listener.wait_messages(5)
    assert consumer.listener.bodies() == ["p9", "p5-a", "p5-b", "p1", "p0"]


def test_expired_messages_are_not_delivered(broker: BrokerProcess, clients: ClientPool) -> None:
    """`expires` is honoured both for a message already stale on arrival and one that
    goes stale while waiting in the queue."""
    queue = f"/queue/{unique('ttl')}"
    producer = clients(broker.port)
    now_ms = int(time.time() * 1000)
    producer.send(queue, "stale-on-arrival", {"expires": str(now_ms - 60_000)})
    soon = now_ms + 800
    producer.send(queue, "stale-while-waiting", {"expires": str(soon)})
    producer.send(queue, "fresh", {"expires": str(now_ms + 3_600_000)})
    producer.send(queue, "no-expiry")
    # Wall-clock condition, not synchronisation: the second message must be past its expiry.
    while time.time() * 1000 <= soon + 50:
        time.sleep(0.05)

    consumer = clients(broker.port)
    consumer.subscribe(queue)
    consumer.listener.wait_messages(2)
    assert consumer.listener.holds_for(lambda: consumer.listener.count() == 2, 0.5)
    assert consumer.listener.bodies() == ["fresh", "no-expiry"]


def test_non_persistent_message_is_delivered(broker: BrokerProcess, clients: ClientPool) -> None:
    """persistent:false skips the store but must still reach the consumer."""
    queue = f"/queue/{unique('transient')}"
    consumer = clients(broker.port)
    consumer.subscribe(queue)
    producer = clients(broker.port)
    producer.send(queue, "fleeting", {"persistent": "false"})
    [msg] = consumer.listener.wait_messages(1)
    assert msg.body == "fleeting"


@pytest.fixture(scope="module")
def pg_broker(request: pytest.FixtureRequest, module_factory: BrokerFactory) -> BrokerProcess:
    """The same on PostgreSQL, for what its store does its own way: a producer identity
    it already holds fails the plain INSERT, and the commit is sent again, careful
    (store/pg_batch.py)."""
    return module_factory.start(name="qt-pg", extra_args=store_args("postgresql", request))


@pytest.mark.parametrize("store", ["sqlite", "postgresql"])
def test_resent_producer_identity_is_stored_once(store: str, request: pytest.FixtureRequest,
                                                 clients: ClientPool) -> None:
    """Dedup: a SEND repeating amqlite.producerId + producerSeq gets a RECEIPT but no copy,
    and the producer's connection goes on (on PostgreSQL, the plain INSERT's refusal is
    the store's business, not the client's)."""
    broker: BrokerProcess = request.getfixturevalue("broker" if store == "sqlite" else "pg_broker")
    queue = f"/queue/{unique('dedup')}"
    producer = clients(broker.port)
    pid = unique("producer")
    producer.send(queue, "once", {"amqlite.producerId": pid, "amqlite.producerSeq": "1"})
    producer.send(queue, "once", {"amqlite.producerId": pid, "amqlite.producerSeq": "1"})
    producer.send(queue, "twice", {"amqlite.producerId": pid, "amqlite.producerSeq": "2"})

    consumer = clients(broker.port)
    consumer.subscribe(queue)
    consumer.listener.wait_messages(2)
    assert consumer.listener.holds_for(lambda: consumer.listener.count() == 2, 0.5)
    assert consumer.listener.bodies() == ["once", "twice"]
