"""``amqlite user add|passwd|delete|list|groups`` and ``amqlite permission
list|set|delete``: the users file (README "Users, groups and authorization") from the
command line, as ``rabbitmqctl add_user|change_password|delete_user|set_permissions``.

The file is found as ``amqlite start`` finds it (``--users-file``, ``AMQLITE_USERS_FILE``,
``users_file`` in ``--config``) and written whole, atomically, mode 0600
(``cli.users_file``). A password is never needed on the command line: it is prompted
for, or read from ``--password-file`` or the environment variable ``--password-env``
names. After a change the running nodes that use the file reload it (SIGHUP): found by
their pid files in ``--data-dir``, else in the data directory ``amqlite start`` would use
here and in every container's.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import click

from amqlite.auth import check_new_password, hash_password
from amqlite.authz import Permission
from amqlite.settings import SettingsError, load_settings
from cli.private_file import read_password_file
from cli.users_file import UsersDoc, UsersFileError, edit, read_doc, reload_nodes

EXIT_FAILED = 1
EXIT_USAGE = 2
#: A login: printable, no spaces (a STOMP header value, a TOML key, a column in tables).
LOGIN_RE = re.compile(r"[^\s\x00-\x1f\x7f]{1,200}")


def _fail(message: str, code: int) -> NoReturn:
    click.echo(f"amqlite: error: {message}", err=True)
    sys.exit(code)


def _file_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    options = [
        click.option("--users-file", envvar="AMQLITE_USERS_FILE", metavar="FILE",
                     help="The users file (default: users_file of --config / the settings)."),
        click.option("--config", "config_file", metavar="FILE",
                     help="A node's config file, to take its users_file from."),
        click.option("--data-dir", "data_dirs", multiple=True, metavar="DIR",
                     help="Reload the running nodes whose pid files are here (repeat; "
                          "default: this group's data directory and every container's)."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _password_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn = click.option("--password-env", metavar="VAR",
                      help="Read the password from this environment variable.")(fn)
    return click.option("--password-file", metavar="FILE",
                        help="Read the password from this file (its first line).")(fn)


class _Where:
    """The users file a command edits, and where to find nodes that use it."""

    def __init__(self, users_file: str | None, config_file: str | None,
                 data_dirs: tuple[str, ...]) -> None:
        try:
            settings = load_settings({"users_file": users_file} if users_file else None,
                                     config_file)
        except SettingsError as e:
            _fail(str(e), EXIT_USAGE)
        if not settings.users_file:
            _fail("no users file: give --users-file FILE (or AMQLITE_USERS_FILE, or "
                  "users_file in --config)", EXIT_USAGE)
        self.path = Path(settings.users_file).expanduser().absolute()
        self.data_dirs = list(data_dirs) or self._default_dirs(settings.data_dir)

    @staticmethod
    def _default_dirs(own: str) -> list[str]:
        from cli.containers import container_home, list_containers

        dirs = [own]
        for c in list_containers(container_home()):
            with contextlib.suppress(SettingsError):
                d = c.settings().data_dir
                if d not in dirs:
                    dirs.append(d)
        return dirs

    def read(self) -> UsersDoc:
        try:
            return read_doc(self.path)
        except UsersFileError as e:
            _fail(str(e), EXIT_USAGE if e.usage else EXIT_FAILED)

    def change(self, what: str, fn: Callable[[UsersDoc], None]) -> None:
        """Apply ``fn``, say ``what`` was done and which nodes reload."""
        try:
            edit(self.path, fn)
        except UsersFileError as e:
            _fail(str(e), EXIT_USAGE if e.usage else EXIT_FAILED)
        nodes = reload_nodes(self.path, self.data_dirs)
        click.echo(what)
        if nodes:
            click.echo("reloaded by " + ", ".join(f"node {n.name} (pid {n.pid})"
                                                  for n in nodes))
        else:
            click.echo(f"no running node uses {self.path} (a node reads it when it starts; "
                       "kill -HUP reloads one)")


def _password(login: str, password_file: str | None, password_env: str | None) -> str:
    """From the file, the environment or a prompt (asked twice); checked like
    ``amqlite passwd``."""
    if password_file and password_env:
        _fail("give --password-file or --password-env, not both", EXIT_USAGE)
    if password_file:
        try:
            password = read_password_file(password_file)
        except OSError as e:
            _fail(f"--password-file {password_file}: {e.strerror}", EXIT_USAGE)
        except ValueError as e:
            _fail(str(e), EXIT_USAGE)
    elif password_env:
        value = os.environ.get(password_env)
        if value is None:
            _fail(f"--password-env {password_env}: no such environment variable", EXIT_USAGE)
        password = value
    else:
        password = click.prompt(f"password for {login}", hide_input=True,
                                confirmation_prompt=True, err=True)
    try:
        check_new_password(password)
    except ValueError as e:
        _fail(str(e), EXIT_USAGE)
    return password


def _login(login: str) -> str:
    if not LOGIN_RE.fullmatch(login):
        _fail(f"bad login {login!r}: 1 to 200 printable characters, no spaces", EXIT_USAGE)
    return login


def _refuse(message: str) -> NoReturn:
    raise UsersFileError(message)


def _set_groups(doc: UsersDoc, login: str, groups: tuple[str, ...]) -> None:
    for name in groups:
        members = doc.groups.setdefault(name, [])
        if login not in members:
            members.append(login)
    for name, members in doc.groups.items():
        if name not in groups and login in members:
            members.remove(login)


# --------------------------------------------------------------------------- user

@click.group("user")
def user() -> None:
    """Logins of the users file: add, change a password, delete, list, set groups."""


@user.command("add")
@click.argument("login")
@click.option("--group", "groups", multiple=True, help="A group to put it in (repeat).")
@_password_options
@_file_options
def user_add(login: str, groups: tuple[str, ...], password_file: str | None,
             password_env: str | None, users_file: str | None, config_file: str | None,
             data_dirs: tuple[str, ...]) -> None:
    """Add LOGIN with a password (prompted, or --password-file / --password-env)."""
    where = _Where(users_file, config_file, data_dirs)
    _login(login)
    if login in where.read().users:  # before asking for a password
        _fail(f"login {login!r} exists in {where.path} (amqlite user passwd changes its "
              "password)", EXIT_FAILED)
    stored = hash_password(_password(login, password_file, password_env))

    def add(doc: UsersDoc) -> None:
        if login in doc.users:
            _refuse(f"login {login!r} exists in {where.path}")
        doc.users[login] = stored
        _set_groups(doc, login, groups)

    where.change(f"added {login}" + (f" (groups {', '.join(groups)})" if groups else ""), add)


@user.command("passwd")
@click.argument("login")
@_password_options
@_file_options
def user_passwd(login: str, password_file: str | None, password_env: str | None,
                users_file: str | None, config_file: str | None,
                data_dirs: tuple[str, ...]) -> None:
    """Change LOGIN's password: its next logins need the new one (connections open
    with the old one stay)."""
    where = _Where(users_file, config_file, data_dirs)
    if login not in where.read().users:
        _fail(f"no login {login!r} in {where.path}", EXIT_FAILED)
    stored = hash_password(_password(login, password_file, password_env))

    def passwd(doc: UsersDoc) -> None:
        if login not in doc.users:
            _refuse(f"no login {login!r} in {where.path}")
        doc.users[login] = stored

    where.change(f"changed the password of {login}", passwd)


@user.command("delete")
@click.argument("login")
@_file_options
def user_delete(login: str, users_file: str | None, config_file: str | None,
                data_dirs: tuple[str, ...]) -> None:
    """Delete LOGIN and its group memberships; its open connections are closed by the
    nodes that reload."""
    where = _Where(users_file, config_file, data_dirs)

    def delete(doc: UsersDoc) -> None:
        if doc.users.pop(login, None) is None:
            _refuse(f"no login {login!r} in {where.path}")
        _set_groups(doc, login, ())

    where.change(f"deleted {login}", delete)


@user.command("groups")
@click.argument("login")
@click.argument("groups", nargs=-1)
@_file_options
def user_groups(login: str, groups: tuple[str, ...], users_file: str | None,
                config_file: str | None, data_dirs: tuple[str, ...]) -> None:
    """Put LOGIN in exactly GROUPS (none: in no group). A group is made by the first
    login put in it; an emptied group stays (permissions may name it)."""
    where = _Where(users_file, config_file, data_dirs)

    def regroup(doc: UsersDoc) -> None:
        if login not in doc.users:
            _refuse(f"no login {login!r} in {where.path}")
        _set_groups(doc, login, groups)

    where.change(f"{login} is in " + (", ".join(groups) or "no group"), regroup)


@user.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON, not a table.")
@_file_options
def user_list(as_json: bool, users_file: str | None, config_file: str | None,
              data_dirs: tuple[str, ...]) -> None:
    """Logins and their groups (never their hashes)."""
    from cli.mgmt_cmds import _emit, table

    doc = _Where(users_file, config_file, data_dirs).read()
    rows = [{"login": login, "groups": doc.groups_of(login)} for login in doc.users]
    _emit(as_json, rows, lambda: table(("login", "groups"), [
        (r["login"], ", ".join(r["groups"])) for r in rows]))


# --------------------------------------------------------------------------- permission

@click.group("permission")
def permission() -> None:
    """The users file's [[authorization]] entries: who may read, write, administer."""


@permission.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON, not a table.")
@_file_options
def permission_list(as_json: bool, users_file: str | None, config_file: str | None,
                    data_dirs: tuple[str, ...]) -> None:
    """Every [[authorization]] entry (none: every login may do everything)."""
    from cli.mgmt_cmds import _emit, table

    doc = _Where(users_file, config_file, data_dirs).read()
    rows: list[dict[str, Any]] = [
        {"destination": e.get("destination"),
         **{p.value: [str(g) for g in e.get(p.value, [])] for p in Permission},
         "auto_create": bool(e.get("auto_create", False))} for e in doc.authorization]
    _emit(as_json, rows, lambda: table(
        ("destination", "read", "write", "admin", "auto-create"),
        [(r["destination"], *(",".join(r[p.value]) for p in Permission),
          "yes" if r["auto_create"] else "no") for r in rows]))


@permission.command("set")
@click.argument("destination")
@click.option("--read", "read", multiple=True, metavar="GROUP",
              help="May SUBSCRIBE and browse (repeat).")
@click.option("--write", "write", multiple=True, metavar="GROUP", help="May SEND (repeat).")
@click.option("--admin", "admin", multiple=True, metavar="GROUP",
              help="May create, purge, delete, move, retry (repeat).")
@click.option("--auto-create/--no-auto-create", default=False, show_default=True,
              help="Whoever may read or write it creates it by using it.")
@_file_options
def permission_set(destination: str, read: tuple[str, ...], write: tuple[str, ...],
                   admin: tuple[str, ...], auto_create: bool, users_file: str | None,
                   config_file: str | None, data_dirs: tuple[str, ...]) -> None:
    """Give groups their permissions on DESTINATION (a pattern: '/queue/orders.>'),
    replacing the entry of that pattern if there is one. A group named here that does
    not exist yet is made, empty."""
    where = _Where(users_file, config_file, data_dirs)
    entry: dict[str, Any] = {"destination": destination, "read": list(read),
                             "write": list(write), "admin": list(admin),
                             "auto_create": auto_create}

    def set_entry(doc: UsersDoc) -> None:
        for name in (*read, *write, *admin):
            doc.groups.setdefault(name, [])
        for i, old in enumerate(doc.authorization):
            if old.get("destination") == destination:
                doc.authorization[i] = entry
                return
        doc.authorization.append(entry)

    where.change(f"set the permissions on {destination}", set_entry)


@permission.command("delete")
@click.argument("destination")
@_file_options
def permission_delete(destination: str, users_file: str | None, config_file: str | None,
                      data_dirs: tuple[str, ...]) -> None:
    """Remove the entry of DESTINATION (the last one gone: every login may do everything)."""
    where = _Where(users_file, config_file, data_dirs)

    def delete(doc: UsersDoc) -> None:
        kept = [e for e in doc.authorization if e.get("destination") != destination]
        if len(kept) == len(doc.authorization):
            _refuse(f"no [[authorization]] entry for {destination} in {where.path}")
        doc.authorization[:] = kept

    where.change(f"removed the permissions on {destination}", delete)


def register(cli_group: click.Group) -> None:
    cli_group.add_command(user)
    cli_group.add_command(permission)
