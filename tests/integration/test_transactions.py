"""STOMP transactions: BEGIN/COMMIT/ABORT around SEND and ACK."""

from __future__ import annotations

import pytest

from tests.helpers.broker_proc import (
    BrokerFactory,
    BrokerProcess,
    ClientPool,
    unique,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

QUIET = 0.6


@pytest.fixture(scope="module")
def broker(module_factory: BrokerFactory) -> BrokerProcess:
    """One broker for the module; each test uses its own queue."""
    return module_factory.start(name="tx")


def test_send_in_transaction_invisible_until_commit(broker: BrokerProcess,
                                                    clients: ClientPool) -> None:
    """Transactional SENDs reach nobody before COMMIT, then all arrive in order."""
    queue = f"/queue/{unique('txsend')}"
    consumer = clients(broker.port)
    consumer.subscribe(queue)
    producer = clients(broker.port)
    tx = unique("tx")
    producer.tx("begin", tx)
    producer.send(queue, "t1", {"transaction": tx})
    producer.send(queue, "t2", {"transaction": tx})
    assert consumer.listener.holds_for(lambda: consumer.listener.count() == 0, QUIET), \
        f"uncommitted messages visible: {consumer.listener.bodies()}"

    producer.tx("commit", tx)
    consumer.listener.wait_messages(2)
    assert consumer.listener.bodies() == ["t1", "t2"]


def test_send_in_aborted_transaction_is_dropped(broker: BrokerProcess,
                                                clients: ClientPool) -> None:
    """ABORT discards the transaction's SENDs; a SEND outside it still goes through."""
    queue = f"/queue/{unique('txabort')}"
    consumer = clients(broker.port)
    consumer.subscribe(queue)
    producer = clients(broker.port)
    tx = unique("tx")
    producer.tx("begin", tx)
    producer.send(queue, "doomed", {"transaction": tx})
    producer.tx("abort", tx)
    producer.send(queue, "outside")

    consumer.listener.wait_messages(1)
    assert consumer.listener.holds_for(lambda: consumer.listener.count() == 1, QUIET)
    assert consumer.listener.bodies() == ["outside"]


def test_ack_in_committed_transaction_settles_messages(broker: BrokerProcess,
                                                       clients: ClientPool) -> None:
    """ACKs inside a committed transaction take effect: nothing is redelivered later."""
    queue = f"/queue/{unique('txack')}"
    producer = clients(broker.port)
    for body in ("k1", "k2"):
        producer.send(queue, body)
    consumer = clients(broker.port)
    consumer.subscribe(queue, ack="client-individual")
    msgs = consumer.listener.wait_messages(2)
    tx = unique("tx")
    consumer.tx("begin", tx)
    for m in msgs:
        consumer.ack(m, transaction=tx)
    consumer.tx("commit", tx)
    consumer.close()

    after = clients(broker.port)
    after.subscribe(queue)
    producer.send(queue, "marker")
    after.listener.wait_messages(1)
    assert after.listener.wait_quiet(QUIET, timeout=10)
    assert after.listener.bodies() == ["marker"]


def test_ack_in_aborted_transaction_is_undone(broker: BrokerProcess,
                                              clients: ClientPool) -> None:
    """An ACK whose transaction was aborted never happened: the message comes back."""
    queue = f"/queue/{unique('txackabort')}"
    producer = clients(broker.port)
    producer.send(queue, "unsettled")
    consumer = clients(broker.port)
    consumer.subscribe(queue, ack="client-individual")
    [msg] = consumer.listener.wait_messages(1)
    tx = unique("tx")
    consumer.tx("begin", tx)
    consumer.ack(msg, transaction=tx)
    consumer.tx("abort", tx)
    consumer.close()

    after = clients(broker.port)
    after.subscribe(queue, ack="client-individual")
    [again] = after.listener.wait_messages(1)
    assert again.body == "unsettled"
    assert again.headers.get("redelivered") == "true", again.headers
