"""Durable topic subscriptions: retention while away, across restarts, and removal."""

from __future__ import annotations

import pytest

from tests.helpers.broker_proc import (
    BrokerFactory,
    BrokerProcess,
    Client,
    ClientPool,
    unique,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

QUIET = 0.6


@pytest.fixture(scope="module")
def broker(module_factory: BrokerFactory) -> BrokerProcess:
    """One broker for the tests that need no restart."""
    return module_factory.start(name="durable")


def durable_client(clients: ClientPool, port: int, client_id: str) -> Client:
    """Durable subscriptions belong to a client-id given on CONNECT."""
    return clients(port, headers={"client-id": client_id})


def test_durable_subscriber_catches_up_after_disconnect(broker: BrokerProcess,
                                                        clients: ClientPool) -> None:
    """Messages published while a durable subscriber is away wait for it, in order."""
    topic, client_id, name = f"/topic/{unique('news')}", unique("cid"), unique("durable")
    sub = durable_client(clients, broker.port, client_id)
    sub.subscribe(topic, headers={"activemq.subscriptionName": name})
    sub.close()

    publisher = clients(broker.port)
    sent = [f"missed-{i}" for i in range(5)]
    for body in sent:
        publisher.send(topic, body)

    back = durable_client(clients, broker.port, client_id)
    back.subscribe(topic, headers={"activemq.subscriptionName": name})
    back.listener.wait_messages(len(sent))
    publisher.send(topic, "live")
    back.listener.wait_messages(len(sent) + 1)
    assert back.listener.holds_for(lambda: back.listener.count() == len(sent) + 1, QUIET)
    assert back.listener.bodies() == [*sent, "live"]


def test_durable_subscription_survives_broker_restart(broker_factory: BrokerFactory,
                                                      clients: ClientPool) -> None:
    """The subscription and its backlog are in the store: a restarted broker still has both
    (subscribed with the `durable-subscription-name` spelling)."""
    node = broker_factory.start(name="durable-restart")
    topic, client_id, name = f"/topic/{unique('news')}", unique("cid"), unique("durable")
    header = {"durable-subscription-name": name}
    sub = durable_client(clients, node.port, client_id)
    sub.subscribe(topic, headers=header)
    sub.close()
    publisher = clients(node.port)
    sent = [f"kept-{i}" for i in range(5)]
    for body in sent:
        publisher.send(topic, body, {"persistent": "true"})
    publisher.close()

    assert node.terminate() == 0, node.log_tail()
    node.start().wait_serving()

    back = durable_client(clients, node.port, client_id)
    back.subscribe(topic, headers=header)
    back.listener.wait_messages(len(sent))
    assert back.listener.holds_for(lambda: back.listener.count() == len(sent), QUIET)
    assert back.listener.bodies() == sent


def test_unsubscribed_durable_subscription_stops_retaining(broker: BrokerProcess,
                                                           clients: ClientPool) -> None:
    """UNSUBSCRIBE with the subscription name deletes it: later messages are not kept."""
    topic, client_id, name = f"/topic/{unique('news')}", unique("cid"), unique("durable")
    header = {"activemq.subscriptionName": name}
    sub = durable_client(clients, broker.port, client_id)
    sub_id = sub.subscribe(topic, headers=header)
    sub.unsubscribe(sub_id, headers=header)
    sub.close()

    publisher = clients(broker.port)
    for i in range(3):
        publisher.send(topic, f"unwanted-{i}")

    back = durable_client(clients, broker.port, client_id)
    back.subscribe(topic, headers=header)
    publisher.send(topic, "after-resubscribe")
    back.listener.wait_messages(1)
    assert back.listener.wait_quiet(QUIET, timeout=10)
    assert back.listener.bodies() == ["after-resubscribe"]
