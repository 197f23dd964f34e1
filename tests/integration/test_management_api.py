"""The management HTTP API against a real broker process (SQLite): health, metrics, the
JSON reads, every action, and bad input. Each test uses its own destinations."""

from __future__ import annotations

import re
import socket

import pytest

from tests.helpers.broker_proc import (
    HOST,
    BrokerFactory,
    BrokerProcess,
    ClientPool,
    send_with_receipt,
    unique,
)
from tests.helpers.mgmt import Api, start_with_http, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


@pytest.fixture(scope="module")
def broker(module_factory: BrokerFactory) -> BrokerProcess:
    """max_redeliveries=0: the first NACK dead-letters (for the retry test)."""
    return start_with_http(module_factory, "mgmt", env={"AMQLITE_MAX_REDELIVERIES": "0"})


@pytest.fixture
def api(broker: BrokerProcess) -> Api:
    return Api(broker.http)  # type: ignore[attr-defined]


def _path(dest: str) -> str:
    return dest.lstrip("/")  # "/queue/x" -> "queue/x"


def _waiting(api: Api, dest: str, n: int) -> dict:
    return wait_until(lambda: (d := api.destination(dest)) and d["waiting"] == n and d,
                      what=f"{dest} waiting == {n}")


def test_healthz_and_readyz_on_the_master(api: Api) -> None:
    """A serving master is healthy and ready, and says so in JSON."""
    status, body = api.get("/healthz")
    assert status == 200 and body["status"] == "ok" and body["role"] == "master"
    status, body = api.get("/readyz")
    assert status == 200 and body == {"ready": True, "role": "master", "name": "mgmt",
                                      "epoch": body["epoch"]}
    assert body["epoch"] >= 1


def test_node_and_group_show_this_node_with_its_http_url(api: Api, broker: BrokerProcess
                                                         ) -> None:
    """The registry publishes each node's management URL next to its STOMP URI."""
    node = api.ok("GET", "/api/v1/node")
    assert node["role"] == "master" and node["ready"] and node["http"] == broker.http
    # The node announces itself as slave before it takes the lock, then as master.
    def master_row() -> dict | None:
        rows = [n for n in api.ok("GET", "/api/v1/group")["nodes"] if n["name"] == "mgmt"]
        return rows[0] if rows and rows[0]["role"] == "master" else None

    me = wait_until(master_row, what="registry row as master")
    assert me["http"] == broker.http
    assert me["services"] == [f"tcp://127.0.0.1:{broker.port}"]  # no http:// among them
    assert me["role"] == "master" and me["heartbeat_at"] > 0


def test_metrics_in_prometheus_format(api: Api, broker: BrokerProcess,
                                      clients: ClientPool) -> None:
    """Depth, consumers, totals and node gauges, labelled by destination."""
    dest = f"/queue/{unique('metrics')}"
    producer = clients(broker.port)
    for i in range(3):
        producer.send(dest, f"m{i}")
    other = f"/queue/{unique('metrics-consumed')}"
    consumer = clients(broker.port)
    consumer.subscribe(other)
    producer.send(other, "x")
    consumer.listener.wait_messages(1)

    def scrape() -> str | None:
        status, text = api.get("/metrics")
        assert status == 200
        line = f'amqlite_destination_messages{{destination="{dest}"}} 3.0'
        return text if line in text else None

    text = wait_until(scrape, what="depth 3 in /metrics")
    assert f'amqlite_messages_enqueued_total{{destination="{dest}"}} 3.0' in text
    assert f'amqlite_messages_dequeued_total{{destination="{other}"}} 1.0' in text
    assert f'amqlite_destination_consumers{{destination="{other}"}} 1.0' in text
    assert "amqlite_node_master 1.0" in text
    assert re.search(r"^amqlite_group_epoch [1-9]", text, re.M)
    assert re.search(r"^amqlite_connections [1-9]", text, re.M)
    assert "amqlite_takeovers_total 1.0" in text
    assert re.search(r"^amqlite_commit_duration_seconds_count [1-9]", text, re.M)
    assert re.search(r"^amqlite_receipt_latency_seconds_count [1-9]", text, re.M)
    assert "amqlite_store_errors_total 0.0" in text


def test_a_new_queue_lists_its_first_message_at_once(api: Api, broker: BrokerProcess,
                                                    clients: ClientPool) -> None:
    """The stored depths are cached for a second; a queue made within that second must
    not be listed with the cache's "nothing stored" (a CI run: `queue list` right after
    `produce` said waiting 0). Its first message is listed as soon as it is receipted."""
    api.ok("GET", "/api/v1/destinations")  # the cache is fresh: read just now
    dest = f"/queue/{unique('fresh')}"
    send_with_receipt(clients(broker.port).conn, dest, "first", {"persistent": "true"})
    [row] = [r for r in api.ok("GET", "/api/v1/destinations")["destinations"]
             if r["name"] == dest]
    assert row["waiting"] == 1, row


def test_browse_pages_by_id_without_consuming(api: Api, broker: BrokerProcess,
                                              clients: ClientPool) -> None:
    dest = f"/queue/{unique('browse')}"
    producer = clients(broker.port)
    for i in range(5):
        producer.send(dest, f"body-{i}", {"x-n": str(i)})
    row = _waiting(api, dest, 5)
    assert row["kind"] == "queue" and row["in_flight"] == 0 and row["enqueued"] == 5

    page = api.ok("GET", f"/api/v1/messages/{_path(dest)}?limit=2")
    assert [m["body"] for m in page["messages"]] == ["body-0", "body-1"]
    assert page["messages"][0]["headers"]["x-n"] == "0"
    rest = api.ok("GET", f"/api/v1/messages/{_path(dest)}?after={page['next_after']}&limit=10")
    assert [m["body"] for m in rest["messages"]] == ["body-2", "body-3", "body-4"]
    assert rest["next_after"] is None
    one = api.ok("GET", f"/api/v1/message/{rest['messages'][0]['id']}")
    assert one["body"] == "body-2" and one["destination"] == dest and one["size"] == 6

    consumer = clients(broker.port)  # nothing was consumed by browsing
    consumer.subscribe(dest)
    assert sorted(m.body for m in consumer.listener.wait_messages(5)) == [
        f"body-{i}" for i in range(5)]


def test_purge_removes_waiting_messages_and_keeps_in_flight(api: Api, broker: BrokerProcess,
                                                           clients: ClientPool) -> None:
    """Purge acks every waiting message in one fenced write; a delivered, unacked one stays
    with its consumer (its ACK settles it) and nothing purged is delivered afterwards."""
    dest = f"/queue/{unique('purge')}"
    producer = clients(broker.port)
    for i in range(4):
        producer.send(dest, f"p{i}")
    consumer = clients(broker.port)
    consumer.subscribe(dest, ack="client-individual", headers={"activemq.prefetchSize": "1"})
    [held] = consumer.listener.wait_messages(1)
    _waiting(api, dest, 3)

    result = api.ok("POST", f"/api/v1/purge/{_path(dest)}")
    assert result == {"destination": dest, "purged": 3, "in_flight_kept": 1}
    row = _waiting(api, dest, 0)
    assert row["in_flight"] == 1
    consumer.ack(held)
    assert consumer.listener.holds_for(lambda: consumer.listener.count() == 1, 0.5)
    assert api.ok("GET", f"/api/v1/messages/{_path(dest)}")["messages"] == []
    assert "purge " + dest in broker.log_text()  # logged, with who asked


def test_move_some_messages_and_delete_one(api: Api, broker: BrokerProcess,
                                          clients: ClientPool) -> None:
    src, dst = f"/queue/{unique('move-src')}", f"/queue/{unique('move-dst')}"
    producer = clients(broker.port)
    for i in range(4):
        producer.send(src, f"mv{i}")
    _waiting(api, src, 4)
    ids = [m["id"] for m in api.ok("GET", f"/api/v1/messages/{_path(src)}")["messages"]]
    moved = api.ok("POST", f"/api/v1/move/{_path(src)}", {"to": dst, "ids": ids[:2]})
    assert moved["moved"] == 2 and moved["target"] == dst
    deleted = api.ok("DELETE", f"/api/v1/message/{ids[2]}")
    assert deleted == {"destination": src, "deleted": 1, "id": ids[2]}
    _waiting(api, src, 1)
    _waiting(api, dst, 2)
    consumer = clients(broker.port)
    consumer.subscribe(dst)
    assert sorted(m.body for m in consumer.listener.wait_messages(2)) == ["mv0", "mv1"]
    assert api.get(f"/api/v1/message/{ids[2]}")[0] == 404


def test_move_all(api: Api, broker: BrokerProcess, clients: ClientPool) -> None:
    src, dst = f"/queue/{unique('moveall-src')}", f"/queue/{unique('moveall-dst')}"
    producer = clients(broker.port)
    for i in range(3):
        producer.send(src, f"a{i}")
    _waiting(api, src, 3)
    assert api.ok("POST", f"/api/v1/move/{_path(src)}", {"to": dst})["moved"] == 3
    _waiting(api, src, 0)
    _waiting(api, dst, 3)


def test_retry_dead_letters_to_their_original_queue(api: Api, broker: BrokerProcess,
                                                   clients: ClientPool) -> None:
    dest = f"/queue/{unique('retry')}"
    consumer = clients(broker.port)
    consumer.subscribe(dest, ack="client-individual")
    clients(broker.port).send(dest, "poison")
    [msg] = consumer.listener.wait_messages(1)
    consumer.nack(msg)  # max_redeliveries = 0: straight to the DLQ
    consumer.unsubscribe(consumer.subscriptions[0])

    def mine() -> list[int]:
        page = api.ok("GET", "/api/v1/messages/queue/DLQ?limit=500")["messages"]
        return [m["id"] for m in page if m["headers"].get("original-destination") == dest]

    ids = wait_until(mine, what="the dead letter in /queue/DLQ")
    result = api.ok("POST", "/api/v1/retry/queue/DLQ", {"ids": ids})
    assert result["moved"] == 1 and result["targets"] == {dest: 1}
    again = clients(broker.port)
    again.subscribe(dest)
    [back] = again.listener.wait_messages(1)
    assert back.body == "poison" and "original-destination" not in back.headers
    assert mine() == []


def test_connections_list_and_close(api: Api, broker: BrokerProcess,
                                    clients: ClientPool) -> None:
    client_id = unique("conn")
    client = clients(broker.port, headers={"client-id": client_id})
    dest = f"/queue/{unique('conn')}"
    client.subscribe(dest, ack="client")
    conns = api.ok("GET", "/api/v1/connections")["connections"]
    [mine] = [c for c in conns if c["client_id"] == client_id]
    assert mine["version"] == "1.2" and mine["connected_since"] > 0
    assert mine["subscriptions"][0]["destination"] == dest and mine["unacked"] == 0
    result = api.ok("DELETE", f"/api/v1/connections/{mine['address']}")
    assert result == {"closed": 1, "address": mine["address"]}
    assert client.listener.wait_for(lambda: client.listener.disconnected)
    # said once: no "closed by an administrator closed by an administrator" (issue 27)
    texts = [t for t in client.listener.error_texts() if "closed by an administrator" in t]
    assert texts and all(t.count("administrator") == 1 for t in texts), texts
    wait_until(lambda: all(c["client_id"] != client_id
                           for c in api.ok("GET", "/api/v1/connections")["connections"]),
               what="the closed connection to leave the list")


def test_connections_list_with_a_socket_still_logging_in(api: Api, broker: BrokerProcess,
                                                        clients: ClientPool) -> None:
    """A socket that has not sent CONNECT yet (no connected_since) is listed beside
    connected clients: sorting by connection time must not fail on it."""
    clients(broker.port)
    with socket.create_connection((HOST, broker.port), timeout=10) as raw:
        host, port = raw.getsockname()[:2]
        address = f"{host}:{port}"
        conns = wait_until(
            lambda: (cs := api.ok("GET", "/api/v1/connections")["connections"])
            and any(c["address"] == address for c in cs) and cs,
            what="the raw socket in the connection list")
        [pending] = [c for c in conns if c["address"] == address]
        assert pending["connected"] is False and pending["connected_since"] is None
        assert any(c["connected"] for c in conns)


def test_durable_subscriptions_listed_offline_and_removed(api: Api, broker: BrokerProcess,
                                                         clients: ClientPool) -> None:
    client_id, name = unique("dur-client"), unique("dur")
    topic = f"/topic/{unique('dur-topic')}"
    sub = clients(broker.port, headers={"client-id": client_id})
    sub_id = sub.subscribe(topic, headers={"activemq.subscriptionName": name})
    sub.close()
    producer = clients(broker.port)
    producer.send(topic, "t1")
    producer.send(topic, "t2")

    def listed() -> dict | None:
        subs = api.ok("GET", "/api/v1/subscriptions")["subscriptions"]
        return next((s for s in subs if s["client_id"] == client_id and s["pending"] == 2),
                    None)

    row = wait_until(listed, what="the offline durable subscription with 2 pending")
    # no users file: no login owns it
    assert row == {"client_id": client_id, "name": name, "topic": topic, "pending": 2,
                   "owner": None, "online": False}
    result = api.ok("DELETE", f"/api/v1/subscriptions/{client_id}/{name}")
    assert result["removed"] == 1 and result["topic"] == topic
    assert all(s["client_id"] != client_id
               for s in api.ok("GET", "/api/v1/subscriptions")["subscriptions"])
    assert api.delete(f"/api/v1/subscriptions/{client_id}/{name}")[0] == 404
    del sub_id


def test_bad_input_is_a_json_error_never_a_traceback(api: Api) -> None:
    status, body = api.get("/api/v1/destinations/queue/does-not-exist")
    assert status == 404 and "no destination /queue/does-not-exist" in body["error"]
    assert api.post("/api/v1/purge/queue/does-not-exist")[0] == 404
    assert api.get("/api/v1/messages/queue/does-not-exist")[0] == 404
    status, body, _ = api.call("POST", "/api/v1/move/queue/x", raw=b"{not json",
                               headers={"Content-Type": "application/json"})
    assert status == 400 and "not valid JSON" in body["error"]
    status, body = api.post("/api/v1/move/queue/x", {"to": "/queue/y", "ids": ["a"]})
    assert status == 400 and "ids" in body["error"]
    status, body = api.post("/api/v1/move/queue/x", {"ids": [1]})
    assert status == 400 and '"to"' in body["error"]
    status, body = api.get("/api/v1/messages/queue/x?limit=banana")
    assert status == 400
    assert api.get("/api/v1/message/123456789")[0] == 404
    assert api.get("/api/v1/message/abc")[0] == 400
    status, body = api.get("/api/v1/nothing-here")
    assert status == 404 and "error" in body
    status, body = api.post("/api/v1/purge/queue/x", csrf=False)
    assert status == 403 and "X-Requested-By" in body["error"]
    status, body = api.post("/api/v1/purge/queue/x",
                            headers={"Origin": "http://evil.example"})
    assert status == 403 and "cross-origin" in body["error"]
    assert api.get("/api/v1/purge/queue/x")[0] == 405  # actions are never GET
    assert api.post("/api/v1/move/queue/x", {"to": "/topic/t"})[0] in (400, 404)
