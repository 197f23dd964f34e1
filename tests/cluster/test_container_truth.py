"""`amqlite container ...` and `cluster-list` tell what happened (issue 15), against real
processes: `container start` reports the role the node really takes, fails with the
node's own error line when it dies or has no role in time, `stop --kill` names the
broker that took over, `logs [-f]` shows the log, `delete` of a group's last container
says what stays; `cluster-list` keeps two groups of one name on two stores apart,
never lists two masters after a crash, widens its columns and warns once per store."""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from amqlite.registry import read_cluster
from tests.helpers.broker_proc import (
    REPO_ROOT,
    BrokerFactory,
    amqlite_command,
    unique,
    wait_one_serving,
)
from tests.helpers.cluster import amqlite, cli_env, ok, one_line_error
from tests.helpers.poll import poll

pytestmark = pytest.mark.integration

#: Slack for a loaded two-core machine on top of a documented bound (s).
SLACK = 5.0
#: How long a `container logs -f` may take to show an appended line (s): it polls
#: every 0.2 s; the rest is a loaded machine starting Python.
FOLLOW_WITHIN = 30.0


@contextlib.contextmanager
def held_port() -> Iterator[int]:
    """A loopback port some other program listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(180)
def test_start_reports_the_real_role_and_stop_kill_names_the_successor(home: Path) -> None:
    env = {"AMQLITE_HOME": str(home)}
    ok(amqlite("container", "create", "first,second", "--group", "truth", env=env))
    # The first node announces "slave" before it takes the free lock: start must wait
    # for what it becomes.
    out = ok(amqlite("container", "start", "first", env=env))
    assert "(pid" in out and out.rstrip().endswith(", master)"), out
    out = ok(amqlite("container", "start", "second", env=env))
    assert out.rstrip().endswith(", slave of first)"), out

    out = ok(amqlite("container", "stop", "first", "--kill", env=env))
    assert "killed container first" in out and "was master" in out, out
    assert "second took over as master after" in out, out
    store = f"sqlite:///{home / '.groups' / 'truth' / 'amqlite.db'}"
    poll(lambda: read_cluster(store, "truth"),
         lambda v: bool(v) and v[0].masters == ["second"], timeout=SLACK, what="second is master")

    # logs: the node's own lines; -n the last ones; -f follows what is appended.
    text = ok(amqlite("container", "logs", "second", env=env))
    assert "master of group truth" in text
    assert len(ok(amqlite("container", "logs", "second", "-n", "2", env=env))
               .splitlines()) == 2
    follow = subprocess.Popen([*amqlite_command(), "container", "logs", "second", "-f"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env=cli_env(env), cwd=REPO_ROOT)
    seen: list[bytes] = []
    marker = unique("appended").encode()
    got_marker = threading.Event()

    def read() -> None:
        assert follow.stdout is not None
        for line in follow.stdout:
            seen.append(line)
            if marker in line:
                got_marker.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        poll(lambda: len(seen), lambda n: n > 0, timeout=FOLLOW_WITHIN,
             what="logs -f prints the log")
        with open(home / "second" / "broker.log", "ab") as f:
            f.write(marker + b"\n")
        assert got_marker.wait(FOLLOW_WITHIN), "logs -f did not show the appended line"
        assert follow.poll() is None, "logs -f ended by itself"
    finally:
        follow.send_signal(signal.SIGINT)
        follow.wait(30)
    assert follow.returncode == 0 and b"Traceback" not in follow.stderr.read()
    assert "no container named" in one_line_error(amqlite("container", "logs", "nosuch",
                                                          env=env))

    # stop of the last running broker: nobody takes over, and it says so.
    out = ok(amqlite("container", "stop", "second", env=env))
    assert "was master" in out and "nobody takes over" in out, out

    # delete: the first one leaves nothing behind worth a word; the last says where the
    # group's store stays and how to remove it.
    assert ok(amqlite("container", "delete", "first", env=env)).strip() == \
        "deleted container first"
    out = ok(amqlite("container", "delete", "second", env=env))
    group_dir = home / ".groups" / "truth"
    assert "last container of group truth" in out and f"rm -r {group_dir}" in out, out
    assert group_dir.is_dir()


@pytest.mark.timeout(120)
def test_start_fails_with_the_nodes_error_line_when_it_dies(home: Path) -> None:
    env = {"AMQLITE_HOME": str(home)}
    with held_port() as port:
        # The node starts, then cannot bind its management port and exits.
        ok(amqlite("container", "create", "dies", "--set", f"http_bind=127.0.0.1:{port}",
                   env=env))
        # On a loaded machine a progress line may come first; the error is the last line.
        result = amqlite("container", "start", "dies", env=env)
        assert result.returncode != 0, result
        line = result.stderr.strip().splitlines()[-1]
        assert line.startswith("amqlite: error: "), result.stderr
        assert "Traceback" not in result.stderr, result.stderr
        assert "container dies exited (status" in line and "cannot listen for HTTP" in line
        assert not (home / "dies" / "broker.pid").exists()
        # Another container's port is refused at create (issue 27).
        line = one_line_error(amqlite("container", "create", "busy", "--bind-base", str(port),
                                      env=env))
        assert f"port {port} for container 'busy' is already used by container 'dies'" in line
    with held_port() as port:
        # A STOMP port in use (by another program) is found before a process is started.
        ok(amqlite("container", "create", "busy", "--bind-base", str(port), env=env))
        line = one_line_error(amqlite("container", "start", "busy", env=env))
        assert f"127.0.0.1:{port} is already in use" in line
    rows = json.loads(ok(amqlite("container", "list", "--json", env=env)))
    assert {r["name"]: r["state"] for r in rows} == {"busy": "stopped", "dies": "stopped"}


@pytest.mark.timeout(120)
def test_start_shows_progress_and_gives_up_on_an_unreachable_store(home: Path) -> None:
    """Nothing listens at the store's address: progress lines on stderr, then one error
    line naming the node's own complaint, and the node is left running (retrying)."""
    env = {"AMQLITE_HOME": str(home)}
    port = closed_port()
    ok(amqlite("container", "create", "lonely", "--store",
               f"postgresql://amq:secret@127.0.0.1:{port}/amq", "--locker",
               f"file://{home / 'lonely.lock'}", env=env))
    result = amqlite("container", "start", "lonely", "--wait", "8", env=env)
    assert result.returncode == 1, result
    lines = result.stderr.strip().splitlines()
    assert any(ln.startswith("amqlite: container lonely: ") for ln in lines[:-1]), lines
    assert lines[-1].startswith("amqlite: error: container lonely (pid "), lines
    assert "has no role after 8s" in lines[-1] and "unreachable" in lines[-1], lines[-1]
    assert "secret" not in result.stderr
    assert "Traceback" not in result.stderr
    ok(amqlite("container", "stop", "lonely", env=env))


@pytest.mark.timeout(180)
def test_cluster_list_rows_per_group_and_store(home: Path,
                                               broker_factory: BrokerFactory) -> None:
    """A plain `amqlite start` of group default and a container of group default on its
    own store: two rows, one master each; a container name longer than 30 characters
    widens its column."""
    env = {"AMQLITE_HOME": str(home)}
    plain_dir = broker_factory.data_dir("plain")
    plain = broker_factory.start(data_dir=plain_dir, name="plain", group="default")
    long_name = "a-container-name-longer-than-thirty-characters"
    assert len(long_name) > 30
    ok(amqlite("container", "create", long_name, env=env))
    ok(amqlite("container", "start", long_name, env=env))
    plain_store = f"sqlite:///{plain_dir / 'amqlite.db'}"
    env["AMQLITE_STORE"] = plain_store

    def two_rows(views: list[dict]) -> bool:
        return len(views) == 2 and all(len(v["masters"]) == 1 for v in views)

    views, _ = poll(lambda: json.loads(ok(amqlite("cluster-list", "--json", env=env))),
                    two_rows, timeout=60, what="two rows of group default")
    assert {v["cluster"] for v in views} == {"default"}
    by_master = {v["masters"][0]: v for v in views}
    assert set(by_master) == {"plain", long_name}
    assert by_master["plain"]["registry"] == plain_store
    assert by_master[long_name]["registry"] == \
        f"sqlite:///{home / '.groups' / 'default' / 'amqlite.db'}"
    assert by_master["plain"]["services"] == [f"tcp://127.0.0.1:{plain.port}"]

    table = ok(amqlite("cluster-list", env=env)).splitlines()
    assert len(table) == 3
    header = table[0]
    start = header.index("[slaves]")
    assert header.index("[masters]") == len("[cluster]".ljust(30)) + 1
    assert start == header.index("[masters]") + len(long_name) + 1, header
    line = next(ln for ln in table if long_name in ln)
    assert line[header.index("[masters]"):start].rstrip() == long_name


@pytest.mark.timeout(180)
def test_cluster_list_never_shows_two_masters_after_a_crash(
        broker_factory: BrokerFactory) -> None:
    """SIGKILL the master: its row outlives it until its heartbeat expires, but from
    the first read on the view lists one master at most, and the dead one as stale
    (never as a second master) once the slave has taken over."""
    shared = broker_factory.data_dir("shared")
    store = f"sqlite:///{shared / 'amqlite.db'}"
    group = unique("crash")
    env = {"AMQLITE_LOCK_POLL_INTERVAL": "0.1"}
    brokers = [broker_factory.new(data_dir=shared, name=n, group=group, env=env).start()
               for n in ("one", "two")]
    master, _ = wait_one_serving(brokers)
    survivor = next(b for b in brokers if b is not master)
    poll(lambda: read_cluster(store, group),
         lambda v: bool(v) and v[0].masters == [master.name]
         and v[0].slaves == [survivor.name], timeout=30, what="one master, one slave")
    master.kill()
    samples = []

    def took_over(views) -> bool:
        samples.append(views)
        return bool(views) and views[0].masters == [survivor.name]

    poll(lambda: read_cluster(store, group), took_over, timeout=30, what="survivor listed master",
         interval=0.01)
    assert all(len(v[0].masters) <= 1 for v in samples if v), samples
    view = read_cluster(store, group)[0]
    assert master.name not in view.masters
    # Until the dead master's row expires it is shown as stale, in the table too.
    if master.name in [m.name for m in view.members]:
        assert master.name in view.stale


@pytest.mark.timeout(120)
def test_cluster_list_warns_once_about_an_unreachable_store(home: Path,
                                                            tmp_path: Path) -> None:
    """Two containers on one unreachable store and a reachable default
    registry: the table, and one warning line for the unreachable store."""
    env = {"AMQLITE_HOME": str(home),
           "AMQLITE_STORE": f"sqlite:///{tmp_path / 'empty' / 'amqlite.db'}"}
    port = closed_port()
    for name in ("x1", "x2"):
        ok(amqlite("container", "create", name, "--group", "far", "--store",
                   f"postgresql://amq:secret@127.0.0.1:{port}/amq", "--locker",
                   f"file://{home / 'far.lock'}", env=env))
    result = amqlite("cluster-list", env=env)
    assert result.returncode == 0, result
    warnings = [ln for ln in result.stderr.splitlines() if ln.startswith("amqlite: warning:")]
    assert len(warnings) == 1, result.stderr
    assert f"127.0.0.1:{port}" in warnings[0] and "secret" not in result.stderr
    assert result.stdout.split() == ["[cluster]", "[masters]", "[slaves]", "[services]",
                                     "[registry]"]
