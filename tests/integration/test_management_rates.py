"""The console's data over HTTP, against real broker processes and stomp.py: the rates
the node samples (``GET /api/v1/rates``, per destination), the send route (``POST
/api/v1/send/...``: the broker's SEND path, CSRF and Origin rules, bad input) and who
sees and may do what with a users file, with and without [[authorization]] entries."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from amqlite.auth import hash_password
from tests.helpers.broker_proc import BrokerFactory, BrokerProcess, ClientPool, unique
from tests.helpers.mgmt import Api, start_with_http, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

PASSWORDS = {"root": "root-pw-4R", "alice": "alice-pw-8T", "carol": "carol-pw-2L"}
POLICY = """
[groups]
admins = ["root"]
ops = ["root"]
apps = ["alice"]
readers = ["carol"]

[[authorization]]
destination = "/queue/orders.>"
read = ["apps", "readers"]
write = ["apps", "ops"]
admin = ["ops"]
auto_create = true

[[authorization]]
destination = "/queue/secret.>"
read = ["ops"]
write = ["ops"]
admin = ["ops"]
"""


@pytest.fixture(scope="module")
def broker(module_factory: BrokerFactory) -> BrokerProcess:
    return start_with_http(module_factory, "rates")


@pytest.fixture
def api(broker: BrokerProcess) -> Api:
    return Api(broker.http)  # type: ignore[attr-defined]


def sampled(api: Api, predicate: Any, what: str) -> dict[str, Any]:
    """Poll /api/v1/rates until ``predicate(data)``; the data."""
    return wait_until(lambda: (d := api.ok("GET", "/api/v1/rates")) and predicate(d) and d,
                      what=what)  # type: ignore[no-any-return]


def test_the_rates_follow_the_broker(broker: BrokerProcess, api: Api,
                                     clients: ClientPool) -> None:
    queue = f"/queue/{unique('rates')}"
    producer = clients(broker.port)
    for i in range(20):
        producer.send(queue, f"m{i}")
    data = sampled(api, lambda d: d["destinations"].get(queue, {}).get("waiting") == 20,
                   "20 waiting in the last sample")
    assert data["interval"] == 2.0 and data["window"] == 600.0 and data["scope"] == "node"
    assert data["memory_limit"] == 256 * 1024 * 1024
    assert len(data["times"]) == len(data["node"]["enqueued"]) <= 300
    assert data["times"] == sorted(data["times"])
    assert any(v and v > 0 for v in data["node"]["enqueued"])
    assert data["node"]["connections"][-1] >= 1
    # a consumer takes them: the queue's own series show it
    consumer = clients(broker.port)
    consumer.subscribe(queue)
    consumer.listener.wait_messages(20)
    path = f"/api/v1/rates{queue}"
    mine = wait_until(lambda: (d := api.ok("GET", path)) and d["series"]["waiting"][-1] == 0
                      and d["series"]["consumers"][-1] == 1 and d, what="the consumer's sample")
    assert mine["destination"] == queue and len(mine["times"]) == len(mine["series"]["waiting"])
    assert 20 in mine["series"]["waiting"]
    assert any(v and v > 0 for v in mine["series"]["delivered"])
    assert any(v and v > 0 for v in mine["series"]["acknowledged"])
    assert api.ok("GET", "/api/v1/destinations/" + queue[1:])["delivered"] == 20
    status, body = api.get(f"/api/v1/rates/queue/{unique('never')}")
    assert status == 404 and "no rates" in body["error"]
    assert api.get("/api/v1/rates/nowhere/x")[0] == 404


def test_send_goes_through_the_send_path(broker: BrokerProcess, api: Api,
                                         clients: ClientPool) -> None:
    queue = f"/queue/{unique('send')}"
    sent = api.ok("POST", f"/api/v1/send{queue}", {"body": "stored first",
                                                   "headers": {"colour": "blue"}})
    assert sent["destination"] == queue and sent["persistent"] is True
    # persistent: in the store before the answer (browse reads the store)
    page = api.ok("GET", f"/api/v1/messages{queue}")
    assert [m["message_id"] for m in page["messages"]] == [sent["message_id"]]
    quick = api.ok("POST", f"/api/v1/send{queue}", {"body": "fleeting", "persistent": False})
    assert quick["persistent"] is False
    consumer = clients(broker.port)
    consumer.subscribe(queue)
    frames = consumer.listener.wait_messages(2)
    assert [f.body for f in frames] == ["stored first", "fleeting"]
    assert frames[0].headers["colour"] == "blue"
    assert frames[0].headers["message-id"] == sent["message_id"]
    assert api.destination(queue)["enqueued"] == 2  # type: ignore[index]
    assert f"send to {queue} by (no login)" in broker.log_text()


@pytest.mark.parametrize("body, reason", [
    ({"body": 7}, '"body" must be a string'),
    ({"headers": ["a"]}, '"headers" must be an object'),
    ({"headers": {"destination": "/queue/other"}}, "'destination' may not be set"),
    ({"headers": {"bad:name": "x"}}, "no ':' in a name"),
    ({"headers": {"x": "two\nlines"}}, "no line break"),
    ({"persistent": "yes"}, '"persistent" must be true or false'),
    ({"headers": {"priority": "high"}}, "priority"),
    ({"headers": False}, '"headers" must be an object'),
    ({"body": "\ud800"}, "lone surrogate"),
    ({"headers": {"x": "\udc00"}}, "lone surrogate"),
])
def test_send_refuses_bad_input(api: Api, body: dict[str, Any], reason: str) -> None:
    status, answer = api.post(f"/api/v1/send/queue/{unique('bad')}", body)
    assert status == 400 and reason in answer["error"], answer


def test_send_needs_the_csrf_header_and_this_origin(api: Api) -> None:
    path = f"/api/v1/send/queue/{unique('csrf')}"
    status, body, _ = api.call("POST", path, {"body": "x"}, csrf=False,
                               headers={"Origin": api.base})
    assert status == 403 and "X-Requested-By" in body["error"]
    status, body = api.post(path, {"body": "x"}, headers={"Origin": "http://evil.example"})
    assert status == 403 and "cross-origin" in body["error"]
    assert api.get("/api/v1/send/queue/x")[0] == 405
    assert api.post("/api/v1/send/nowhere/x", {"body": "x"})[0] == 404
    status, body, _ = api.call("POST", path, raw=b"{")
    assert status == 400 and "not valid JSON" in body["error"]


def users(tmp_path: Path, rules: str) -> Path:
    path = tmp_path / "users.toml"
    lines = "\n".join(f'{u} = "{hash_password(pw)}"' for u, pw in PASSWORDS.items())
    path.write_text(f"[users]\n{lines}\n{rules}")
    return path


def login(broker: BrokerProcess, who: str) -> Api:
    return Api(broker.http, who, PASSWORDS[who])  # type: ignore[attr-defined]


def test_with_authorization_a_login_sees_and_sends_what_it_may(
        broker_factory: BrokerFactory, tmp_path: Path, clients: ClientPool) -> None:
    broker = start_with_http(broker_factory, "rates-authz", users(tmp_path, POLICY))
    root, alice, carol = (login(broker, u) for u in ("root", "alice", "carol"))
    orders, secret = f"/queue/orders.{unique('o')}", f"/queue/secret.{unique('s')}"
    assert alice.ok("POST", f"/api/v1/send{orders}", {"body": "o"})["persistent"] is True
    assert root.ok("POST", f"/api/v1/send{secret}", {"body": "s"})
    status, body = carol.post(f"/api/v1/send{orders}", {"body": "x"})  # read, not write
    assert status == 403 and "write" in body["error"]
    status, body = alice.post(f"/api/v1/send{secret}", {"body": "x"})
    assert status == 403 and "write" in body["error"]
    status, body = alice.post(f"/api/v1/send/queue/{unique('elsewhere')}", {"body": "x"})
    assert status == 403
    assert Api(broker.http).post(f"/api/v1/send{orders}", {"body": "x"})[0] == 401  # type: ignore[attr-defined]

    everything = sampled(root, lambda d: secret in d["destinations"]
                         and orders in d["destinations"], "both queues sampled")
    assert everything["scope"] == "node"
    seen = carol.ok("GET", "/api/v1/rates")
    assert seen["scope"] == "readable"
    assert orders in seen["destinations"] and secret not in seen["destinations"]
    assert seen["node"]["waiting"][-1] == seen["destinations"][orders]["waiting"] == 1
    assert carol.get(f"/api/v1/rates{orders}")[0] == 200
    status, body = carol.get(f"/api/v1/rates{secret}")
    assert status == 403 and "read" in body["error"]
    consumer = clients(broker.port, username="alice", passcode=PASSWORDS["alice"])
    consumer.subscribe(orders)
    assert [f.body for f in consumer.listener.wait_messages(1)] == ["o"]


def test_without_authorization_entries_sending_needs_an_administrator(
        broker_factory: BrokerFactory, tmp_path: Path) -> None:
    broker = start_with_http(broker_factory, "rates-admins", users(tmp_path, POLICY.split(
        "[[authorization]]")[0]))
    queue = f"/queue/{unique('admins')}"
    status, body = login(broker, "alice").post(f"/api/v1/send{queue}", {"body": "x"})
    assert status == 403 and "not an administrator" in body["error"]
    assert login(broker, "root").ok("POST", f"/api/v1/send{queue}", {"body": "x"})
    assert login(broker, "alice").get("/api/v1/rates")[0] == 200  # reads: every login


def test_the_group_names_the_master_and_each_heartbeat_age(broker: BrokerProcess,
                                                           api: Api) -> None:
    group = wait_until(lambda: (g := api.ok("GET", "/api/v1/group"))["master"] and g,
                       what="the master in the registry")
    assert group["master"] == "rates"
    [me] = [n for n in group["nodes"] if n["name"] == "rates"]
    assert me["stale"] is False and me["role"] == "master"
    # heartbeats every 0.5 s; a loaded machine may be late, never by the 2 s that is stale
    assert 0 <= me["heartbeat_age_ms"] < 2000
