"""Issue 22: what a PostgreSQL store's replication means for the RECEIPT promise
(store/replication.py), and what a node does about it (amqlite/replication.py): refuse
asynchronous replication unless allow_async_replication accepts it, name a missing
synchronous standby, and end a master's term when a periodic read finds a state an
activation would refuse. No server here: the states are made by hand."""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

import pytest

from amqlite import replication as monitor_mod
from amqlite.replication import ReplicationMonitor
from amqlite.settings import Settings
from cli.cluster_cmds import replication_notes
from store import StoreError, StoreUnusable
from store.replication import ReplicationState, Standby, parse_sync_rule


def state(names: str = "", *standbys: Standby, commit: str = "on",
          recovery: bool = False) -> ReplicationState:
    return ReplicationState(recovery, names, commit, tuple(standbys))


SYNC = Standby("standby1", "streaming", "sync")
ASYNC = Standby("standby2", "streaming", "async")
HIDDEN = Standby("standby1", None, None)  # a role without pg_read_all_stats


@pytest.mark.parametrize(("setting", "method", "count", "names"), [
    ("standby1", "FIRST", 1, ("standby1",)),
    ("*", "FIRST", 1, ("*",)),
    ("a, b", "FIRST", 1, ("a", "b")),
    ("2 (a, b, c)", "FIRST", 2, ("a", "b", "c")),
    ("FIRST 1 (a, \"B c\")", "FIRST", 1, ("a", "B c")),
    ("any 2 (a,b,c)", "ANY", 2, ("a", "b", "c")),
])
def test_synchronous_standby_names_grammar(setting: str, method: str, count: int,
                                           names: tuple[str, ...]) -> None:
    rule = parse_sync_rule(setting)
    assert rule is not None and (rule.method, rule.count, rule.names) == (method, count, names)
    assert parse_sync_rule("  ") is None


def test_names_match_case_insensitively_and_star_matches_any() -> None:
    rule = parse_sync_rule('"Standby1"')
    assert rule is not None and rule.matches("standby1") and not rule.matches("standby2")
    star = parse_sync_rule("*")
    assert star is not None and star.matches("anything")


def test_no_replica_is_safe_and_says_so() -> None:
    s = state()
    assert s.unsafe is None and s.waiting is None and s.synchronous == []
    assert s.summary.startswith("no replication")


def test_a_replica_without_synchronous_standby_names_is_unsafe() -> None:
    s = state("", ASYNC)
    assert s.unsafe is not None and s.unsafe.startswith(
        "asynchronous replication: 1 standby connected (standby2), none synchronous")
    assert s.summary.startswith("asynchronous replication only")


def test_a_weak_synchronous_commit_is_unsafe() -> None:
    for level in ("off", "local", "remote_write"):
        s = state("standby1", SYNC, commit=level)
        assert s.unsafe is not None and f"synchronous_commit = {level}" in s.unsafe
    for level in ("on", "remote_apply"):
        assert state("standby1", SYNC, commit=level).unsafe is None


def test_a_connected_synchronous_standby_is_named() -> None:
    s = state("standby1", SYNC, ASYNC)
    assert s.unsafe is None and s.waiting is None and s.synchronous == ["standby1"]
    assert s.summary.startswith("synchronous standby standby1 connected; "
                                "synchronous_standby_names = 'standby1'")
    assert "standby1 (sync, streaming), standby2 (async, streaming)" in s.summary


def test_a_missing_synchronous_standby_makes_commits_wait() -> None:
    s = state("standby1", ASYNC)
    assert s.unsafe is None  # commits wait: nothing is RECEIPTed that is not replicated
    assert s.waiting is not None and "asks for 1 synchronous standby, 0 connected" in s.waiting
    assert s.summary.startswith("no synchronous standby connected")
    quorum = state("ANY 2 (a, b)", Standby("a", "streaming", "quorum"))
    assert quorum.waiting is not None and "asks for 2 synchronous standbys, 1" in quorum.waiting


def test_hidden_sync_state_is_inferred_from_the_names() -> None:
    s = state("standby1", HIDDEN, Standby("other", None, None))
    assert s.hidden and s.synchronous == ["standby1"] and s.waiting is None
    assert "inferred from the names; GRANT pg_read_all_stats" in s.summary


# -- the node's monitor -------------------------------------------------------------------


class FakeStore:
    dialect = "postgresql"
    description = "postgresql+psycopg://amq@db/amq"
    group = "g"
    engine: Any = None


def monitor(monkeypatch: pytest.MonkeyPatch, states: list[ReplicationState | Exception],
            **settings: Any) -> ReplicationMonitor:
    """A monitor whose reads return ``states`` one after the other (the last repeats)."""
    m = ReplicationMonitor(Settings(**settings), FakeStore())

    def read(_engine: Any, _description: str) -> ReplicationState:
        item = states.pop(0) if len(states) > 1 else states[0]
        if isinstance(item, Exception):
            raise item
        return item

    monkeypatch.setattr(monitor_mod, "read_replication", read)
    return m


def test_sqlite_has_nothing_to_check() -> None:
    class Sqlite:
        dialect = "sqlite"

    m = ReplicationMonitor(Settings(), Sqlite())
    asyncio.run(m.check("start"))
    assert m.state is None and m.to_json() is None and m.warning is None


def test_asynchronous_replication_is_refused_unless_accepted(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    m = monitor(monkeypatch, [state("", ASYNC)])
    with pytest.raises(StoreUnusable, match=r"asynchronous replication.*set "
                                            r"allow_async_replication = true$"):
        asyncio.run(m.check("start"))
    accepted = monitor(monkeypatch, [state("", ASYNC)], allow_async_replication=True)
    with caplog.at_level(logging.WARNING, "amqlite.node"):
        asyncio.run(accepted.check("activation"))
    assert "serving anyway (allow_async_replication)" in caplog.text
    assert accepted.warning is not None and accepted.warning.endswith(
        "(accepted by allow_async_replication)")
    shown = accepted.to_json()
    assert shown is not None and shown["accepted"] and shown["unsafe"]


def test_a_standby_server_is_refused_whatever_the_settings(
        monkeypatch: pytest.MonkeyPatch) -> None:
    m = monitor(monkeypatch, [state(recovery=True)], allow_async_replication=True)
    with pytest.raises(StoreUnusable, match=r"in recovery.*target_session_attrs=read-write"):
        asyncio.run(m.check("start"))


def test_an_unreadable_state_stops_a_start_but_not_an_activation(
        monkeypatch: pytest.MonkeyPatch) -> None:
    m = monitor(monkeypatch, [StoreError("gone")])
    with pytest.raises(StoreError, match="gone"):
        asyncio.run(m.check("start"))
    asyncio.run(m.check("activation"))  # the claim that follows will say what is wrong


class FakeCommitter:
    busy_since: float | None = None


def test_a_master_whose_store_turns_asynchronous_is_demoted(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(monitor_mod, "REPLICATION_CHECK_INTERVAL", 0.0)
    monkeypatch.setattr(monitor_mod, "STALL_POLL", 0.0)
    m = monitor(monkeypatch, [state("standby1", SYNC), state("", ASYNC)])
    asyncio.run(m.check("activation"))
    reasons: list[str] = []
    asyncio.run(asyncio.wait_for(m.watch(FakeCommitter(), reasons.append), 5))
    assert len(reasons) == 1 and reasons[0].startswith(
        "store replication: asynchronous replication"), reasons


def test_a_stuck_commit_is_diagnosed_once_then_cleared(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    m = monitor(monkeypatch, [state("standby1")])
    monkeypatch.setattr(monitor_mod, "sync_rep_waiters", lambda *_: 2)
    committer = FakeCommitter()
    now = monitor_mod.time.monotonic()
    committer.busy_since = now - monitor_mod.SLOW_COMMIT - 1
    with caplog.at_level(logging.INFO, "amqlite.node"):
        asyncio.run(m._look_at_commit(committer))
        asyncio.run(m._look_at_commit(committer))  # within STALL_REMIND: said once
        assert m.stall is not None and "2 store session(s) wait on SyncRep" in m.stall
        assert "synchronous_standby_names = 'standby1', connected standbys: none" in m.stall
        assert m.warning == m.stall
        committer.busy_since = None
        asyncio.run(m._look_at_commit(committer))
    assert caplog.text.count("for a synchronous standby") == 1
    assert "the group commit went through" in caplog.text and m.stall is None


def test_a_slow_commit_without_sync_rep_waiters_blames_the_database(
        monkeypatch: pytest.MonkeyPatch) -> None:
    m = monitor(monkeypatch, [state()])
    monkeypatch.setattr(monitor_mod, "sync_rep_waiters", lambda *_: 0)
    assert "the database is slow or out of reach" in asyncio.run(m.diagnose(4.0))


def test_cluster_list_notes_name_what_the_master_read() -> None:
    from amqlite.registry import GroupView

    views = [GroupView("orders", ["b1"], [], [], registry="postgresql://db/amq"),
             GroupView("other", ["c1"], [], [], registry="sqlite:////x.db")]
    replication: dict[str, dict[str, Any] | None] = {
        "orderspostgresql://db/amq": {"summary": "synchronous standby s1 connected",
                                      "waiting": None, "commit_waiting": None},
        "othersqlite:////x.db": None}
    assert replication_notes(views, replication) == [
        "[replication] orders (master b1): synchronous standby s1 connected"]


def test_allow_async_replication_is_a_setting_that_applies_to_postgresql_only(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from amqlite.settings import read_settings

    for name in [n for n in os.environ if n.startswith("AMQLITE_")]:
        monkeypatch.delenv(name)
    settings, warnings = read_settings({"allow_async_replication": "true"}, environ={})
    assert settings.allow_async_replication is True
    assert warnings == ["allow_async_replication (--allow-async-replication) does not apply "
                        "and is ignored: only a PostgreSQL store's replication is checked, the "
                        "store is sqlite://"]
    pg = "postgresql://amq@db/amq"
    assert read_settings({"allow_async_replication": "true", "store": pg},
                         environ={})[1] == []
    assert Settings().allow_async_replication is False
