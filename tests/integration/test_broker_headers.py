"""Issue 23 item 7: headers only the broker sets are removed from a SEND, so a client
cannot forge a dead letter's ``original-destination`` (an operator's retry trusts it),
``JMSXGroupFirstForConsumer`` or ``amqlite.omittedHeaders``; an administrator's retry of
a dead letter sent with a forged one returns it to the queue it really came from."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers.broker_proc import BrokerFactory, BrokerProcess, ClientPool, unique
from tests.helpers.mgmt import Api, start_with_http, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

FORGED = {"original-destination": "/queue/elsewhere", "JMSXGroupFirstForConsumer": "true",
          "amqlite.omittedHeaders": "x", "amqlite.deliveryCount": "9", "kept": "yes"}


@pytest.fixture(scope="module")
def broker(module_factory: BrokerFactory) -> BrokerProcess:
    return start_with_http(module_factory, "headers", env={"AMQLITE_MAX_REDELIVERIES": "1"})


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
    # Listed in the DLQ (not consumed: the retry below takes it) with the real queue.
    api = Api(broker.http)  # type: ignore[attr-defined]

    def letter() -> list[dict[str, Any]]:
        page = api.ok("GET", "/api/v1/messages/queue/DLQ?limit=500")["messages"]
        return [m for m in page if m["message_id"] == message.headers["message-id"]]

    [dead] = wait_until(letter, what="the dead letter listed in /queue/DLQ")
    assert dead["headers"]["original-destination"] == queue
    # The administrator's retry goes by original-destination: back to the real queue.
    result = api.ok("POST", "/api/v1/retry/queue/DLQ", {"ids": [dead["id"]]})
    assert result["moved"] == 1 and result["targets"] == {queue: 1}, result
    [back] = consumer.listener.wait_messages(3)[2:]
    assert back.body == "poison" and "original-destination" not in back.headers
    elsewhere = api.destination("/queue/elsewhere")
    assert elsewhere is None or elsewhere["waiting"] == 0, elsewhere
