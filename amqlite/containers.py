"""Containers: named broker processes on this machine (Fuse Fabric's
``container-create|start|stop|list|delete``), managed here; ``cli.cluster_cmds``
only parses the command line and prints what these functions return.

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
from typing import Any

from amqlite.registry import Member, RegistryError, Role, read_members, registry_url
from amqlite.settings import Settings, SettingsError, load_settings

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


def _extra_settings(extra: tuple[str, ...] | list[str]) -> dict[str, str]:
    """``KEY=VALUE`` items of ``--set``: known settings that create does not manage."""
    extras: dict[str, str] = {}
    fields = {f.name for f in dataclasses.fields(Settings)}
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
    if bind_base is not None:
        if bind_base + len(names) - 1 > 65535:
            raise ContainerError("--bind-base: not enough ports above it", usage=True)
        ports = [bind_base + i for i in range(len(names))]
    else:
        taken = set()
        for c in existing.values():
            with contextlib.suppress(SettingsError):
                taken.add(c.settings().bind_address[1])
        ports = _free_ports(len(names), taken)
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
        c.config.write_text(f"# amqlite container {c.name}: `amqlite start --config "
                            f"{c.config}`\n[broker]\n{body}")
        created.append((c, values["bind"]))
    return created


# --------------------------------------------------------------------------- start, stop


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


@dataclass(frozen=True)
class Started:
    """A started container: its pid and its role in the registry, or None when
    it did not show up there within ``START_WAIT`` (it may still be starting)."""

    container: Container
    pid: int
    role: str | None


def start_container(home: Path, name: str) -> Started:
    """Start container ``name`` in the background; returns once it has joined
    its group's registry (as master or slave), or after ``START_WAIT``."""
    c = get_container(home, name)
    pid = c.pid()
    if pid is not None:
        raise ContainerError(f"container {name} is already running (pid {pid})")
    try:
        settings = c.settings()
    except SettingsError as e:
        raise ContainerError(f"container {name}: {e}") from None
    proc = _spawn(c)
    c.pid_file.write_text(f"{proc.pid}\n")
    url = registry_url(settings)
    deadline = time.monotonic() + START_WAIT
    while True:
        code = proc.poll()
        if code is not None:
            c.pid_file.unlink(missing_ok=True)
            raise ContainerError(f"container {name} exited at once (status {code}): "
                                 f"{_last_line(c.log)}")
        with contextlib.suppress(RegistryError):
            member = next((m for m in read_members(url, settings.group)
                           if m.name == settings.name and m.pid == proc.pid), None)
            if member is not None:
                return Started(c, proc.pid, member.role)
        if time.monotonic() >= deadline:
            return Started(c, proc.pid, None)
        time.sleep(POLL)


def _wait_gone(pid: int, marker: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while broker_runs(pid, marker):
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL)
    return True


def stop_container(home: Path, name: str, *, kill: bool = False) -> int:
    """Stop container ``name``: SIGTERM and wait (a master hands over at once),
    or SIGKILL with ``kill``. Returns the pid it stopped."""
    c = get_container(home, name)
    pid = c.pid()
    if pid is None:
        c.pid_file.unlink(missing_ok=True)
        raise ContainerError(f"container {name} is not running")
    marker = str(c.config)
    with contextlib.suppress(ProcessLookupError):
        if kill:
            os.kill(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGCONT)  # a paused broker cannot handle SIGTERM
            os.kill(pid, signal.SIGTERM)
    if not _wait_gone(pid, marker, KILL_WAIT if kill else STOP_WAIT):
        raise ContainerError(f"container {name} (pid {pid}) still runs after "
                             f"{KILL_WAIT if kill else STOP_WAIT:g}s"
                             + ("" if kill else "; try --kill"))
    c.pid_file.unlink(missing_ok=True)
    return pid


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


def delete_container(home: Path, name: str) -> None:
    """Delete container ``name``'s directory (config, data, log). It must be
    stopped; a shared store under <home>/.groups is kept for the group's others."""
    c = get_container(home, name)
    pid = c.pid()
    if pid is not None:
        raise ContainerError(f"container {name} is running (pid {pid}): stop it first")
    shutil.rmtree(c.dir)
