"""``amqlite status|queue|connection`` tell the truth about which node answers (issue 27,
"commands that mislead"): status checks the node it was asked about, the management
commands find a group's master as ``cluster-list`` does and follow it after a takeover,
a 401 reads as what it is, and ``container create`` refuses a port another container has.
Real broker processes and the real CLI throughout."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from amqlite.auth import hash_password
from tests.helpers.broker_proc import BrokerFactory, unique
from tests.helpers.broker_process import START_TIMEOUT, BrokerProcess
from tests.helpers.cluster import amqlite, ok, one_line_error
from tests.helpers.mgmt import start_with_http
from tests.helpers.poll import poll
from tests.helpers.servers import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def _isolated(tmp_path: Path, **extra: str) -> dict[str, str]:
    """No default data directory, container home or store of the developer's own."""
    (tmp_path / "xdg").mkdir(exist_ok=True)
    return {"XDG_DATA_HOME": str(tmp_path / "xdg"), "AMQLITE_HOME": str(tmp_path / "home"),
            **extra}


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _serves_or_exits(broker: BrokerProcess) -> bool:
    """Whether the broker came up (True) or exited (False), whichever happens first."""
    poll(lambda: broker.is_serving() or not broker.alive, timeout=START_TIMEOUT,
         what=f"{broker.name} serving or exiting", context=broker.log_tail)
    return broker.alive


def test_status_refuses_a_node_it_was_not_asked_about(broker_factory: BrokerFactory,
                                                      tmp_path: Path) -> None:
    # Issue 27: with a node of group `orders` on 8161, `status --data-dir EMPTY` and plain
    # `status` printed "b1 orders master yes", exit 0. Use 8161 when it is free, so the
    # default URL really answers with the wrong node.
    http = 8161 if _port_free(8161) else free_port()
    b1 = broker_factory.start(name="b1", group="orders", wait=False,
                              extra_args=["--http", f"127.0.0.1:{http}"])
    if http == 8161 and not _serves_or_exits(b1):
        # Another broker (a test running beside this one) took 8161 after it was free.
        http = free_port()
        b1 = broker_factory.start(name="b1", group="orders",
                                  extra_args=["--http", f"127.0.0.1:{http}"])
    b1.wait_serving()
    url = f"http://127.0.0.1:{http}"
    env = _isolated(tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()

    proc = amqlite("status", "--data-dir", str(empty), env=env)
    line = one_line_error(proc)
    assert f"no node is running with data directory {empty}" in line
    assert "orders" not in proc.stdout

    # Plain `status` of a group nobody runs here: whatever answers on the default URL
    # (b1 when it got 8161, else some other node, or nobody) is not it.
    mine = {**env, "AMQLITE_GROUP": unique("nobody")}
    proc = amqlite("status", env=mine)
    assert proc.returncode == 1 and " yes " not in proc.stdout, proc.stdout
    if http == 8161:
        assert f"is b1 of group orders, not of group {mine['AMQLITE_GROUP']}" in proc.stderr
        assert "wrong node" in proc.stdout
        # queue/connection commands refuse the wrong group's node just the same
        line = one_line_error(amqlite("queue", "list", env=mine))
        assert "is b1 of group orders, not of group" in line

    proc = amqlite("status", "--url", url, "--group", "payments", env=env)
    assert proc.returncode == 1 and "not of group payments" in proc.stderr

    # The node's own data directory and group: the truth, exit 0.
    [node] = json.loads(ok(amqlite("status", "--data-dir", str(b1.data_dir), "--json",
                                   env=env)))
    assert (node["name"], node["group"], node["role"], node["ready"]) == \
        ("b1", "orders", "master", True)
    ok(amqlite("status", "--url", url, "--group", "orders", env=env))


def test_group_commands_find_the_master_and_follow_a_takeover(
        broker_factory: BrokerFactory, pg_url: str, tmp_path: Path) -> None:
    group = unique("g2")
    lock = f"file://{tmp_path / 'g2.lock'}"
    common = ["--store", pg_url, "--locker", lock]
    first = start_with_http(broker_factory, "first", group=group, extra_args=common)
    second = start_with_http(broker_factory, "second", group=group, extra_args=common,
                             wait=False)
    env = _isolated(tmp_path, AMQLITE_STORE=pg_url)

    def status_rows() -> list[dict[str, object]]:
        proc = amqlite("status", "--group", group, "--json", env=env)
        return json.loads(proc.stdout) if proc.stdout.strip() else []

    rows, _ = poll(status_rows, lambda r: len(r) == 2, timeout=30,
                   what="both nodes in status --group")
    assert sorted(str(r["name"]) for r in rows) == ["first", "second"]
    assert [r["name"] for r in rows if r["ready"]] == ["first"]
    ok(amqlite("status", "--group", group, env=env))

    dest = f"/queue/{unique('follow')}"
    ok(amqlite("produce", "--broker-url", f"tcp://127.0.0.1:{first.port}", "--destination",
               dest, "--count", "1", env=env))
    [row] = [r for r in json.loads(ok(amqlite("queue", "list", "--group", group, "--json",
                                               env=env))) if r["name"] == dest]
    assert row["waiting"] == 1

    first.kill()
    second.wait_serving(60)
    # No --url, no 127.0.0.1:8161: the registry names the new master.
    rows = json.loads(ok(amqlite("queue", "list", "--group", group, "--json", env=env)))
    assert [r["waiting"] for r in rows if r["name"] == dest] == [1]
    # Without --group, the group of the settings (AMQLITE_GROUP) is looked up the same way.
    ok(amqlite("connection", "list", env={**env, "AMQLITE_GROUP": group}))
    [node] = [r for r in json.loads(ok(amqlite("status", "--group", group, "--json",
                                               env=env))) if r["ready"]]
    assert node["name"] == "second" and node["http"] == second.http  # type: ignore


def test_status_group_finds_containers(tmp_path: Path) -> None:
    env = _isolated(tmp_path)
    group = unique("cg")
    ok(amqlite("container", "create", "c1", "--group", group, env=env))
    try:
        ok(amqlite("container", "start", "c1", env=env))
        rows = json.loads(ok(amqlite("status", "--group", group, "--json", env=env)))
        assert [(r["name"], r["role"], r["ready"]) for r in rows] == [("c1", "master", True)]
        ok(amqlite("queue", "list", "--group", group, env=env))
    finally:
        amqlite("container", "stop", "c1", "--kill", env=env)


def test_401_is_an_authentication_error_and_listed_once(broker_factory: BrokerFactory,
                                                         tmp_path: Path) -> None:
    users = tmp_path / "users.toml"
    users.write_text(f'[users]\nalice = "{hash_password("alice-pw")}"\n[groups]\n'
                     'admins = ["alice"]\n')
    group = unique("auth")
    b = start_with_http(broker_factory, "guarded", users, group=group)
    env = _isolated(tmp_path, AMQLITE_DATA_DIR=str(b.data_dir))

    line = one_line_error(amqlite("queue", "list", "--url", b.http, env=env))  # type: ignore
    assert "authentication required" in line and "cannot connect" not in line
    line = one_line_error(amqlite("queue", "list", "--url", b.http,  # type: ignore
                                  "--user", "alice", env={**env, "AMQLITE_PASSWORD": "no"}))
    assert "authentication failed for alice" in line

    # The pid file and the registry both name the node: one row, not "unreachable".
    proc = amqlite("status", "--group", group, "--json", env=env)
    rows = json.loads(proc.stdout)
    assert proc.returncode == 1 and [(r["name"], r["role"]) for r in rows] == \
        [("guarded", "unauthorized")]
    assert "authentication required" in proc.stderr
    proc = amqlite("status", "--group", group, "--json", "--user", "alice",
                   env={**env, "AMQLITE_PASSWORD": "alice-pw"})
    rows = json.loads(ok(proc))
    assert [(r["name"], r["role"]) for r in rows] == [("guarded", "master")]


def test_container_create_refuses_a_port_in_use(tmp_path: Path) -> None:
    env = _isolated(tmp_path)
    port = free_port()
    ok(amqlite("container", "create", "a", "--bind-base", str(port), env=env))
    line = one_line_error(amqlite("container", "create", "b", "--bind-base", str(port),
                                  env=env))
    assert f"port {port}" in line and "'a'" in line
    line = one_line_error(amqlite("container", "create", "c,d", "--bind-base",
                                  str(port - 1), env=env))
    assert f"port {port}" in line
    assert not (tmp_path / "home" / "b").exists() and not (tmp_path / "home" / "c").exists()
    ok(amqlite("container", "create", "e", "--bind-base", str(port + 1), env=env))
