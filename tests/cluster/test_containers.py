"""`amqlite container create|start|stop|list|delete` against real processes, and the
operator's failover drill from Fuse Fabric: three containers of one group on ZooKeeper and
PostgreSQL, a producer that finds the master through a discovery: URI, `container stop`
on the master while it sends, and `cluster-list` showing the new master."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from amqlite.settings import load_settings
from cli.containers import broker_runs as _runs
from tests.helpers.broker_proc import unique
from tests.helpers.cluster import (
    Producer,
    amqlite,
    cluster_json,
    drain_bodies,
    log_tails,
    ok,
    one_line_error,
    port_of,
)
from tests.helpers.poll import poll

pytestmark = pytest.mark.integration

#: The containers' ZooKeeper session timeout (s): short, so a killed container leaves
#: the registry quickly; inside the test server's 0.4-20 s range.
SESSION_TIMEOUT = 2.0
#: Slack for a loaded two-core machine on top of a documented bound (s).
SLACK = 3.0
#: Messages the producer must get receipted by a master before we act.
STEADY = 20


def container_list(env: dict[str, str]) -> dict[str, dict]:
    return {r["name"]: r for r in json.loads(ok(amqlite("container", "list", "--json",
                                                         env=env)))}


@pytest.mark.timeout(240)
def test_every_container_verb_and_a_forced_failover(home: Path, pg_url: str,
                                                    zk_url: str) -> None:
    env = {"AMQLITE_HOME": str(home)}
    names = ["broker1", "broker2", "broker3"]
    logs = [home / n / "broker.log" for n in names]

    # create: config, data and log directory per container, distinct ports.
    out = ok(amqlite("container", "create", ",".join(names), "--group", "tolerant",
                     "--store", pg_url, "--locker", zk_url,
                     "--set", f"zk_session_timeout={SESSION_TIMEOUT}", env=env))
    assert out.count("created container") == 3
    ports = set()
    for n in names:
        cfg = home / n / "config.toml"
        assert (home / n / "data").is_dir()
        with open(cfg, "rb") as f:
            assert tomllib.load(f)["broker"]["name"] == n
        s = load_settings(None, str(cfg), environ={})
        assert (s.group, s.store, s.locker, s.zk_session_timeout) == (
            "tolerant", pg_url, zk_url, SESSION_TIMEOUT)
        assert s.data_dir == str(home / n / "data") and s.rejoin
        ports.add(s.bind_address[1])
    assert len(ports) == 3
    assert "already exists" in one_line_error(
        amqlite("container", "create", "broker1", "--group", "tolerant", env=env))
    one_line_error(amqlite("container", "create", "bad/name", env=env))

    listed = container_list(env)
    assert sorted(listed) == names
    assert {r["state"] for r in listed.values()} == {"stopped"}

    # start: returns once the process runs and has joined the registry.
    for n in names:
        assert "started container" in ok(amqlite("container", "start", n, env=env))
    assert "already running" in one_line_error(amqlite("container", "start", "broker1",
                                                       env=env))
    one_line_error(amqlite("container", "start", "nosuch", env=env))

    def one_master(rows: dict[str, dict]) -> bool:
        roles = sorted(r["role"] for r in rows.values())
        return roles == ["master", "slave", "slave"]

    try:
        listed, _ = poll(lambda: container_list(env), one_master, timeout=60,
                         what="one master and two slaves")
    except AssertionError as e:
        raise AssertionError(f"{e}\n{log_tails(logs)}") from None
    assert all(r["state"] == "running" and _runs(r["pid"], str(home / n / "config.toml"))
               for n, r in listed.items())
    master = next(n for n, r in listed.items() if r["role"] == "master")
    master_port = port_of(listed[master]["services"][0])
    views = cluster_json("--registry", zk_url, "--group", "tolerant")
    assert views[0]["masters"] == [master]
    assert views[0]["services"] == listed[master]["services"]

    # The drill: a producer on discovery:, `container stop` on the master meanwhile.
    queue = f"/queue/{unique('summit')}"
    producer = Producer(f"discovery:{zk_url}?group=tolerant", queue, unique("prod"))
    producer.start()
    try:
        producer.wait_receipts_from(master_port, STEADY, 30)
        assert f"stopped container {master}" in ok(amqlite("container", "stop", master,
                                                           env=env))
        views, took = poll(
            lambda: cluster_json("--registry", zk_url, "--group", "tolerant"),
            lambda v: len(v[0]["masters"]) == 1 and v[0]["masters"][0] != master, timeout=30,
            what="cluster-list shows a new master")
        new_master = views[0]["masters"][0]
        print(f"\ncluster-list showed {new_master} as master {took:.3f}s after "
              f"`container stop {master}` returned")
        assert master not in views[0]["slaves"]
        new_port = port_of(views[0]["services"][0])
        producer.wait_receipts_from(new_port, STEADY, 30)
    finally:
        receipted = producer.finish()
    bodies = drain_bodies(new_port, queue, len(receipted))
    missing = {f"m{s}" for s in receipted} - set(bodies)
    assert not missing, f"{len(missing)} receipted messages lost: {sorted(missing)[:10]}"
    assert len(bodies) == len(set(bodies)), "a message arrived twice"

    listed = container_list(env)
    assert listed[master]["state"] == "stopped" and listed[master]["pid"] is None
    assert listed[new_master]["role"] == "master"
    assert "not running" in one_line_error(amqlite("container", "stop", master, env=env))

    # The old master comes back as a slave.
    ok(amqlite("container", "start", master, env=env))
    listed, _ = poll(lambda: container_list(env),
                     lambda r: r[master]["role"] == "slave", timeout=30, what="old master is slave")

    # stop --kill is a crash: the killed slave leaves the registry after its session.
    slave = next(n for n in names if n not in (master, new_master))
    assert f"killed container {slave}" in ok(amqlite("container", "stop", slave, "--kill",
                                                     env=env))
    poll(lambda: cluster_json("--registry", zk_url, "--group", "tolerant"),
         lambda v: slave not in v[0]["slaves"], timeout=SESSION_TIMEOUT + SLACK,
         what="killed slave gone from cluster-list")
    assert container_list(env)[slave]["state"] == "stopped"

    # delete: refused while running, removes a stopped container's directory.
    assert "stop it first" in one_line_error(amqlite("container", "delete", new_master,
                                                     env=env))
    assert "deleted container" in ok(amqlite("container", "delete", slave, env=env))
    assert not (home / slave).exists()
    assert sorted(container_list(env)) == sorted(n for n in names if n != slave)
    for n in (master, new_master):
        ok(amqlite("container", "stop", n, env=env))
    assert {r["state"] for r in container_list(env).values()} == {"stopped"}


def test_container_create_defaults_to_a_shared_embedded_store(home: Path) -> None:
    """Without --store, a group's containers share one SQLite store and lock file under
    the home (each container's own data dir would make each its own master)."""
    env = {"AMQLITE_HOME": str(home)}
    ok(amqlite("container", "create", "a,b", "--group", "emb", "--bind-base", "40613",
               env=env))
    sa = load_settings(None, str(home / "a" / "config.toml"), environ={})
    sb = load_settings(None, str(home / "b" / "config.toml"), environ={})
    assert sa.store == sb.store == f"sqlite:///{home / '.groups' / 'emb' / 'amqlite.db'}"
    assert sa.locker == sb.locker == f"file://{home / '.groups' / 'emb' / 'amqlite.lock'}"
    assert (sa.bind, sb.bind) == ("127.0.0.1:40613", "127.0.0.1:40614")
    assert "--set" in one_line_error(amqlite("container", "create", "c", "--set", "nope=1",
                                             env=env))
