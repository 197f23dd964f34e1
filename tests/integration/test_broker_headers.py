"""Issue 23 item 7: headers only the broker sets are removed from a SEND, so a client
cannot forge a dead letter's ``original-destination`` (an operator's retry trusts it),
``JMSXGroupFirstForConsumer`` or ``amqlite.omittedHeaders``."""

from __future__ import annotations

import pytest

from tests.helpers.broker_proc import BrokerFactory, BrokerProcess, ClientPool, unique

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

FORGED = {"original-destination": "/queue/elsewhere", "JMSXGroupFirstForConsumer": "true",
          "amqlite.omittedHeaders": "x", "amqlite.deliveryCount": "9", "kept": "yes"}


@pytest.fixture(scope="module")
def broker(module_factory: BrokerFactory) -> BrokerProcess:
    return module_factory.start(name="headers", env={"AMQLITE_MAX_REDELIVERIES": "1"})


def test_broker_only_headers_are_removed_from_a_send(broker: BrokerProcess,
                                                     clients: ClientPool) -> None:
    queue = f"/queue/{unique('forged')}"
    consumer = clients(broker.port)
    consumer.subscribe(queue)
    clients(broker.port).send(queue, "m", headers=FORGED)
    [message] = consumer.listener.wait_messages(1)
    assert message.headers["kept"] == "yes"
    for name in FORGED.keys() - {"kept"}:
        assert name not in message.headers, (name, message.headers)


def test_a_dead_letter_names_where_it_really_came_from(broker: BrokerProcess,
                                                       clients: ClientPool) -> None:
    queue = f"/queue/{unique('poison')}"
    producer = clients(broker.port)
    producer.send(queue, "poison", headers={"original-destination": "/queue/elsewhere"})
    consumer = clients(broker.port)
    consumer.subscribe(queue, ack="client-individual")
    for n in range(2):  # max_redeliveries 1: the second NACK sends it to the DLQ
        message = consumer.listener.wait_messages(n + 1)[n]
        consumer.nack(message)
    dlq = clients(broker.port)
    dlq.subscribe("/queue/DLQ", headers={"selector": f"JMSMessageID = "
                                                    f"'{message.headers['message-id']}'"})
    [dead] = dlq.listener.wait_messages(1)
    assert dead.headers["original-destination"] == queue
