"""amqlite: lockers — the group election behind one interface.

``open_locker(url, group)`` picks the backend from the URL:

* ``file:///abs/path/amqlite.lock`` — ``flock`` on a local file (embedded default);
* ``postgresql://...`` (also ``postgres://`` and SQLAlchemy's ``postgresql+psycopg://``) —
  a session advisory lock; several hosts in either of libpq's spellings
  (``lockers.connections.pg_url``);
* ``zk://host:port[,host:port][/root]`` — kazoo's lock recipe (root ``/amqlite``).
"""

from __future__ import annotations

import math
import os
import re
import socket
from urllib.parse import unquote, urlsplit

from lockers.base import (
    DEFAULT_KEEPALIVE_INTERVAL,
    DEFAULT_POLL_INTERVAL,
    Locker,
    LockerError,
    LockerUnusable,
    LockLost,
    LockState,
    StateListener,
)

__all__ = [
    "DEFAULT_KEEPALIVE_INTERVAL",
    "DEFAULT_POLL_INTERVAL",
    "LockLost",
    "LockState",
    "Locker",
    "LockerError",
    "LockerUnusable",
    "StateListener",
    "open_locker",
]

#: Group names become a file note, a znode name and part of application_name,
#: so they are kept to characters every backend takes verbatim. 100 leaves
#: room in ZooKeeper paths and is far beyond any sensible name.
GROUP_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")

_PG_SCHEMES = ("postgresql", "postgres")


def _positive(name: str, value: float | None) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise LockerError(f"{name} must be a number of seconds, not {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise LockerError(f"{name} must be a positive number of seconds, not {value!r}")
    return float(value)


def open_locker(
    url: str,
    group: str,
    *,
    session_timeout: float | None = None,
    keepalive_interval: float | None = None,
    node: str | None = None,
    lease: float | None = None,
) -> Locker:
    """The locker for ``url``; raises ``LockerError`` (one line) on a bad URL.

    ``session_timeout``: ZooKeeper's session timeout; the file and PostgreSQL
    lockers have no session to time out and ignore it (PostgreSQL's TCP
    timeouts are ``lockers.connections.postgres.PG_DEAD_PEER_TIMEOUT``). ``node`` names this
    broker in the lock (file note, znode data, ``application_name``); default
    ``host:pid``. ``lease``: PostgreSQL's lease in seconds (``lockers.pg_lease``;
    None: its default, 0: none), so a paused master loses the lock; the others
    ignore it (ZooKeeper's session timeout plays that part).
    Nothing connects until the first ``try_acquire``/``acquire``.
    """
    if not isinstance(group, str) or not GROUP_NAME.fullmatch(group):
        raise LockerError(
            f"bad group name {group!r}: use letters, digits, '.', '_' and '-' (at most 100)"
        )
    session_timeout = _positive("session_timeout", session_timeout)
    keepalive_interval = _positive("keepalive_interval", keepalive_interval)
    node = node or f"{socket.gethostname()}:{os.getpid()}"
    interval = keepalive_interval or DEFAULT_KEEPALIVE_INTERVAL
    if not isinstance(url, str) or "://" not in url:
        raise LockerError(
            "locker URL must look like file:///path, postgresql://... or zk://host:port/root"
        )
    scheme = url.split("://", 1)[0].lower()

    if scheme == "file":
        parts = urlsplit(url)
        if parts.netloc not in ("", "localhost"):
            raise LockerError("file:// locker URL: only local files (file:///abs/path.lock)")
        if parts.query or parts.fragment:
            raise LockerError("file:// locker URL: no query or fragment allowed")
        path = unquote(parts.path)
        if not path.startswith("/") or path.endswith("/"):
            raise LockerError("file:// locker URL must name a file by absolute path")
        from lockers.file import FileLocker

        locker: Locker = FileLocker(path, group, node=node)
        locker.keepalive_interval = interval
        return locker

    if scheme in _PG_SCHEMES or scheme.startswith("postgresql+"):
        from lockers.connections.pg_url import PgUrlError, parse_pg_url
        from lockers.pg_lease import PG_LEASE, PG_MIN_LEASE
        from lockers.postgres import PostgresLocker

        if lease is not None and not (lease == 0 or PG_MIN_LEASE <= lease < math.inf):
            raise LockerError(f"lease: must be 0 (none) or at least {PG_MIN_LEASE:g}s,"
                              f" got {lease!r}")
        try:
            pg = parse_pg_url(url)  # either spelling of several hosts, checked
        except PgUrlError as e:
            raise LockerError(f"bad PostgreSQL URL: {e}") from None
        if pg.several_hosts:
            # libpq's keywords, with target_session_attrs defaulted: the lock must be
            # taken on the primary, where the store writes.
            from psycopg.conninfo import make_conninfo

            url = make_conninfo("", **pg.params)
        return PostgresLocker(
            url, group, node=node, keepalive_interval=interval,
            lease=PG_LEASE if lease is None else lease,
        )

    if scheme == "zk":
        from lockers.connections.zookeeper import ZkUrlError, parse_zk_url

        try:
            target = parse_zk_url(url)
        except ZkUrlError as e:
            raise LockerError(f"zk:// locker URL: {e}") from None
        from lockers.zookeeper import ZK_SESSION_TIMEOUT, ZooKeeperLocker

        return ZooKeeperLocker(
            target.hosts,
            target.root,
            group,
            node=node,
            session_timeout=session_timeout or ZK_SESSION_TIMEOUT,
            keepalive_interval=interval,
        )

    raise LockerError(
        f"unsupported locker URL scheme {scheme + '://'!r}: use file://, postgresql:// or zk://"
    )
