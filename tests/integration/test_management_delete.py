"""Deleting a destination through the management API and ``amqlite queue delete``, against
real broker processes: it is gone from the store, so a new master after a SIGKILL neither
lists it nor delivers a message of it (SQLite with a file-lock pair, and PostgreSQL); it is
refused while it has consumers; a SEND afterwards creates it again, from zero."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers.broker_proc import BrokerFactory, BrokerProcess, Client, ClientPool, unique
from tests.helpers.cluster import amqlite
from tests.helpers.mgmt import Api, start_with_http, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

#: How long a consumer must stay without a message it must never get, after the
#: sentinel sent behind it arrived (only a late duplicate could still come).
QUIET = 0.5


def _node(factory: BrokerFactory, name: str, data: Path | None, store: str | None,
          wait: bool = True) -> tuple[BrokerProcess, Api]:
    args = ["--store", store, "--locker", store] if store is not None else []
    broker = start_with_http(factory, name, data_dir=data, extra_args=args, wait=wait)
    return broker, Api(broker.http)  # type: ignore[attr-defined]


def _names(api: Api) -> set[str]:
    return {d["name"] for d in api.ok("GET", "/api/v1/destinations")["destinations"]}


def _fill(api: Api, producer: Client, dest: str, n: int) -> None:
    for i in range(n):
        producer.send(dest, f"{dest}-{i}")
    wait_until(lambda: (d := api.destination(dest)) and d["waiting"] == n,
               what=f"{n} waiting in {dest}")


def _only_new_messages(clients: ClientPool, port: int, dest: str) -> None:
    """A consumer of ``dest`` gets the sentinel sent now and nothing older: a message
    of the deleted destination would have a lower id and come first."""
    consumer = clients(port)
    consumer.subscribe(dest)
    sentinel = f"after-{unique('s')}"
    clients(port).send(dest, sentinel)
    [first] = consumer.listener.wait_messages(1)
    assert first.body == sentinel
    assert consumer.listener.holds_for(lambda: consumer.listener.count() == 1, QUIET)


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_deleted_destination_stays_deleted_after_a_failover(
        backend: str, broker_factory: BrokerFactory, clients: ClientPool,
        request: pytest.FixtureRequest) -> None:
    if backend == "sqlite":  # a file-lock pair on one data directory
        shared = broker_factory.data_dir("shared")
        master, api = _node(broker_factory, "del-a", shared, None)
        slave, slave_api = _node(broker_factory, "del-b", shared, None, wait=False)
    else:
        pg_url = request.getfixturevalue("pg_url")
        master, api = _node(broker_factory, "del-a", None, pg_url)
        slave, slave_api = _node(broker_factory, "del-b", None, pg_url, wait=False)
    by_api, by_cli = f"/queue/{unique('del-api')}", f"/queue/{unique('del-cli')}"
    kept, topic = f"/queue/{unique('kept')}", f"/topic/{unique('del-topic')}"
    client_id, sub_name = unique("del-client"), unique("del-sub")
    durable = clients(master.port, headers={"client-id": client_id})
    durable.subscribe(topic, headers={"activemq.subscriptionName": sub_name})
    durable.close()
    producer = clients(master.port)
    _fill(api, producer, by_api, 3)
    _fill(api, producer, by_cli, 2)
    _fill(api, producer, kept, 1)
    producer.send(topic, "owed-1")
    producer.send(topic, "owed-2")
    wait_until(lambda: any(s["pending"] == 2 for s in
                           api.ok("GET", "/api/v1/subscriptions")["subscriptions"]
                           if s["client_id"] == client_id), what="2 owed to the durable")

    assert api.ok("DELETE", f"/api/v1/destinations{by_api}") == {
        "destination": by_api, "deleted": 1, "purged": 3, "messages": 3, "subscriptions": 0}
    out = amqlite("queue", "delete", by_cli, "--url", api.base)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert f"deleted {by_cli}: 2 messages removed" in out.stdout
    result = api.ok("DELETE", f"/api/v1/destinations{topic}")
    assert result == {"destination": topic, "deleted": 1, "purged": 0, "messages": 2,
                      "subscriptions": 1}
    for name in (by_api, by_cli, topic):
        assert re.search(rf"delete {re.escape(name)} by .*\"deleted\": 1", master.log_text())
    gone = {by_api, by_cli, topic}
    assert not gone & _names(api)
    metrics = api.get("/metrics")[1]
    assert not any(name in metrics for name in gone)

    master.kill()
    slave.wait_serving()
    wait_until(lambda: slave_api.get("/readyz")[0] == 200, what="the new master ready")
    names = _names(slave_api)
    assert kept in names and not gone & names
    assert slave_api.destination(kept)["waiting"] == 1  # type: ignore[index]
    assert all(s["client_id"] != client_id
               for s in slave_api.ok("GET", "/api/v1/subscriptions")["subscriptions"])
    for dest in (by_api, by_cli):
        _only_new_messages(clients, slave.port, dest)
    # The durable subscription is gone too: subscribing by its name starts afresh.
    again = clients(slave.port, headers={"client-id": client_id})
    again.subscribe(topic, headers={"activemq.subscriptionName": sub_name})
    clients(slave.port).send(topic, "new")
    [first] = again.listener.wait_messages(1)
    assert first.body == "new"
    assert again.listener.holds_for(lambda: again.listener.count() == 1, QUIET)


@pytest.fixture
def single(broker_factory: BrokerFactory) -> tuple[BrokerProcess, Api]:
    return _node(broker_factory, "del-one", None, None)


def test_delete_is_refused_while_the_destination_has_consumers(
        single: tuple[BrokerProcess, Api], clients: ClientPool) -> None:
    broker, api = single
    queue, topic = f"/queue/{unique('busy')}", f"/topic/{unique('busy-topic')}"
    _fill(api, clients(broker.port), queue, 2)
    consumer = clients(broker.port)
    sub_id = consumer.subscribe(queue, ack="client")
    consumer.listener.wait_messages(2)
    status, body = api.delete(f"/api/v1/destinations{queue}")
    assert status == 409 and "1 consumers" in body["error"]
    # Nothing changed: both messages are still owed to the consumer, the queue listed.
    assert api.destination(queue)["in_flight"] == 2  # type: ignore[index]
    listener = clients(broker.port)
    listener.subscribe(topic)
    assert api.delete(f"/api/v1/destinations{topic}")[0] == 409
    consumer.unsubscribe(sub_id)
    listener.close()
    result = api.ok("DELETE", f"/api/v1/destinations{queue}")
    assert result["messages"] == 2 and result["deleted"] == 1
    assert queue not in _names(api)
    # A topic with no row, no message and no subscriber left is freed from memory when its
    # last subscriber leaves (issue 23 item 8): there is nothing left to delete.
    assert not {queue, topic} & _names(api)
    assert api.delete(f"/api/v1/destinations{queue}")[0] == 404
    assert api.delete(f"/api/v1/destinations{topic}")[0] == 404


def test_a_send_after_the_delete_creates_it_again_from_zero(
        single: tuple[BrokerProcess, Api], clients: ClientPool) -> None:
    broker, api = single
    queue = f"/queue/{unique('again')}"
    _fill(api, clients(broker.port), queue, 3)
    assert api.ok("DELETE", f"/api/v1/destinations{queue}")["messages"] == 3
    assert queue not in api.get("/metrics")[1]
    clients(broker.port).send(queue, "fresh")
    row = wait_until(lambda: (d := api.destination(queue)) and d["waiting"] == 1 and d,
                     what="the queue created again")
    assert row["enqueued"] == 1  # counted from zero, not from before the delete
    consumer = clients(broker.port)
    consumer.subscribe(queue)
    [first] = consumer.listener.wait_messages(1)
    assert first.body == "fresh"
    assert consumer.listener.holds_for(lambda: consumer.listener.count() == 1, QUIET)
