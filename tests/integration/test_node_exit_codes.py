"""Issue 15: a node tells the truth with its exit code, finds out about bad settings
at once, waits for a transient outage with bounded noise, keeps the RECEIPT's durability
promise, and can be stopped and queried by its pid file. Real `amqlite` processes."""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.helpers.broker_proc import HOST, BrokerFactory, never_serves, unique
from tests.helpers.cluster import amqlite
from tests.helpers.poll import poll
from tests.helpers.servers import PostgresServer, free_port, running_postgres

#: A refused start must end this soon (no retrying for ever).
EXIT_DEADLINE = 60.0
#: ``amqlite start``'s exit status for a configuration error (cli.main.EXIT_USAGE).
EXIT_CONFIG = 2


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("amqlite: error:")]


def assert_config_error(result: subprocess.CompletedProcess, *words: str) -> None:
    assert result.returncode == EXIT_CONFIG, result.stderr
    lines = error_lines(result.stderr)
    assert len(lines) == 1, result.stderr
    for word in words:
        assert word in lines[0], lines[0]
    assert "Traceback" not in result.stderr


def group_epoch(data_dir: Path, group: str) -> int | None:
    db = data_dir / "amqlite.db"
    if not db.exists():
        return None
    with sqlite3.connect(db) as conn:
        row = conn.execute("SELECT epoch FROM amq_groups WHERE grp = ?", (group,)).fetchone()
    return None if row is None else int(row[0])


def start_args(data_dir: Path, *extra: str) -> list[str]:
    return ["start", "--data-dir", str(data_dir), "--bind", f"{HOST}:{free_port()}",
            "--http", "off", *extra]


# -- a node that cannot serve ---------------------------------------------------------


def test_port_in_use_exits_nonzero_without_claiming_an_epoch(
        broker_factory: BrokerFactory) -> None:
    with socket.socket() as taken:
        taken.bind((HOST, 0))
        taken.listen()
        port = taken.getsockname()[1]
        broker = broker_factory.new(port=port, extra_args=["--http", "off"]).start()
        code = broker.wait_exit(EXIT_DEADLINE)
    assert code == 1, broker.log_tail()
    assert "Address already in use" in broker.log_text()
    # The node got the lock but not the port: the group's epoch is untouched.
    assert not group_epoch(broker.data_dir, broker.group), broker.log_tail()


def test_unresolvable_bind_host_is_a_config_error(tmp_path: Path) -> None:
    result = amqlite("start", "--data-dir", str(tmp_path / "d"), "--http", "off",
                     "--bind", "no-such-host.invalid:61613", "--allow-anonymous-remote")
    assert_config_error(result, "--bind", "cannot resolve")
    assert group_epoch(tmp_path / "d", "default") is None


@pytest.mark.parametrize("toml, words", [
    ("bind = 61613\n", ("bind", "expected a string")),
    ("max_connections = \"many\"\n", ("max_connections", "'many'")),
    ("max_connections = 1.5\n", ("max_connections", "expected an integer")),
    ("rejoin = 1\n", ("rejoin", "true or false")),
    ("bind = \"127.0.0.1:1\"\n[broker]\nmax_connections = 10\n", ("[broker]", "bind")),
    ("dedup_window = -1\n", ("dedup_window",)),
])
def test_bad_toml_is_one_line_config_error(tmp_path: Path, toml: str, words: tuple) -> None:
    config = tmp_path / "amqlite.toml"
    config.write_text(toml)
    result = amqlite("start", "--data-dir", str(tmp_path / "d"), "--config", str(config))
    assert_config_error(result, *words)


def test_toml_keys_under_broker_table_are_used(tmp_path: Path) -> None:
    """The [broker] layout still works (and is not mixed up with the refusal above)."""
    config = tmp_path / "amqlite.toml"
    config.write_text("[broker]\nbind = 7\n")
    assert_config_error(amqlite("start", "--config", str(config)), "bind", "expected a string")


def test_passwd_refuses_an_empty_password() -> None:
    result = amqlite("passwd", "--password", "")
    assert result.returncode != 0
    assert "empty" in result.stderr
    assert "$" not in result.stdout


# -- permanent errors at start -----------------------------------------------------------


def test_data_dir_that_is_a_file_is_a_config_error(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    assert_config_error(amqlite(*start_args(not_a_dir)), "--data-dir", "not a directory")


#: Root writes through any mode bits, so as root (CI) the node runs in a mount namespace
#: of its own where the directory is bind-mounted read-only: refused for root as well.
READ_ONLY_MOUNT = ('mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && shift '
                   '&& exec "$@"')


def test_read_only_data_dir_is_a_config_error(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    as_root = ["unshare", "--mount", "sh", "-c", READ_ONLY_MOUNT, "sh", str(ro)]
    result = amqlite(*start_args(ro), wrapper=as_root if os.geteuid() == 0 else ())
    assert_config_error(result, "--data-dir", "not writable")


def test_missing_database_is_a_config_error(tmp_path: Path,
                                            postgres_server: PostgresServer) -> None:
    url = postgres_server.url("amqlite_no_such_database")
    result = amqlite(*start_args(tmp_path / "d", "--store", url))
    assert_config_error(result, "does not exist")


def test_refused_login_is_a_config_error(tmp_path: Path,
                                         postgres_server: PostgresServer) -> None:
    url = f"postgresql://amqlite_no_such_role@127.0.0.1:{postgres_server.port}/postgres"
    result = amqlite(*start_args(tmp_path / "d", "--store", url))
    assert_config_error(result, "amqlite_no_such_role")


def test_refused_locker_login_is_a_config_error_not_retried(
        tmp_path: Path, postgres_server: PostgresServer) -> None:
    """A login the locker's server refuses is as final as the same in --store: exit 2."""
    url = f"postgresql://amqlite_no_such_role@127.0.0.1:{postgres_server.port}/postgres"
    started = time.monotonic()
    result = amqlite(*start_args(tmp_path / "d", "--locker", url))
    assert_config_error(result, "amqlite_no_such_role")
    assert time.monotonic() - started < 15, result.stderr


@pytest.mark.parametrize("option, url, words", [
    ("--store", "mysql://x/y", ("mysql", "--store")),
    ("--locker", "etcd://x", ("etcd", "--locker")),
])
def test_unsupported_url_scheme_is_a_config_error(tmp_path: Path, option: str, url: str,
                                                  words: tuple[str, ...]) -> None:
    assert_config_error(amqlite(*start_args(tmp_path / "d", option, url)), *words)


def test_nan_poll_interval_in_the_environment_is_one_line(tmp_path: Path) -> None:
    result = amqlite(*start_args(tmp_path / "d"), env={"AMQLITE_LOCK_POLL_INTERVAL": "nan"})
    assert_config_error(result, "lock_poll_interval", "AMQLITE_LOCK_POLL_INTERVAL")


def test_nan_keepalive_in_the_config_file_names_it(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text("lock_keepalive = nan\n")
    result = amqlite(*start_args(tmp_path / "d", "--config", str(config)))
    assert_config_error(result, "lock_keepalive")


def test_unreachable_store_gives_up_after_start_timeout(tmp_path: Path) -> None:
    url = f"postgresql://postgres@127.0.0.1:{free_port()}/postgres"  # nobody listens
    started = time.monotonic()
    result = amqlite(*start_args(tmp_path / "d", "--store", url),
                     env={"AMQLITE_START_TIMEOUT": "3"})
    elapsed = time.monotonic() - started
    assert result.returncode == 1, result.stderr
    lines = error_lines(result.stderr)
    assert len(lines) == 1 and "start_timeout" in lines[0], result.stderr
    # Capped doubling back-off: a handful of lines in 3 s, not one per connect.
    retries = [ln for ln in result.stderr.splitlines() if "unreachable" in ln and "ERROR" in ln]
    assert 1 <= len(retries) <= 4, result.stderr
    assert elapsed < EXIT_DEADLINE


def test_sigterm_while_waiting_for_the_store_ends_cleanly(broker_factory: BrokerFactory) -> None:
    url = f"postgresql://postgres@127.0.0.1:{free_port()}/postgres"
    broker = broker_factory.new(extra_args=["--store", url, "--http", "off"]).start()
    broker.wait_log(r"unreachable: .*retrying")
    assert broker.terminate() == 0
    log = broker.log_text()
    assert "Traceback" not in log and "never retrieved" not in log, log


def test_sigterm_while_zookeeper_is_down_ends_cleanly_and_quietly(
        broker_factory: BrokerFactory) -> None:
    dead_zk = f"zk://127.0.0.1:{free_port()}/amqlite"
    broker = broker_factory.new(extra_args=["--locker", dead_zk, "--http", "off"]).start()
    started = time.monotonic()
    broker.wait_log(r"cannot connect.*retrying")
    assert broker.terminate() == 0
    elapsed = time.monotonic() - started
    log = broker.log_text()
    assert "Traceback" not in log and "never retrieved" not in log, log
    # kazoo warns on every attempt (several a second); one line per 10 s gets through
    # per logger, plus errors.
    kazoo = [ln for ln in log.splitlines() if " kazoo." in ln and "WARNING" in ln]
    assert len(kazoo) <= 2 * (2 + elapsed / 10), log


# -- pid file, stop, status ------------------------------------------------------------


def test_stop_and_status_find_a_foreground_node_by_its_pid_file(
        broker_factory: BrokerFactory) -> None:
    broker = broker_factory.start(extra_args=["--http", "off"])
    pid_files = list(broker.data_dir.glob("amqlite-*.pid"))
    assert len(pid_files) == 1
    assert json.loads(pid_files[0].read_text())["pid"] == broker.pid

    status = amqlite("status", "--data-dir", str(broker.data_dir))
    assert f"running (pid {broker.pid})" in status.stdout, status.stdout + status.stderr

    stopped = amqlite("stop", "--data-dir", str(broker.data_dir))
    assert stopped.returncode == 0, stopped.stderr
    assert f"pid {broker.pid}" in stopped.stdout
    assert broker.wait_exit(5) == 0  # stop waited for the exit
    assert not list(broker.data_dir.glob("amqlite-*.pid"))

    again = amqlite("stop", "--data-dir", str(broker.data_dir))
    assert again.returncode == 1 and "no running node" in again.stderr


def test_stop_ends_a_paused_node(broker_factory: BrokerFactory) -> None:
    """A SIGSTOPped node cannot handle SIGTERM: ``amqlite stop`` wakes it first (as
    ``container stop`` does) instead of waiting out its timeout."""
    broker = broker_factory.start(extra_args=["--http", "off"])
    broker.pause()
    try:
        stopped = amqlite("stop", "--data-dir", str(broker.data_dir), "--timeout", "20")
    finally:
        broker.resume()  # harmless once it is gone; lets it stop if stop failed
    assert stopped.returncode == 0, stopped.stderr
    assert f"pid {broker.pid}" in stopped.stdout
    assert broker.wait_exit(5) == 0


def test_status_reports_the_pid_file_nodes_management_api(
        broker_factory: BrokerFactory) -> None:
    http = f"{HOST}:{free_port()}"
    broker = broker_factory.start(extra_args=["--http", http])
    status = amqlite("status", "--data-dir", str(broker.data_dir), "--json")
    assert status.returncode == 0, status.stderr
    nodes = json.loads(status.stdout)
    assert [(n["name"], n["role"], n["ready"]) for n in nodes] == [(broker.name, "master", True)]


# -- durability -------------------------------------------------------------------------


def test_store_sessions_force_synchronous_commit(postgres_server: PostgresServer) -> None:
    """A database default of synchronous_commit = off does not reach the store's sessions."""
    from sqlalchemy import text

    from store import open_store

    url = postgres_server.create_database()
    dbname = url.rsplit("/", 1)[1]
    postgres_server.psql(f"ALTER DATABASE {dbname} SET synchronous_commit = off")
    store = open_store(url, "g")
    store.open()
    try:
        with store.engine.connect() as conn:
            assert conn.scalar(text("SHOW synchronous_commit")) == "on"
    finally:
        store.close()


@pytest.fixture(scope="module")
def fsync_off_server():
    """A PostgreSQL of its own (never the session's) running with fsync = off."""
    with running_postgres() as server:
        server.psql("ALTER SYSTEM SET fsync = off")
        server.psql("SELECT pg_reload_conf()")
        poll(lambda: server.psql("SHOW fsync"), lambda value: value == "off", timeout=30,
             what="fsync = off in effect")
        yield server


def test_fsync_off_store_is_refused(tmp_path: Path, fsync_off_server: PostgresServer) -> None:
    url = fsync_off_server.create_database()
    assert_config_error(amqlite(*start_args(tmp_path / "d", "--store", url)),
                        "fsync = off", "allow_fsync_off")


def test_fsync_off_accepted_is_warned_in_log_and_readyz(
        broker_factory: BrokerFactory, fsync_off_server: PostgresServer) -> None:
    url = fsync_off_server.create_database()
    http = f"{HOST}:{free_port()}"
    broker = broker_factory.start(extra_args=["--store", url, "--http", http],
                                  env={"AMQLITE_ALLOW_FSYNC_OFF": "true"})
    assert "fsync = off" in broker.log_text()
    try:
        body = urllib.request.urlopen(f"http://{http}/readyz", timeout=10).read()
    except urllib.error.HTTPError as e:  # pragma: no cover - shown on failure
        raise AssertionError(e.read()) from None
    ready = json.loads(body)
    assert ready["ready"] is True
    assert any("fsync = off" in w for w in ready["warnings"]), ready


def test_unreachable_zookeeper_gives_up_after_start_timeout(tmp_path: Path) -> None:
    dead_zk = f"zk://127.0.0.1:{free_port()}/amqlite"
    started = time.monotonic()
    result = amqlite(*start_args(tmp_path / "d", "--locker", dead_zk),
                     env={"AMQLITE_START_TIMEOUT": "3"})
    # about start_timeout (plus the interpreter's start), not 11.5 s of clean-up
    assert time.monotonic() - started < 7, result.stderr
    assert result.returncode == 1, result.stderr
    lines = error_lines(result.stderr)
    assert len(lines) == 1 and "start_timeout" in lines[0], result.stderr
    assert "Traceback" not in result.stderr and "never retrieved" not in result.stderr


def test_start_timeout_does_not_bound_a_slave_waiting_for_its_master(
        broker_factory: BrokerFactory, zookeeper_server) -> None:
    """A reachable ZooKeeper with the lock held elsewhere: the slave waits, as slaves do."""
    locker = f"zk://127.0.0.1:{zookeeper_server.port}/{unique('amqlite')}"
    env = {"AMQLITE_START_TIMEOUT": "1"}
    master = broker_factory.start(extra_args=["--locker", locker, "--http", "off"], env=env)
    slave = broker_factory.new(data_dir=master.data_dir,
                               extra_args=["--locker", locker, "--http", "off"], env=env).start()
    slave.wait_log(r"waiting for the lock")
    # three start_timeouts later it still waits (alive, and not serving: the lock is held)
    assert never_serves(slave, 3), slave.log_tail()
    assert master.terminate() == 0
    slave.wait_serving()



def test_bad_users_file_at_start_is_a_config_error(tmp_path: Path) -> None:
    users = tmp_path / "users.toml"
    users.write_text('[users]\nalice = "not-a-hash"\n')
    result = amqlite(*start_args(tmp_path / "d", "--users-file", str(users)))
    assert_config_error(result)


def test_lost_mastership_exit_code_is_documented() -> None:
    """The README's exit-code table names the codes node.py and the CLI use."""
    from amqlite.node import EXIT_DEMOTED, EXIT_ERROR, EXIT_OK
    from cli.main import EXIT_USAGE

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    for code in (EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_DEMOTED, 130):
        assert f"\n| {code} | " in readme, code
