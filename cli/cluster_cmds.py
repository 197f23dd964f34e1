"""``amqlite cluster-list`` and ``amqlite container ...``: Fuse Fabric's
``fabric:cluster-list`` and ``container-create|start|stop|list|delete`` for amqlite.

This module parses the command line and prints; the containers themselves
(their home, directories, processes) are managed by ``amqlite.containers``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import NoReturn

import click

from amqlite.containers import (
    HOME_ENV,
    ContainerError,
    container_home,
    container_registries,
    container_rows,
    create_containers,
    delete_container,
    start_container,
    stop_container,
)
from amqlite.registry import (
    GroupView,
    Member,
    RegistryError,
    group_views,
    read_members,
    registry_url,
)
from amqlite.settings import SettingsError, load_settings

#: Exit codes: a failed operation, and a bad request (click's usage code).
EXIT_FAILED = 1
EXIT_USAGE = 2

#: Fabric's cluster-list column width.
COLUMN_WIDTH = 30


def _fail(message: str, code: int = EXIT_FAILED) -> NoReturn:
    click.echo(f"amqlite: error: {message}", err=True)
    sys.exit(code)


def _warn(message: str) -> None:
    click.echo(f"amqlite: warning: {message}", err=True)


def _fail_on(e: ContainerError) -> NoReturn:
    _fail(str(e), EXIT_USAGE if e.usage else EXIT_FAILED)


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
@click.pass_obj
def start(home: Path, name: str) -> None:
    """Start container NAME in the background; returns once it has joined its
    group's registry (as master or slave)."""
    try:
        started = start_container(home, name)
    except ContainerError as e:
        _fail_on(e)
    if started.role is not None:
        click.echo(f"started container {name} (pid {started.pid}, {started.role})")
    else:
        click.echo(f"started container {name} (pid {started.pid}); not in the registry yet: "
                   f"see {started.container.log}")


@container.command("stop")
@click.argument("name")
@click.option("--kill", is_flag=True, help="SIGKILL (a crash) instead of a graceful stop.")
@click.pass_obj
def stop(home: Path, name: str, kill: bool) -> None:
    """Stop container NAME: SIGTERM and wait (a master hands over at once), or
    SIGKILL with --kill."""
    try:
        pid = stop_container(home, name, kill=kill)
    except ContainerError as e:
        _fail_on(e)
    click.echo(f"{'killed' if kill else 'stopped'} container {name} (pid {pid})")


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
    a shared store under <home>/.groups is kept for the group's other containers."""
    try:
        delete_container(home, name)
    except ContainerError as e:
        _fail_on(e)
    click.echo(f"deleted container {name}")


def register(cli_group: click.Group) -> None:
    """Add ``cluster-list`` and ``container`` to the ``amqlite`` command group."""
    cli_group.add_command(cluster_list)
    cli_group.add_command(container)
