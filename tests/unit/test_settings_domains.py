"""Issue 20: settings are checked once, in amqlite/settings.py, whatever their source
(option, AMQLITE_* variable, --config file): a bad value is one line and exit 2, a
setting that does not apply is a warning, and every setting is an `amqlite start`
option whose --help shows its default and where it comes from."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from amqlite.settings import (
    FILE_ONLY,
    Settings,
    SettingsError,
    definitions,
    load_settings,
    read_settings,
)
from cli.main import EXIT_USAGE, cli, start
from lockers.pg_lease import PG_LEASE, PG_MIN_LEASE

PG_URL = "postgresql://amq@127.0.0.1:5432/amq"
ZK_URL = "zk://127.0.0.1:2181/amqlite"


@pytest.fixture(autouse=True)
def no_amqlite_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """A developer's AMQLITE_* variables must not leak into these settings."""
    import os

    for name in [n for n in os.environ if n.startswith("AMQLITE_")]:
        monkeypatch.delenv(name)


@pytest.fixture
def no_node(monkeypatch: pytest.MonkeyPatch) -> None:
    """`amqlite start` must fail before it runs a node; running one is a test failure."""
    import amqlite.node

    def refuse(settings: Settings) -> int:
        raise AssertionError(f"the node ran with {settings!r}")

    monkeypatch.setattr(amqlite.node, "run_node", refuse)


def run_start(args: list[str], env: dict[str, str] | None = None) -> click.testing.Result:
    return CliRunner().invoke(cli, ["start", *args], env=env, catch_exceptions=False)


def error_lines(result: click.testing.Result) -> list[str]:
    return [ln for ln in result.stderr.splitlines() if ln.strip()]


# -- lock_lease: one domain, whatever the source ---------------------------------------


@pytest.mark.parametrize("source", ["option", "env", "config"])
def test_a_lease_below_the_pg_minimum_is_one_line_and_exit_2(
        tmp_path: Path, no_node: None, source: str) -> None:
    args = ["--data-dir", str(tmp_path / "d"), "--http", "off"]
    env: dict[str, str] = {}
    if source == "option":
        args += ["--lock-lease", "0.5"]
    elif source == "env":
        env["AMQLITE_LOCK_LEASE"] = "0.5"
    else:
        config = tmp_path / "amqlite.toml"
        config.write_text("lock_lease = 0.5\n")
        args += ["--config", str(config)]
    result = run_start(args, env)
    assert result.exit_code == EXIT_USAGE, result.output
    lines = error_lines(result)
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("amqlite: error: lock_lease:"), lines
    assert f"{PG_MIN_LEASE:g}" in lines[0] and "0.5" in lines[0]
    where = {"option": "--lock-lease", "env": "AMQLITE_LOCK_LEASE", "config": "amqlite.toml"}
    assert where[source] in lines[0]
    assert "Traceback" not in result.output


@pytest.mark.parametrize("locker", ["", PG_URL, ZK_URL])
@pytest.mark.parametrize("lease", ["0.5", "-1", "nan", "inf", "0.999"])
def test_the_lease_domain_does_not_depend_on_the_locker(locker: str, lease: str) -> None:
    with pytest.raises(SettingsError, match="lock_lease"):
        load_settings({"locker": locker or None}, environ={"AMQLITE_LOCK_LEASE": lease})


@pytest.mark.parametrize("lease", [0.0, PG_MIN_LEASE, PG_LEASE, 30.0])
def test_no_lease_and_leases_from_the_pg_minimum_are_accepted(lease: float) -> None:
    s = load_settings({"locker": PG_URL, "lock_lease": str(lease)}, environ={})
    assert s.lock_lease == lease


def test_the_defaults_are_the_lockers_own() -> None:
    from lockers.zookeeper import ZK_SESSION_TIMEOUT

    assert Settings().lock_lease == PG_LEASE
    assert Settings().zk_session_timeout == ZK_SESSION_TIMEOUT


# -- every other domain ------------------------------------------------------------------


@pytest.mark.parametrize("name, value", [
    ("housekeeping_interval", "0"),
    ("housekeeping_interval", "inf"),
    ("lock_poll_interval", "nan"),
    ("lock_keepalive", "-1"),
    ("zk_session_timeout", "0"),
    ("connect_timeout", "inf"),
    ("frame_timeout", "0"),
    ("dedup_window", "-1"),
    ("start_timeout", "nan"),
    ("max_connections", "0"),
    ("max_unauthenticated", "-1"),
    ("max_frame_size", "0"),
    ("max_header_count", "-5"),
    ("max_header_length", "0"),
    ("max_handshake_bytes", "0"),
    ("max_memory", "0"),
    ("max_destination_memory", "-1"),
    ("max_redeliveries", "-1"),
    ("default_prefetch", "0"),
    ("default_prefetch", "1000000"),
    ("dead_letter_queue", "DLQ"),
    ("dead_letter_queue", "/queue/a\nb"),
    ("log_level", "VERBOSE"),
    ("name", "a/b"),
    ("name", " "),
    ("group", "a b"),
    ("group", "a/b"),
    ("bind", "127.0.0.1:0"),
    ("bind", "127.0.0.1:70000"),
    ("heartbeat", "10,x"),
    ("advertise", "http://h:8161"),
    ("update_cluster_filter", "("),
    ("http_bind", "somewhere"),
    ("store", "mysql://u@h/db"),
    ("store", "sqlite:///:memory:"),
    ("locker", "redis://h"),
    ("locker", "file://relative.lock"),
    ("locker", "zk://bad host:x/r"),
])
def test_a_value_outside_its_domain_is_a_settings_error_naming_it_and_its_source(
        name: str, value: str) -> None:
    env_name = f"AMQLITE_{name.upper()}"
    with pytest.raises(SettingsError) as info:
        load_settings(environ={env_name: value})
    message = str(info.value)
    assert name in message and env_name in message, message
    assert "\n" not in message


@pytest.mark.parametrize("name, value", [("housekeeping_interval", "0"),
                                         ("locker", "redis://h"),
                                         ("log_level", "chatty"),
                                         ("dead_letter_queue", "DLQ")])
def test_late_failures_are_now_exit_2_at_start(tmp_path: Path, no_node: None,
                                               name: str, value: str) -> None:
    option = "--" + name.replace("_", "-")
    result = run_start(["--data-dir", str(tmp_path), "--http", "off", option, value])
    assert result.exit_code == EXIT_USAGE, result.output
    lines = error_lines(result)
    assert len(lines) == 1 and name in lines[0] and option in lines[0], lines


def test_log_level_is_any_case() -> None:
    assert load_settings({"log_level": "debug"}, environ={}).log_level == "DEBUG"


# -- settings that do not apply -----------------------------------------------------------


@pytest.mark.parametrize("given, locker, store, warned", [
    ({"lock_lease": "5"}, "", "", ["lock_lease"]),
    ({"lock_lease": "5"}, ZK_URL, "", ["lock_lease"]),
    ({"lock_lease": "5"}, PG_URL, "", []),
    ({"zk_session_timeout": "6"}, "", "", ["zk_session_timeout"]),
    ({"zk_session_timeout": "6"}, PG_URL, "", ["zk_session_timeout"]),
    ({"zk_session_timeout": "6"}, ZK_URL, "", []),
    ({"lock_poll_interval": "0.1"}, PG_URL, "", ["lock_poll_interval"]),
    ({"lock_poll_interval": "0.1"}, "", "", []),
    ({"allow_fsync_off": "true"}, "", "", ["allow_fsync_off"]),
    ({"allow_fsync_off": "true"}, "", PG_URL, []),
    ({"rebalance_cluster_clients": "true"}, "", "", ["rebalance_cluster_clients"]),
])
def test_a_setting_that_does_not_apply_is_warned_about(
        given: dict[str, str], locker: str, store: str, warned: list[str]) -> None:
    env = {f"AMQLITE_{k.upper()}": v for k, v in given.items()}
    cli_values = {"locker": locker or None, "store": store or None}
    _, warnings = read_settings(cli_values, environ=env)
    assert [w.split(" ", 1)[0] for w in warnings] == warned, warnings
    for w in warnings:
        assert f"AMQLITE_{w.split(' ', 1)[0].upper()}" in w


def test_defaults_give_no_warning() -> None:
    assert read_settings(environ={})[1] == []


def test_the_warning_reaches_the_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     caplog: pytest.LogCaptureFixture) -> None:
    import amqlite.node

    monkeypatch.setattr(amqlite.node, "run_node", lambda settings: 0)
    result = run_start(["--data-dir", str(tmp_path), "--lock-lease", "5"])
    assert result.exit_code == 0, result.output
    warned = [r.getMessage() for r in caplog.records
              if r.name == "amqlite.settings" and r.levelname == "WARNING"]
    assert len(warned) == 1 and re.match(r"lock_lease \(--lock-lease\) does not apply",
                                         warned[0]), warned


# -- options made from the fields -----------------------------------------------------------


def start_options() -> dict[str, click.Option]:
    return {p.name: p for p in start.params if isinstance(p, click.Option) and p.name}


@pytest.mark.parametrize("f", [f for f in dataclasses.fields(Settings)
                               if not f.metadata.get(FILE_ONLY)], ids=lambda f: f.name)
def test_every_setting_has_a_start_option(f: dataclasses.Field) -> None:
    """Every setting but the config file's tables (``[[policy]]``)."""
    option = start_options().get(f.name)
    assert option is not None, f"amqlite start has no option for {f.name}"
    flag = "--" + f.name.replace("_", "-")
    assert flag in option.opts
    if f.type == "bool":
        assert option.secondary_opts == ["--no-" + flag[2:]]


def parse(*args: str) -> dict[str, object]:
    ctx = start.make_context("start", list(args))
    return {k: v for k, v in ctx.params.items() if v is not None}


def test_options_reach_the_settings_as_their_fields() -> None:
    assert parse("--lock-lease", "2", "--no-http-ssl", "--max-memory", "1024") == {
        "lock_lease": "2", "http_ssl": False, "max_memory": "1024"}
    assert parse() == {}  # nothing given: the environment and the file still count


def test_the_old_spellings_still_work() -> None:
    assert parse("--http", "off", "--config", "c.toml", "--log-level", "debug",
                 "--data-dir", "d", "--ssl-bind", "h:1", "--rejoin", "--advertise",
                 "tcp://h:1", "--bind", "off") == {
        "http_bind": "off", "config_file": "c.toml", "log_level": "debug", "data_dir": "d",
        "ssl_bind": "h:1", "rejoin": True, "advertise": "tcp://h:1", "bind": "off"}
    assert parse("--no-rejoin", "--http-bind", "127.0.0.1:1") == {
        "rejoin": False, "http_bind": "127.0.0.1:1"}


def test_precedence_is_option_then_environment_then_config_then_default(
        tmp_path: Path) -> None:
    config = tmp_path / "amqlite.toml"
    config.write_text("max_connections = 10\nmax_redeliveries = 1\ndedup_window = 5\n")
    env = {"AMQLITE_MAX_CONNECTIONS": "20", "AMQLITE_MAX_REDELIVERIES": "2"}
    s = load_settings({"max_connections": "30"}, str(config), env)
    assert (s.max_connections, s.max_redeliveries, s.dedup_window, s.frame_timeout) == (
        30, 2, 5.0, Settings().frame_timeout)


def test_help_shows_every_default_and_its_origin() -> None:
    result = CliRunner().invoke(cli, ["start", "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    for d in definitions():
        assert d.option in text, d.name
        assert f"[default: {d.default}" in text, d.name
        if d.origin:
            assert d.origin in text, d.name
    # The numbers' origins are there, not just the numbers.
    assert "PG_LEASE, lockers/pg_lease.py" in text
    assert "ActiveMQ's transport maximumConnections" in text
