"""``amqlite user`` and ``amqlite permission`` against a real broker (issue 27): the
users file written atomically with mode 0600, passwords from a file, the environment or
the prompt (never the command line), the running node told to reload (SIGHUP) so a
changed password, a new login, a deleted login and a new permission hold for what comes
next; ``produce``/``consume`` with a password from a file and from the environment; a
container config holding a store password written 0600; one-line errors, exit 1 or 2."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from tests.helpers.broker_proc import (
    REPO_ROOT,
    BrokerFactory,
    BrokerProcess,
    ClientPool,
    ConnectRefused,
    amqlite_command,
    cli_env,
    open_client,
    unique,
)
from tests.helpers.cluster import amqlite
from tests.helpers.mgmt import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

#: Room for the CLI's scrypt hashing and a loaded machine.
CLI_TIMEOUT = 60


def run(*args: str, code: int = 0, env: dict[str, str] | None = None,
        stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([*amqlite_command(), *args], capture_output=True, text=True,
                          env=cli_env(env), cwd=REPO_ROOT, timeout=CLI_TIMEOUT, input=stdin,
                          check=False)
    assert proc.returncode == code, (f"amqlite {' '.join(args)} exited {proc.returncode}: "
                                     f"{proc.stdout} {proc.stderr}")
    assert "Traceback" not in proc.stderr
    return proc


def one_error(proc: subprocess.CompletedProcess[str]) -> str:
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("amqlite: error: ")
    return line


def secret(tmp: Path, name: str, password: str) -> str:
    path = tmp / name
    path.write_text(password + "\n")
    path.chmod(0o600)
    return str(path)


def can_login(port: int, login: str, password: str) -> bool:
    try:
        client = open_client(port, username=login, passcode=password)
    except ConnectRefused as e:
        e.client.close()
        return False
    client.close()
    return True


def test_users_and_permissions_from_the_cli_reach_a_running_node(
        tmp_path: Path, broker_factory: BrokerFactory, clients: ClientPool) -> None:
    users = tmp_path / "users.toml"
    data = broker_factory.data_dir("node")
    where = ["--users-file", str(users), "--data-dir", str(data)]
    # The file is made by the first add; passwords from a file and the environment.
    run("user", "add", "admin", "--group", "admins",
        "--password-file", secret(tmp_path, "admin.pw", "admin-secret-1"), *where)
    out = run("user", "add", "alice", "--group", "apps", "--password-env", "ALICE_PW",
              *where, env={"ALICE_PW": "alice-secret-1"}).stdout
    assert out.splitlines()[0] == "added alice (groups apps)"
    assert "no running node uses" in out
    assert stat.S_IMODE(users.stat().st_mode) == 0o600
    assert "alice-secret-1" not in users.read_text()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".users.toml.")
            and p.suffix == ".tmp"] == []  # no temporary file left behind

    broker: BrokerProcess = broker_factory.start(
        name="users-node", data_dir=data, env={"AMQLITE_USERS_FILE": str(users)})
    port = broker.port
    assert can_login(port, "alice", "alice-secret-1")
    kept = clients(port, username="alice", passcode="alice-secret-1")

    # A changed password: the node reloads, new logins need the new one.
    out = run("user", "passwd", "alice", *where,
              "--password-file", secret(tmp_path, "alice.pw", "alice-secret-2")).stdout
    assert "reloaded by node users-node" in out
    wait_until(lambda: can_login(port, "alice", "alice-secret-2"), what="the new password")
    assert not can_login(port, "alice", "alice-secret-1")
    kept.send("/queue/still.open", "the old connection stays")

    # A new login from the prompt (asked twice, read from stdin here).
    run("user", "add", "bob", "--group", "apps", *where, stdin="bob-secret-1\nbob-secret-1\n")
    wait_until(lambda: can_login(port, "bob", "bob-secret-1"), what="bob's login")
    bob = clients(port, username="bob", passcode="bob-secret-1")

    # A permission: only /queue/orders.> for apps, created by using it.
    run("permission", "set", "/queue/orders.>", "--read", "apps", "--write", "apps",
        "--admin", "admins", "--auto-create", *where)
    listed = json.loads(run("permission", "list", "--json", *where).stdout)
    assert listed == [{"destination": "/queue/orders.>", "read": ["apps"], "write": ["apps"],
                       "admin": ["admins"], "auto_create": True}]

    def refused_elsewhere() -> bool:
        c = clients(port, username="alice", passcode="alice-secret-2")
        c.conn.send("/queue/other", "x", receipt=unique("r"))
        return c.listener.wait_for(lambda: bool(c.listener.error_texts()), 5)

    wait_until(refused_elsewhere, what="the permission in force")
    clients(port, username="alice", passcode="alice-secret-2").send("/queue/orders.new", "ok")

    # A deleted login: its open connection is closed by the node.
    run("user", "delete", "bob", *where)
    assert bob.listener.wait_for(lambda: bob.listener.disconnected, 15)
    assert not can_login(port, "bob", "bob-secret-1")
    rows = json.loads(run("user", "list", "--json", *where).stdout)
    assert rows == [{"login": "admin", "groups": ["admins"]},
                    {"login": "alice", "groups": ["apps"]}]

    # Without --data-dir the node is found where `amqlite start` would put it (the
    # settings' data directory) and in the containers' (none here).
    out = run("user", "groups", "admin", "admins", "apps", "--users-file", str(users),
              env={"AMQLITE_DATA_DIR": str(data), "AMQLITE_HOME": str(tmp_path / "home")}
              ).stdout
    assert "reloaded by node users-node" in out

    # produce / consume: the passcode from a file, and from AMQLITE_PASSWORD.
    url = f"tcp://127.0.0.1:{port}"
    run("produce", "--brokerUrl", url, "--destination", "queue://orders.cli", "--count", "2",
        "--user", "alice", "--password-file", str(tmp_path / "alice.pw"), "--timeout", "30")
    out = run("consume", "--brokerUrl", url, "--destination", "queue://orders.cli",
              "--count", "2", "--user", "alice", "--timeout", "30", "--json",
              env={"AMQLITE_PASSWORD": "alice-secret-2"}).stdout
    assert json.loads(out)["received"] == 2
    proc = run("produce", "--brokerUrl", url, "--user", "alice", "--password-file",
               str(tmp_path / "missing.pw"), code=2)
    assert "missing.pw" in one_error(proc)


def test_user_commands_refuse_with_one_line(tmp_path: Path) -> None:
    users = tmp_path / "users.toml"
    where = ["--users-file", str(users), "--data-dir", str(tmp_path)]
    pw = secret(tmp_path, "pw", "a-secret-1")
    run("user", "add", "alice", "--password-file", pw, *where)
    before = users.read_bytes()
    # Runtime refusals (1): a login that exists, one that does not.
    assert "exists" in one_error(run("user", "add", "alice", "--password-file", pw, *where,
                                     code=1))
    assert "no login 'nobody'" in one_error(run("user", "passwd", "nobody", "--password-file",
                                                pw, *where, code=1))
    assert "no login 'nobody'" in one_error(run("user", "delete", "nobody", *where, code=1))
    # Usage that cannot work (2): no users file, an unreadable or empty password file, a
    # password from a variable that is not set, a bad login, a change the broker's loader
    # refuses (the file stays as it was).
    assert "no users file" in one_error(run("user", "list", code=2))
    assert "nope.pw" in one_error(run("user", "add", "bob", "--password-file",
                                      str(tmp_path / "nope.pw"), *where, code=2))
    assert "is empty" in one_error(run("user", "add", "bob", "--password-file",
                                       secret(tmp_path, "empty", ""), *where, code=2))
    assert "NOT_SET" in one_error(run("user", "add", "bob", "--password-env", "NOT_SET",
                                      *where, code=2))
    assert "bad login" in one_error(run("user", "add", "b b", "--password-file", pw, *where,
                                        code=2))
    assert "invalid" in one_error(run("permission", "set", "/queue/a.>.b", "--read", "g",
                                      *where, code=2))
    assert users.read_bytes() == before
    assert "no [[authorization]] entry" in one_error(run("permission", "delete", "/queue/x",
                                                         *where, code=1))


def test_a_container_config_with_a_store_password_is_private(tmp_path: Path) -> None:
    home = tmp_path / "home"
    proc = amqlite("container", "create", "c1", "--group", "g1", "--store",
                   "postgresql://amq:s3cret@127.0.0.1:1/amq", env={"AMQLITE_HOME": str(home)})
    assert proc.returncode == 0, proc.stderr
    config = home / "c1" / "config.toml"
    assert "s3cret" in config.read_text()
    assert stat.S_IMODE(os.stat(config).st_mode) == 0o600


def test_a_users_file_the_broker_would_refuse_is_not_edited(tmp_path: Path) -> None:
    users = tmp_path / "users.toml"
    users.write_text("users = 5\n")
    proc = run("user", "add", "alice", "--password-file", secret(tmp_path, "pw", "a-secret-1"),
               "--users-file", str(users), "--data-dir", str(tmp_path), code=2)
    assert "fix it by hand first" in one_error(proc)
    assert users.read_text() == "users = 5\n"
