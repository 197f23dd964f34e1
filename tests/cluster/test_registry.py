"""The registry: pure folding of entries into cluster views, the store registry on real
SQLite and PostgreSQL, the ZooKeeper registry on a real ZooKeeper, and discovery URIs
resolved from both."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from amqlite.client.discovery import DiscoveryError, parse, resolve, resolve_agent
from amqlite.registry import (
    STALE_AFTER_MS,
    STORE_MAX_AGE_MS,
    ZK_CHECK_INTERVAL,
    ZK_MASTER_REANNOUNCE_GRACE,
    GroupView,
    Member,
    NullRegistry,
    Registry,
    StoreRegistry,
    ZooKeeperRegistry,
    group_views,
    open_registry,
    read_cluster,
)
from amqlite.settings import Settings
from cli.cluster_cmds import COLUMN_WIDTH, format_table
from tests.helpers.poll import poll as poll_until
from tests.helpers.servers import ZooKeeperServer, free_port

#: "cluster-list ... within a second of a change" (issue 4).
CHANGE_VISIBLE_WITHIN = 1.0
STORE_MAX_AGE = STORE_MAX_AGE_MS / 1000
#: Slack for a loaded two-core machine on top of a documented bound.
SLACK = 2.0


def settings(name: str, group: str, store: str, locker: str = "") -> Settings:
    port = free_port()
    return Settings(group=group, name=name, store=store, locker=locker or "",
                    data_dir=str(Path(store.removeprefix("sqlite:///")).parent)
                    if store.startswith("sqlite") else "/nonexistent",
                    bind=f"127.0.0.1:{port}", zk_session_timeout=2.0).resolved()


def poll(read: Callable[[], list[GroupView]], predicate: Callable[[list[GroupView]], bool],
         timeout: float, what: str) -> tuple[list[GroupView], float]:
    """Poll ``read()`` until ``predicate``; returns the views and the seconds it took."""
    return poll_until(read, predicate, timeout=timeout, what=what, interval=0.02)


def members_of(views: list[GroupView], group: str) -> dict[str, Member]:
    for v in views:
        if v.group == group:
            return {m.name: m for m in v.members}
    return {}


# --------------------------------------------------------------------------- pure


def test_views_list_the_highest_epoch_master_and_take_its_services() -> None:
    """A deposed master that has not left the registry yet is stale, not a second
    master, and services are the real master's."""
    views = group_views([
        Member("g", "old", "master", ("tcp://h:1",), epoch=3),
        Member("g", "new", "master", ("tcp://h:2",), epoch=9),
        Member("g", "s2", "slave", ("tcp://h:4",)),
        Member("g", "s1", "slave", ("tcp://h:3",)),
        Member("other", "x", "slave", ("tcp://h:5",)),
    ])
    assert [v.group for v in views] == ["g", "other"]
    g = views[0]
    assert g.masters == ["new"] and g.stale == ["old"]
    assert g.slaves == ["s1", "s2"]
    assert g.services == ["tcp://h:2"]
    assert views[1].masters == [] and views[1].services == []


def test_table_has_fabric_30_character_columns() -> None:
    table = format_table([GroupView("default", ["broker1"], ["broker2", "broker3"],
                                    ["tcp://127.0.0.1:61613"], registry="zk://h:2181/amq")])
    header, row = table.splitlines()
    w = COLUMN_WIDTH + 1
    assert header[:w].rstrip() == "[cluster]" and header[w:2 * w].rstrip() == "[masters]"
    assert header[2 * w:3 * w].rstrip() == "[slaves]"
    assert header[3 * w:4 * w].rstrip() == "[services]" and header[4 * w:] == "[registry]"
    assert row[:w].rstrip() == "default" and row[w:2 * w].rstrip() == "broker1"
    assert row[2 * w:3 * w].rstrip() == "broker2, broker3"
    assert row[3 * w:4 * w].rstrip() == "tcp://127.0.0.1:61613"
    assert row[4 * w:] == "zk://h:2181/amq"


def test_table_columns_widen_for_long_cells_and_mark_stale_entries() -> None:
    name = "g" * 42
    view = group_views([Member(name, "b1", "master", ("tcp://h:1",), epoch=1,
                               heartbeat_at=1_000),
                        Member(name, "b2", "master", ("tcp://h:2",), epoch=2,
                               heartbeat_at=1_000 + STALE_AFTER_MS)],
                       "sqlite:////x.db", now_ms=1_000 + STALE_AFTER_MS)
    header, row = format_table(view).splitlines()
    assert header.index("[masters]") == len(name) + 1
    assert row[len(name) + 1:].startswith("b2, b1 (stale)")


def test_a_late_heartbeat_is_stale_not_master() -> None:
    """A master one heartbeat late (a crash not expired yet) is not listed as master."""
    now = 10_000
    views = group_views([Member("g", "dead", "master", ("tcp://h:1",), epoch=5,
                                heartbeat_at=now - STALE_AFTER_MS - 1),
                         Member("g", "s", "slave", ("tcp://h:2",), heartbeat_at=now)],
                        now_ms=now)
    assert views[0].masters == [] and views[0].stale == ["dead"]
    assert views[0].slaves == ["s"] and views[0].services == []
    fresh = group_views([Member("g", "m", "master", ("tcp://h:1",), epoch=5,
                                heartbeat_at=now - STALE_AFTER_MS)], now_ms=now)
    assert fresh[0].masters == ["m"] and fresh[0].stale == []


@pytest.mark.parametrize(("uri", "url", "group"), [
    ("discovery:zk://127.0.0.1:2181/amqlite?group=default", "zk://127.0.0.1:2181/amqlite",
     "default"),
    ("discovery:(zk://a:1,b:2/amq)?group=orders", "zk://a:1,b:2/amq", "orders"),
    ("discovery:sqlite:////var/lib/a.db?group=g", "sqlite:////var/lib/a.db", "g"),
    ("discovery:postgresql://u@h:5432/db?sslmode=disable&group=g",
     "postgresql://u@h:5432/db?sslmode=disable", "g"),
    ("discovery:zk://h:2181/amqlite", "zk://h:2181/amqlite", "default"),
])
def test_discovery_uri_names_a_registry_and_a_group(uri: str, url: str, group: str) -> None:
    assert parse(uri) == (url, group)


@pytest.mark.parametrize("uri", ["tcp://h:1", "discovery:nothing", "discovery:(zk://h:1",
                                 "discovery:zk://h:1/r?group="])
def test_bad_discovery_uri_is_one_clear_error(uri: str) -> None:
    with pytest.raises(DiscoveryError):
        parse(uri)


# --------------------------------------------------------------------------- store


@pytest.mark.integration
def test_store_registry_shows_changes_within_a_second_and_heartbeats(store_url: str) -> None:
    """Role changes are written at once (visible < 1 s); the heartbeat keeps a live
    node listed past the max age; withdraw removes it before returning."""
    s = settings("n1", "g1", store_url)
    read = lambda: read_cluster(store_url, "g1")  # noqa: E731

    async def scenario() -> None:
        reg = open_registry(s)
        assert isinstance(reg, StoreRegistry)
        try:
            await reg.announce("slave", None)
            views, took = await asyncio.to_thread(
                poll, read, lambda v: bool(v) and v[0].slaves == ["n1"], 10, "n1 as slave")
            print(f"\nfirst announce visible after {took:.3f}s (includes schema creation)")
            await reg.announce("master", 7)
            views, took = await asyncio.to_thread(
                poll, read, lambda v: bool(v) and v[0].masters == ["n1"], SLACK, "n1 master")
            assert took < CHANGE_VISIBLE_WITHIN, f"promotion visible after {took:.3f}s"
            assert views[0].services == [s.advertise]
            assert members_of(views, "g1")["n1"].epoch == 7
            assert members_of(views, "g1")["n1"].pid is not None
            # Listed on every read for twice the max age: the heartbeat keeps it fresh.
            end = time.monotonic() + 2 * STORE_MAX_AGE
            while time.monotonic() < end:
                views = await asyncio.to_thread(read)
                assert views and views[0].masters == ["n1"], "a live master dropped out"
                await asyncio.sleep(0.1)
            await reg.withdraw()
            assert await asyncio.to_thread(read) == []
        finally:
            await reg.close()

    asyncio.run(scenario())


@pytest.mark.integration
def test_store_registry_entry_of_a_silent_node_expires(store_url: str) -> None:
    """A node that stops heartbeating (as a crash would) leaves the view within the max
    age, and a live one next to it stays."""
    read = lambda: read_cluster(store_url, "g2")  # noqa: E731

    async def scenario() -> None:
        silent = open_registry(settings("silent", "g2", store_url))
        live = open_registry(settings("live", "g2", store_url))
        try:
            await silent.announce("slave", None)
            await live.announce("master", 1)
            await asyncio.to_thread(poll, read, lambda v: bool(v) and len(v[0].members) == 2,
                                    10, "both listed")
            await silent.close()  # no withdraw: the row stays, its heartbeat stops
            assert "silent" in members_of(await asyncio.to_thread(read), "g2")
            views, took = await asyncio.to_thread(
                poll, read, lambda v: "silent" not in members_of(v, "g2"),
                STORE_MAX_AGE + SLACK, "silent node gone")
            print(f"\nsilent node gone after {took:.3f}s (max age {STORE_MAX_AGE}s)")
            assert views[0].masters == ["live"]
        finally:
            await live.withdraw()
            await live.close()
            await silent.close()

    asyncio.run(scenario())


@pytest.mark.integration
def test_discovery_resolves_the_store_registry_master_first(store_url: str) -> None:
    async def scenario() -> None:
        a, b = settings("a", "g3", store_url), settings("b", "g3", store_url)
        ra, rb = open_registry(a), open_registry(b)
        try:
            await ra.announce("slave", None)
            await rb.announce("master", 4)
            uri = f"discovery:{store_url}?group=g3"
            deadline = time.monotonic() + 10
            while (got := await asyncio.to_thread(resolve, uri)) != [b.advertise, a.advertise]:
                assert time.monotonic() < deadline, f"resolve gave {got}"
                await asyncio.sleep(0.05)
            # Failover: a takes over with a higher epoch, b becomes slave.
            await ra.announce("master", 5)
            await rb.announce("slave", None)
            deadline = time.monotonic() + CHANGE_VISIBLE_WITHIN
            while (got := await asyncio.to_thread(resolve, uri)) != [a.advertise, b.advertise]:
                assert time.monotonic() < deadline, f"resolve gave {got} after the failover"
                await asyncio.sleep(0.02)
            assert await asyncio.to_thread(resolve, f"discovery:{store_url}?group=none") == []
            # The client's resolver hook gets the text after "discovery:".
            assert await asyncio.to_thread(resolve_agent, f"{store_url}?group=g3") == [
                a.advertise, b.advertise]
        finally:
            for r in (ra, rb):
                await r.withdraw()
                await r.close()

    asyncio.run(scenario())


def test_a_registry_that_cannot_be_set_up_never_stops_the_node(tmp_path: Path) -> None:
    s = Settings(group="g", name="n", data_dir=str(tmp_path), locker="zk://bad host:x/r",
                 bind="127.0.0.1:1").resolved()
    reg = open_registry(s)
    assert isinstance(reg, NullRegistry)


# --------------------------------------------------------------------------- ZooKeeper


def _zk_admin(server: ZooKeeperServer) -> KazooClient:
    client = KazooClient(hosts=server.hosts, timeout=10.0)
    client.start(timeout=30)
    return client


def _expire_session(server: ZooKeeperServer, reg: Registry) -> None:
    """Expire the registry's session the way ZooKeeper's own tests do: a second client
    attaches to the same session and closes it."""
    assert isinstance(reg, ZooKeeperRegistry)
    session_id, password = reg._client.client_id  # test-only peek at the session
    twin = KazooClient(hosts=server.hosts, client_id=(session_id, password), timeout=10.0)
    twin.start(timeout=30)
    twin.stop()
    twin.close()


@pytest.mark.integration
def test_zk_registry_is_an_ephemeral_json_node(zookeeper_server: ZooKeeperServer,
                                               zk_url: str, tmp_path: Path) -> None:
    s = settings("zk1", "zg", f"sqlite:///{tmp_path / 'a.db'}", locker=zk_url)
    root = zk_url.split("/", 3)[3]
    path = f"/{root}/groups/zg/members/zk1"
    admin = _zk_admin(zookeeper_server)

    async def scenario() -> None:
        reg = open_registry(s)
        assert isinstance(reg, ZooKeeperRegistry) and reg.path == path
        try:
            await reg.announce("slave", None)
            await asyncio.to_thread(poll, lambda: read_cluster(zk_url, None),
                                    lambda v: bool(v) and v[0].slaves == ["zk1"], 10, "slave")
            raw, stat = admin.get(path)
            assert stat.ephemeralOwner != 0, "registry node is not ephemeral"
            data = json.loads(raw)
            assert data["role"] == "slave" and data["services"] == [s.advertise]
            assert data["group"] == "zg" and isinstance(data["pid"], int) and data["host"]
            await reg.announce("master", 12)
            views, took = await asyncio.to_thread(
                poll, lambda: read_cluster(zk_url, "zg"),
                lambda v: bool(v) and v[0].masters == ["zk1"], SLACK, "master")
            assert took < CHANGE_VISIBLE_WITHIN, f"promotion visible after {took:.3f}s"
            assert views[0].services == [s.advertise]
            assert json.loads(admin.get(path)[0])["epoch"] == 12
            await reg.withdraw()
            assert admin.exists(path) is None
        finally:
            await reg.close()

    try:
        asyncio.run(scenario())
    finally:
        admin.stop()
        admin.close()


@pytest.mark.integration
def test_zk_registry_node_returns_after_session_loss(zookeeper_server: ZooKeeperServer,
                                                      zk_url: str, tmp_path: Path) -> None:
    """Session expiry deletes the ephemeral node; the registry puts it back under its new
    session, a master only after ZK_MASTER_REANNOUNCE_GRACE (so that a deposed master
    demotes before it could reappear as master)."""
    s = settings("zk2", "zg2", f"sqlite:///{tmp_path / 'a.db'}", locker=zk_url)
    root = zk_url.split("/", 3)[3]
    path = f"/{root}/groups/zg2/members/zk2"
    admin = _zk_admin(zookeeper_server)

    async def wait_node(timeout: float, gone: bool = False) -> float:
        start = time.monotonic()
        while (admin.exists(path) is None) != gone:
            assert time.monotonic() - start < timeout, f"node {'still there' if gone else 'absent'}"
            await asyncio.sleep(0.01)
        return time.monotonic()

    async def scenario() -> None:
        reg = open_registry(s)
        try:
            await reg.announce("master", 3)
            await wait_node(10)
            owner = admin.exists(path).ephemeralOwner
            await asyncio.to_thread(_expire_session, zookeeper_server, reg)
            gone_at = await wait_node(10, gone=True)
            back_at = await wait_node(ZK_MASTER_REANNOUNCE_GRACE + ZK_CHECK_INTERVAL + SLACK)
            stat = admin.exists(path)
            assert stat.ephemeralOwner not in (0, owner), "not re-created in a new session"
            assert json.loads(admin.get(path)[0])["role"] == "master"
            waited = back_at - gone_at
            print(f"\nmaster entry back {waited:.3f}s after the session expired")
            assert waited >= ZK_MASTER_REANNOUNCE_GRACE - 0.1, "master came back without grace"
            # A slave entry comes back without waiting for any grace.
            await reg.announce("slave", None)
            while json.loads(admin.get(path)[0])["role"] != "slave":
                await asyncio.sleep(0.01)
            await asyncio.to_thread(_expire_session, zookeeper_server, reg)
            gone_at = await wait_node(10, gone=True)
            back_at = await wait_node(ZK_CHECK_INTERVAL + SLACK)
            assert json.loads(admin.get(path)[0])["role"] == "slave"
        finally:
            await reg.close()
        assert admin.exists(path) is None, "close() left the node behind"

    try:
        asyncio.run(scenario())
    finally:
        admin.stop()
        admin.close()


@pytest.mark.integration
def test_discovery_resolves_the_zookeeper_registry(zk_url: str, tmp_path: Path) -> None:
    a = settings("za", "dz", f"sqlite:///{tmp_path / 'a.db'}", locker=zk_url)
    b = settings("zb", "dz", f"sqlite:///{tmp_path / 'a.db'}", locker=zk_url)

    async def scenario() -> None:
        ra, rb = open_registry(a), open_registry(b)
        try:
            await ra.announce("master", 2)
            await rb.announce("slave", None)
            uri = f"discovery:{zk_url}?group=dz"
            deadline = time.monotonic() + 10
            while (got := await asyncio.to_thread(resolve, uri)) != [a.advertise, b.advertise]:
                assert time.monotonic() < deadline, f"resolve gave {got}"
                await asyncio.sleep(0.05)
        finally:
            for r in (ra, rb):
                await r.withdraw()
                await r.close()

    asyncio.run(scenario())
