"""Issue 23, items 3-5, against a real broker process: bad numbers and bodies are one-line
4xx (never a 500 or a traceback), a Host this node does not serve is refused (DNS
rebinding), state changes need this listener's own Origin, and a login sees only the
metadata it may (destinations it may read; connections and /metrics for administrators,
or the scrape token)."""

from __future__ import annotations

import urllib.error
import urllib.request
from typing import Any

import pytest

from amqlite.auth import hash_password
from tests.helpers.broker_proc import BrokerFactory, BrokerProcess, ClientPool, unique
from tests.helpers.mgmt import Api, start_with_http, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

TOO_BIG = str(2**63)  # one past the store's BIGINT
HUGE = "9" * 5000
PASSWORDS = {"root": "root-Pw-1", "bob": "bob-Pw-2", "prom": "prom-Pw-3"}
TOKEN = "scrape-Token-0123456789"
RULES = """
[groups]
admins = ["root"]
apps = ["bob"]

[[authorization]]
destination = "/queue/open.>"
read = ["apps", "admins"]
write = ["apps", "admins"]
admin = ["admins"]
auto_create = true

[[authorization]]
destination = "/topic/news.>"
read = ["apps", "admins"]
write = ["apps", "admins"]
admin = ["admins"]
auto_create = true

[[authorization]]
destination = "/queue/secret.>"
read = ["admins"]
write = ["admins"]
admin = ["admins"]
auto_create = true
"""


#: A name the node is told to answer to (``http_allowed_hosts``: a reverse proxy's).
PROXY_NAME = "broker.internal"


@pytest.fixture(scope="module")
def broker(module_factory: BrokerFactory) -> BrokerProcess:
    return start_with_http(module_factory, "hostile",
                           env={"AMQLITE_HTTP_ALLOWED_HOSTS": PROXY_NAME})


@pytest.fixture
def api(broker: BrokerProcess) -> Api:
    return Api(broker.http)  # type: ignore[attr-defined]


def one_line_4xx(result: tuple[int, Any], *status: int) -> str:
    code, body = result
    assert 400 <= code < 500 and (not status or code in status), (code, body)
    assert isinstance(body, dict) and isinstance(body["error"], str), body
    assert "\n" not in body["error"] and len(body["error"]) < 300, body
    return body["error"]


def test_bad_numbers_and_bodies_are_one_line_4xx(api: Api, broker: BrokerProcess,
                                                 clients: ClientPool) -> None:
    dest = f"/queue/{unique('nums')}"
    clients(broker.port).send(dest, "m")
    wait_until(lambda: api.destination(dest), what="the queue exists")
    name = dest.removeprefix("/queue/")
    for bad in (TOO_BIG, HUGE, "-1", "1_0", "0x10", "%D9%A1%D9%A2", "%20"):
        one_line_4xx(api.get(f"/api/v1/message/{bad}"), 400)
        one_line_4xx(api.delete(f"/api/v1/message/{bad}"), 400)
        one_line_4xx(api.delete(f"/api/v1/scheduled/{bad}"), 400)
        one_line_4xx(api.get(f"/api/v1/messages/queue/{name}?after={bad}"), 400)
        one_line_4xx(api.get(f"/api/v1/messages/queue/{name}?limit={bad}"), 400)
        one_line_4xx(api.get(f"/api/v1/scheduled?limit={bad}"), 400)
    for ids in (f"[{TOO_BIG}]", f"[{HUGE}]", "[-1]", "[1.5]", "[1e999]", "[true]"):
        raw = f'{{"to": "/queue/elsewhere", "ids": {ids}}}'.encode()
        one_line_4xx(api.call("POST", f"/api/v1/move/queue/{name}", raw=raw,
                              headers={"Content-Type": "application/json"})[:2], 400)
        one_line_4xx(api.call("POST", f"/api/v1/retry/queue/{name}",
                              raw=b'{"ids": ' + ids.encode() + b"}",
                              headers={"Content-Type": "application/json"})[:2], 400)
    for raw in (b"[" * 200_000, b'{"a": ' + b"[" * 50 + b"]" * 50 + b"}", b"\xff\xfe",
                b"{", b'"x"'):
        error = one_line_4xx(api.call("POST", f"/api/v1/move/queue/{name}", raw=raw,
                                      headers={"Content-Type": "application/json"})[:2], 400)
        assert "JSON" in error or "nests" in error or "UTF-8" in error, error
    one_line_4xx(api.call("POST", f"/api/v1/move/queue/{name}", raw=b" " * (2 << 20),
                          headers={"Content-Type": "application/json"})[:2], 413)
    assert api.destination(dest)["waiting"] == 1  # nothing moved
    log = broker.log_text()
    assert "Traceback" not in log and "internal error" not in log


def test_a_host_this_node_does_not_serve_is_refused(api: Api, broker: BrokerProcess,
                                                    clients: ClientPool) -> None:
    """DNS rebinding: evil.example resolving to 127.0.0.1 reaches the listener with its
    own name in Host; refused before routing and before any action: the issue's purge
    and browse (which returned the bodies) included. The names the node serves (its
    address, localhost, http_allowed_hosts) are answered, a purge among them."""
    port = broker.http.rsplit(":", 1)[1]  # type: ignore[attr-defined]
    dest = f"/queue/{unique('rebind')}"
    clients(broker.port).send(dest, "secret-body")
    wait_until(lambda: (d := api.destination(dest)) and d["waiting"] == 1,
               what="one message waiting")
    browse = f"/api/v1/messages{dest}"
    for host in (f"evil.example:{port}", "evil.example", f"10.0.0.1:{port}",
                 f"127.0.0.1.evil.example:{port}", f"{PROXY_NAME}.evil.example:{port}"):
        for method, path in (("GET", "/api/v1/node"), ("GET", "/metrics"),
                             ("GET", "/healthz"), ("POST", f"/api/v1/purge{dest}"),
                             ("GET", browse), ("GET", "/nothing")):
            status, body, _ = api.call(method, path, headers={
                "Host": host, "Origin": f"http://{host}"})
            assert status == 421 and "host" in body["error"], (host, path, status, body)
            assert "secret-body" not in str(body)
    assert api.destination(dest)["waiting"] == 1  # nothing purged
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"LOCALHOST:{port}",
                 f"{PROXY_NAME}:{port}"):
        assert api.call("GET", "/api/v1/node", headers={"Host": host})[0] == 200, host
    status, body, _ = api.call("GET", browse, headers={"Host": f"{PROXY_NAME}:{port}"})
    assert status == 200 and [m["body"] for m in body["messages"]] == ["secret-body"], body
    status, body, _ = api.call("POST", f"/api/v1/purge{dest}", headers={
        "Host": f"{PROXY_NAME}:{port}", "Origin": f"http://{PROXY_NAME}:{port}"})
    assert status == 200 and body["purged"] == 1, body


def test_state_changes_need_the_listeners_own_origin(api: Api, broker: BrokerProcess,
                                                     clients: ClientPool) -> None:
    dest = f"/queue/{unique('origin')}"
    clients(broker.port).send(dest, "m")
    wait_until(lambda: (d := api.destination(dest)) and d["waiting"] == 1,
               what="one message waiting")
    purge = f"/api/v1/purge{dest}"
    base = api.base
    for headers in ({"Origin": "null"}, {"Origin": "http://evil.example"},
                    {"Origin": base.replace("127.0.0.1", "localhost")},
                    {"Origin": base + ".evil.example"}, {"Origin": ""},
                    {"Referer": "http://evil.example/"}, {"Referer": "null"}):
        error = one_line_4xx(api.call("POST", purge, headers=headers)[:2], 403)
        assert "origin" in error.lower() or "Referer" in error, (headers, error)
    # neither Origin nor Referer (the helper adds an Origin: plain urllib here)
    req = urllib.request.Request(base + purge, data=b"", method="POST",
                                 headers={"X-Requested-By": "tests"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 403 and b"Origin or Referer" in e.value.read()
    assert api.destination(dest)["waiting"] == 1  # nothing purged so far
    one_line_4xx(api.post(purge, csrf=False), 403)  # the CSRF header is still needed
    # the console's own origin (what a browser sends from the console page) works
    status, body = api.post(purge, headers={"Origin": base})
    assert status == 200 and body["purged"] == 1, body
    status, body = api.post(purge, headers={"Referer": base + "/"})  # no Origin
    assert status == 200, body
    console = api.get("/")
    assert console[0] == 200


@pytest.fixture(scope="module")
def authz(module_factory: BrokerFactory, tmp_path_factory: pytest.TempPathFactory
          ) -> BrokerProcess:
    d = tmp_path_factory.mktemp("hostile-authz")
    users = "\n".join(f'{u} = "{hash_password(p)}"' for u, p in PASSWORDS.items())
    (d / "users.toml").write_text(f"[users]\n{users}\n{RULES}")
    (d / "token").write_text(TOKEN + "\n")
    return start_with_http(module_factory, "hostile-authz", d / "users.toml", env={
        "AMQLITE_METRICS_TOKEN_FILE": str(d / "token"), "AMQLITE_METRICS_LOGIN": "prom"})


def test_a_login_sees_only_the_metadata_it_may(authz: BrokerProcess,
                                               clients: ClientPool) -> None:
    http = authz.http  # type: ignore[attr-defined]
    root, bob, prom = (Api(http, u, PASSWORDS[u]) for u in ("root", "bob", "prom"))
    secret, public = f"/queue/secret.{unique('s')}", f"/queue/open.{unique('o')}"
    clients(authz.port, username="root", passcode=PASSWORDS["root"]).send(secret, "s")
    clients(authz.port, username="bob", passcode=PASSWORDS["bob"]).send(public, "p")

    def names(api: Api) -> set[str]:
        status, body = api.get("/api/v1/destinations")
        assert status == 200, body
        return {r["name"] for r in body["destinations"]}

    wait_until(lambda: {secret, public} <= names(root), what="root sees both")
    seen = names(bob)
    assert public in seen and secret not in seen
    one_line_4xx(bob.get(f"/api/v1/destinations{secret}"), 403)
    assert bob.get(f"/api/v1/destinations{public}")[0] == 200
    # connections (logins, addresses, client-ids) and /metrics: administrators
    one_line_4xx(bob.get("/api/v1/connections"), 403)
    status, body = root.get("/api/v1/connections")
    assert status == 200 and {c["login"] for c in body["connections"]} >= {"root", "bob"}
    one_line_4xx(bob.get("/metrics"), 403)
    status, text = root.get("/metrics")
    assert status == 200 and secret in text
    # the scrape login and the bearer token read /metrics and nothing more
    assert prom.get("/metrics")[0] == 200
    one_line_4xx(prom.get("/api/v1/connections"), 403)
    status, text = Api(http).get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert status == 200 and secret in text
    status, _ = Api(http).get("/metrics", headers={"Authorization": "Bearer wrong"})
    assert status == 401
    status, _ = Api(http).get("/api/v1/destinations",
                              headers={"Authorization": f"Bearer {TOKEN}"})
    assert status == 401
    # durable subscriptions of others need an administrator
    topic = f"/topic/news.{unique('t')}"
    for login in ("root", "bob"):
        c = clients(authz.port, username=login, passcode=PASSWORDS[login],
                    headers={"client-id": f"{login}-{unique('c')}"})
        c.subscribe(topic, headers={"activemq.subscriptionName": f"{login}-sub"})

    def owners(api: Api) -> set[str]:
        status, body = api.get("/api/v1/subscriptions")
        assert status == 200, body
        return {s["owner"] for s in body["subscriptions"] if s["topic"] == topic}

    wait_until(lambda: owners(root) == {"root", "bob"}, what="both durables listed")
    assert owners(bob) == {"bob"}


def test_no_users_file_keeps_the_open_loopback_api(api: Api) -> None:
    """Without a users file nothing changes: no login, /metrics and connections open."""
    assert api.get("/metrics")[0] == 200
    assert api.get("/api/v1/connections")[0] == 200
    assert api.get("/api/v1/subscriptions")[0] == 200
