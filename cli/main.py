"""The ``amqlite`` command line: one click group, one sub-command per verb.

Errors are one line on stderr and a non-zero exit; a traceback is a bug.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from amqlite import __version__
from amqlite.settings import Definition, SettingsError, definitions, load_settings, read_settings
from cli import cluster_cmds

#: Exit status for a usage or configuration error (click uses 2 for usage too).
EXIT_USAGE = 2
#: Exit status of a command that could not do what it was asked.
EXIT_FAILED = 1

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def fail(message: str, code: int = EXIT_USAGE) -> None:
    click.echo(f"amqlite: error: {message}", err=True)
    sys.exit(code)


def print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    """``--version``: the release, and which build of the hot path is installed
    (compiled by mypyc, or pure Python: amqlite.native)."""
    if not value or ctx.resilient_parsing:
        return
    from amqlite.native import implementation

    click.echo(f"amqlite, version {__version__} ({implementation()})")
    ctx.exit()


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True,
              callback=print_version, help="Show the version and the build, and exit.")
def cli() -> None:
    """amqlite: a highly available STOMP 1.2 message broker."""


#: Option spellings ``amqlite start`` had before its options were made from the settings;
#: they stay (README, scripts), beside the generated ``--kebab-case`` one.
OPTION_ALIASES: dict[str, tuple[str, ...]] = {"http_bind": ("--http",)}
#: ``--help``'s value placeholder where a setting's metadata names none.
METAVARS: dict[type, str] = {float: "SECONDS", int: "N", str: "TEXT"}

F = TypeVar("F", bound=Callable[..., Any])


def setting_help(d: Definition) -> str:
    """A setting's ``--help`` text: what it does, its default and where that comes from."""
    origin = f"; {d.origin}" if d.origin else ""
    return f"{d.help} [default: {d.default}{origin}]"


def setting_options(command: F) -> F:
    """One option per setting (amqlite.settings.Settings), in the fields' order. Values
    reach load_settings as text (booleans as True/False, None when not given), so a bad
    one is its one-line SettingsError, whatever the source."""
    for d in reversed(definitions()):
        if d.kind is bool:
            flag = d.option.removeprefix("--")
            command = click.option(f"--{flag}/--no-{flag}", d.name, default=None,
                                   help=setting_help(d))(command)
        else:
            command = click.option(d.option, *OPTION_ALIASES.get(d.name, ()), d.name,
                                   metavar=d.metavar or METAVARS[d.kind],
                                   help=setting_help(d))(command)
    return command


@cli.command()
@click.option("--config", "config_file", type=click.Path(dir_okay=False),
              help="TOML file of settings: the option names below, as snake_case keys, at "
                   "top level or all under [broker].")
@setting_options
def start(config_file: str | None, **options: Any) -> None:
    """Start a broker node: slave until it holds the group's lock, then master.

    Every setting is an option here, an environment variable AMQLITE_<NAME> (e.g.
    AMQLITE_LOCK_LEASE) and a --config key (lock_lease). Precedence: options >
    AMQLITE_* environment > --config file > defaults.
    """
    from amqlite.auth import AuthError
    from amqlite.node import EXIT_ERROR, run_node
    from lockers import LockerError, LockerUnusable
    from store import StoreError, StoreUnusable

    try:
        settings, warnings = read_settings(options, config_file)
    except SettingsError as exc:
        fail(str(exc))
    logging.basicConfig(level=settings.log_level, format=LOG_FORMAT, stream=sys.stderr)
    for warning in warnings:
        logging.getLogger("amqlite.settings").warning("%s", warning)
    try:
        code = run_node(settings)
    except (SettingsError, StoreUnusable, LockerUnusable, AuthError) as exc:  # settings
        fail(str(exc), EXIT_USAGE)
    except (StoreError, LockerError) as exc:
        fail(str(exc), EXIT_ERROR)
    except KeyboardInterrupt:
        code = 0
    sys.exit(code)


#: How long ``amqlite stop`` waits for a node to finish: a graceful stop drains the
#: group commit in flight (node.GRACEFUL_DRAIN_TIMEOUT, 10 s) and closes the store.
STOP_TIMEOUT = 30.0


def node_data_dir(group: str | None, data_dir: str | None) -> str:
    """The data directory ``amqlite start`` would use with these options (and the
    AMQLITE_* environment): where its pid files are."""
    try:
        return load_settings({"group": group, "data_dir": data_dir}).data_dir
    except SettingsError as exc:
        fail(str(exc))
        raise  # unreachable: fail() exits


@cli.command()
@click.option("--group", help="Stop the nodes of this group (its default data directory).")
@click.option("--data-dir", help="Stop the nodes whose data directory this is.")
@click.option("--name", help="Only the node of this name.")
@click.option("--timeout", type=float, default=STOP_TIMEOUT, show_default=True,
              help="Seconds to wait for each node to stop.")
def stop(group: str | None, data_dir: str | None, name: str | None, timeout: float) -> None:
    """Stop foreground nodes (started with ``amqlite start``) found by their pid files:
    SIGTERM, a graceful stop, and wait. Exit 1 when no node was running."""
    import os

    from amqlite import pidfile

    directory = node_data_dir(group, data_dir)
    nodes = [n for n in pidfile.read_all(directory) if name is None or n.name == name]
    running = []
    for n in nodes:
        if n.alive:
            running.append(n)
        else:  # a node that was SIGKILLed left its file behind
            with contextlib.suppress(OSError):
                os.unlink(n.path)
    if not running:
        fail(f"no running node in {directory}", EXIT_FAILED)
    failed = False
    for n in running:
        if not pidfile.stop_process(n.pid, functools.partial(pidfile.process_alive, n.pid),
                                    timeout):
            click.echo(f"amqlite: error: node {n.name} (pid {n.pid}) still running after "
                       f"{timeout:g} s", err=True)
            failed = True
        else:
            click.echo(f"stopped node {n.name} of group {n.group} (pid {n.pid})")
    sys.exit(EXIT_FAILED if failed else 0)


@cli.command()
@click.option("--password", prompt=True, hide_input=True, confirmation_prompt=True,
              help="The password to hash (prompted when omitted).")
def passwd(password: str) -> None:
    """Print a password hash for the users file ([users] login = "HASH")."""
    from amqlite.auth import check_new_password, hash_password

    try:
        check_new_password(password)
    except ValueError as exc:
        fail(str(exc))
    click.echo(hash_password(password))


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="JSON instead of the YAML file.")
def openapi(as_json: bool) -> None:
    """Print the management API's OpenAPI document (docs/openapi.yaml), as installed:
    no node and no network needed (a node serves the same at /api/v1/openapi.yaml)."""
    from amqlite.management.document import DocumentMissing, OpenApiDocument

    document = OpenApiDocument()
    try:
        text = document.as_json() if as_json else document.as_yaml().decode("utf-8")
    except DocumentMissing as exc:
        fail(str(exc), EXIT_FAILED)
    click.echo(text, nl=as_json)


def _register_commands() -> None:
    """Sub-commands that live in their own modules (and import what they need lazily)."""
    from cli import client_cmds, mgmt_cmds, subscription_cmds, user_cmds
    from cli.audit_cmd import audit

    client_cmds.register(cli)
    mgmt_cmds.register(cli)
    subscription_cmds.register(cli)
    user_cmds.register(cli)
    cluster_cmds.register(cli)
    cli.add_command(audit)


_register_commands()


def main() -> None:
    cli(prog_name="amqlite")


if __name__ == "__main__":
    main()
