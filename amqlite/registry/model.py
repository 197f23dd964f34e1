"""The registry's model: what an entry says (``Member``, ``Role``), how one group's
entries fold into who is master (``GroupView``, ``current_master``, ``group_views``) and
where a node registers (``registry_url``, ``zk_target``, ``display_url``).

Every reader asks these functions, whichever backend the entries came from, so a stale
entry is never anybody's master. No I/O here; the backends are ``store_rows`` and
``zookeeper``, the node's writer base ``writer`` (``amqlite.registry`` says the whole).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from amqlite.settings import Settings
from lockers.connections.zookeeper import ZkTarget, ZkUrlError, is_zk_url, parse_zk_url


class Role(enum.StrEnum):
    """A node's role (amqlite.node). A registry entry carries MASTER or SLAVE, stored
    as the plain strings "master" and "slave" (readers, old and new, compare those);
    the other roles are the node's own moments between the two."""

    STARTING = "starting"
    SLAVE = "slave"
    MASTER = "master"
    DEMOTED = "demoted"  # lost mastership, closing everything
    STOPPING = "stopping"  # graceful stop as master


#: The roles a registry entry may carry.
ROLES = (Role.MASTER, Role.SLAVE)

#: Store registry heartbeat period (s). Role changes are written at once (they
#: do not wait for a heartbeat); the heartbeat only proves liveness. 0.5 s is
#: two short upserts a second per broker: nothing for PostgreSQL and a small
#: share of SQLite's write lock next to a master's group commits.
STORE_HEARTBEAT_INTERVAL = 0.5
#: Store registry rows older than this are gone (ms): four heartbeat periods,
#: so three late heartbeats in a row (a busy SQLite write lock, a GC pause, a
#: loaded machine) do not make a live broker vanish, while a crashed broker
#: leaves the view within 2 s. Assumes broker and reader clocks agree to well
#: under a second (NTP), as heartbeats carry the writer's clock.
STORE_MAX_AGE_MS = 2_000

#: Service URIs with these schemes are a node's management API, not a client URI.
HTTP_SCHEMES = ("http://", "https://")
#: ... and these its STOMP-over-WebSocket listeners (for pages, not for TCP clients).
WS_SCHEMES = ("ws://", "wss://")


class RegistryError(Exception):
    """The registry cannot be read (bad URL, unreachable); one line for the CLI."""


@dataclass(frozen=True)
class Member:
    """One broker's registry entry."""

    group: str
    name: str
    role: str
    services: tuple[str, ...]
    host: str | None = None
    pid: int | None = None
    epoch: int | None = None
    #: The node's management API (``http://host:port``), None when it has none.
    http: str | None = None
    #: Last heartbeat (ms since the Unix epoch), store registry only.
    heartbeat_at: int | None = None
    #: The node's STOMP-over-WebSocket URLs (``ws://host:port/ws``), kept out of
    #: ``services``: a TCP client cannot use them.
    websocket: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"group": self.group, "name": self.name, "role": self.role,
                "services": list(self.services), "host": self.host, "pid": self.pid,
                "epoch": self.epoch, "http": self.http, "heartbeat_at": self.heartbeat_at,
                "websocket": list(self.websocket)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Member:
        services = data.get("services") or ()
        if isinstance(services, str):
            services = [s for s in services.split(",") if s]
        pid, epoch = data.get("pid"), data.get("epoch")
        # The store registry has one services column: an http(s):// entry in it is the
        # management URL and ws(s):// ones the WebSocket URLs (kept out of the client
        # URIs); ZooKeeper entries carry "http" and "websocket".
        http = data.get("http")
        uris, websocket = [], [str(u) for u in data.get("websocket") or ()]
        for uri in (str(s) for s in services):
            if uri.startswith(HTTP_SCHEMES):
                http = http or uri
            elif uri.startswith(WS_SCHEMES):
                websocket.append(uri)
            else:
                uris.append(uri)
        heartbeat = data.get("heartbeat_at")
        return cls(
            group=str(data["group"]), name=str(data["name"]), role=str(data["role"]),
            services=tuple(uris),
            host=None if data.get("host") is None else str(data["host"]),
            pid=None if pid is None else int(pid),
            epoch=None if epoch is None else int(epoch),
            http=None if http is None else str(http),
            heartbeat_at=None if heartbeat is None else int(heartbeat),
            websocket=tuple(dict.fromkeys(websocket)),
        )


#: A store registry entry whose heartbeat is older than this is shown as stale, not in
#: its role (ms): six heartbeat periods. A heartbeat or two late is common on a loaded
#: machine (a 2-core CI box running PostgreSQL and several brokers) and a live master
#: must not flicker; a crashed master nobody took over from is then no longer listed as
#: master after 3 s, before its row expires at ``STORE_MAX_AGE_MS``; one somebody took
#: over from is stale at once (superseded by a higher epoch).
STALE_AFTER_MS = 6 * int(STORE_HEARTBEAT_INTERVAL * 1000)


@dataclass(frozen=True)
class GroupView:
    """One group of one registry as ``cluster-list`` shows it (Fabric's cluster row).

    ``masters``: the live master announcing the highest epoch (more than one only
    when two live masters announce the same epoch, which fencing rules out).
    ``stale``: entries not to be trusted in their role: a master superseded by a
    higher epoch (a deposed or crashed master not gone from the registry yet) or a
    store entry whose heartbeat is late (``STALE_AFTER_MS``).
    ``services``: the client URIs of the real master; ``websocket`` its WebSocket URLs.
    ``registry``: where the entries were read (password masked); two groups of
    one name in two stores are two views.
    """

    group: str
    masters: list[str]
    slaves: list[str]
    services: list[str]
    members: list[Member] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)
    registry: str = ""
    websocket: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"cluster": self.group, "registry": self.registry, "masters": self.masters,
                "slaves": self.slaves, "stale": self.stale, "services": self.services,
                "websocket": self.websocket, "members": [m.to_json() for m in self.members]}


def master_order(m: Member) -> tuple[int, str]:
    """Sort key of master entries: highest epoch first, then by name."""
    return (-(m.epoch if m.epoch is not None else -1), m.name)


def heartbeat_stale(m: Member, now_ms: int) -> bool:
    """True if ``m`` has a heartbeat (store registry) older than ``STALE_AFTER_MS``."""
    return m.heartbeat_at is not None and now_ms - m.heartbeat_at > STALE_AFTER_MS


def _sort_out(entries: list[Member], now_ms: int) -> tuple[list[Member], list[Member], set[str]]:
    """One group's entries as (masters, live slaves, stale names): the one rule for who
    is master (see ``GroupView``), used by every reader of the registry."""
    live: list[Member] = []
    stale: set[str] = set()
    for m in entries:
        if heartbeat_stale(m, now_ms):
            stale.add(m.name)
        else:
            live.append(m)
    masters = sorted((m for m in live if m.role == Role.MASTER), key=master_order)
    if masters:
        top = masters[0].epoch
        stale |= {m.name for m in masters if m.epoch != top}
        masters = [m for m in masters if m.epoch == top]
    slaves = [m for m in live if m.role != Role.MASTER and m.name not in stale]
    return masters, slaves, stale


def _now_ms(now_ms: int | None) -> int:
    return int(time.time() * 1000) if now_ms is None else now_ms


def current_master(members: Iterable[Member], now_ms: int | None = None) -> Member | None:
    """The real master among one group's entries (the first of ``GroupView.masters``),
    None when no live master announces itself. ``cluster-list``, the management API and
    the management CLI all ask this, so a stale entry is never anybody's master."""
    masters = _sort_out(list(members), _now_ms(now_ms))[0]
    return masters[0] if masters else None


def group_views(members: Iterable[Member], registry: str = "",
                now_ms: int | None = None) -> list[GroupView]:
    """Fold the entries of one registry into one view per group, sorted by group
    name; stale entries (see ``GroupView``) are set apart, never listed as master."""
    now = _now_ms(now_ms)
    by_group: dict[str, list[Member]] = {}
    for m in members:
        by_group.setdefault(m.group, []).append(m)
    views = []
    for group in sorted(by_group):
        entries = by_group[group]
        masters, slaves, stale = _sort_out(entries, now)
        services = list(masters[0].services) if masters else []
        views.append(GroupView(group, [m.name for m in masters], sorted(m.name for m in slaves),
                               services, sorted(entries, key=lambda m: m.name), sorted(stale),
                               registry, list(masters[0].websocket) if masters else []))
    return views


def display_url(url: str) -> str:
    """A registry URL as the user should see it: a store URL normalised (absolute
    SQLite path, no driver suffix) with its password masked; a zk:// URL as given.
    Two spellings of one store give one string."""
    if is_zk_url(url):
        return url
    from store import StoreError, parse_store_url
    from store.url import describe

    try:
        parsed = parse_store_url(url)
    except StoreError:
        return url
    return describe(parsed.url.set(drivername=parsed.dialect))


def zk_target(url: str) -> ZkTarget:
    """Hosts and root of a zk:// registry URL; raises ``RegistryError``."""
    try:
        return parse_zk_url(url)
    except ZkUrlError as e:
        raise RegistryError(f"zk:// URL: {e}") from None


def registry_url(settings: Settings) -> str:
    """Where a node with these settings registers: its zk:// locker, else its store."""
    return settings.locker if is_zk_url(settings.locker) else settings.store
