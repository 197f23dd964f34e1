"""The management listener as part of a node's life: login and administrators, a slave
that answers health/role/metrics and points at the master, two nodes with default HTTP
settings on one machine, ``off``, and an action on PostgreSQL."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from amqlite.auth import hash_password
from tests.helpers.broker_proc import BrokerFactory, BrokerProcess, ClientPool, unique
from tests.helpers.mgmt import Api, start_with_http, wait_until
from tests.helpers.servers import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

URL_IN_LOG = re.compile(r"management API on (http://[0-9.]+:\d+)")


def _http_url(broker: BrokerProcess) -> str:
    """The URL the broker logged (it picks the port itself without --http)."""
    found = wait_until(lambda: URL_IN_LOG.search(broker.log_text()), what="management URL")
    return found.group(1)


def test_login_required_and_actions_need_an_administrator(broker_factory: BrokerFactory,
                                                          tmp_path: Path,
                                                          clients: ClientPool) -> None:
    users = tmp_path / "users.toml"
    users.write_text(
        "[users]\n"
        f'alice = "{hash_password("alice-pw")}"\n'
        f'bob = "{hash_password("bob-pw")}"\n'
        "[groups]\n"
        'admins = ["alice"]\n')
    broker = start_with_http(broker_factory, "authn", users)
    base = broker.http  # type: ignore[attr-defined]

    assert Api(base).get("/healthz")[0] == 200  # health checks carry no credentials
    status, body, headers = Api(base).call("GET", "/api/v1/destinations")
    assert status == 401 and headers.get("WWW-Authenticate", "").startswith("Basic")
    assert Api(base, "alice", "wrong").get("/api/v1/destinations")[0] == 401
    assert Api(base, "nobody", "alice-pw").get("/metrics")[0] == 401
    bob, alice = Api(base, "bob", "bob-pw"), Api(base, "alice", "alice-pw")
    assert bob.get("/api/v1/destinations")[0] == 200
    assert bob.get("/metrics")[0] == 403  # every destination's depth: administrators
    assert alice.get("/metrics")[0] == 200

    dest = f"/queue/{unique('auth')}"
    clients(broker.port, username="alice", passcode="alice-pw").send(dest, "x")
    wait_until(lambda: (d := alice.destination(dest)) and d["waiting"] == 1,
               what="the message")
    status, body = bob.post(f"/api/v1/purge{dest}")
    assert status == 403 and "not an administrator" in body["error"]
    assert alice.ok("POST", f"/api/v1/purge{dest}")["purged"] == 1
    assert re.search(rf"purge {re.escape(dest)} by alice from 127\.0\.0\.1",
                     broker.log_text())


def test_a_slave_serves_health_role_and_metrics_and_names_the_master(
        broker_factory: BrokerFactory) -> None:
    data = broker_factory.data_dir("shared")
    h1, h2 = free_port(), free_port()
    master = broker_factory.start(name="m1", data_dir=data,
                                  extra_args=["--http", f"127.0.0.1:{h1}"])
    slave = broker_factory.start(name="s1", data_dir=data, wait=False,
                                 extra_args=["--http", f"127.0.0.1:{h2}"])
    api = Api(f"http://127.0.0.1:{h2}")
    wait_until(api.up, what="the slave's listener")
    assert api.get("/healthz")[1]["role"] == "slave"

    def named() -> dict | None:
        status, body = api.get("/readyz")
        assert status == 503 and body["ready"] is False and body["role"] == "slave"
        return body["master"]

    master_info = wait_until(named, what="the master in the registry")
    assert master_info["name"] == "m1" and master_info["http"] == f"http://127.0.0.1:{h1}"
    status, text = api.get("/metrics")
    assert status == 200 and "amqlite_node_master 0.0" in text
    assert api.get("/api/v1/node")[1]["role"] == "slave"
    status, body = api.post("/api/v1/purge/queue/anything")
    assert status == 503 and "m1" in body["error"] and body["master"]["name"] == "m1"
    status, body = api.get("/api/v1/destinations")
    assert status == 503 and f"http://127.0.0.1:{h1}" in body["error"]
    assert master.alive and slave.alive


def test_two_nodes_with_default_http_settings_both_run(broker_factory: BrokerFactory) -> None:
    """No --http: each node takes the derived port or the next free one, logs it and
    publishes it in the registry."""
    a = broker_factory.start(name="defa", group=unique("ga"))
    b = broker_factory.start(name="defb", group=unique("gb"))
    url_a, url_b = _http_url(a), _http_url(b)
    assert url_a != url_b
    for url, broker in ((url_a, a), (url_b, b)):
        api = Api(url)
        assert api.get("/readyz")[0] == 200
        assert api.ok("GET", "/api/v1/node")["http"] == url
        nodes = wait_until(lambda api=api: api.ok("GET", "/api/v1/group")["nodes"],
                           what="registry")
        assert nodes[0]["http"] == url and nodes[0]["name"] == broker.name


def test_nodes_started_together_each_get_a_port(broker_factory: BrokerFactory) -> None:
    """Nodes started at once race for the same automatic HTTP port: the losers move on
    to the next port; none crashes or keeps a listener that accepts nothing (a CI run
    once lost a node to that race)."""
    data = broker_factory.data_dir("together")
    nodes = [broker_factory.start(name=f"tog{i}", data_dir=data, wait=False)
             for i in range(3)]
    urls = [_http_url(node) for node in nodes]
    assert len(set(urls)) == len(nodes)
    for url, node in zip(urls, nodes, strict=True):
        assert Api(url).get("/healthz")[1]["name"] == node.name
        assert node.alive


def test_http_off(broker_factory: BrokerFactory) -> None:
    broker = broker_factory.start(name="nohttp", extra_args=["--http", "off"])
    wait_until(lambda: "management API off" in broker.log_text(), what="the log line")
    assert not URL_IN_LOG.search(broker.log_text())


def test_purge_and_move_on_postgresql(broker_factory: BrokerFactory, pg_url: str,
                                      clients: ClientPool) -> None:
    broker = start_with_http(broker_factory, "pgm",
                             extra_args=["--store", pg_url, "--locker", pg_url])
    api = Api(broker.http)  # type: ignore[attr-defined]
    src, dst = f"/queue/{unique('pg-src')}", f"/queue/{unique('pg-dst')}"
    producer = clients(broker.port)
    for i in range(5):
        producer.send(src, f"pg{i}")
    wait_until(lambda: (d := api.destination(src)) and d["waiting"] == 5, what="5 waiting")
    page = api.ok("GET", f"/api/v1/messages{src}?limit=2")
    assert [m["body"] for m in page["messages"]] == ["pg0", "pg1"]
    ids = [m["id"] for m in page["messages"]]
    assert api.ok("POST", f"/api/v1/move{src}", {"to": dst, "ids": ids})["moved"] == 2
    assert api.ok("POST", f"/api/v1/purge{src}")["purged"] == 3
    wait_until(lambda: (d := api.destination(src)) and d["waiting"] == 0, what="src empty")
    consumer = clients(broker.port)
    consumer.subscribe(dst)
    assert sorted(m.body for m in consumer.listener.wait_messages(2)) == ["pg0", "pg1"]
    consumer.subscribe(src)
    assert consumer.listener.holds_for(lambda: consumer.listener.count() == 2, 0.5)
