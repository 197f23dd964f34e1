"""One rule for "the group's master" (registry.current_master): cluster-list's view, the
management API's 503 hint, the management CLI's --group target and discovery URIs all
pick the same entry, and a stale entry (late heartbeat, or superseded epoch) is nobody's
master."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from amqlite.client.discovery import order_services
from amqlite.management.view import NodeView
from amqlite.registry import STALE_AFTER_MS, Member, current_master, group_views
from amqlite.settings import Settings
from cli.mgmt_cmds import Target


def _now() -> int:
    return int(time.time() * 1000)


def _members(now: int) -> list[Member]:
    """A crashed master of the highest epoch whose row has not expired yet (heartbeat
    late), the live master, a deposed master of a lower epoch, and a slave."""
    return [
        Member("g", "crashed", "master", ("tcp://h:1",), epoch=9, http="http://h:8001",
               heartbeat_at=now - STALE_AFTER_MS - 500),
        Member("g", "live", "master", ("tcp://h:2",), epoch=7, http="http://h:8002",
               heartbeat_at=now),
        Member("g", "deposed", "master", ("tcp://h:3",), epoch=5, http="http://h:8003",
               heartbeat_at=now),
        Member("g", "s", "slave", ("tcp://h:4",), http="http://h:8004", heartbeat_at=now),
    ]


def test_current_master_is_group_views_first_master() -> None:
    now = _now()
    members = _members(now)
    master = current_master(members, now_ms=now)
    assert master is not None and master.name == "live"
    view = group_views(members, now_ms=now)[0]
    assert view.masters == ["live"] and view.stale == ["crashed", "deposed"]
    assert current_master([m for m in members if m.role != "master"], now_ms=now) is None


def test_cli_target_goes_to_the_live_master() -> None:
    now = _now()

    class Registered(Target):
        def members(self) -> list[Member]:
            return _members(now)

    t = Registered(None, "g", None, None, None)
    assert t.master_url() == "http://h:8002"


def test_cli_target_without_a_live_master_is_one_line_exit_1(
        capsys: pytest.CaptureFixture[str]) -> None:
    stale_only = _members(_now())[:1]

    class Registered(Target):
        def members(self) -> list[Member]:
            return stale_only

    with pytest.raises(SystemExit) as info:
        Registered(None, "g", None, None, None).master_url()
    assert info.value.code == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no master registered in group g" in err


def test_management_api_names_the_live_master(tmp_path: Path) -> None:
    settings = Settings(name="s", group="g", data_dir=str(tmp_path)).resolved()
    view = NodeView(SimpleNamespace(settings=settings))  # type: ignore[arg-type]
    view._group, view._group_at = _members(_now()), time.monotonic()
    master = asyncio.run(view.master())
    assert master is not None and master["name"] == "live"
    assert master["http"] == "http://h:8002"
    view.reader.close()


def test_discovery_tries_the_live_master_first() -> None:
    assert order_services(_members(_now()))[0] == "tcp://h:2"
