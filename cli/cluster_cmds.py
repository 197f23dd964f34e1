"""``amqlite cluster-list`` and ``amqlite container ...``: Fuse Fabric's
``fabric:cluster-list`` and ``container-create|start|stop|list|delete`` for amqlite.

Containers are named broker processes on this machine, each with its own
directory under one home (``AMQLITE_HOME``, default
``$XDG_DATA_HOME/amqlite/containers``, i.e. ``~/.local/share/amqlite/containers``)::

    <home>/<name>/config.toml   settings of `amqlite start --config` ([broker] table)
    <home>/<name>/data/         the node's data directory
    <home>/<name>/broker.log    stdout and stderr of the process
    <home>/<name>/broker.pid    pid of the running process
    <home>/.groups/<group>/     the group's shared SQLite store and lock file, when
                                `container create` was given no --store

The config is authoritative: ``container start`` drops ``AMQLITE_<SETTING>``
variables from the broker's environment (use ``container create --set``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import click

from amqlite.registry import (
    GroupView,
    Member,
    RegistryError,
    group_views,
    read_members,
    registry_url,
)
from amqlite.settings import Settings, SettingsError, load_settings

#: Exit codes: a failed operation, and a bad request (click's usage code).
EXIT_FAILED = 1
EXIT_USAGE = 2

#: Fabric's cluster-list column width.
COLUMN_WIDTH = 30
HOME_ENV = "AMQLITE_HOME"
CONFIG_FILE = "config.toml"
PID_FILE = "broker.pid"
LOG_FILE = "broker.log"
DATA_DIR = "data"
#: Shared embedded stores of container groups created without --store.
GROUPS_DIR = ".groups"
#: Names become directory names, znode names and registry keys: the locker's rule.
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
#: Settings that ``container create`` writes itself and ``--set`` may not override.
MANAGED_SETTINGS = ("group", "name", "data_dir", "store", "locker", "bind")
#: How long ``container start`` waits for the broker to show up in the registry
#: (s): importing, opening the store and the first registry write take a second
#: or two on a loaded machine; after this it reports "started" anyway.
START_WAIT = 30.0
#: How long ``container stop`` waits after SIGTERM (s): the node drains its
#: group commit for up to 10 s (node.GRACEFUL_DRAIN_TIMEOUT), plus margin.
STOP_WAIT = 30.0
#: How long ``container stop --kill`` waits for the kernel to end the process (s).
KILL_WAIT = 10.0
#: Poll period while waiting for a process or the registry (s).
POLL = 0.05


def _fail(message: str, code: int = EXIT_FAILED) -> NoReturn:
    click.echo(f"amqlite: error: {message}", err=True)
    sys.exit(code)


def _warn(message: str) -> None:
    click.echo(f"amqlite: warning: {message}", err=True)


# --------------------------------------------------------------------------- cluster-list


def _cell(values: list[str]) -> str:
    return ", ".join(values) if values else "-"


def format_table(views: list[GroupView]) -> str:
    """Fabric's layout: 30-character columns, one row per group."""
    w = COLUMN_WIDTH
    lines = [f"{'[cluster]':<{w}} {'[masters]':<{w}} {'[slaves]':<{w}} [services]"]
    for v in views:
        lines.append(f"{v.group:<{w}} {_cell(v.masters):<{w}} {_cell(v.slaves):<{w}} "
                     f"{_cell(v.services)}".rstrip())
    return "\n".join(lines)


def _default_sources(group: str | None, config_file: str | None) -> list[str]:
    """The registry of the settings this shell would start a broker with, and
    that of every container under the home."""
    try:
        settings = load_settings({"group": group} if group else {}, config_file)
    except SettingsError as e:
        _fail(str(e), EXIT_USAGE)
    sources = [registry_url(settings)]
    for c in _containers(container_home()):
        with contextlib.suppress(SettingsError):
            url = registry_url(c.settings())
            if url not in sources:
                sources.append(url)
    return sources


@click.command("cluster-list")
@click.option("--registry", "registry", metavar="URL",
              help="Registry to read: zk://host:port/root or a store URL.")
@click.option("--store", metavar="URL",
              help="Store whose registry to read (store-registry groups).")
@click.option("--group", help="Show only this group.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option("--config", "config_file", type=click.Path(dir_okay=False),
              help="Settings file whose registry to read (as `amqlite start --config`).")
def cluster_list(registry: str | None, store: str | None, group: str | None, as_json: bool,
                 config_file: str | None) -> None:
    """One row per group: its master, slaves and the master's client URIs.

    Without --registry/--store: the registry of the settings `amqlite start`
    would use here (AMQLITE_* environment, --config; zk:// locker, else the
    store) and those of every container under AMQLITE_HOME.
    """
    if registry and store:
        _fail("give --registry or --store, not both", EXIT_USAGE)
    explicit = registry or store
    sources = [explicit] if explicit else _default_sources(group, config_file)
    members: dict[tuple[str, str], Member] = {}
    errors: list[str] = []
    for url in sources:
        try:
            for m in read_members(url, group):
                members.setdefault((m.group, m.name), m)
        except RegistryError as e:
            errors.append(str(e))
    if errors and (explicit or len(errors) == len(sources)):
        _fail(errors[0])
    for e in errors:
        _warn(e)
    views = group_views(members.values())
    if as_json:
        click.echo(json.dumps([v.to_json() for v in views], indent=2))
    else:
        click.echo(format_table(views))


# --------------------------------------------------------------------------- containers


def container_home() -> Path:
    """``AMQLITE_HOME``, else ``$XDG_DATA_HOME/amqlite/containers``."""
    if os.environ.get(HOME_ENV):
        return Path(os.environ[HOME_ENV]).expanduser().resolve()
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(Path.home(), ".local", "share")
    return Path(base).resolve() / "amqlite" / "containers"


@dataclass
class Container:
    name: str
    dir: Path

    @property
    def config(self) -> Path:
        return self.dir / CONFIG_FILE

    @property
    def pid_file(self) -> Path:
        return self.dir / PID_FILE

    @property
    def log(self) -> Path:
        return self.dir / LOG_FILE

    def settings(self) -> Settings:
        """The container's settings, from its config alone (not this shell's env)."""
        return load_settings(None, str(self.config), environ={})

    def pid(self) -> int | None:
        """The broker's pid if it runs (a stale pid file or a reused pid is not it)."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if _runs(pid, str(self.config)) else None


def _runs(pid: int, marker: str) -> bool:
    """True if ``pid`` is alive (not a zombie: a broker started from this very
    process and not reaped yet is dead) and its command line names ``marker``
    (so a pid reused by another program is not taken for the broker)."""
    if Path("/proc/self").exists():
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            return False
        state = stat.rsplit(")", 1)[-1].split()[0]
        return state not in ("Z", "X") and marker in cmdline.split("\0")
    try:  # no procfs: the pid file is all we have
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _containers(home: Path) -> list[Container]:
    if not home.is_dir():
        return []
    return [Container(p.name, p) for p in sorted(home.iterdir())
            if not p.name.startswith(".") and (p / CONFIG_FILE).is_file()]


def _get(home: Path, name: str) -> Container:
    c = Container(name, home / name)
    if not NAME_RE.fullmatch(name) or not c.config.is_file():
        _fail(f"no container named {name!r} in {home}")
    return c


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(str(value))  # a JSON string is a valid TOML basic string


def _free_ports(count: int, taken: set[int]) -> list[int]:
    """Ports free now on loopback; ``taken``: ports other containers were given."""
    ports: list[int] = []
    while len(ports) < count:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in taken and port not in ports:
            ports.append(port)
    return ports


def _default_locker(store: str) -> str:
    """A locker every container of the group shares: the PostgreSQL store's
    advisory lock, or a lock file beside the SQLite store."""
    from store import parse_store_url

    parsed = parse_store_url(store)
    if parsed.dialect == "postgresql":
        return store
    assert parsed.path is not None
    return f"file://{parsed.path.parent / 'amqlite.lock'}"


@click.group("container")
@click.option("--home", envvar=HOME_ENV, type=click.Path(file_okay=False),
              help=f"Containers' home directory (env {HOME_ENV}; default "
                   "~/.local/share/amqlite/containers).")
@click.pass_context
def container(ctx: click.Context, home: str | None) -> None:
    """Named broker processes on this machine: create, start, stop, list, delete."""
    ctx.obj = Path(home).expanduser().resolve() if home else container_home()


@container.command("create")
@click.argument("names")
@click.option("--group", default="default", show_default=True, help="The brokers' group.")
@click.option("--store", help="Shared store URL (default: a SQLite store under the home).")
@click.option("--locker", help="Locker URL (default: the PostgreSQL store's advisory lock, "
                               "or a lock file beside the SQLite store).")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address the brokers listen on.")
@click.option("--bind-base", type=click.IntRange(1, 65535),
              help="First STOMP port; the next containers get the following ones "
                   "(default: free ports picked now).")
@click.option("--rejoin/--no-rejoin", default=True, show_default=True,
              help="A demoted broker waits as slave again instead of exiting.")
@click.option("--set", "extra", multiple=True, metavar="KEY=VALUE",
              help="Any other setting for the config file, e.g. zk_session_timeout=5.")
@click.pass_obj
def create(home: Path, names: str, group: str, store: str | None, locker: str | None,
           host: str, bind_base: int | None, rejoin: bool, extra: tuple[str, ...]) -> None:
    """Create containers NAMES (comma-separated) of one group."""
    from lockers import LockerError, open_locker
    from store import StoreError, parse_store_url

    wanted = [n.strip() for n in names.split(",") if n.strip()]
    if not wanted:
        _fail("no container names given", EXIT_USAGE)
    for n in wanted:
        if not NAME_RE.fullmatch(n):
            _fail(f"bad container name {n!r}: use letters, digits, '.', '_' and '-'", EXIT_USAGE)
    if len(set(wanted)) != len(wanted):
        _fail("a container name is given twice", EXIT_USAGE)
    existing = {c.name: c for c in _containers(home)}
    for n in wanted:
        if n in existing or (home / n).exists():
            _fail(f"container {n!r} already exists in {home}")
    extras: dict[str, str] = {}
    fields = {f.name for f in dataclasses.fields(Settings)}
    for item in extra:
        key, sep, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in fields:
            _fail(f"--set {item!r}: expected KEY=VALUE with a setting name", EXIT_USAGE)
        if key in MANAGED_SETTINGS:
            _fail(f"--set {key}: use the option of `container create` instead", EXIT_USAGE)
        extras[key] = value
    group_dir = home / GROUPS_DIR / group
    store = store or f"sqlite:///{group_dir / 'amqlite.db'}"
    try:
        parse_store_url(store)
        locker = locker or _default_locker(store)
        open_locker(locker, group)  # validates the URL; connects to nothing
    except (StoreError, LockerError) as e:
        _fail(str(e), EXIT_USAGE)
    if bind_base is not None:
        if bind_base + len(wanted) - 1 > 65535:
            _fail("--bind-base: not enough ports above it", EXIT_USAGE)
        ports = [bind_base + i for i in range(len(wanted))]
    else:
        taken = set()
        for c in existing.values():
            with contextlib.suppress(SettingsError):
                taken.add(c.settings().bind_address[1])
        ports = _free_ports(len(wanted), taken)
    configs: list[tuple[Container, dict[str, Any]]] = []
    for name, port in zip(wanted, ports, strict=True):
        c = Container(name, home / name)
        values: dict[str, Any] = {
            "group": group, "name": name, "data_dir": str(c.dir / DATA_DIR), "store": store,
            "locker": locker, "bind": f"{host}:{port}", "rejoin": rejoin, **extras,
        }
        try:
            load_settings(values, environ={})
        except SettingsError as e:
            _fail(str(e), EXIT_USAGE)
        configs.append((c, values))
    if store.startswith("sqlite:"):
        group_dir.mkdir(parents=True, exist_ok=True)
    for c, values in configs:
        (c.dir / DATA_DIR).mkdir(parents=True)
        body = "".join(f"{k} = {_toml_value(v)}\n" for k, v in values.items())
        c.config.write_text(f"# amqlite container {c.name}: `amqlite start --config "
                            f"{c.config}`\n[broker]\n{body}")
        click.echo(f"created container {c.name} (group {group}, stomp {values['bind']}) "
                   f"in {c.dir}")


def _spawn(c: Container) -> subprocess.Popen[bytes]:
    fields = {f"AMQLITE_{f.name.upper()}" for f in dataclasses.fields(Settings)}
    env = {k: v for k, v in os.environ.items() if k not in fields}
    env["PYTHONUNBUFFERED"] = "1"
    argv = [sys.executable, "-m", "cli", "start", "--config", str(c.config)]
    with open(c.log, "ab") as log:
        log.write(f"=== amqlite container start {c.name} at {time.strftime('%F %T')}\n".encode())
        log.flush()
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, env=env, cwd=c.dir,
                                start_new_session=True)


def _last_line(path: Path) -> str:
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1] if lines else ""


@container.command("start")
@click.argument("name")
@click.pass_obj
def start(home: Path, name: str) -> None:
    """Start container NAME in the background; returns once it has joined its
    group's registry (as master or slave)."""
    c = _get(home, name)
    pid = c.pid()
    if pid is not None:
        _fail(f"container {name} is already running (pid {pid})")
    try:
        settings = c.settings()
    except SettingsError as e:
        _fail(f"container {name}: {e}")
    proc = _spawn(c)
    c.pid_file.write_text(f"{proc.pid}\n")
    url = registry_url(settings)
    deadline = time.monotonic() + START_WAIT
    while True:
        code = proc.poll()
        if code is not None:
            c.pid_file.unlink(missing_ok=True)
            _fail(f"container {name} exited at once (status {code}): {_last_line(c.log)}")
        with contextlib.suppress(RegistryError):
            member = next((m for m in read_members(url, settings.group)
                           if m.name == settings.name and m.pid == proc.pid), None)
            if member is not None:
                click.echo(f"started container {name} (pid {proc.pid}, {member.role})")
                return
        if time.monotonic() >= deadline:
            click.echo(f"started container {name} (pid {proc.pid}); not in the registry yet: "
                       f"see {c.log}")
            return
        time.sleep(POLL)


def _wait_gone(pid: int, marker: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while _runs(pid, marker):
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL)
    return True


@container.command("stop")
@click.argument("name")
@click.option("--kill", is_flag=True, help="SIGKILL (a crash) instead of a graceful stop.")
@click.pass_obj
def stop(home: Path, name: str, kill: bool) -> None:
    """Stop container NAME: SIGTERM and wait (a master hands over at once), or
    SIGKILL with --kill."""
    c = _get(home, name)
    pid = c.pid()
    if pid is None:
        c.pid_file.unlink(missing_ok=True)
        _fail(f"container {name} is not running")
    marker = str(c.config)
    with contextlib.suppress(ProcessLookupError):
        if kill:
            os.kill(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGCONT)  # a paused broker cannot handle SIGTERM
            os.kill(pid, signal.SIGTERM)
    if not _wait_gone(pid, marker, KILL_WAIT if kill else STOP_WAIT):
        _fail(f"container {name} (pid {pid}) still runs after "
              f"{KILL_WAIT if kill else STOP_WAIT:g}s" + ("" if kill else "; try --kill"))
    c.pid_file.unlink(missing_ok=True)
    click.echo(f"{'killed' if kill else 'stopped'} container {name} (pid {pid})")


@container.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.pass_obj
def list_(home: Path, as_json: bool) -> None:
    """Every container: group, state, pid, role (from the registry), services."""
    rows: list[dict[str, Any]] = []
    registries: dict[str, list[Member] | None] = {}
    for c in _containers(home):
        pid = c.pid()
        try:
            s = c.settings()
        except SettingsError as e:
            _warn(f"container {c.name}: {e}")
            rows.append({"name": c.name, "group": "?", "state": "broken", "pid": pid,
                         "role": "-", "services": []})
            continue
        role, services = "-", [s.advertise]
        if pid is not None:
            url = registry_url(s)
            if url not in registries:
                try:
                    registries[url] = read_members(url, None)
                except RegistryError as e:
                    _warn(str(e))
                    registries[url] = None
            found = registries[url]
            member = next((m for m in found or () if m.group == s.group and m.name == s.name),
                          None)
            role = "?" if found is None else (member.role if member else "starting")
            if member is not None and member.services:
                services = list(member.services)
        rows.append({"name": c.name, "group": s.group, "state": "running" if pid else "stopped",
                     "pid": pid, "role": role, "services": services})
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    header = ("[name]", "[group]", "[state]", "[pid]", "[role]", "[services]")
    table = [header] + [(r["name"], r["group"], r["state"], str(r["pid"] or "-"), r["role"],
                         ", ".join(r["services"])) for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header) - 1)]
    for row in table:
        click.echo("  ".join(f"{v:<{w}}" for v, w in zip(row, widths, strict=False))
                   + "  " + row[-1])


@container.command("delete")
@click.argument("name")
@click.pass_obj
def delete(home: Path, name: str) -> None:
    """Delete container NAME's directory (config, data, log). It must be stopped;
    a shared store under <home>/.groups is kept for the group's other containers."""
    c = _get(home, name)
    pid = c.pid()
    if pid is not None:
        _fail(f"container {name} is running (pid {pid}): stop it first")
    shutil.rmtree(c.dir)
    click.echo(f"deleted container {name}")


def register(cli_group: click.Group) -> None:
    """Add ``cluster-list`` and ``container`` to the ``amqlite`` command group."""
    cli_group.add_command(cluster_list)
    cli_group.add_command(container)
