"""Per-destination authorization, client-id ownership, SIGHUP reload and secrets, against a
real broker process (issue 16's authorization part)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from amqlite.auth import hash_password
from tests.helpers.broker_proc import (
    REPO_ROOT,
    WAIT,
    BrokerFactory,
    BrokerProcess,
    ClientPool,
    ConnectRefused,
    unique,
)
from tests.helpers.mgmt import Api, start_with_http, wait_until

#: Distinctive passwords, so the log can be searched for them.
PASSWORDS = {"alice": "alice-Secret-7Q2", "bob": "bob-Secret-9Z4", "carol": "carol-Secret-3K8",
             "root": "root-Secret-5M1"}
HASHES = {login: hash_password(pw) for login, pw in PASSWORDS.items()}

RULES = """
[groups]
admins = ["root"]
ops = ["root"]
apps = ["alice", "bob"]
readers = ["carol"]

[[authorization]]
destination = "/queue/orders.>"
read = ["apps", "readers"]
write = ["apps", "ops"]
admin = ["ops"]
auto_create = true

[[authorization]]
destination = "/queue/fixed.*"
read = ["apps"]
write = ["apps", "ops"]
admin = ["ops"]

[[authorization]]
destination = "/queue/secret.*"
read = ["ops"]
write = ["ops"]
admin = ["ops"]

[[authorization]]
destination = "/topic/news.>"
read = ["apps"]
write = ["apps"]
admin = ["ops"]
auto_create = true

[[authorization]]
destination = "/queue/DLQ"
read = ["ops"]
admin = ["ops"]
"""


def users_toml(logins: list[str], rules: str = RULES) -> str:
    users = "\n".join(f'{u} = "{HASHES[u]}"' for u in logins)
    return f"[users]\n{users}\n{rules}"


@pytest.fixture(scope="module")
def users_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("authz") / "users.toml"
    path.write_text(users_toml(list(PASSWORDS)))
    return path


@pytest.fixture(scope="module")
def broker(module_factory: BrokerFactory, users_path: Path) -> BrokerProcess:
    return start_with_http(module_factory, "authz", users_path)


def connect(clients: ClientPool, broker: BrokerProcess, login: str, **headers: str):
    return clients(broker.port, username=login, passcode=PASSWORDS[login],
                   headers=headers or None)


def denied(client, what: str, *needles: str) -> str:
    """Wait for the ERROR that refused ``what``; it must name every needle."""
    assert client.listener.wait_for(lambda: bool(client.listener.errors), WAIT), \
        f"{what}: no ERROR"
    text = " ".join(client.listener.error_texts())
    for needle in needles:
        assert needle in text, f"{what}: ERROR {text!r} does not name {needle!r}"
    return text


def send_denied(client, dest: str, *needles: str) -> None:
    client.conn.send(dest, "x", headers={"receipt": unique("r")})
    denied(client, f"SEND {dest}", dest, *needles)


def subscribe_denied(client, dest: str, *needles: str, **headers: str) -> None:
    client.conn.subscribe(dest, id=unique("s"), headers={"receipt": unique("r"), **headers})
    denied(client, f"SUBSCRIBE {dest}", dest, *needles)


def test_send_allowed_with_write_and_denied_without(broker: BrokerProcess,
                                                    clients: ClientPool) -> None:
    dest = f"/queue/orders.{unique('eu')}"
    alice = connect(clients, broker, "alice")
    alice.send(dest, "from alice")
    carol = connect(clients, broker, "carol")  # readers: read, not write
    send_denied(carol, dest, "write", "'carol'")
    # Nothing happened: only alice's message is there.
    reader = connect(clients, broker, "bob")
    reader.subscribe(dest)
    assert [f.body for f in reader.listener.wait_messages(1)] == ["from alice"]
    assert reader.listener.holds_for(lambda: reader.listener.count() == 1, 0.5)


def test_subscribe_allowed_with_read_and_denied_without(broker: BrokerProcess,
                                                        clients: ClientPool) -> None:
    dest = f"/queue/orders.{unique('r')}"
    connect(clients, broker, "alice").send(dest, "m")
    carol = connect(clients, broker, "carol")
    carol.subscribe(dest)
    assert carol.listener.wait_messages(1)[0].body == "m"
    secret = f"/queue/secret.{unique('s')}"
    connect(clients, broker, "root").send(secret, "hidden")
    bob = connect(clients, broker, "bob")
    subscribe_denied(bob, secret, "read", "'bob'")
    # A destination no entry matches is denied (ActiveMQ: no entry, no access).
    alice = connect(clients, broker, "alice")
    subscribe_denied(alice, f"/queue/{unique('unlisted')}", "read")


def test_creating_a_destination_needs_admin_unless_auto_create(broker: BrokerProcess,
                                                               clients: ClientPool) -> None:
    dest = f"/queue/fixed.{unique('f')}"
    alice = connect(clients, broker, "alice")
    send_denied(alice, dest, "admin", "create")
    root = connect(clients, broker, "root")
    root.send(dest, "created by root")  # ops: admin, creates it
    connect(clients, broker, "alice").send(dest, "now it exists")  # write suffices now
    # auto_create = true: a writer creates orders.* by sending
    connect(clients, broker, "bob").send(f"/queue/orders.{unique('new')}", "x")


def test_durable_subscription_needs_read(broker: BrokerProcess, clients: ClientPool) -> None:
    topic = f"/topic/news.{unique('t')}"
    alice = connect(clients, broker, "alice", **{"client-id": unique("alice-cid")})
    alice.subscribe(topic, headers={"activemq.subscriptionName": "mine"})
    carol = connect(clients, broker, "carol", **{"client-id": unique("carol-cid")})
    subscribe_denied(carol, topic, "read", **{"activemq.subscriptionName": "hers"})
    # carol may not write the topic either; alice's durable subscription got only alice's
    send_denied(connect(clients, broker, "carol"), topic, "write")
    connect(clients, broker, "bob").send(topic, "news", headers={"persistent": "true"})
    assert alice.listener.wait_messages(1)[0].body == "news"


def test_client_id_taken_over_only_by_the_same_login(broker: BrokerProcess,
                                                     clients: ClientPool) -> None:
    cid = unique("cid")
    first = connect(clients, broker, "alice", **{"client-id": cid})
    with pytest.raises(ConnectRefused) as refused:
        connect(clients, broker, "bob", **{"client-id": cid})
    assert "in use by another login" in str(refused.value)
    first.send(f"/queue/orders.{unique('still')}", "alice is still connected")
    # the same login takes over (failover reconnect): the older connection is closed
    connect(clients, broker, "alice", **{"client-id": cid})
    denied(first, "takeover", "taken over")


def test_management_actions_need_admin_on_the_destination(broker: BrokerProcess,
                                                           clients: ClientPool) -> None:
    dest = f"/queue/orders.{unique('m')}"
    name = dest.removeprefix("/queue/")
    connect(clients, broker, "alice").send(dest, "m1")
    http = broker.http  # type: ignore[attr-defined]
    alice, root, carol = (Api(http, u, PASSWORDS[u]) for u in ("alice", "root", "carol"))
    status, body = alice.post(f"/api/v1/purge/queue/{name}")
    assert status == 403 and "admin" in body["error"] and dest in body["error"]
    status, body = alice.post(f"/api/v1/move/queue/{name}", {"to": "/queue/orders.other"})
    assert status == 403
    status, body = alice.delete(f"/api/v1/destinations/queue/{name}")
    assert status == 403
    # read is enough to browse; carol (readers) may browse orders but not secrets
    assert carol.get(f"/api/v1/messages/queue/{name}")[0] == 200
    secret = f"/queue/secret.{unique('b')}"
    connect(clients, broker, "root").send(secret, "s")
    status, body = carol.get(f"/api/v1/messages/queue/{secret.removeprefix('/queue/')}")
    assert status == 403 and "read" in body["error"]
    status, body = root.post(f"/api/v1/purge/queue/{name}")
    assert status == 200, body


def test_secrets_never_in_the_log(broker: BrokerProcess, clients: ClientPool) -> None:
    wrong = "wrong-Secret-0X0"
    with pytest.raises(ConnectRefused) as refused:
        clients(broker.port, username="alice", passcode=wrong)
    assert wrong not in str(refused.value)
    connect(clients, broker, "bob")  # a good login too
    log = broker.log_text()
    assert "authentication failed" in log
    for secret in [wrong, *PASSWORDS.values(), *HASHES.values()]:
        assert secret not in log
    for h in HASHES.values():
        assert h.rsplit("$", 1)[1] not in log  # not even the digest


# -- reload -------------------------------------------------------------------------------


def wait_log(broker: BrokerProcess, needle: str) -> str:
    def logged() -> str | None:
        text = broker.log_text()
        return text if needle in text else None

    return wait_until(logged, what=f"{needle!r} in {broker.name}'s log")


def test_sighup_reload_closes_removed_login_and_refuses_a_bad_file(
        broker_factory: BrokerFactory, clients: ClientPool, tmp_path: Path) -> None:
    path = tmp_path / "users.toml"
    path.write_text(users_toml(["alice", "bob"]))
    b = broker_factory.start(name="reload", env={"AMQLITE_USERS_FILE": str(path)})
    alice = connect(clients, b, "alice")
    bob = connect(clients, b, "bob")
    # carol is not in the file yet
    with pytest.raises(ConnectRefused):
        clients(b.port, username="carol", passcode=PASSWORDS["carol"])

    path.write_text(users_toml(["alice", "carol"]))
    b.send_signal(signal.SIGHUP)
    wait_log(b, "users file reloaded")
    denied(bob, "removed login", "login removed")
    assert bob.listener.wait_for(lambda: bob.listener.disconnected, WAIT)
    alice.send(f"/queue/orders.{unique('after')}", "alice stays")
    connect(clients, b, "carol")  # added without a restart

    # A bad file (an unknown group) is refused with one line; the old rules stay.
    path.write_text(users_toml(["alice"], RULES.replace('read = ["ops"]\nwrite',
                                                        'read = ["nobody"]\nwrite', 1)))
    b.send_signal(signal.SIGHUP)
    text = wait_log(b, "reload refused")
    line = next(ln for ln in text.splitlines() if "reload refused" in ln)
    assert "nobody" in line and "Traceback" not in text
    assert b.alive
    connect(clients, b, "carol")  # still in the kept rules
    alice.send(f"/queue/orders.{unique('kept')}", "still allowed")


# -- bad input at start, passwd -------------------------------------------------------------


@pytest.mark.parametrize("rules, words", [
    (RULES.replace('admin = ["ops"]\nauto_create', 'admin = ["ghosts"]\nauto_create', 1),
     "unknown group"),
    (RULES.replace('"/queue/fixed.*"', '"/queue/fixed.x*"'), "whole segments"),
    (RULES.replace('"/queue/secret.*"', '"/queue/secret.>.x"'), "last segment"),
    (RULES.replace('"/queue/DLQ"', '"orders"'), "/queue/PATTERN"),
])
def test_bad_users_file_is_one_line_and_a_non_zero_exit(
        broker_factory: BrokerFactory, tmp_path: Path, rules: str, words: str) -> None:
    path = tmp_path / "users.toml"
    path.write_text(users_toml(["alice"], rules))
    b = broker_factory.start(name="bad", wait=False, env={"AMQLITE_USERS_FILE": str(path)})
    code = b.wait_exit(30)
    assert code != 0
    out = [ln for ln in b.log_text().splitlines() if ln and not ln.startswith("=== harness")]
    assert len(out) == 1 and words in out[0] and "Traceback" not in out[0], out
    assert HASHES["alice"] not in out[0]


def test_passwd_refuses_an_empty_password() -> None:
    proc = subprocess.run([sys.executable, "-m", "cli", "passwd", "--password", ""],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "empty password" in proc.stderr and "scrypt$" not in proc.stdout
