"""A node name is unique among a group's live nodes (issue 27: two nodes named alike hid
the slave from ``cluster-list`` and made ``amqlite stop`` stop the wrong one).

At start, before it writes its pid file or announces itself, a node reads its group's
registry (the one it will write: the store's rows or ZooKeeper's znodes) and refuses to
run when a live entry already has its name. Live: the heartbeat is recent (the store) or
the session holds (ZooKeeper), and, when the entry is of this host, its pid still runs
an amqlite node, so a node restarted right after a crash (its old row not expired yet)
is not refused. Best effort: a registry that cannot be read in time does not stop a start
(the lock, not the registry, decides who serves).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import threading
import time

from amqlite.pidfile import process_alive
from amqlite.registry import Member, RegistryError, heartbeat_stale, read_members, registry_url
from amqlite.settings import Settings, SettingsError

log = logging.getLogger("amqlite.node")

#: How long the check may take (s): a registry that does not answer by then is skipped
#: (a reachable store or ZooKeeper answers in milliseconds).
CHECK_TIMEOUT = 1.5


def holder_of_name(members: list[Member], name: str, now_ms: int | None = None,
                   host: str | None = None) -> Member | None:
    """The live entry other than this process that already has ``name``, or None."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    here = socket.gethostname() if host is None else host
    for m in members:
        if m.name != name or heartbeat_stale(m, now):
            continue
        if m.host == here and m.pid is not None and (
                m.pid == os.getpid() or not process_alive(m.pid)):
            continue  # this process, or a crashed node of this host not expired yet
        return m
    return None


async def _read_members(url: str, group: str, timeout: float) -> list[Member]:
    """``read_members`` in a daemon thread, given up after ``timeout``: a registry that
    does not answer (ZooKeeper down: its connect alone waits 5 s) neither delays the
    start for longer nor holds the process's exit (``asyncio.to_thread`` would)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[list[Member]] = loop.create_future()

    def settle(result: list[Member] | None, error: BaseException | None) -> None:
        if done.done():
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(result or [])

    def work() -> None:
        try:
            result, error = read_members(url, group), None
        except Exception as e:
            result, error = None, e
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=work, name="amqlite-name-check", daemon=True).start()
    return await asyncio.wait_for(done, timeout)


async def refuse_duplicate_name(settings: Settings) -> None:
    """Raise ``SettingsError`` (one line, exit 2) when a live node of the group already
    runs under ``settings.name``."""
    try:
        members = await _read_members(registry_url(settings), settings.group, CHECK_TIMEOUT)
    except (RegistryError, TimeoutError) as exc:
        log.info("node %s: name check skipped: registry %s", settings.name,
                 str(exc) or "did not answer in time")
        return
    holder = holder_of_name(members, settings.name)
    if holder is not None:
        where = f"{holder.host or '?'}, pid {holder.pid}" if holder.pid else holder.host or "?"
        raise SettingsError(
            f"name {settings.name}: a live node of group {settings.group} already has it "
            f"({holder.role} on {where}); give this one another --name", "name")
