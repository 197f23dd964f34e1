"""A durable subscription belongs to the login that created it (issue 16): against real
broker processes and stomp.py, on SQLite and PostgreSQL, including a store made by the
schema before owners were stored, upgraded at start by two nodes at once."""

from __future__ import annotations

from pathlib import Path

import pytest

from amqlite.auth import hash_password
from store import DestinationRow, NewMessage, SubscriptionRow
from tests.helpers.broker_proc import (
    WAIT,
    BrokerFactory,
    BrokerProcess,
    Client,
    ClientPool,
    unique,
    wait_one_serving,
)
from tests.helpers.mgmt import Api
from tests.helpers.poll import poll
from tests.helpers.servers import free_port
from tests.helpers.store import make_v1_store

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

PASSWORDS = {"alice": "alice-Owner-4R7", "bob": "bob-Owner-8W2", "root": "root-Owner-1T5"}
#: No [[authorization]] entry: every login may read and write everything, so only
#: ownership stands between bob and alice's subscription.
USERS = "[users]\n" + "".join(f'{u} = "{hash_password(p)}"\n' for u, p in PASSWORDS.items()) \
    + '[groups]\nadmins = ["root"]\n'
BELONGS = "belongs to another login"


@pytest.fixture(scope="module")
def users_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("owner") / "users.toml"
    path.write_text(USERS)
    return path


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, broker_factory: BrokerFactory) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{broker_factory.data_dir('shared') / 'amqlite.db'}"
    return request.getfixturevalue("pg_url")


def start_args(store_url: str, http: int | None = None) -> list[str]:
    args = ["--store", store_url]
    if store_url.startswith("postgresql"):
        args += ["--locker", store_url]
    return [*args, "--http", f"127.0.0.1:{http}" if http else "off"]


def connect(clients: ClientPool, broker: BrokerProcess, login: str, client_id: str) -> Client:
    return clients(broker.port, username=login, passcode=PASSWORDS[login],
                   headers={"client-id": client_id})


def refused(client: Client, what: str, name: str) -> None:
    """The ERROR that refused ``what`` names the subscription and whose it is not."""
    assert client.listener.wait_for(lambda: bool(client.listener.errors), WAIT), \
        f"{what}: no ERROR"
    text = " ".join(client.listener.error_texts())
    assert name in text and BELONGS in text, f"{what}: ERROR {text!r}"
    assert "'alice'" not in text, f"{what}: the ERROR names the owner: {text!r}"


def bob_is_refused(clients: ClientPool, broker: BrokerProcess, cid: str, topic: str,
                   name: str) -> None:
    """bob, with alice's client-id while she is away, may not reattach, replace or remove
    her subscription (each refusal closes his connection; he comes back for the next)."""
    header = {"activemq.subscriptionName": name}
    bob = connect(clients, broker, "bob", cid)
    bob.conn.subscribe(topic, id=unique("s"), headers={**header, "receipt": unique("r")})
    refused(bob, "reattach", name)
    bob = connect(clients, broker, "bob", cid)
    bob.conn.subscribe(f"/topic/{unique('other')}", id=unique("s"),
                       headers={**header, "receipt": unique("r")})
    refused(bob, "replace", name)
    bob = connect(clients, broker, "bob", cid)
    bob.conn.unsubscribe(unique("s"), headers={**header, "receipt": unique("r")})
    refused(bob, "unsubscribe", name)
    # the durable name spelled the other way is the same subscription
    bob = connect(clients, broker, "bob", cid)
    bob.conn.unsubscribe(unique("s"), headers={"durable-subscription-name": name,
                                               "receipt": unique("r")})
    refused(bob, "unsubscribe (durable-subscription-name)", name)


def alice_gets(clients: ClientPool, broker: BrokerProcess, cid: str, topic: str, name: str,
               bodies: list[str]) -> tuple[Client, str]:
    alice = connect(clients, broker, "alice", cid)
    sub_id = alice.subscribe(topic, headers={"activemq.subscriptionName": name})
    alice.listener.wait_messages(len(bodies))
    assert alice.listener.holds_for(lambda: alice.listener.count() == len(bodies), 0.5)
    assert alice.listener.bodies() == bodies
    return alice, sub_id


def subscriptions(api: Api) -> dict[tuple[str, str], dict]:
    rows = api.ok("GET", "/subscriptions")["subscriptions"]
    return {(s["client_id"], s["name"]): s for s in rows}


def test_only_the_owner_may_reattach_replace_or_remove(
        broker_factory: BrokerFactory, clients: ClientPool, users_path: Path,
        store_url: str) -> None:
    http = free_port()
    broker = broker_factory.start(name="owner", extra_args=start_args(store_url, http),
                                  env={"AMQLITE_USERS_FILE": str(users_path)})
    api = Api(f"http://127.0.0.1:{http}/api/v1", "root", PASSWORDS["root"])
    topic, cid, name = f"/topic/{unique('news')}", unique("alice-cid"), unique("mine")
    header = {"activemq.subscriptionName": name}
    alice = connect(clients, broker, "alice", cid)
    alice.subscribe(topic, headers=header)
    alice.close()

    bob_is_refused(clients, broker, cid, topic, name)
    assert "refused (it belongs to another login)" in broker.log_text()

    # Nothing changed: the subscription is there, alice's, and kept what was sent.
    clients(broker.port, username="bob", passcode=PASSWORDS["bob"]).send(
        topic, "for alice", {"persistent": "true"})
    listed = subscriptions(api)[(cid, name)]
    assert listed["owner"] == "alice" and listed["topic"] == topic
    alice, sub_id = alice_gets(clients, broker, cid, topic, name, ["for alice"])
    # The owner may remove it.
    alice.unsubscribe(sub_id, headers=header)
    poll(lambda: subscriptions(api), lambda subs: (cid, name) not in subs, timeout=WAIT,
         what="alice's subscription removed")

    # An administrator removes anyone's through the management API.
    other = unique("other")
    alice = connect(clients, broker, "alice", cid)
    alice.subscribe(topic, headers={"activemq.subscriptionName": other})
    alice.close()
    status, body = api.delete(f"/subscriptions/{cid}/{other}")
    assert status == 200, body
    assert (cid, other) not in subscriptions(api)


def test_a_v1_store_is_upgraded_at_start_by_two_nodes_at_once(
        broker_factory: BrokerFactory, clients: ClientPool, users_path: Path,
        store_url: str) -> None:
    group = unique("grp")
    topic = DestinationRow(1, f"/topic/{unique('old')}", "topic")
    cid, name = unique("old-cid"), unique("old-sub")
    stored = NewMessage(1, topic.id, "ID:old-1", {}, b"kept across the upgrade",
                        enqueued_at=1, subscriber_ids=(1,))
    make_v1_store(store_url, group, [SubscriptionRow(1, cid, name, topic.id)], topic, [stored])

    env = {"AMQLITE_USERS_FILE": str(users_path)}
    shared = broker_factory.data_dir("nodes")  # the file locker of the SQLite case
    nodes = [broker_factory.new(name=f"up{i}", group=group, data_dir=shared, env=env,
                                extra_args=start_args(store_url)) for i in range(2)]
    for node in nodes:
        node.start()
    master, _ = wait_one_serving(nodes)
    slave = next(n for n in nodes if n is not master)
    poll(slave.log_text, lambda log: "waiting for the lock" in log or not slave.alive,
         timeout=WAIT * 3, what="the other node opened the store and waits as slave")
    assert slave.alive, slave.log_tail()
    logs = [n.log_text() for n in nodes]
    assert sum(log.count("upgrading schema v1 -> v2") for log in logs) == 1, logs
    for log in logs:
        assert "Traceback" not in log and " ERROR " not in log, log

    # The old subscription kept its message; the first login to reattach it owns it now.
    alice, _ = alice_gets(clients, master, cid, topic.name, name, ["kept across the upgrade"])
    assert "had no owner: login 'alice' owns it now" in master.log_text()
    alice.close()
    bob_is_refused(clients, master, cid, topic.name, name)
    # The claim is in the store (committed before alice's RECEIPT): the node taking
    # over knows the owner too.
    master.kill()
    slave.wait_serving()
    bob_is_refused(clients, slave, cid, topic.name, name)
    assert "owns it now" not in slave.log_text()
    alice_gets(clients, slave, cid, topic.name, name, [])
