"""Editing the users file (``amqlite.authz`` reads it) from the command line: read it
whole, change it, write it whole (``private_file.write_private``: atomic, 0600, checked
by the broker's own loader before it replaces the old one), then tell the running nodes
that use it to reload it (SIGHUP, which a node already handles: ``Node.reload_users``).

The file is rewritten from what it means, so comments in it are not kept; a file with
tables the broker does not read is refused rather than silently trimmed.
"""

from __future__ import annotations

import json
import os
import signal
import tomllib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from amqlite import pidfile
from amqlite.auth import AuthError
from amqlite.authz import Permission, load_users_file
from cli.private_file import edit_lock, write_private

#: The tables a users file has (``amqlite.authz.load_users_file``).
TABLES = ("users", "groups", "authorization")
#: Keys of one ``[[authorization]]`` entry, in the order they are written.
ENTRY_KEYS = ("destination", *(p.value for p in Permission), "auto_create")
HEADER = ("# amqlite users file (README: Users, groups and authorization). Written by\n"
          "# `amqlite user` and `amqlite permission`, which keep no comments.\n")


class UsersFileError(Exception):
    """The file cannot be read or would not be valid; ``usage``: retrying the same
    command changes nothing (exit 2), else it cannot be done as things are (exit 1)."""

    def __init__(self, message: str, usage: bool = False) -> None:
        super().__init__(message)
        self.usage = usage


@dataclass
class UsersDoc:
    users: dict[str, str] = field(default_factory=dict)
    groups: dict[str, list[str]] = field(default_factory=dict)
    authorization: list[dict[str, Any]] = field(default_factory=list)

    def groups_of(self, login: str) -> list[str]:
        return sorted(g for g, members in self.groups.items() if login in members)


def read_doc(path: Path) -> UsersDoc:
    """The file's contents (an empty document when there is no file yet)."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        return UsersDoc()
    except OSError as e:
        raise UsersFileError(f"users file {path}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise UsersFileError(f"users file {path} is not valid TOML: {e}", usage=True) from None
    unknown = sorted(set(data) - set(TABLES))
    if unknown:
        raise UsersFileError(f"users file {path}: {', '.join(unknown)} is not a users file "
                             "table; edit it by hand", usage=True)
    try:  # what the broker would refuse is not edited either (its shape is known after)
        load_users_file(str(path))
    except AuthError as e:
        raise UsersFileError(f"{e}; fix it by hand first", usage=True) from None
    return UsersDoc(dict(data.get("users", {})),
                    {k: list(v) for k, v in data.get("groups", {}).items()},
                    list(data.get("authorization", [])))


def _s(value: str) -> str:
    """A TOML basic string (a JSON string is one), also as a quoted key."""
    return json.dumps(value)


def render(doc: UsersDoc) -> str:
    out = [HEADER, "[users]\n"]
    out += [f"{_s(login)} = {_s(stored)}\n" for login, stored in doc.users.items()]
    out.append("\n[groups]\n")
    out += [f"{_s(name)} = [{', '.join(map(_s, members))}]\n"
            for name, members in doc.groups.items()]
    for entry in doc.authorization:
        out.append("\n[[authorization]]\n")
        for key in ENTRY_KEYS:
            if key not in entry:
                continue
            value = entry[key]
            if isinstance(value, bool):
                text = "true" if value else "false"
            elif isinstance(value, list):
                text = f"[{', '.join(map(_s, value))}]"
            else:
                text = _s(str(value))
            out.append(f"{key} = {text}\n")
    return "".join(out)


def _check(path: str) -> None:
    try:
        load_users_file(path)
    except AuthError as e:
        raise UsersFileError(f"the change would make the users file invalid: {e}",
                             usage=True) from None


def edit(path: Path, change: Callable[[UsersDoc], None]) -> UsersDoc:
    """Read, ``change`` (it raises ``UsersFileError`` to refuse), check and write the
    users file under the editors' lock; the document written."""
    if not path.parent.is_dir():
        raise UsersFileError(f"users file {path}: no directory {path.parent}", usage=True)
    with edit_lock(path):
        doc = read_doc(path)
        change(doc)
        try:
            write_private(path, render(doc), check=_check)
        except OSError as e:
            raise UsersFileError(f"users file {path}: cannot write: {e.strerror}") from None
    return doc


def reload_nodes(path: Path, data_dirs: Iterable[str]) -> list[pidfile.PidInfo]:
    """SIGHUP every running node (found by its pid file in ``data_dirs``) whose users
    file is ``path``; the nodes signalled. A node reloads at once: a removed login's
    connections close, a changed password holds for the next login."""
    target = os.path.realpath(path)
    signalled: list[pidfile.PidInfo] = []
    seen: set[int] = set()
    for directory in data_dirs:
        for info in pidfile.read_all(directory):
            if (info.pid in seen or not info.users_file
                    or os.path.realpath(info.users_file) != target or not info.alive):
                continue
            seen.add(info.pid)
            try:
                os.kill(info.pid, signal.SIGHUP)
            except ProcessLookupError:
                continue
            signalled.append(info)
    return signalled
