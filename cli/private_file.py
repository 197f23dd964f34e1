"""Files that hold secrets (the users file's hashes, a container config's store URL
with its password), written as a whole and readable by their owner only, and the
passwords the CLI reads from somewhere other than its command line."""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

#: Owner read/write only: the file holds a password or password hashes.
PRIVATE_MODE = 0o600


def write_private(path: Path, text: str,
                  check: Callable[[str], None] | None = None) -> None:
    """Replace ``path`` by ``text`` atomically, mode 0600: a temporary file in the same
    directory (created 0600, so the secret is never readable by others even for a
    moment), flushed to disk, then renamed over ``path``. A reader (a node reloading
    the users file) sees the old file or the new one, never half of one. ``check`` is
    called with the temporary file's path before the rename; what it raises leaves
    ``path`` as it was."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, PRIVATE_MODE)
        if check is not None:
            check(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # the rename itself survives a crash
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


@contextlib.contextmanager
def edit_lock(path: Path) -> Iterator[None]:
    """Serialise editors of ``path`` (two ``amqlite user`` commands at once would each
    write what they read, and one change would be lost): an exclusive lock on a file
    beside it (``path`` itself is replaced on every write, so locking it would not)."""
    lock = path.parent / f".{path.name}.lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, PRIVATE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def read_password_file(path: str) -> str:
    """A password kept in a file: its first line, without the line end (``echo secret >
    FILE`` writes one). OSError when it cannot be read; ValueError when it is empty."""
    with open(path, encoding="utf-8") as f:
        line = f.readline()
    password = line.rstrip("\r\n")
    if not password:
        raise ValueError(f"password file {path} is empty")
    return password
