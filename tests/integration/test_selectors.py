"""Issue 21, selectors: ActiveMQ's JMS message selectors on SUBSCRIBE, against real broker
processes on SQLite and PostgreSQL with stomp.py as the client.

On a queue a message goes to a consumer whose selector it matches; what nobody matches
stays for later consumers and never blocks the queue, even when the one match is
behind thousands of others in the store. Topic subscriptions get only what matches; a
durable subscription keeps its selector in the store, and a changed selector is a new
subscription (JMS). A selector that does not parse is an ERROR naming its position.
Selective traffic survives the master's SIGKILL: every receipted message arrives once.
"""

from __future__ import annotations

import collections

import pytest

from tests.helpers.broker_fixtures import store_args
from tests.helpers.broker_proc import (
    WAIT,
    BrokerFactory,
    BrokerProcess,
    Client,
    ClientPool,
    RawStomp,
    assert_error_then_closed,
    start_pair,
    unique,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

#: How long "nothing more arrives" is watched (s).
QUIET = 0.6


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def broker(request: pytest.FixtureRequest, module_factory: BrokerFactory) -> BrokerProcess:
    name = "sel-sqlite" if request.param == "sqlite" else "sel-pg"
    return module_factory.start(name=name, extra_args=store_args(request.param, request))


def send_bulk(client: Client, queue: str, bodies: list[str], headers: dict[str, str]) -> None:
    """Pipelined SENDs; the last one's RECEIPT says all of them are stored (one
    connection's frames commit in order)."""
    for body in bodies[:-1]:
        client.conn.send(queue, body, headers=headers)
    client.send(queue, bodies[-1], headers=headers)


def test_queue_selectors_split_the_traffic_and_leave_what_nobody_matches(
        broker: BrokerProcess, clients: ClientPool) -> None:
    queue = f"/queue/{unique('colors')}"
    red = clients(broker.port)
    red.subscribe(queue, ack="client-individual", headers={"selector": "color = 'red'"})
    big = clients(broker.port)
    big.subscribe(queue, headers={"selector": "size > 10 AND color <> 'red'"})
    producer = clients(broker.port)
    sent = [("r1", "red", "1"), ("b1", "blue", "20"), ("g1", "green", "5"),
            ("r2", "red", "30"), ("b2", "blue", "3"), ("x1", "blue", "abc")]
    for body, color, size in sent:
        producer.send(queue, body, headers={"color": color, "size": size})
    assert [m.body for m in red.listener.wait_messages(2)] == ["r1", "r2"]
    assert [m.body for m in big.listener.wait_messages(1)] == ["b1"]
    assert red.listener.holds_for(lambda: red.listener.count() == 2, QUIET)
    assert big.listener.holds_for(lambda: big.listener.count() == 1, QUIET)
    rest = clients(broker.port)
    rest.subscribe(queue)
    # ActiveMQ's STOMP typing: size 'abc' compared with 10 is FALSE, so x1 stays too.
    assert sorted(m.body for m in rest.listener.wait_messages(3)) == ["b2", "g1", "x1"]
    assert rest.listener.holds_for(lambda: rest.listener.count() == 3, QUIET)


def test_jms_fields_and_the_full_grammar_select(broker: BrokerProcess,
                                                 clients: ClientPool) -> None:
    queue = f"/queue/{unique('jms')}"
    producer = clients(broker.port)
    producer.send(queue, "low", headers={"priority": "1", "type": "order",
                                         "region": "eu_west"})
    producer.send(queue, "high", headers={"priority": "8", "type": "order",
                                          "region": "us_east", "correlation-id": "c-7"})
    consumer = clients(broker.port)
    consumer.subscribe(queue, headers={"selector": (
        "JMSPriority BETWEEN 5 AND 9 AND JMSType IN ('order', 'refund') AND "
        "region LIKE 'us\\_%' ESCAPE '\\' AND JMSCorrelationID IS NOT NULL AND "
        "JMSDeliveryMode = 'PERSISTENT'")})
    assert [m.body for m in consumer.listener.wait_messages(1)] == ["high"]
    assert consumer.listener.holds_for(lambda: consumer.listener.count() == 1, QUIET)


def test_one_match_behind_thousands_in_the_store_arrives(broker: BrokerProcess,
                                                         clients: ClientPool) -> None:
    """5,000 messages nobody selects fill memory's share of the queue and the store
    behind it; the one match at the end still reaches its consumer (the scan reads
    the store with the selector, not page after page into memory)."""
    queue = f"/queue/{unique('deep')}"
    producer = clients(broker.port)
    send_bulk(producer, queue, [f"n{i}" for i in range(5000)], {"kind": "noise"})
    producer.send(queue, "needle", headers={"kind": "needle"})
    consumer = clients(broker.port)
    consumer.subscribe(queue, headers={"selector": "kind = 'needle'"})
    assert [m.body for m in consumer.listener.wait_messages(1, timeout=10)] == ["needle"]
    noise = clients(broker.port)
    noise.subscribe(queue, headers={"selector": "kind = 'noise'"})
    got = noise.listener.wait_messages(5000, timeout=60)
    assert [m.body for m in got[:3]] == ["n0", "n1", "n2"]
    assert len({m.body for m in got}) == 5000
    assert consumer.listener.holds_for(lambda: consumer.listener.count() == 1, QUIET)


def test_topic_selectors_and_durable_ones_kept_and_replaced(broker: BrokerProcess,
                                                            clients: ClientPool) -> None:
    topic = f"/topic/{unique('news')}"
    client_id, name = unique("cid"), unique("dur")
    durable = {"activemq.subscriptionName": name}
    plain = clients(broker.port)
    plain.subscribe(topic, headers={"selector": "lang = 'en'"})
    sub = clients(broker.port, headers={"client-id": client_id})
    sub.subscribe(topic, ack="client-individual",
                  headers={**durable, "selector": "lang = 'fr'"})
    sub.close()
    producer = clients(broker.port)
    for body, lang in (("hello", "en"), ("bonjour", "fr"), ("hallo", "de"), ("salut", "fr")):
        producer.send(topic, body, headers={"lang": lang})
    assert [m.body for m in plain.listener.wait_messages(1)] == ["hello"]
    again = clients(broker.port, headers={"client-id": client_id})
    again.subscribe(topic, ack="client-individual",
                    headers={**durable, "selector": "lang = 'fr'"})
    got = again.listener.wait_messages(2)
    assert [m.body for m in got] == ["bonjour", "salut"]
    for m in got:
        again.ack(m)
    again.close()
    producer.send(topic, "bonsoir", headers={"lang": "fr"})
    # Another selector: a new subscription, which was not there for "bonsoir" (JMS).
    changed = clients(broker.port, headers={"client-id": client_id})
    changed.subscribe(topic, headers={**durable, "selector": "lang = 'de'"})
    assert changed.listener.wait_quiet(QUIET, timeout=WAIT)
    assert changed.listener.bodies() == []
    producer.send(topic, "guten tag", headers={"lang": "de"})
    assert [m.body for m in changed.listener.wait_messages(1)] == ["guten tag"]
    assert plain.listener.holds_for(lambda: plain.listener.count() == 1, QUIET)


@pytest.mark.parametrize(("selector", "position"), [
    ("color = ", "position 8"), ("a = 'x' AND", "position 11"), ("a IN ()", "position 6"),
])
def test_a_selector_that_does_not_parse_is_an_error_naming_the_position(
        broker: BrokerProcess, clients: ClientPool, selector: str, position: str) -> None:
    with RawStomp(broker.port) as raw:
        raw.connect()
        raw.send_frame("SUBSCRIBE", {"destination": "/queue/x", "id": "1", "receipt": "r1",
                                     "selector": selector})
        error = assert_error_then_closed(raw, f"selector {selector!r}", None, receipt="r1")
        said = error.headers.get("message", "") + error.body.decode()
        assert "selector" in said and position in said, said
    clients(broker.port).send(f"/queue/{unique('after')}", "still serving")


@pytest.mark.parametrize("store", ["sqlite", "postgresql"])
def test_selective_traffic_survives_the_masters_sigkill(
        broker_factory: BrokerFactory, clients: ClientPool, request: pytest.FixtureRequest,
        store: str) -> None:
    """Two nodes on one store; selective consumers busy; SIGKILL the master: after the
    takeover every receipted message reaches the consumer its selector picks, once."""
    master, slave = start_pair(broker_factory, ("sel-a", "sel-b"),
                               store_args=store_args(store, request))
    queue = f"/queue/{unique('selha')}"
    producer = clients(master.port)
    sent = {"even": [], "odd": []}
    for i in range(300):
        parity = "odd" if i % 2 else "even"
        sent[parity].append(f"m{i}")
    consumers = {}
    for parity in ("even", "odd"):
        c = clients(master.port)
        c.subscribe(queue, ack="client-individual",
                    headers={"selector": f"parity = '{parity}'",
                             "activemq.prefetchSize": "20"})
        consumers[parity] = c
    for i in range(300):
        producer.send(queue, f"m{i}", headers={"parity": "odd" if i % 2 else "even"})
    acked: dict[str, set[str]] = {}
    for parity, c in consumers.items():
        got = c.listener.wait_messages(20)
        for m in got[:10]:
            c.ack(m)
        acked[parity] = {m.body for m in got[:10]}
    master.kill()
    slave.wait_serving(timeout=30)
    for parity in ("even", "odd"):
        after = clients(slave.port)
        after.subscribe(queue, headers={"selector": f"parity = '{parity}'"})
        expected = set(sent[parity]) - acked[parity]
        got = after.listener.wait_messages(len(expected), timeout=60)
        bodies = [m.body for m in got]
        assert not [b for b, n in collections.Counter(bodies).items() if n > 1]
        assert set(bodies) == expected, sorted(expected - set(bodies))[:10]
        count = len(expected)
        assert after.listener.holds_for(lambda a=after, n=count: a.listener.count() == n,
                                        QUIET)
