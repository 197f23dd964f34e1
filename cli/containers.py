"""Containers: named broker processes on this machine (Fuse Fabric's
``container-create|start|stop|list|delete``), managed here; ``cli.cluster_cmds``
only parses the command line and prints what these functions return. Operator
tooling of the CLI alone, so it lives in ``cli`` (it uses ``amqlite``, never the reverse).

Each container has its own directory under one home (``AMQLITE_HOME``, default
``$XDG_DATA_HOME/amqlite/containers``, i.e. ``~/.local/share/amqlite/containers``)::

    <home>/<name>/config.toml   settings of `amqlite start --config` ([broker] table)
    <home>/<name>/data/         the node's data directory
    <home>/<name>/broker.log    stdout and stderr of the process
    <home>/<name>/broker.pid    pid of the running process
    <home>/.groups/<group>/     the group's shared SQLite store and lock file, when
                                `container create` was given no --store

The config is authoritative: ``start_container`` drops ``AMQLITE_<SETTING>``
variables from the broker's environment (use ``container create --set``).
Failures raise ``ContainerError`` with a one-line message for the user.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from amqlite.listen import pick_ports
from amqlite.pidfile import pid_runs, stop_process
from amqlite.registry import (
    GroupView,
    Member,
    RegistryError,
    Role,
    display_url,
    group_views,
    read_members,
    registry_url,
)
from amqlite.settings import Settings, SettingsError, definitions, load_settings
from cli.private_file import write_private

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
#: How long ``container start`` waits for the broker to take its real role (s):
#: importing, opening the store and the first registry write take a second or two
#: on a loaded machine; a node that keeps retrying an unreachable store or
#: ZooKeeper past this is reported as not started (it keeps running and retrying).
START_WAIT = 30.0
#: A new node announces "slave" before it asks for the lock, so "slave" is its real
#: role only once another node is master or it has stayed slave this long (s):
#: a free lock is taken within a poll interval (0.5 s default) plus activation.
SLAVE_SETTLE = 5.0
#: How often ``container start`` and ``stop`` say what they are waiting for (s).
PROGRESS_INTERVAL = 2.0
#: How long ``container stop`` waits for another broker to take over (s): a SIGKILLed
#: master's ZooKeeper lock outlives it by the session timeout (4 s default, up to
#: 20 s) and a PostgreSQL lease by ``lock_lease``; this covers both with margin.
TAKEOVER_WAIT = 30.0
#: Log lines that say why a node failed: the logger's ERROR/CRITICAL level, the
#: CLI's one-line ``amqlite: error:``, the last line of a traceback.
ERROR_LINE_RE = re.compile(r"\b(ERROR|CRITICAL)\b|^amqlite: error:|^\w*(Error|Exception)\b")
#: The line ``_spawn`` writes before each start; a log's tail starts after the last one.
START_MARKER = "=== amqlite container start "
#: How long ``container stop`` waits after SIGTERM (s): the node drains its
#: group commit for up to 10 s (node.GRACEFUL_DRAIN_TIMEOUT), plus margin.
STOP_WAIT = 30.0
#: How long ``container stop --kill`` waits for the kernel to end the process (s).
KILL_WAIT = 10.0
#: Poll period while waiting for a process or the registry (s).
POLL = 0.05


class ContainerError(Exception):
    """An operation failed (one line for the user); ``usage``: the request
    itself was wrong (the CLI exits with its usage code)."""

    def __init__(self, message: str, *, usage: bool = False) -> None:
        super().__init__(message)
        self.usage = usage


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
        return pid if broker_runs(pid, str(self.config)) else None


def broker_runs(pid: int, marker: str) -> bool:
    """True if ``pid`` is alive and its command line names ``marker`` (the container's
    config file), so a pid reused by another program is not taken for the broker."""
    return pid_runs(pid, lambda argv: marker in argv)


def list_containers(home: Path) -> list[Container]:
    """Every container under ``home``, by name."""
    if not home.is_dir():
        return []
    return [Container(p.name, p) for p in sorted(home.iterdir())
            if not p.name.startswith(".") and (p / CONFIG_FILE).is_file()]


def get_container(home: Path, name: str) -> Container:
    c = Container(name, home / name)
    if not NAME_RE.fullmatch(name) or not c.config.is_file():
        raise ContainerError(f"no container named {name!r} in {home}")
    return c


def container_registries(home: Path) -> list[str]:
    """The registry URL of every container under ``home`` whose config loads,
    each once, in container order."""
    urls: list[str] = []
    for c in list_containers(home):
        with contextlib.suppress(SettingsError):
            url = registry_url(c.settings())
            if url not in urls:
                urls.append(url)
    return urls


# --------------------------------------------------------------------------- create


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(str(value))  # a JSON string is a valid TOML basic string


def _ports_in_use(containers: Iterable[Container]) -> dict[int, str]:
    """Port -> name of the container that listens there (STOMP, TLS, HTTP when set)."""
    used: dict[int, str] = {}
    for c in containers:
        with contextlib.suppress(SettingsError, ValueError):
            s = c.settings()
            ports = [s.bind_address[1]]
            if s.ssl_address is not None:
                ports.append(s.ssl_address[1])
            if s.http_bind and ":" in s.http_bind:
                ports.append(int(s.http_bind.rsplit(":", 1)[1]))
            for port in ports:
                used.setdefault(port, c.name)
    return used


def _default_locker(store: str) -> str:
    """A locker every container of the group shares: the PostgreSQL store's
    advisory lock, or a lock file beside the SQLite store."""
    from store import parse_store_url

    parsed = parse_store_url(store)
    if parsed.dialect == "postgresql":
        return store
    assert parsed.path is not None
    return f"file://{parsed.path.parent / 'amqlite.lock'}"


def _extra_settings(extra: tuple[str, ...] | list[str]) -> dict[str, str]:
    """``KEY=VALUE`` items of ``--set``: known settings that create does not manage."""
    extras: dict[str, str] = {}
    fields = {d.name for d in definitions()}
    for item in extra:
        key, sep, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in fields:
            raise ContainerError(f"--set {item!r}: expected KEY=VALUE with a setting name",
                                 usage=True)
        if key in MANAGED_SETTINGS:
            raise ContainerError(f"--set {key}: use the option of `container create` instead",
                                 usage=True)
        extras[key] = value
    return extras


def create_containers(home: Path, names: list[str], *, group: str, store: str | None,
                      locker: str | None, host: str, bind_base: int | None, rejoin: bool,
                      extra: tuple[str, ...] | list[str] = ()) -> list[tuple[Container, str]]:
    """Create containers ``names`` of one group: (container, its STOMP bind
    address) each. Everything is checked before the first directory is made."""
    from lockers import LockerError, open_locker
    from store import StoreError, parse_store_url

    if not names:
        raise ContainerError("no container names given", usage=True)
    for n in names:
        if not NAME_RE.fullmatch(n):
            raise ContainerError(f"bad container name {n!r}: use letters, digits, '.', '_' "
                                 "and '-'", usage=True)
    if len(set(names)) != len(names):
        raise ContainerError("a container name is given twice", usage=True)
    existing = {c.name: c for c in list_containers(home)}
    for n in names:
        if n in existing or (home / n).exists():
            raise ContainerError(f"container {n!r} already exists in {home}")
    extras = _extra_settings(extra)
    group_dir = home / GROUPS_DIR / group
    store = store or f"sqlite:///{group_dir / 'amqlite.db'}"
    try:
        parse_store_url(store)
        locker = locker or _default_locker(store)
        open_locker(locker, group)  # validates the URL; connects to nothing
    except (StoreError, LockerError) as e:
        raise ContainerError(str(e), usage=True) from None
    used = _ports_in_use(existing.values())
    if bind_base is not None:
        if bind_base + len(names) - 1 > 65535:
            raise ContainerError("--bind-base: not enough ports above it", usage=True)
        ports = [bind_base + i for i in range(len(names))]
        for n, port in zip(names, ports, strict=True):
            if port in used:
                raise ContainerError(f"port {port} for container {n!r} is already used by "
                                     f"container {used[port]!r}", usage=True)
    else:
        ports = pick_ports(len(names), taken=used)
    configs: list[tuple[Container, dict[str, Any]]] = []
    for name, port in zip(names, ports, strict=True):
        c = Container(name, home / name)
        values: dict[str, Any] = {
            "group": group, "name": name, "data_dir": str(c.dir / DATA_DIR), "store": store,
            "locker": locker, "bind": f"{host}:{port}", "rejoin": rejoin, **extras,
        }
        try:
            load_settings(values, environ={})
        except SettingsError as e:
            raise ContainerError(str(e), usage=True) from None
        configs.append((c, values))
    if store.startswith("sqlite:"):
        group_dir.mkdir(parents=True, exist_ok=True)
    created: list[tuple[Container, str]] = []
    for c, values in configs:
        (c.dir / DATA_DIR).mkdir(parents=True)
        body = "".join(f"{k} = {_toml_value(v)}\n" for k, v in values.items())
        # 0600: the store URL may carry its password
        write_private(c.config, f"# amqlite container {c.name}: `amqlite start --config "
                                f"{c.config}`\n[broker]\n{body}")
        created.append((c, values["bind"]))
    return created


# --------------------------------------------------------------------------- start, stop


def _spawn(c: Container) -> subprocess.Popen[bytes]:
    fields = {d.env for d in definitions()}
    env = {k: v for k, v in os.environ.items() if k not in fields}
    env["PYTHONUNBUFFERED"] = "1"
    argv = [sys.executable, "-m", "cli", "start", "--config", str(c.config)]
    with open(c.log, "ab") as log:
        log.write(f"{START_MARKER}{c.name} at {time.strftime('%F %T')}\n".encode())
        log.flush()
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, env=env, cwd=c.dir,
                                start_new_session=True)


def _run_lines(path: Path) -> list[str]:
    """The non-blank lines the current (last) run of the container wrote to its log."""
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return []
    starts = [i for i, ln in enumerate(lines) if ln.startswith(START_MARKER)]
    return lines[starts[-1] + 1:] if starts else lines


def last_error_line(path: Path, fallback: str = "") -> str:
    """The last line of the current run that says why it failed (the node knows best),
    else ``fallback`` (e.g. the registry's error), else its last line."""
    lines = _run_lines(path)
    errors = [ln for ln in lines if ERROR_LINE_RE.search(ln)]
    if errors:
        return errors[-1]
    return fallback or (lines[-1] if lines else "(nothing logged)")


Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    return None


@dataclass(frozen=True)
class Started:
    """A started container: its pid, its role in the registry ("master" or
    "slave"), and the group's master when it is a slave (None: none registered)."""

    container: Container
    pid: int
    role: str
    master: str | None = None


def _port_free(host: str, port: int) -> bool:
    """Whether a listener could bind ``host:port`` now (SO_REUSEADDR as asyncio's
    server sets it, so a port in TIME_WAIT counts as free)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            return e.errno != errno.EADDRINUSE
    return True


def start_container(home: Path, name: str, *, wait: float = START_WAIT,
                    progress: Progress = _quiet) -> Started:
    """Start container ``name`` in the background and return its real role: master
    once its own registry entry (by name and pid) says so; slave once another node
    is master, or after ``SLAVE_SETTLE`` without one. Raises ``ContainerError``
    when the process dies (with the last error line of its log) or has no role
    after ``wait`` seconds (it keeps running). ``progress`` gets a line every
    ``PROGRESS_INTERVAL`` while it waits."""
    c = get_container(home, name)
    pid = c.pid()
    if pid is not None:
        raise ContainerError(f"container {name} is already running (pid {pid})")
    try:
        settings = c.settings()
    except SettingsError as e:
        raise ContainerError(f"container {name}: {e}") from None
    host, port = settings.bind_address
    if not _port_free(host, port):
        raise ContainerError(f"container {name}: {host}:{port} is already in use (another "
                             f"broker?); change `bind` in {c.config}")
    proc = _spawn(c)
    c.pid_file.write_text(f"{proc.pid}\n")
    url = registry_url(settings)
    started = time.monotonic()
    deadline = started + wait
    next_progress = started + PROGRESS_INTERVAL
    slave_since: float | None = None
    while True:
        code = proc.poll()
        if code is not None:
            c.pid_file.unlink(missing_ok=True)
            raise ContainerError(f"container {name} exited (status {code}): "
                                 f"{last_error_line(c.log)}")
        view, registry_error = _group_view(url, settings.group)
        me = next((m for m in view.members if m.name == settings.name and m.pid == proc.pid),
                  None) if view else None
        now = time.monotonic()
        if me is not None and view is not None:
            if settings.name in view.masters:
                return Started(c, proc.pid, Role.MASTER)
            if settings.name in view.slaves:
                others = [m for m in view.masters if m != settings.name]
                slave_since = slave_since if slave_since is not None else now
                if others or now - slave_since >= SLAVE_SETTLE:
                    return Started(c, proc.pid, Role.SLAVE, others[0] if others else None)
        if now >= deadline:
            why = last_error_line(c.log, registry_error)
            raise ContainerError(f"container {name} (pid {proc.pid}) has no role after "
                                 f"{wait:g}s; it keeps running and retrying: {why} "
                                 f"(see `amqlite container logs {name}`; stop it with "
                                 f"`amqlite container stop {name}`)")
        if now >= next_progress:
            state = ("slave, waiting for the lock" if me is not None
                     else "not in the registry yet")
            progress(f"container {name}: {state} after {now - started:.0f}s: "
                     f"{last_error_line(c.log, registry_error)}")
            next_progress = now + PROGRESS_INTERVAL
        time.sleep(POLL)


@dataclass(frozen=True)
class Stopped:
    """A stopped container: its pid, the role it had in the registry ("-": not
    there), and who is master of its group afterwards (None: nobody within
    ``TAKEOVER_WAIT``, or ``alone``: no other broker of the group was running);
    ``took``: seconds from the signal to the new master's registry entry."""

    pid: int
    role: str
    master: str | None = None
    epoch: int | None = None
    took: float | None = None
    alone: bool = False


def _group_view(url: str, group: str) -> tuple[GroupView | None, str]:
    """The registry's view of ``group`` (None: no entry), and the error that kept it
    from being read ("" when it was)."""
    try:
        views = group_views(read_members(url, group))
    except RegistryError as e:
        return None, str(e)
    return (views[0] if views else None), ""


def stop_container(home: Path, name: str, *, kill: bool = False,
                   progress: Progress = _quiet) -> Stopped:
    """Stop container ``name``: SIGTERM and wait (a master hands over at once),
    or SIGKILL with ``kill``; then wait for the group's new master."""
    c = get_container(home, name)
    pid = c.pid()
    if pid is None:
        c.pid_file.unlink(missing_ok=True)
        raise ContainerError(f"container {name} is not running")
    settings: Settings | None = None
    with contextlib.suppress(SettingsError):
        settings = c.settings()
    url = registry_url(settings) if settings is not None else None
    before = _group_view(url, settings.group)[0] if settings is not None and url else None
    role = "-"
    if before is not None and settings is not None:
        me = next((m for m in before.members if m.name == settings.name), None)
        role = ("stale" if settings.name in before.stale
                else me.role if me is not None else "-")
    marker = str(c.config)
    signalled = time.monotonic()  # takeover time counts from here, as a client sees it
    if not stop_process(pid, lambda: broker_runs(pid, marker),
                        KILL_WAIT if kill else STOP_WAIT, kill=kill):
        raise ContainerError(f"container {name} (pid {pid}) still runs after "
                             f"{KILL_WAIT if kill else STOP_WAIT:g}s"
                             + ("" if kill else "; try --kill"))
    c.pid_file.unlink(missing_ok=True)
    if settings is None or url is None or before is None:
        return Stopped(pid, role)
    others = [m for m in before.members
              if m.name != settings.name and m.name not in before.stale]
    if role != Role.MASTER:
        master = next((m for m in before.masters if m != settings.name), None)
        return Stopped(pid, role, master, alone=not others)
    if not others:
        return Stopped(pid, role, alone=True)
    # A master's row may outlive it (a crash): the successor is a live master of
    # another name, or of a higher epoch.
    stopped_at = time.monotonic()
    next_progress = stopped_at + PROGRESS_INTERVAL
    while True:
        view, _ = _group_view(url, settings.group)
        now = time.monotonic()
        if view is not None:
            new = next((m for m in view.members if m.name in view.masters
                        and m.name != settings.name), None)
            if new is not None:
                return Stopped(pid, role, new.name, new.epoch, now - signalled)
        if now - stopped_at >= TAKEOVER_WAIT:
            return Stopped(pid, role)
        if now >= next_progress:
            progress(f"waiting for a broker of group {settings.group} to take over "
                     f"({now - stopped_at:.0f}s)")
            next_progress = now + PROGRESS_INTERVAL
        time.sleep(POLL)


# --------------------------------------------------------------------------- list, delete


def container_rows(home: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """Every container: name, group, state, pid, role (from the registry) and
    services; and the warnings met on the way (a broken config, a registry
    that cannot be read)."""
    rows: list[dict[str, Any]] = []
    warnings: list[str] = []
    registries: dict[str, list[Member] | None] = {}
    for c in list_containers(home):
        pid = c.pid()
        try:
            s = c.settings()
        except SettingsError as e:
            warnings.append(f"container {c.name}: {e}")
            rows.append({"name": c.name, "group": "?", "state": "broken", "pid": pid,
                         "role": "-", "services": []})
            continue
        role, services = "-", s.advertise_uris
        if pid is not None:
            url = registry_url(s)
            if url not in registries:
                try:
                    registries[url] = read_members(url, None)
                except RegistryError as e:
                    warnings.append(str(e))
                    registries[url] = None
            found = registries[url]
            member = next((m for m in found or () if m.group == s.group and m.name == s.name),
                          None)
            role = "?" if found is None else (member.role if member else Role.STARTING.value)
            if member is not None and member.services:
                services = list(member.services)
        rows.append({"name": c.name, "group": s.group, "state": "running" if pid else "stopped",
                     "pid": pid, "role": role, "services": services})
    return rows, warnings


def delete_container(home: Path, name: str) -> str | None:
    """Delete container ``name``'s directory (config, data, log). It must be
    stopped; its group's store is kept. Returns what the user should know when
    this was the last container on that store: where the group's data stays and
    how to remove it (None when other containers still use the store)."""
    c = get_container(home, name)
    pid = c.pid()
    if pid is not None:
        raise ContainerError(f"container {name} is running (pid {pid}): stop it first")
    try:
        settings: Settings | None = c.settings()
    except SettingsError:
        settings = None
    shutil.rmtree(c.dir)
    if settings is None:
        return None
    where = display_url(settings.store)
    for other in list_containers(home):
        with contextlib.suppress(SettingsError):
            if display_url(other.settings().store) == where:
                return None
    group_dir = home / GROUPS_DIR / settings.group
    from store import StoreError, parse_store_url

    try:
        path = parse_store_url(settings.store).path
    except StoreError:
        path = None
    if path is not None and path.parent == group_dir:
        return (f"it was the last container of group {settings.group}: the group's store "
                f"stays in {group_dir} (a container created again with --group "
                f"{settings.group} finds its messages); remove it with: "
                f"rm -r {shlex.quote(str(group_dir))}")
    return (f"it was the last container on store {where}: group {settings.group}'s "
            f"messages stay there; remove them with the database's own tools (that store "
            f"may serve other groups)")
