"""open_locker: URL forms, clear one-line errors, no secrets in descriptions."""

from __future__ import annotations

import pytest

from lockers import Locker, LockerError, open_locker
from lockers.file import FileLocker
from lockers.postgres import (
    PG_DEAD_PEER_TIMEOUT,
    PostgresLocker,
    advisory_key,
    key_parts,
    tcp_settings,
)
from lockers.zookeeper import ZK_DEFAULT_ROOT, ZooKeeperLocker


@pytest.mark.parametrize(
    ("url", "kind"),
    [
        ("file:///var/lib/amqlite/amqlite.lock", FileLocker),
        ("postgresql://amq@db.example:5433/amq", PostgresLocker),
        ("postgres://amq@db.example/amq", PostgresLocker),
        ("postgresql+psycopg://amq@db.example/amq", PostgresLocker),
        ("postgresql+psycopg2://amq@db.example/amq", PostgresLocker),
        ("zk://zk1:2181,zk2:2181/amq", ZooKeeperLocker),
        ("zk://zk1:2181", ZooKeeperLocker),
    ],
)
def test_url_picks_backend(url: str, kind: type[Locker]) -> None:
    assert isinstance(open_locker(url, "default"), kind)


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("", "locker URL must look like"),
        ("amqlite.lock", "locker URL must look like"),
        ("http://x/y", "unsupported locker URL scheme"),
        ("file://otherhost/x.lock", "only local files"),
        ("file:///var/lib/amqlite/", "absolute path"),
        ("file://relative.lock", "only local files"),
        ("zk://zk1:notaport/amq", "bad host:port"),
        ("zk://user:pw@zk1:2181/amq", "user info"),
        ("zk://zk1:2181/a//b", "bad root path"),
        ("postgresql://h/db?nosuchparam=1", "bad PostgreSQL URL"),
        ("postgresql://u:p%zzs3cr3t@h/db", "bad PostgreSQL URL"),
        ("postgresql://h/db?keepalives_idle=soon", "whole numbers"),
    ],
)
def test_bad_url_is_one_clear_line(url: str, needle: str) -> None:
    with pytest.raises(LockerError) as info:
        open_locker(url, "default")
    message = str(info.value)
    assert needle in message
    assert "\n" not in message
    assert "s3cr3t" not in message  # libpq quotes the bad token: it may be the password


@pytest.mark.parametrize("group", ["", "a/b", "..", "-x", "x" * 101, "spa ce"])
def test_bad_group_name(group: str) -> None:
    with pytest.raises(LockerError, match="bad group name"):
        open_locker("file:///tmp/x.lock", group)


@pytest.mark.parametrize("value", [0, -1.0, float("nan"), "2"])
def test_bad_timeouts(value: object) -> None:
    with pytest.raises(LockerError, match="session_timeout"):
        open_locker("zk://zk1:2181", "g", session_timeout=value)  # type: ignore[arg-type]
    with pytest.raises(LockerError, match="keepalive_interval"):
        open_locker("zk://zk1:2181", "g", keepalive_interval=value)  # type: ignore[arg-type]


def test_description_has_no_password() -> None:
    locker = open_locker(
        "postgresql+psycopg://amq:s3cr3t@db.example:5433/amq?password=0ther", "default"
    )
    assert "s3cr3t" not in locker.description
    assert "0ther" not in locker.description
    assert "amq@db.example:5433/amq" in locker.description


def test_settings_reach_the_locker() -> None:
    zk = open_locker("zk://zk1:2181", "g", session_timeout=3, keepalive_interval=0.25)
    assert isinstance(zk, ZooKeeperLocker)
    assert zk.session_timeout == 3.0
    assert zk.keepalive_interval == 0.25
    assert zk.lock_path == f"{ZK_DEFAULT_ROOT}/groups/g/lock"
    pg = open_locker("postgresql://h/db", "g", session_timeout=10, keepalive_interval=0.5)
    assert isinstance(pg, PostgresLocker)
    assert pg.dead_peer_timeout == PG_DEAD_PEER_TIMEOUT  # a ZooKeeper setting: not for TCP
    assert pg.keepalive_interval == 0.5


def test_advisory_key_is_stable_and_signed_64_bit() -> None:
    # A fixed value: every broker of a group, on any host and Python, must agree.
    assert advisory_key("default") == advisory_key("default")
    assert advisory_key("default") != advisory_key("default2")
    keys = [advisory_key(f"g{i}") for i in range(200)]
    assert all(-(2**63) <= k < 2**63 for k in keys)
    assert any(k < 0 for k in keys) and any(k > 0 for k in keys)
    assert key_parts(-5) == (0xFFFF_FFFF, 0xFFFF_FFFB)
    assert key_parts(5) == (0, 5)


def test_tcp_settings_notice_a_dead_peer_within_the_timeout() -> None:
    s = tcp_settings(5.0)
    assert s["keepalives"] == 1
    assert s["keepalives_idle"] + s["keepalives_interval"] * s["keepalives_count"] <= 5
    assert s["tcp_user_timeout"] == 5000
