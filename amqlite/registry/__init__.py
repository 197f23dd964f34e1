"""The group registry: who is in each group, in which role, reachable where.

Every broker, master or slave, announces itself (group, name, role, client
URIs, host, pid, epoch) so that ``amqlite cluster-list``, ``amqlite container
list`` and ``discovery:`` URIs can show or find a group's master without
asking the brokers. Two backends, chosen like the locker:

* ZooKeeper (``--locker zk://...``): an ephemeral znode
  ``/<root>/groups/<group>/members/<name>`` holding JSON. It vanishes with the
  broker's session, so a crashed broker leaves the registry after one session
  timeout, the same bound as its lock.
* the store otherwise (``amq_registry``): a heartbeat row per broker; a row
  whose heartbeat is older than ``STORE_MAX_AGE_MS`` counts as gone.

A master entry carries the epoch it claimed in the store. Epochs only grow, so
when a deposed master has not withdrawn yet (it is paused, or crashed and its
row or znode has not expired), readers still know which of two "masters" is
the real one: the higher epoch. ``GroupView.masters`` lists it first.

Announcing never blocks and never raises: the node sets what it wants the
registry to say, and a background task writes it, retries and heartbeats. A
registry that is down must not stop a broker from serving (it is a view for
operators and clients, not part of the election).

The package: ``model`` (entries, roles, who is master, registry URLs), ``writer`` (the
node's ``Registry`` and the background worker), the backends ``store_rows`` and
``zookeeper`` (each a writer and a reader), and here the choice between them
(``open_registry``, ``read_members``) and the cluster views (``read_cluster``,
``poll_cluster``). Importers use ``amqlite.registry``, which re-exports every public
name of its parts.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from amqlite.registry.model import (
    HTTP_SCHEMES,
    ROLES,
    STALE_AFTER_MS,
    STORE_HEARTBEAT_INTERVAL,
    STORE_MAX_AGE_MS,
    GroupView,
    Member,
    RegistryError,
    Role,
    current_master,
    display_url,
    group_views,
    heartbeat_stale,
    master_order,
    registry_url,
    zk_target,
)
from amqlite.registry.store_rows import StoreRegistry, read_store
from amqlite.registry.writer import WITHDRAW_TIMEOUT, NullRegistry, Registry
from amqlite.registry.zookeeper import (
    CLOSE_TIMEOUT,
    ZK_CHECK_INTERVAL,
    ZK_CONNECT_TIMEOUT,
    ZK_MASTER_REANNOUNCE_GRACE,
    ZK_SESSION_RETRY,
    ZooKeeperRegistry,
    read_zk,
)
from amqlite.settings import Settings
from lockers.connections.errors import one_line
from lockers.connections.zookeeper import is_zk_url

__all__ = [
    "CLOSE_TIMEOUT",
    "HTTP_SCHEMES",
    "ROLES",
    "STALE_AFTER_MS",
    "STORE_HEARTBEAT_INTERVAL",
    "STORE_MAX_AGE_MS",
    "WITHDRAW_TIMEOUT",
    "ZK_CHECK_INTERVAL",
    "ZK_CONNECT_TIMEOUT",
    "ZK_MASTER_REANNOUNCE_GRACE",
    "ZK_SESSION_RETRY",
    "GroupView",
    "Member",
    "NullRegistry",
    "Registry",
    "RegistryError",
    "Role",
    "StoreRegistry",
    "ZooKeeperRegistry",
    "current_master",
    "display_url",
    "group_views",
    "heartbeat_stale",
    "master_order",
    "open_registry",
    "poll_cluster",
    "read_cluster",
    "read_members",
    "registry_url",
    "zk_target",
]

log = logging.getLogger("amqlite.registry")


def open_registry(settings: Settings, store: Any | None = None) -> Registry:
    """The registry for a node: ZooKeeper when its locker is zk://, else its store
    (``store``: the node's own, already open, to share its connection pool).
    Never raises: a registry that cannot be set up is logged and skipped."""
    try:
        if is_zk_url(settings.locker):
            target = zk_target(settings.locker)
            return ZooKeeperRegistry(settings, target.hosts, target.root)
        return StoreRegistry(settings, store)
    except Exception as e:
        log.error("no registry for node %s: %s", settings.name, one_line(e))
        return NullRegistry()


def read_members(url: str, group: str | None = None) -> list[Member]:
    """Every live registry entry at ``url`` (a zk:// URL or a store URL), of
    one group or all. Blocking; raises ``RegistryError``."""
    if is_zk_url(url):
        return read_zk(url, group)
    return read_store(url, group)


def read_cluster(url: str, group: str | None = None) -> list[GroupView]:
    """One ``GroupView`` per group registered at ``url``; blocking; raises
    ``RegistryError``."""
    return group_views(read_members(url, group), display_url(url))


def poll_cluster(predicate: Callable[[list[GroupView]], bool], url: str, group: str | None,
                 timeout: float, interval: float = 0.1) -> list[GroupView] | None:
    """Poll ``read_cluster`` until ``predicate(views)`` holds; the views, or None
    at the deadline. For the CLI's start/stop and for tests."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            views = read_cluster(url, group)
        except RegistryError:
            views = None
        if views is not None and predicate(views):
            return views
        if time.monotonic() >= deadline:
            return None
        time.sleep(interval)
