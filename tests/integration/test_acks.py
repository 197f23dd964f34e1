"""Acknowledgement modes, redelivery, the dead-letter queue and prefetch."""

from __future__ import annotations

import pytest

from tests.helpers.broker_proc import (
    BrokerFactory,
    BrokerProcess,
    Client,
    ClientPool,
    unique,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

MAX_REDELIVERIES = 2
#: The broker must stay quiet this long for "nothing more arrives" to count.
QUIET = 0.6


@pytest.fixture(scope="module")
def broker(module_factory: BrokerFactory) -> BrokerProcess:
    """A small redelivery limit so the DLQ path takes three deliveries, not seven."""
    return module_factory.start(name="acks",
                                env={"AMQLITE_MAX_REDELIVERIES": str(MAX_REDELIVERIES)})


def fill(client: Client, queue: str, bodies: list[str]) -> None:
    """Enqueue with receipts, so the messages are stored before anyone subscribes."""
    for body in bodies:
        client.send(queue, body)


def only_marker_follows(client: Client, queue: str) -> list[str]:
    """Subscribe a fresh consumer, send a marker after it, and return what it receives
    before things go quiet: nothing but the marker means the queue held nothing else."""
    client.subscribe(queue)
    client.send(queue, "marker")
    assert client.listener.wait_for(lambda: "marker" in client.listener.bodies()), \
        f"marker not delivered, got {client.listener.bodies()}"
    assert client.listener.wait_quiet(QUIET, timeout=10)
    return client.listener.bodies()


def test_auto_ack_messages_are_gone_after_delivery(broker: BrokerProcess,
                                                   clients: ClientPool) -> None:
    """ack:auto consumes on delivery: a consumer that leaves gets nothing redelivered."""
    queue = f"/queue/{unique('auto')}"
    fill(clients(broker.port), queue, ["a1", "a2", "a3"])
    first = clients(broker.port)
    first.subscribe(queue, ack="auto")
    first.listener.wait_messages(3)
    assert first.listener.bodies() == ["a1", "a2", "a3"]
    first.close()

    assert only_marker_follows(clients(broker.port), queue) == ["marker"]


def test_client_ack_of_third_acknowledges_first_three(broker: BrokerProcess,
                                                      clients: ClientPool) -> None:
    """ack:client is cumulative: ACKing the 3rd message settles 1-3 but not the 4th."""
    queue = f"/queue/{unique('cumulative')}"
    fill(clients(broker.port), queue, ["c1", "c2", "c3", "c4"])
    first = clients(broker.port)
    first.subscribe(queue, ack="client")
    msgs = first.listener.wait_messages(4)
    assert [m.body for m in msgs] == ["c1", "c2", "c3", "c4"]
    first.ack(msgs[2])
    first.close()

    second = clients(broker.port)
    got = only_marker_follows(second, queue)
    assert sorted(got) == ["c4", "marker"], got
    [c4] = [m for m in second.listener.snapshot() if m.body == "c4"]
    assert c4.headers.get("redelivered") == "true", c4.headers


def test_client_ack_unacked_redelivered_to_next_consumer(broker: BrokerProcess,
                                                         clients: ClientPool) -> None:
    """A client-ack consumer that disconnects without ACK hands its messages to the next
    consumer, flagged redelivered:true."""
    queue = f"/queue/{unique('noack')}"
    fill(clients(broker.port), queue, ["n1", "n2", "n3"])
    first = clients(broker.port)
    first.subscribe(queue, ack="client")
    first.listener.wait_messages(3)
    first.close()

    second = clients(broker.port)
    second.subscribe(queue, ack="client")
    msgs = second.listener.wait_messages(3)
    assert second.listener.holds_for(lambda: second.listener.count() == 3, QUIET)
    assert [m.body for m in msgs] == ["n1", "n2", "n3"]
    for m in msgs:
        assert m.headers.get("redelivered") == "true", m.headers
        assert int(m.headers["amqlite.deliveryCount"]) >= 1, m.headers


def test_client_individual_ack_only_unacked_comes_back(broker: BrokerProcess,
                                                       clients: ClientPool) -> None:
    """ack:client-individual settles exactly the ACKed messages, not the ones before them."""
    queue = f"/queue/{unique('individual')}"
    fill(clients(broker.port), queue, ["i1", "i2", "i3"])
    first = clients(broker.port)
    first.subscribe(queue, ack="client-individual")
    msgs = first.listener.wait_messages(3)
    first.ack(msgs[0])
    first.ack(msgs[2])
    first.close()

    second = clients(broker.port)
    got = only_marker_follows(second, queue)
    assert sorted(got) == ["i2", "marker"], got
    [i2] = [m for m in second.listener.snapshot() if m.body == "i2"]
    assert i2.headers.get("redelivered") == "true", i2.headers


def test_nack_redelivers_with_redelivered_flag(broker: BrokerProcess,
                                               clients: ClientPool) -> None:
    """NACK gives the message back at once, flagged, with a growing delivery count."""
    queue = f"/queue/{unique('nack')}"
    clients(broker.port).send(queue, "retry-me")
    consumer = clients(broker.port)
    consumer.subscribe(queue, ack="client-individual")
    [first] = consumer.listener.wait_messages(1)
    assert first.headers.get("redelivered", "false") == "false", first.headers
    consumer.nack(first)

    second = consumer.listener.wait_messages(2)[1]
    assert second.body == "retry-me"
    assert second.headers.get("redelivered") == "true", second.headers
    before = int(first.headers.get("amqlite.deliveryCount", "0"))
    assert int(second.headers["amqlite.deliveryCount"]) > before, second.headers
    consumer.ack(second)


def test_message_goes_to_dlq_after_max_redeliveries(broker: BrokerProcess,
                                                    clients: ClientPool) -> None:
    """With max_redeliveries=2 a message is delivered 1 + 2 times; the next NACK moves it
    to /queue/DLQ, tagged with where it came from."""
    queue = f"/queue/{unique('poison')}"
    body = unique("poison")
    clients(broker.port).send(queue, body)
    consumer = clients(broker.port)
    consumer.subscribe(queue, ack="client-individual")
    for attempt in range(1 + MAX_REDELIVERIES):
        msg = consumer.listener.wait_messages(attempt + 1)[attempt]
        assert msg.body == body
        consumer.nack(msg)
    assert consumer.listener.holds_for(
        lambda: consumer.listener.count() == 1 + MAX_REDELIVERIES, QUIET), \
        f"delivered more than 1+{MAX_REDELIVERIES} times"

    dlq = clients(broker.port)
    dlq.subscribe("/queue/DLQ", ack="client-individual")
    assert dlq.listener.wait_for(lambda: body in dlq.listener.bodies()), dlq.listener.bodies()
    [dead] = [m for m in dlq.listener.snapshot() if m.body == body]
    assert dead.headers.get("original-destination") == queue, dead.headers
    dlq.ack(dead)


def test_prefetch_caps_unacked_messages(broker: BrokerProcess, clients: ClientPool) -> None:
    """activemq.prefetchSize:2 with ack:client: never more than 2 unacked at the consumer;
    each cumulative ACK opens the window again."""
    queue = f"/queue/{unique('prefetch')}"
    fill(clients(broker.port), queue, [f"f{i}" for i in range(6)])
    consumer = clients(broker.port)
    consumer.subscribe(queue, ack="client", headers={"activemq.prefetchSize": "2"})
    listener = consumer.listener
    for window_end in (2, 4, 6):
        msgs = listener.wait_messages(window_end)
        assert listener.holds_for(lambda n=window_end: listener.count() == n, QUIET), \
            f"more than 2 unacked: {listener.bodies()}"
        consumer.ack(msgs[window_end - 1])
    assert listener.bodies() == [f"f{i}" for i in range(6)]
