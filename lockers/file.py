"""The embedded default: an ``flock`` on a lock file beside the SQLite store.

Local disks only. ``flock`` over NFS is emulated (or silently local) depending
on the client, and a lock file removed under a live master is exactly how
ActiveMQ and Artemis ended up with two masters; the keepalive therefore checks
that the path still names the file our descriptor locks.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import threading
from pathlib import Path

from lockers.base import (
    DEFAULT_POLL_INTERVAL,
    Locker,
    LockerError,
    LockLost,
    LockState,
)
from lockers.connections.blocking import run_blocking

log = logging.getLogger(__name__)

#: Permissions of a newly created lock file: other users may read who holds it.
LOCK_FILE_MODE = 0o644


class FileLocker(Locker):
    """``fcntl.flock(LOCK_EX | LOCK_NB)`` on a separate lock file.

    The open descriptor is the proof: the kernel drops the lock when the
    process dies, however it dies, so a SIGKILLed master is replaced within one
    poll interval. The descriptor is opened non-inheritable (PEP 446), so a
    child process (the audit job) cannot keep a dead master's lock alive.
    The pid and node name written into the file are for people; nothing
    trusts them.
    """

    def __init__(self, path: str | os.PathLike[str], group: str, *, node: str) -> None:
        super().__init__()
        self.path = Path(path)
        self.group = group
        self.node = node
        self.description = f"file lock {self.path} (group {group})"
        self._fd: int | None = None

    # -- blocking parts (run in a thread) ---------------------------------
    def _try_lock_blocking(self) -> int | None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, LOCK_FILE_MODE)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return None
            # The path may have been unlinked or replaced between our open and
            # our flock: then we locked a file nobody else will ever look at.
            if not self._same_file(fd):
                os.close(fd)
                return None
            return fd
        except BaseException:
            os.close(fd)
            raise

    def _same_file(self, fd: int) -> bool:
        mine = os.fstat(fd)
        if mine.st_nlink == 0:
            return False
        try:
            there = os.stat(self.path)
        except FileNotFoundError:
            return False
        return (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino)

    def _unlock_blocking(self, fd: int) -> None:
        try:
            if self._same_file(fd):
                os.ftruncate(fd, 0)  # before unlocking: a new holder writes its own note
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    # -- Locker -----------------------------------------------------------
    async def try_acquire(self) -> bool:
        if self._fd is not None:
            return True
        try:
            fd = await run_blocking(self._try_lock_blocking, name="amqlite-file-lock")
        except OSError as e:
            raise LockerError(f"{self.description}: {e.strerror or e}") from e
        if fd is None:
            return False
        self._take(fd)
        return True

    async def acquire(self, poll_interval: float = DEFAULT_POLL_INTERVAL) -> None:
        """Wait in a blocking ``flock`` (in a thread) so a slave wakes the instant
        the kernel drops a dead master's lock, instead of up to one poll later.
        The poll still runs beside it: it notices a lock file that was replaced
        (the blocked thread would wait on the old inode forever)."""
        if await self.try_acquire():
            return
        waiter = _FlockWaiter(self)
        try:
            while True:
                with contextlib.suppress(asyncio.TimeoutError):
                    fd = await asyncio.wait_for(asyncio.shield(waiter.future), poll_interval)
                    if fd is not None and self._same_file(fd):  # two stat calls: fine on the loop
                        waiter.taken = True
                        self._take(fd)
                        return
                    if fd is not None:  # locked a replaced file: start over
                        os.close(fd)
                        waiter = _FlockWaiter(self)
                        continue
                if await self.try_acquire():
                    return
        finally:
            if not waiter.taken:
                waiter.abandon()

    def _take(self, fd: int) -> None:
        note = f"pid={os.getpid()} node={self.node} group={self.group}\n".encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, note, 0)
        self._fd = fd
        log.info("acquired %s", self.description)

    async def keepalive(self) -> None:
        fd = self._fd
        if fd is None:
            raise LockLost(f"{self.description}: not held")
        try:
            same = await run_blocking(lambda: self._same_file(fd), name="amqlite-file-check")
        except OSError as e:
            same = False
            log.error("%s: cannot check the lock file: %s", self.description, e)
        if same:
            return
        # Someone deleted or replaced the lock file: a new contender can lock the
        # new file, so our lock proves nothing any more.
        log.error("%s: the lock file was removed or replaced under us", self.description)
        self._fd = None
        await run_blocking(lambda: os.close(fd), name="amqlite-file-close")
        self._notify(LockState.LOST)
        raise LockLost(f"{self.description}: lock file removed or replaced")

    async def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        await run_blocking(lambda: self._unlock_blocking(fd), name="amqlite-file-unlock")
        log.info("released %s", self.description)


class _FlockWaiter:
    """One daemon thread blocked in ``flock(LOCK_EX)`` on the lock file.

    A blocked flock cannot be interrupted; an abandoned waiter that gets the
    lock later unlocks and closes at once, so nothing is left held.
    """

    def __init__(self, locker: FileLocker) -> None:
        self.loop = asyncio.get_running_loop()
        self.future: asyncio.Future[int | None] = self.loop.create_future()
        self.taken = False
        self._abandoned = threading.Event()
        self._lock = threading.Lock()
        self._path = locker.path
        threading.Thread(target=self._run, name="amqlite-file-wait", daemon=True).start()

    def _run(self) -> None:
        fd: int | None = None
        try:
            fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, LOCK_FILE_MODE)
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            if fd is not None:
                os.close(fd)
            fd = None
        with self._lock:
            if self._abandoned.is_set():
                if fd is not None:
                    os.close(fd)  # closing the descriptor drops the flock
                return
            with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits
                self.loop.call_soon_threadsafe(self._deliver, fd)

    def _deliver(self, fd: int | None) -> None:
        if self.future.done() or self._abandoned.is_set():
            if fd is not None:
                os.close(fd)
            return
        self.future.set_result(fd)

    def abandon(self) -> None:
        with self._lock:
            self._abandoned.set()
        if self.future.done() and not self.future.cancelled():
            fd = self.future.result()
            if fd is not None:
                os.close(fd)
