"""The ZooKeeper plumbing the locker and the registry share (lockers/connections/zookeeper.py),
and the bounded, cancellable lock wait composed of kazoo's public API."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from amqlite.registry import RegistryError, zk_target
from lockers import LockerError, open_locker
from lockers.connections import zookeeper as zk_connect
from lockers.zookeeper import ZK_CANCEL_GRACE, ZK_WAIT_SLICE, ZooKeeperLocker
from tests.helpers.lockers import eventually, run
from tests.helpers.servers import ZooKeeperServer

#: Slack on top of the bounds under test, for a loaded two-core machine.
MARGIN = 5.0

_counter = iter(range(1_000_000))


@pytest.mark.parametrize(
    ("url", "hosts", "root"),
    [
        ("zk://zk1", f"zk1:{zk_connect.ZK_DEFAULT_PORT}", zk_connect.ZK_DEFAULT_ROOT),
        ("ZK://zk1:2182/", "zk1:2182", zk_connect.ZK_DEFAULT_ROOT),
        ("zk://zk1:2181, zk2:02182/a/b-c.d", "zk1:2181,zk2:2182", "/a/b-c.d"),
    ],
)
def test_parse_zk_url(url: str, hosts: str, root: str) -> None:
    assert zk_connect.is_zk_url(url)
    assert zk_connect.parse_zk_url(url) == zk_connect.ZkTarget(hosts, root)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://zk1:2181", "not a ZooKeeper URL"),
        ("zk:///root", "not a ZooKeeper URL"),
        ("zk://zk1:2181/r?x=1", "no query or fragment"),
        ("zk://u:p@zk1:2181", "user info"),
        ("zk://zk1:0", "bad host:port"),
        ("zk://zk1:2181,:2181", "bad host:port"),
        ("zk://zk1/a//b", "bad root path"),
    ],
)
def test_one_parser_one_verdict_for_locker_and_registry(url: str, message: str) -> None:
    """The locker and the registry read a zk:// URL alike; each names its own URL."""
    with pytest.raises(zk_connect.ZkUrlError, match=message):
        zk_connect.parse_zk_url(url)
    with pytest.raises(RegistryError, match=f"^zk:// URL: .*{message}"):
        zk_target(url)
    if zk_connect.is_zk_url(url):
        with pytest.raises(LockerError, match=f"^zk:// locker URL: .*{message}"):
            open_locker(url, "g")


def test_stop_zk_client_from_two_threads_ends_the_session_once(
    zookeeper_server: ZooKeeperServer,
) -> None:
    path = f"/plumbing{next(_counter)}/node"
    client, admin = (zk_connect.new_zk_client(zookeeper_server.hosts, 10.0) for _ in range(2))
    client.start(timeout=30)
    admin.start(timeout=30)
    client.create(path, b"x", ephemeral=True, makepath=True)
    errors: list[BaseException] = []

    def stop() -> None:
        try:
            zk_connect.stop_zk_client(client)
        except BaseException as e:  # collected and asserted below
            errors.append(e)

    threads = [threading.Thread(target=stop) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    try:
        assert admin.exists(path) is None  # the session, and its node, are gone
    finally:
        zk_connect.stop_zk_client(admin)
    zk_connect.stop_zk_client(client)  # idempotent


def _lock_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "amqlite-zk-lock"}


def test_wait_cancelled_during_an_outage_ends_its_thread(
    zookeeper_server: ZooKeeperServer,
) -> None:
    """kazoo's Lock ignores cancel() while disconnected; sliced waits bound that."""

    async def main() -> None:
        url = f"zk://{zookeeper_server.hosts}/plumbing{next(_counter)}"
        a, b = open_locker(url, "g", node="a"), open_locker(url, "g", node="b")
        assert isinstance(a, ZooKeeperLocker) and isinstance(b, ZooKeeperLocker)
        assert await a.try_acquire()
        before = _lock_threads()
        waiting = asyncio.create_task(b.acquire())
        mine = await eventually(lambda: _lock_threads() - before, 10.0, "b's wait started")
        try:
            await asyncio.to_thread(zookeeper_server.stop)
            waiting.cancel()
            start = time.monotonic()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(waiting, ZK_CANCEL_GRACE + MARGIN)
            await eventually(
                lambda: not any(t.is_alive() for t in mine),
                ZK_WAIT_SLICE + MARGIN,
                "the cancelled wait's thread ended",
            )
            print(f"\nzookeeper: cancelled wait's thread ended "
                  f"{time.monotonic() - start:.2f} s after the cancel, during an outage")
        finally:
            await asyncio.to_thread(zookeeper_server.start)
        await a.close()
        await b.close()

    run(main())
