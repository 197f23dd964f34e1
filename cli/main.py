"""The ``amqlite`` command line: one click group, one sub-command per verb.

Errors are one line on stderr and a non-zero exit; a traceback is a bug.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import click

from amqlite import __version__
from amqlite.settings import SettingsError, load_settings
from cli import cluster_cmds

#: Exit status for a usage or configuration error (click uses 2 for usage too).
EXIT_USAGE = 2

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def fail(message: str, code: int = EXIT_USAGE) -> None:
    click.echo(f"amqlite: error: {message}", err=True)
    sys.exit(code)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="amqlite")
def cli() -> None:
    """amqlite: a highly available STOMP 1.2 message broker."""


@cli.command()
@click.option("--group", help="Broker group: nodes of one group share one store and one lock.")
@click.option("--name", help="This node's name (default: host-pid).")
@click.option("--data-dir", help="Data directory of the embedded store and lock file.")
@click.option("--store", help="Store URL: sqlite:///path or postgresql://user@host/db.")
@click.option("--locker", help="Locker URL: file:///path, postgresql://..., zk://host:port/root.")
@click.option("--bind", help="Address to listen on (default 127.0.0.1:61613).")
@click.option("--http", "http_bind",
              help="Management HTTP listener HOST:PORT, or 'off' (default 127.0.0.1:8161, "
                   "or a port derived from --bind's).")
@click.option("--advertise", help="Client URI published in the registry (default tcp://BIND).")
@click.option("--rejoin/--no-rejoin", default=None,
              help="After losing mastership, go back to waiting as slave instead of exiting.")
@click.option("--config", "config_file", type=click.Path(dir_okay=False),
              help="TOML file with settings (see README).")
@click.option("--log-level", type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"],
                                               case_sensitive=False))
def start(config_file: str | None, **options: Any) -> None:
    """Start a broker node: slave until it holds the group's lock, then master.

    Precedence: options > AMQLITE_* environment > --config file > defaults.
    """
    from amqlite.auth import AuthError
    from amqlite.node import EXIT_ERROR, run_node
    from lockers import LockerError
    from store import StoreError

    try:
        settings = load_settings(options, config_file)
    except SettingsError as exc:
        fail(str(exc))
    logging.basicConfig(level=settings.log_level.upper(), format=LOG_FORMAT, stream=sys.stderr)
    try:
        code = run_node(settings)
    except (StoreError, LockerError, AuthError, SettingsError) as exc:
        fail(str(exc), EXIT_ERROR)
    except KeyboardInterrupt:
        code = 0
    sys.exit(code)


@cli.command()
@click.option("--password", prompt=True, hide_input=True, confirmation_prompt=True,
              help="The password to hash (prompted when omitted).")
def passwd(password: str) -> None:
    """Print a password hash for the users file ([users] login = "HASH")."""
    from amqlite.auth import hash_password

    if not password:
        fail("passwd: the password must not be empty")
    click.echo(hash_password(password))


def _register_commands() -> None:
    """Sub-commands that live in their own modules (and import what they need lazily)."""
    from cli import client_cmds, mgmt_cmds
    from cli.audit_cmd import audit

    client_cmds.register(cli)
    mgmt_cmds.register(cli)
    cluster_cmds.register(cli)
    cli.add_command(audit)


_register_commands()


def main() -> None:
    cli(prog_name="amqlite")


if __name__ == "__main__":
    main()
