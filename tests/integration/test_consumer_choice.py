"""Issue 21, consumer choice: ActiveMQ's message groups (JMSXGroupID), exclusive
consumers, consumer priority and noLocal, against real broker processes with stomp.py.

A group stays with one consumer until that consumer leaves, then moves, and the first
message it gets there says so; group order holds through a SIGKILL takeover, and every
receipted message arrives once.
"""

from __future__ import annotations

import collections

import pytest

from tests.helpers.broker_fixtures import store_args
from tests.helpers.broker_proc import (
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
GROUP = "JMSXGroupID"
FIRST = "JMSXGroupFirstForConsumer"


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def broker(request: pytest.FixtureRequest, module_factory: BrokerFactory) -> BrokerProcess:
    name = "choice-sqlite" if request.param == "sqlite" else "choice-pg"
    return module_factory.start(name=name, extra_args=store_args(request.param, request))


def groups_of(client: Client) -> dict[str, list[str]]:
    by_group: dict[str, list[str]] = collections.defaultdict(list)
    for m in client.listener.snapshot():
        by_group[m.headers[GROUP]].append(m.body)
    return by_group


def test_a_group_stays_with_one_consumer_then_moves_when_it_leaves(
        broker: BrokerProcess, clients: ClientPool) -> None:
    queue = f"/queue/{unique('groups')}"
    a = clients(broker.port)
    a.subscribe(queue, ack="client-individual")
    b = clients(broker.port)
    b.subscribe(queue, ack="client-individual")
    producer = clients(broker.port)
    for i in range(12):
        producer.send(queue, f"{'xyz'[i % 3]}{i}", headers={GROUP: "xyz"[i % 3]})
    assert a.listener.wait_for(lambda: a.listener.count() + b.listener.count() == 12)
    owners = {}
    for client in (a, b):
        for group, bodies in groups_of(client).items():
            assert group not in owners, f"group {group} went to two consumers"
            owners[group] = client
            assert bodies == [f"{group}{i}" for i in range(12) if "xyz"[i % 3] == group]
        firsts = [m.body for m in client.listener.snapshot() if m.headers.get(FIRST)]
        assert sorted(firsts) == sorted(
            next(m.body for m in client.listener.snapshot() if m.headers[GROUP] == g)
            for g in groups_of(client))
    leaving = owners["x"]
    staying = b if leaving is a else a
    for m in staying.listener.snapshot():
        staying.ack(m)
    leaving.close()  # unacknowledged: its group x moves, with its messages, in order
    producer.send(queue, "x12", headers={GROUP: "x"})
    expected_x = ["x0", "x3", "x6", "x9", "x12"]
    assert staying.listener.wait_for(lambda: groups_of(staying).get("x") == expected_x)
    moved = [m for m in staying.listener.snapshot() if m.headers[GROUP] == "x"]
    assert moved[0].headers.get(FIRST) == "true", moved[0].headers
    assert all(not m.headers.get(FIRST) for m in moved[1:])


def test_exclusive_consumer_takes_everything_while_it_is_there(
        broker: BrokerProcess, clients: ClientPool) -> None:
    queue = f"/queue/{unique('excl')}"
    plain = clients(broker.port)
    plain.subscribe(queue)
    exclusive = clients(broker.port)
    exclusive.subscribe(queue, headers={"activemq.exclusive": "true"})
    producer = clients(broker.port)
    for i in range(5):
        producer.send(queue, f"m{i}")
    assert [m.body for m in exclusive.listener.wait_messages(5)] == [f"m{i}" for i in range(5)]
    assert plain.listener.holds_for(lambda: plain.listener.count() == 0, QUIET)
    exclusive.close()
    producer.send(queue, "after")
    assert [m.body for m in plain.listener.wait_messages(1)] == ["after"]


def test_higher_priority_consumers_first_lower_when_they_are_full(
        broker: BrokerProcess, clients: ClientPool) -> None:
    queue = f"/queue/{unique('prio')}"
    low = clients(broker.port)
    low.subscribe(queue, ack="client-individual", headers={"activemq.priority": "1"})
    high = clients(broker.port)
    high.subscribe(queue, ack="client-individual",
                   headers={"activemq.priority": "9", "activemq.prefetchSize": "3"})
    producer = clients(broker.port)
    for i in range(5):
        producer.send(queue, f"m{i}")
    assert [m.body for m in high.listener.wait_messages(3)] == ["m0", "m1", "m2"]
    assert [m.body for m in low.listener.wait_messages(2)] == ["m3", "m4"]
    assert high.listener.holds_for(lambda: high.listener.count() == 3, QUIET)


def test_bad_consumer_priority_is_an_error(broker: BrokerProcess) -> None:
    with RawStomp(broker.port) as raw:
        raw.connect()
        raw.send_frame("SUBSCRIBE", {"destination": "/queue/p", "id": "1", "receipt": "r",
                                     "activemq.priority": "-1"})
        error = assert_error_then_closed(raw, "priority -1", None, receipt="r")
        assert "activemq.priority" in error.headers.get("message", "") + error.body.decode()


def test_no_local_topic_subscriber_skips_its_own_connection(
        broker: BrokerProcess, clients: ClientPool) -> None:
    topic = f"/topic/{unique('chat')}"
    me = clients(broker.port)
    me.subscribe(topic, headers={"activemq.noLocal": "true"})
    other = clients(broker.port)
    me.send(topic, "mine")
    other.send(topic, "theirs")
    assert [m.body for m in me.listener.wait_messages(1)] == ["theirs"]
    assert me.listener.holds_for(lambda: me.listener.count() == 1, QUIET)


@pytest.mark.parametrize("store", ["sqlite", "postgresql"])
def test_group_order_and_exactly_once_through_a_sigkill(
        broker_factory: BrokerFactory, clients: ClientPool, request: pytest.FixtureRequest,
        store: str) -> None:
    master, slave = start_pair(broker_factory, ("grp-a", "grp-b"),
                               store_args=store_args(store, request))
    queue = f"/queue/{unique('grpha')}"
    consumers = []  # both there first: the groups spread over them
    for _ in range(2):
        c = clients(master.port)
        c.subscribe(queue, ack="client-individual", headers={"activemq.prefetchSize": "10"})
        consumers.append(c)
    producer = clients(master.port)
    groups = [f"g{k}" for k in range(4)]
    for i in range(200):
        group = groups[i % 4]
        producer.send(queue, f"{group}-{i:03d}", headers={GROUP: group})
    acked: set[str] = set()
    for c in consumers:
        c.listener.wait_messages(10)
        for m in c.listener.snapshot()[:5]:
            c.ack(m)
            acked.add(m.body)
    master.kill()
    slave.wait_serving(timeout=30)
    after = [clients(slave.port) for _ in range(2)]
    for c in after:
        c.subscribe(queue, ack="auto")
    expected = {f"{groups[i % 4]}-{i:03d}" for i in range(200)} - acked
    assert after[0].listener.wait_for(
        lambda: sum(c.listener.count() for c in after) >= len(expected), timeout=60)
    bodies = [m.body for c in after for m in c.listener.snapshot()]
    assert not [b for b, n in collections.Counter(bodies).items() if n > 1]
    assert set(bodies) == expected
    seen_groups: dict[str, int] = {}
    for index, c in enumerate(after):
        for group, got in groups_of(c).items():
            assert seen_groups.setdefault(group, index) == index, f"{group} on two consumers"
            assert got == sorted(got), f"{group} out of order: {got[:10]}"
