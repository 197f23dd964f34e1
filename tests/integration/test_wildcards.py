"""Issue 21, wildcards: ActiveMQ's destination wildcards on SUBSCRIBE (``.`` separates,
``*`` is one element, ``>`` the rest), against a real broker process with stomp.py.

The MESSAGE's ``destination`` is the concrete one; a durable wildcard subscription keeps
what it is owed while offline; a SEND to a pattern is an ERROR; authorization is checked
per concrete destination, including topics created after the SUBSCRIBE.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from amqlite.auth import hash_password
from tests.helpers.broker_fixtures import store_args
from tests.helpers.broker_proc import (
    WAIT,
    BrokerFactory,
    BrokerProcess,
    ClientPool,
    RawFrame,
    RawStomp,
    assert_error_then_closed,
    start_pair,
    unique,
    wait_receipt,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

#: How long "nothing more arrives" is watched (s).
QUIET = 0.6
PASSWORDS = {"alice": "alice-Wild-7Q2", "root": "root-Wild-5M1"}
RULES = """
[groups]
apps = ["alice"]
ops = ["root"]

[[authorization]]
destination = "/topic/pub.>"
read = ["apps", "ops"]
write = ["ops"]
admin = ["ops"]
auto_create = true

[[authorization]]
destination = "/queue/pub.>"
read = ["apps", "ops"]
write = ["ops"]
admin = ["ops"]
auto_create = true

[[authorization]]
destination = "/queue/priv.>"
read = ["ops"]
write = ["ops"]
admin = ["ops"]
auto_create = true

[[authorization]]
destination = "/topic/priv.>"
read = ["ops"]
write = ["ops"]
admin = ["ops"]
auto_create = true
"""


def said(error: RawFrame) -> str:
    """An ERROR's message header and body, as one text."""
    return error.headers.get("message", "") + " " + error.body.decode(errors="replace")


@pytest.fixture(scope="module")
def broker(module_factory: BrokerFactory) -> BrokerProcess:
    return module_factory.start(name="wildcards")


@pytest.fixture(scope="module")
def secured(module_factory: BrokerFactory, tmp_path_factory: pytest.TempPathFactory
            ) -> BrokerProcess:
    path: Path = tmp_path_factory.mktemp("wild") / "users.toml"
    users = "\n".join(f'{u} = "{hash_password(p)}"' for u, p in PASSWORDS.items())
    path.write_text(f"[users]\n{users}\n{RULES}")
    return module_factory.start(name="wildcards-authz", env={"AMQLITE_USERS_FILE": str(path)})


def test_topic_wildcards_deliver_what_matches_with_the_concrete_destination(
        broker: BrokerProcess, clients: ClientPool) -> None:
    root = unique("PRICE")
    rest = clients(broker.port)
    rest.subscribe(f"/topic/{root}.STOCK.>")
    one = clients(broker.port)
    one.subscribe(f"/topic/{root}.*.IBM")
    producer = clients(broker.port)
    sent = [f"{root}.STOCK.NASDAQ.IBM", f"{root}.STOCK.IBM", f"{root}.BOND.IBM",
            f"{root}.STOCK", f"{root}.BOND.NASDAQ.IBM"]
    for name in sent:
        producer.send(f"/topic/{name}", name)
    got = rest.listener.wait_messages(2)
    assert [m.body for m in got] == [f"{root}.STOCK.NASDAQ.IBM", f"{root}.STOCK.IBM"]
    assert [m.headers["destination"] for m in got] == [f"/topic/{m.body}" for m in got]
    got = one.listener.wait_messages(2)
    assert [m.body for m in got] == [f"{root}.STOCK.IBM", f"{root}.BOND.IBM"]
    assert rest.listener.holds_for(lambda: rest.listener.count() == 2, QUIET)
    assert one.listener.holds_for(lambda: one.listener.count() == 2, QUIET)


def test_durable_wildcard_subscription_keeps_what_it_is_owed_while_offline(
        broker: BrokerProcess, clients: ClientPool) -> None:
    root = unique("orders")
    client_id = unique("cid")
    name = unique("dur")
    durable = {"activemq.subscriptionName": name}
    sub = clients(broker.port, headers={"client-id": client_id})
    sub.subscribe(f"/topic/{root}.>", ack="client-individual", headers=durable)
    sub.close()
    producer = clients(broker.port)
    producer.send(f"/topic/{root}.eu", "eu")
    producer.send(f"/topic/{root}.us.east", "us")
    producer.send(f"/topic/{unique('other')}.eu", "other")
    again = clients(broker.port, headers={"client-id": client_id})
    again.subscribe(f"/topic/{root}.>", ack="client-individual", headers=durable)
    got = again.listener.wait_messages(2)
    assert sorted(m.body for m in got) == ["eu", "us"]
    for m in got:
        again.ack(m)
    assert again.listener.holds_for(lambda: again.listener.count() == 2, QUIET)


@pytest.mark.parametrize("destination", ["/topic/a.>", "/topic/a.*.b", "/queue/a.>"])
def test_send_to_a_wildcard_is_an_error_and_stores_nothing(
        broker: BrokerProcess, clients: ClientPool, destination: str) -> None:
    with RawStomp(broker.port) as raw:
        raw.connect()
        raw.send_frame("SEND", {"destination": destination, "receipt": "r-wild"}, b"x")
        error = assert_error_then_closed(raw, "SEND to a wildcard", None, receipt="r-wild")
        assert "wildcard" in said(error), said(error)
    other = clients(broker.port)  # the broker goes on serving
    other.send(f"/queue/{unique('after')}", "fine")


def test_malformed_pattern_is_an_error_naming_why(broker: BrokerProcess) -> None:
    for destination, needle in (("/topic/a.>.b", "last"), ("/queue/>.a", "last")):
        with RawStomp(broker.port) as raw:
            raw.connect()
            raw.send_frame("SUBSCRIBE", {"destination": destination, "id": "1",
                                         "receipt": "r-sub"})
            error = assert_error_then_closed(raw, f"SUBSCRIBE {destination}", None,
                                             receipt="r-sub")
            assert needle in said(error), said(error)


def test_wildcard_never_delivers_from_a_topic_the_login_may_not_read(
        secured: BrokerProcess, clients: ClientPool) -> None:
    alice = clients(secured.port, username="alice", passcode=PASSWORDS["alice"])
    alice.subscribe("/topic/>")
    root = clients(secured.port, username="root", passcode=PASSWORDS["root"])
    root.subscribe("/topic/>")
    fresh = unique("new")  # created after both SUBSCRIBEs
    for name in (f"pub.{fresh}", f"priv.{fresh}", f"pub.{fresh}.x"):
        root.send(f"/topic/{name}", name)
    got = alice.listener.wait_messages(2)
    assert [m.body for m in got] == [f"pub.{fresh}", f"pub.{fresh}.x"]
    assert root.listener.wait_messages(3, timeout=WAIT)
    assert alice.listener.holds_for(lambda: alice.listener.count() == 2, QUIET), \
        alice.listener.bodies()
    assert not alice.listener.errors


@pytest.mark.parametrize("version", ["1.1", "1.2"])
def test_queue_wildcard_consumes_from_existing_and_later_queues(
        broker: BrokerProcess, clients: ClientPool, version: str) -> None:
    """``/queue/ROOT.*``: the queues that exist and those created after the SUBSCRIBE;
    ACKs (1.1: subscription + message-id, 1.2: ack id) settle on the right queue."""
    root = unique("orders")
    producer = clients(broker.port)
    producer.send(f"/queue/{root}.eu", "eu-1")
    producer.send(f"/queue/{root}.eu.west", "deeper")  # two elements: '*' is one
    consumer = clients(broker.port, version=version)
    consumer.subscribe(f"/queue/{root}.*", ack="client-individual")
    producer.send(f"/queue/{root}.us", "us-1")  # a queue created after the SUBSCRIBE
    got = consumer.listener.wait_messages(2)
    assert sorted(m.body for m in got) == ["eu-1", "us-1"]
    assert {m.headers["destination"] for m in got} == {f"/queue/{root}.eu",
                                                      f"/queue/{root}.us"}
    for m in got:
        if version == "1.2":
            consumer.ack(m)
        else:  # STOMP 1.1 names the subscription and the message-id
            receipt = unique("r-ack")
            consumer.conn.ack(m.headers["message-id"], m.headers["subscription"],
                              receipt=receipt)
            wait_receipt(consumer.listener, receipt, WAIT, "ACK")
    assert consumer.listener.holds_for(lambda: consumer.listener.count() == 2, QUIET)
    consumer.close()
    after = clients(broker.port)
    after.subscribe(f"/queue/{root}.>")
    assert [m.body for m in after.listener.wait_messages(1)] == ["deeper"]
    assert after.listener.holds_for(lambda: after.listener.count() == 1, QUIET), \
        "an acknowledged message came back"


def test_queue_wildcard_returns_what_it_did_not_ack_when_it_leaves(
        broker: BrokerProcess, clients: ClientPool) -> None:
    root = unique("jobs")
    producer = clients(broker.port)
    for name in ("a", "b"):
        producer.send(f"/queue/{root}.{name}", name)
    consumer = clients(broker.port)
    sub = consumer.subscribe(f"/queue/{root}.*", ack="client-individual")
    consumer.listener.wait_messages(2)
    consumer.unsubscribe(sub)
    again = clients(broker.port)
    again.subscribe(f"/queue/{root}.*")
    got = again.listener.wait_messages(2)
    assert sorted(m.body for m in got) == ["a", "b"]
    assert all(m.headers.get("redelivered") == "true" for m in got)


def test_queue_wildcard_joins_only_queues_the_login_may_read(
        secured: BrokerProcess, clients: ClientPool) -> None:
    root = clients(secured.port, username="root", passcode=PASSWORDS["root"])
    fresh = unique("q")
    root.send(f"/queue/pub.{fresh}", "public")
    alice = clients(secured.port, username="alice", passcode=PASSWORDS["alice"])
    alice.subscribe("/queue/>")
    root.send(f"/queue/priv.{fresh}", "private")  # created after the SUBSCRIBE
    root.send(f"/queue/pub.{fresh}.late", "public-late")
    got = alice.listener.wait_messages(2)
    assert sorted(m.body for m in got) == ["public", "public-late"]
    assert alice.listener.holds_for(lambda: alice.listener.count() == 2, QUIET)
    reader = clients(secured.port, username="root", passcode=PASSWORDS["root"])
    reader.subscribe(f"/queue/priv.{fresh}")
    assert [m.body for m in reader.listener.wait_messages(1)] == ["private"]


@pytest.mark.parametrize("store", ["sqlite", "postgresql"])
def test_durable_wildcard_subscription_survives_the_masters_sigkill(
        broker_factory: BrokerFactory, clients: ClientPool, request: pytest.FixtureRequest,
        store: str) -> None:
    """Its pattern is in the store: the new master stores for it what matches, and what
    was receipted before the crash arrives once."""
    master, slave = start_pair(broker_factory, ("wild-a", "wild-b"),
                               store_args=store_args(store, request))
    root, client_id, name = unique("ev"), unique("cid"), unique("dur")
    durable = {"activemq.subscriptionName": name}
    sub = clients(master.port, headers={"client-id": client_id})
    sub.subscribe(f"/topic/{root}.>", ack="client-individual", headers=durable)
    sub.close()
    producer = clients(master.port)
    for i in range(50):
        producer.send(f"/topic/{root}.{'ab'[i % 2]}", f"before-{i}")
    master.kill()
    slave.wait_serving(timeout=30)
    clients(slave.port).send(f"/topic/{root}.c.d", "after")
    again = clients(slave.port, headers={"client-id": client_id})
    again.subscribe(f"/topic/{root}.>", headers=durable)
    got = [m.body for m in again.listener.wait_messages(51)]
    assert sorted(got) == sorted([f"before-{i}" for i in range(50)] + ["after"])
    assert again.listener.holds_for(lambda: again.listener.count() == 51, QUIET)
