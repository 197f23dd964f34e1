"""ZooKeeper plumbing shared by the lock (``lockers.zookeeper``) and the group
registry (``amqlite.registry``): the zk:// URL, the kazoo client, its stop.

Both talk to the same ensemble named by the same ``--locker zk://...`` URL, so
they must read it alike and retry alike. It lives here, on the floor they share
(``lockers.connections``), because ``lockers`` must not import ``amqlite``. kazoo is
imported only when a client is made: reading a URL (the CLI, a file-locked node) does
not load it.
"""

from __future__ import annotations

import logging
import re
import threading
import time
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from kazoo.client import KazooClient

#: ZooKeeper's default client port, used when a zk:// host names none.
ZK_DEFAULT_PORT = 2181

#: Root of our tree when a zk:// URL names none (lock and registry share it).
ZK_DEFAULT_ROOT = "/amqlite"

#: Cap on kazoo's reconnect and retry backoff, seconds. kazoo's defaults cap at
#: 60 s (commands, lock recipe) and 3600 s (connection), so a slave or a
#: registry could notice a restarted ensemble minutes late; 1 s costs one
#: connection attempt a second.
ZK_RETRY_MAX_DELAY = 1.0

#: Attempts for one plain command: a few quick ones, then the caller decides
#: (the lock drops its session, the registry tries again next period).
ZK_COMMAND_TRIES = 3

#: A root path: one or more ``/segment`` of characters ZooKeeper takes verbatim.
_ZK_ROOT = re.compile(r"(/[A-Za-z0-9._-]+)+")


class ZkUrlError(ValueError):
    """A zk:// URL that cannot be used; the message is one line, without the
    caller's prefix (the locker and the registry each say which URL it was)."""


@dataclass(frozen=True)
class ZkTarget:
    """Where a zk:// URL points: kazoo's ``hosts`` string and our tree's root."""

    hosts: str
    root: str


def is_zk_url(url: str) -> bool:
    return url.lower().startswith("zk://")


def parse_zk_url(url: str) -> ZkTarget:
    """``zk://h1:p1,h2:p2[/root]`` -> ``ZkTarget``; raises ``ZkUrlError``."""
    parts = urlsplit(url)
    if parts.scheme.lower() != "zk" or not parts.netloc:
        raise ZkUrlError(f"not a ZooKeeper URL (zk://host:port/root): {url!r}")
    if parts.query or parts.fragment:
        raise ZkUrlError("no query or fragment allowed")
    if "@" in parts.netloc:
        raise ZkUrlError("user info is not supported")
    hosts = []
    for part in parts.netloc.split(","):
        host, sep, port = part.strip().rpartition(":")
        if not sep:
            host, port = part.strip(), str(ZK_DEFAULT_PORT)
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ZkUrlError(f"bad host:port {part!r}")
        hosts.append(f"{host}:{int(port)}")
    root = parts.path.rstrip("/") or ZK_DEFAULT_ROOT
    if not _ZK_ROOT.fullmatch(root):
        raise ZkUrlError(f"bad root path {root!r}")
    return ZkTarget(",".join(hosts), root)


#: kazoo logs each failed connection attempt (several a second while ZooKeeper is
#: down): let one of its records through per this many seconds. Our locker and
#: registry log the states that matter themselves.
KAZOO_LOG_INTERVAL = 10.0
KAZOO_LOGGERS = ("kazoo.client", "kazoo.protocol.connection")


class _RateLimit(logging.Filter):
    """One record per ``interval`` seconds (errors always pass)."""

    def __init__(self, interval: float) -> None:
        super().__init__()
        self.interval = interval
        self.next_at = 0.0

    def filter(self, record: logging.LogRecord) -> bool:
        now = time.monotonic()
        if record.levelno >= logging.ERROR or now >= self.next_at:
            self.next_at = now + self.interval
            return True
        return False


def quiet_kazoo() -> None:
    """Rate-limit kazoo's loggers (idempotent)."""
    for name in KAZOO_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _RateLimit) for f in logger.filters):
            logger.addFilter(_RateLimit(KAZOO_LOG_INTERVAL))


def new_zk_client(hosts: str, session_timeout: float, *, ignore_expire: bool = True) -> KazooClient:
    """A kazoo client (not started) with our retry caps and kazoo's retry chatter
    rate-limited (every user of ZooKeeper gets both: locker, registry, discovery).

    ``ignore_expire=False``: a command does not silently retry in a new session
    (the registry must know its session changed to rewrite its ephemeral node).
    """
    from kazoo.client import KazooClient
    from kazoo.retry import KazooRetry

    quiet_kazoo()
    return KazooClient(
        hosts=hosts,
        timeout=session_timeout,
        connection_retry=KazooRetry(max_tries=-1, max_delay=ZK_RETRY_MAX_DELAY),
        command_retry=KazooRetry(
            max_tries=ZK_COMMAND_TRIES, max_delay=ZK_RETRY_MAX_DELAY, ignore_expire=ignore_expire
        ),
    )


#: One guard per client being stopped (see ``stop_zk_client``); weak, so a
#: stopped client is not kept alive by it.
_STOP_GUARDS: weakref.WeakKeyDictionary[KazooClient, threading.Lock] = (
    weakref.WeakKeyDictionary()
)
_STOPPED: weakref.WeakSet[KazooClient] = weakref.WeakSet()
_STOP_GUARDS_LOCK = threading.Lock()


def stop_zk_client(client: KazooClient) -> None:
    """End the session (and with it every ephemeral node it made) and free the
    client. Blocking; idempotent; safe from two threads at once.

    Two paths may end one session at once (the lock's close() and a failed
    wait): kazoo's ``close()`` refuses while another thread's ``stop()`` is
    still running, so stops of one client are serialised.
    """
    with _STOP_GUARDS_LOCK:
        guard = _STOP_GUARDS.setdefault(client, threading.Lock())
    with guard:
        if client in _STOPPED:
            return
        try:
            client.stop()
        finally:
            client.close()
            _STOPPED.add(client)
