"""``amqlite cluster-list`` and ``amqlite container ...``: Fuse Fabric's
``fabric:cluster-list`` and ``container-create|start|stop|list|delete`` for amqlite.

This module parses the command line and prints; the containers themselves
(their home, directories, processes) are managed by ``cli.containers``.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, NoReturn

import click

from amqlite.registry import (
    GroupView,
    RegistryError,
    Role,
    display_url,
    group_views,
    read_members,
    registry_url,
)
from amqlite.settings import SettingsError, load_settings
from cli.containers import (
    HOME_ENV,
    START_WAIT,
    TAKEOVER_WAIT,
    ContainerError,
    container_home,
    container_registries,
    container_rows,
    create_containers,
    delete_container,
    get_container,
    start_container,
    stop_container,
)

#: Exit codes: a failed operation, and a bad request (click's usage code).
EXIT_FAILED = 1
EXIT_USAGE = 2

#: ``container logs -f``: how often it looks for new lines (s), as ``tail -f`` does.
FOLLOW_POLL = 0.2
#: Fabric's cluster-list column width: the minimum; a longer cell widens its column.
COLUMN_WIDTH = 30
#: How long cluster-list waits for a master's /readyz (s), where it reads the store's
#: replication: a live master answers in milliseconds, and a frozen one must not hold
#: the listing up for longer than this.
READYZ_TIMEOUT = 1.0


def _fail(message: str, code: int = EXIT_FAILED) -> NoReturn:
    click.echo(f"amqlite: error: {message}", err=True)
    sys.exit(code)


def _warn(message: str) -> None:
    click.echo(f"amqlite: warning: {message}", err=True)


def _progress(message: str) -> None:
    click.echo(f"amqlite: {message}", err=True)


def _fail_on(e: ContainerError) -> NoReturn:
    _fail(str(e), EXIT_USAGE if e.usage else EXIT_FAILED)


# --------------------------------------------------------------------------- cluster-list


def _cell(values: list[str]) -> str:
    return ", ".join(values) if values else "-"


def _role_cells(v: GroupView) -> tuple[str, str]:
    """The masters and slaves cells: live entries first, then stale ones marked as
    such under the role they announced (a crashed master reads "b1 (stale)")."""
    masters, slaves = list(v.masters), list(v.slaves)
    for m in v.members:
        if m.name in v.stale:
            (masters if m.role == Role.MASTER else slaves).append(f"{m.name} (stale)")
    return _cell(masters), _cell(slaves)


def format_table(views: list[GroupView]) -> str:
    """Fabric's layout, one row per group and registry: columns of at least 30
    characters, wider when a cell is longer; the registry last."""
    header = ["[cluster]", "[masters]", "[slaves]", "[services]", "[registry]"]
    rows = [[v.group, *_role_cells(v), _cell([*v.services, *v.websocket]), v.registry or "-"]
            for v in views]
    widths = [max([COLUMN_WIDTH] + [len(r[i]) for r in rows]) for i in range(len(header) - 1)]
    lines = []
    for r in [header, *rows]:
        cells = [f"{c:<{w}}" for c, w in zip(r, widths, strict=False)]
        lines.append(" ".join([*cells, r[-1]]).rstrip())
    return "\n".join(lines)


def master_replication(v: GroupView) -> dict[str, Any] | None:
    """The store's replication as the group's master last read it (its /readyz, which
    needs no login), None when it has none to say (SQLite) or there is no master."""
    if v.registry.startswith("sqlite") or not v.masters:
        return None  # a SQLite registry is a SQLite store: no replication
    master = next((m for m in v.members if m.name == v.masters[0]), None)
    if master is None or not master.http:
        return None
    url = master.http.rstrip("/") + "/readyz"
    try:
        with urllib.request.urlopen(url, timeout=READYZ_TIMEOUT) as resp:
            body = json.loads(resp.read())
    except urllib.error.HTTPError as e:  # 503: not serving, still says what it read
        body = json.loads(e.read() or b"{}")
    except (OSError, ValueError) as e:
        return {"summary": f"unknown ({url}: {getattr(e, 'reason', e)})"}
    replication = body.get("replication") if isinstance(body, dict) else None
    return replication if isinstance(replication, dict) else None


def replication_notes(views: list[GroupView],
                      replication: dict[str, dict[str, Any] | None]) -> list[str]:
    """One line per group whose master reads a replicated store: what its commits wait
    for (below the table: the table keeps Fabric's columns)."""
    notes = []
    for v in views:
        r = replication.get(v.group + v.registry)
        if r is not None:
            waiting = r.get("commit_waiting") or r.get("waiting")
            notes.append(f"[replication] {v.group} (master {v.masters[0]}): {r.get('summary')}"
                         + (f"; {waiting}" if waiting else ""))
    return notes


def _default_sources(group: str | None, config_file: str | None) -> list[str]:
    """The registry of the settings this shell would start a broker with, and
    that of every container under the home."""
    try:
        settings = load_settings({"group": group} if group else {}, config_file)
    except SettingsError as e:
        _fail(str(e), EXIT_USAGE)
    sources = [registry_url(settings)]
    sources += [u for u in container_registries(container_home()) if u not in sources]
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
    """One row per group and registry: its master, slaves and the master's client
    URIs. Entries whose heartbeat is late, and masters superseded by a higher epoch
    (crashed, not expired yet), are marked "(stale)", never listed as master.

    Without --registry/--store: the registry of the settings `amqlite start`
    would use here (AMQLITE_* environment, --config; zk:// locker, else the
    store) and those of every container under AMQLITE_HOME.
    """
    if registry and store:
        _fail("give --registry or --store, not both", EXIT_USAGE)
    explicit = registry or store
    sources = [explicit] if explicit else _default_sources(group, config_file)
    views: dict[tuple[str, str], GroupView] = {}
    errors: list[str] = []  # each once: one store behind several sources warns once
    failed = 0
    read: set[str] = set()
    for url in sources:
        where = display_url(url)
        if where in read:  # one store under two spellings: one registry
            continue
        read.add(where)
        try:
            found = read_members(url, group)
        except RegistryError as e:
            failed += 1
            if str(e) not in errors:
                errors.append(str(e))
            continue
        for v in group_views(found, where):
            views.setdefault((v.group, where), v)
    if errors and (explicit or failed == len(read)):
        _fail(errors[0])
    for error in errors:
        _warn(error)
    ordered = [views[k] for k in sorted(views)]
    replication = {v.group + v.registry: master_replication(v) for v in ordered}
    if as_json:
        click.echo(json.dumps([{**v.to_json(), "replication": replication[v.group + v.registry]}
                               for v in ordered], indent=2))
    else:
        click.echo(format_table(ordered))
        for note in replication_notes(ordered, replication):
            click.echo(note)


# --------------------------------------------------------------------------- containers


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
                   "(default: free ports picked now, below the kernel's ephemeral range "
                   "so that no outgoing connection takes one before the broker starts).")
@click.option("--rejoin/--no-rejoin", default=True, show_default=True,
              help="A demoted broker waits as slave again instead of exiting.")
@click.option("--set", "extra", multiple=True, metavar="KEY=VALUE",
              help="Any other setting for the config file, e.g. zk_session_timeout=5.")
@click.pass_obj
def create(home: Path, names: str, group: str, store: str | None, locker: str | None,
           host: str, bind_base: int | None, rejoin: bool, extra: tuple[str, ...]) -> None:
    """Create containers NAMES (comma-separated) of one group."""
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    try:
        created = create_containers(home, wanted, group=group, store=store, locker=locker,
                                    host=host, bind_base=bind_base, rejoin=rejoin, extra=extra)
    except ContainerError as e:
        _fail_on(e)
    for c, bind in created:
        click.echo(f"created container {c.name} (group {group}, stomp {bind}) in {c.dir}")


@container.command("start")
@click.argument("name")
@click.option("--wait", type=click.FloatRange(min=0), default=START_WAIT, show_default=True,
              metavar="SECONDS", help="How long to wait for the broker to take its role.")
@click.pass_obj
def start(home: Path, name: str, wait: float) -> None:
    """Start container NAME in the background; returns once it is master, or slave
    of a master (progress on stderr meanwhile). Exits non-zero with the last error
    line of its log if it dies, or if it has no role within --wait seconds."""
    try:
        started = start_container(home, name, wait=wait, progress=_progress)
    except ContainerError as e:
        _fail_on(e)
    if started.role == Role.MASTER:
        role = "master"
    elif started.master is not None:
        role = f"slave of {started.master}"
    else:
        role = "slave; no master registered in its group yet"
    click.echo(f"started container {name} (pid {started.pid}, {role})")


@container.command("stop")
@click.argument("name")
@click.option("--kill", is_flag=True, help="SIGKILL (a crash) instead of a graceful stop.")
@click.pass_obj
def stop(home: Path, name: str, kill: bool) -> None:
    """Stop container NAME: SIGTERM and wait (a master hands over at once), or
    SIGKILL with --kill; then show which broker took over."""
    try:
        stopped = stop_container(home, name, kill=kill, progress=_progress)
    except ContainerError as e:
        _fail_on(e)
    was = "" if stopped.role == "-" else f", was {stopped.role}"
    click.echo(f"{'killed' if kill else 'stopped'} container {name} (pid {stopped.pid}{was})")
    if stopped.alone:
        click.echo("no other broker of its group is running: nobody takes over")
    elif stopped.role == Role.MASTER and stopped.master is None:
        _warn(f"no broker took over within {TAKEOVER_WAIT:g}s (see `amqlite cluster-list`)")
    elif stopped.took is not None:
        click.echo(f"{stopped.master} took over as master after {stopped.took:.1f}s "
                   f"(epoch {stopped.epoch})")
    elif stopped.master is not None:
        click.echo(f"master of its group: {stopped.master}")


@container.command("logs")
@click.argument("name")
@click.option("-f", "--follow", is_flag=True, help="Keep printing what the broker logs "
                                                   "(Ctrl-C ends).")
@click.option("-n", "--lines", type=click.IntRange(min=0), metavar="N",
              help="Only the last N lines.")
@click.pass_obj
def logs(home: Path, name: str, follow: bool, lines: int | None) -> None:
    """Print container NAME's log (stdout and stderr of every run)."""
    try:
        path = get_container(home, name).log
    except ContainerError as e:
        _fail_on(e)
    out = sys.stdout.buffer
    try:
        with open(path, "rb") as f:
            if lines is not None:
                tail = f.read().splitlines(keepends=True)[-lines:] if lines else []
                out.write(b"".join(tail))
            else:
                shutil.copyfileobj(f, out)
            out.flush()
            while follow:
                chunk = f.read()
                if chunk:
                    out.write(chunk)
                    out.flush()
                else:
                    time.sleep(FOLLOW_POLL)
    except FileNotFoundError:
        if not follow:
            click.echo(f"container {name} has not been started yet: no log", err=True)
            return
        _fail(f"container {name} has no log yet: start it first")
    except KeyboardInterrupt:
        return
    except BrokenPipeError:  # `| head`
        sys.stderr.close()


@container.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.pass_obj
def list_(home: Path, as_json: bool) -> None:
    """Every container: group, state, pid, role (from the registry), services."""
    rows, warnings = container_rows(home)
    for w in warnings:
        _warn(w)
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
    the group's store is kept (it says where, when this was its last container)."""
    try:
        left = delete_container(home, name)
    except ContainerError as e:
        _fail_on(e)
    click.echo(f"deleted container {name}" + (f"; {left}" if left else ""))


def register(cli_group: click.Group) -> None:
    """Add ``cluster-list`` and ``container`` to the ``amqlite`` command group."""
    cli_group.add_command(cluster_list)
    cli_group.add_command(container)
