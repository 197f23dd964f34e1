"""docker-compose.yml and the Dockerfile, checked without a Docker engine: the services
the issue names, health checks and their dependencies (the audit starts no broker),
every `amqlite` command line against the real click commands, every AMQLITE_* variable
against the real settings, the brokers forming one group, the pinned base image, and the
compose and image health checks run for real against brokers' management APIs."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from amqlite.settings import Settings, load_settings
from cli.main import cli
from tests.helpers.broker_proc import REPO_ROOT, BrokerFactory, unique
from tests.helpers.poll import poll
from tests.helpers.servers import free_port

COMPOSE = REPO_ROOT / "docker-compose.yml"
DOCKERFILE = REPO_ROOT / "Dockerfile"
SERVICES = {"postgres", "zookeeper", "broker1", "broker2", "broker3", "audit"}
BROKERS = ("broker1", "broker2", "broker3")
SETTINGS_ENV = {f"AMQLITE_{f.upper()}" for f in Settings.__dataclass_fields__}
#: How long a health check may take here (s): one CLI start and one registry read.
HEALTHCHECK_TIMEOUT = 60.0


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    with open(COMPOSE) as f:
        return yaml.safe_load(f)


def parse_amqlite(argv: list[str]) -> tuple[click.Command, dict[str, Any]]:
    """Parse ``amqlite ...`` with the real CLI (without running it); fails the test on an
    unknown command or option, a bad value or a missing required option."""
    assert argv and argv[0] == "amqlite", argv
    group: click.Command = cli
    ctx = click.Context(cli, info_name="amqlite")
    args = argv[1:]
    while isinstance(group, click.Group):
        assert args, f"{argv}: no sub-command"
        sub = group.get_command(ctx, args[0])
        assert sub is not None, f"{argv}: `amqlite` has no command {args[0]!r}"
        if isinstance(sub, click.Group):  # (options of a group itself: not used here)
            ctx = click.Context(sub, info_name=args[0], parent=ctx)
            args = args[1:]
            group = sub
            continue
        try:
            sub_ctx = sub.make_context(args[0], list(args[1:]), parent=ctx)
        except click.exceptions.Exit as e:  # --help, --version
            assert e.exit_code == 0, argv
            return sub, {}
        except click.ClickException as e:
            raise AssertionError(f"{argv}: {e.format_message()}") from None
        return sub, sub_ctx.params
    raise AssertionError(f"{argv}: not a command")


def service_env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def shell_commands(line: str, env: dict[str, str]) -> list[list[str]]:
    """The commands of a CMD-SHELL pipeline, Compose's $$ unescaped and $VARs expanded;
    a variable the service does not define fails the test."""
    line = line.replace("$$", "$")
    used = set(re.findall(r"\$\{?(\w+)", line))
    assert used <= set(env), f"health check uses undefined {used - set(env)}"
    out = []
    for part in line.split("|"):
        words = shlex.split(part)
        out.append([re.sub(r"\$\{?(\w+)\}?", lambda m: env[m.group(1)], w) for w in words])
    return out


def amqlite_lines(service: dict[str, Any]) -> list[list[str]]:
    """Every amqlite command line of a service: its command and its health check."""
    env = service_env(service)
    lines = []
    command = service.get("command")
    if command:
        lines.append(command if isinstance(command, list) else shlex.split(command))
    test = (service.get("healthcheck") or {}).get("test")
    if isinstance(test, list) and test[0] == "CMD-SHELL":
        lines += shell_commands(test[1], env)
    elif isinstance(test, list) and test[0] == "CMD":
        lines.append(test[1:])
    return [ln for ln in lines if ln and ln[0] == "amqlite"]


def test_compose_names_the_issues_services_with_health_checks(compose: dict) -> None:
    services = compose["services"]
    assert set(services) == SERVICES
    for name in ("postgres", "zookeeper", *BROKERS):
        assert services[name].get("healthcheck", {}).get("test"), f"{name}: no health check"
    for name, svc in services.items():
        depends = svc.get("depends_on") or {}
        for dep, spec in (depends.items() if isinstance(depends, dict)
                          else ((d, {}) for d in depends)):
            assert dep in services, f"{name} depends on unknown service {dep}"
            if spec.get("condition") == "service_healthy":
                assert services[dep].get("healthcheck"), f"{name} waits for {dep}'s health"
    for name in BROKERS:
        assert {"postgres", "zookeeper"} <= set(services[name]["depends_on"])
    assert "postgres" in services["audit"]["depends_on"]
    # `docker compose run audit` starts the audit's dependencies: a broker among them
    # would be started again after the user stopped it.
    assert not set(services["audit"]["depends_on"]) & set(BROKERS), "audit starts brokers"
    for name in BROKERS:
        # Restarted after a crash, not after `docker compose stop`.
        assert services[name]["restart"] == "unless-stopped"
        test = " ".join(services[name]["healthcheck"]["test"][1:])
        assert re.search(r"/(healthz|readyz)\b", test), f"{name}: health check is not the API's"
    for name, svc in services.items():
        for port in svc.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} beyond loopback"


def test_every_amqlite_command_line_parses_with_the_real_cli(compose: dict) -> None:
    seen = set()
    for name, svc in compose["services"].items():
        for argv in amqlite_lines(svc):
            command, _ = parse_amqlite(argv)
            seen.add((name, command.name))
    for name in BROKERS:
        assert (name, "start") in seen
    assert ("audit", "audit") in seen


def test_environment_names_real_settings_and_the_brokers_form_one_group(
        compose: dict) -> None:
    services = compose["services"]
    pg = service_env(services["postgres"])
    resolved: dict[str, Settings] = {}
    for name in BROKERS:
        svc = services[name]
        env = service_env(svc)
        unknown = {k for k in env if k.startswith("AMQLITE_")} - SETTINGS_ENV
        assert not unknown, f"{name}: no such settings {unknown}"
        (start,) = [ln for ln in amqlite_lines(svc) if ln[1] == "start"]
        _, params = parse_amqlite(start)
        options = {k: v for k, v in params.items() if k != "config_file"}
        resolved[name] = s = load_settings(options, params.get("config_file"), environ=env)
        assert s.bind == "0.0.0.0:61613"
        (port,) = svc["ports"]
        host_ip, host_port, container_port = str(port).split(":")
        assert container_port == "61613"
        assert s.advertise == f"tcp://{host_ip}:{host_port}", f"{name} advertises {s.advertise}"
    assert {s.name for s in resolved.values()} == set(BROKERS)
    assert len({s.advertise for s in resolved.values()}) == 3
    assert len({(s.group, s.store, s.locker) for s in resolved.values()}) == 1
    s = resolved["broker1"]
    assert s.store == (f"postgresql://{pg['POSTGRES_USER']}:{pg['POSTGRES_PASSWORD']}"
                       f"@postgres:5432/{pg['POSTGRES_DB']}")
    assert s.locker.startswith("zk://zookeeper:2181/")
    assert s.rejoin
    (audit,) = amqlite_lines(services["audit"])
    _, params = parse_amqlite(audit)
    assert params["store"] == s.store


def test_dockerfile_builds_the_targets_compose_uses(compose: dict) -> None:
    text = DOCKERFILE.read_text()
    stages = re.findall(r"^FROM\s+(\S+)(?:\s+AS\s+(\S+))?", text, re.M | re.I)
    # The Debian release is pinned: the audit's openjdk-17-jre-headless is in Debian 12
    # (bookworm), not in 13, which plain python:3.11-slim moved to.
    assert stages[0][0] == "python:3.11-slim-bookworm"
    assert "openjdk-17-jre-headless" in text or "default-jre-headless" in text
    assert re.search(r"^HEALTHCHECK\s.*\n?.*CMD\s.*/healthz", text, re.M), "no HEALTHCHECK"
    names = {n for _, n in stages if n}
    for name, svc in compose["services"].items():
        build = svc.get("build")
        if isinstance(build, dict) and "target" in build:
            assert build["target"] in names, f"{name} builds unknown target {build['target']}"
    for cmd in re.findall(r"^CMD\s+(\[.*\])\s*$", text, re.M):
        parse_amqlite(json.loads(cmd))
    copied = set(re.findall(r"^COPY\s+(\S+)\s+\./\S+\s*$", text, re.M))
    with open(REPO_ROOT / "pyproject.toml", "rb") as f:
        packages = tomllib.load(f)["tool"]["setuptools"]["packages"]["find"]["include"]
    for pattern in packages:
        assert pattern.rstrip("*") in copied, f"the image lacks package {pattern}"
    for path in copied:
        assert (REPO_ROOT / path).exists(), f"COPY {path}: no such path"
    ignored = (REPO_ROOT / ".dockerignore").read_text().split()
    assert not set(ignored) & copied, "the image copies what .dockerignore drops"


def dockerfile_healthcheck() -> list[str]:
    """The image's HEALTHCHECK command (exec form)."""
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    (cmd,) = re.findall(r"^HEALTHCHECK\s.*?\bCMD\s+(\[.*\])\s*$", text, re.M)
    return json.loads(cmd)


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_health_checks_pass_for_a_live_master_and_slave_only(
        compose: dict, broker_factory: BrokerFactory, tmp_path: Path) -> None:
    """The brokers' CMD-SHELL health check (run by a real shell) and the image's
    HEALTHCHECK, against real brokers' management APIs at the address compose and the
    image give them: healthy as master and as slave, unhealthy where nothing answers."""
    test = compose["services"]["broker1"]["healthcheck"]["test"]
    assert test[0] == "CMD-SHELL"
    script = test[1].replace("$$", "$")
    image_check = dockerfile_healthcheck()
    shared = broker_factory.data_dir("shared")
    group = unique("hc")
    http = {n: f"127.0.0.1:{free_port()}" for n in ("m", "s")}
    master = broker_factory.start(data_dir=shared, name="m", group=group,
                                  extra_args=["--http", http["m"]])
    broker_factory.start(data_dir=shared, name="s", group=group, wait=False,
                         extra_args=["--http", http["s"]])
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    assert master.is_serving()

    def check(address: str) -> tuple[int, int]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AMQLITE_")}
        env.update(PATH=path, AMQLITE_HTTP_BIND=address)
        shell = subprocess.run(["sh", "-c", script], env=env, capture_output=True,
                               timeout=HEALTHCHECK_TIMEOUT, check=False).returncode
        image = subprocess.run(image_check, env=env, capture_output=True,
                               timeout=HEALTHCHECK_TIMEOUT, check=False).returncode
        return shell, image

    for name, address in http.items():
        poll(lambda a=address: check(a), lambda codes: codes == (0, 0),
             timeout=HEALTHCHECK_TIMEOUT, what=f"health checks pass for {name}")
    shell, image = check(f"127.0.0.1:{free_port()}")
    assert shell != 0 and image != 0
