"""The advisory-lock locker against a real PostgreSQL and real processes."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from urllib.parse import urlsplit

import pytest

from lockers import LockerError, LockLost, LockState, open_locker
from lockers.pg_lease import LEASE_TABLE_LOCK
from lockers.postgres import (
    APPLICATION_NAME_PREFIX,
    PG_CALL_TIMEOUT,
    PG_CANCEL_GRACE,
    PostgresLocker,
    advisory_key,
    key_parts,
    tcp_settings,
)
from tests.helpers.lockers import Holder, StateRecorder, cancel_wait_around_release, eventually, run
from tests.helpers.servers import PostgresServer

#: Takeover target after a release or a crash: the slave waits on the server.
TAKEOVER_LIMIT = 1.0

#: Rounds of the cancel-versus-grant race: enough to hit both outcomes.
RACE_ROUNDS = 40

#: A restarted PostgreSQL plus the slave's reconnect backoff (capped at 2 s).
RESTART_TAKEOVER_LIMIT = 30.0


def _dbname(url: str) -> str:
    return urlsplit(url).path.lstrip("/")


async def advisory_rows(server: PostgresServer, url: str) -> list[tuple[str, bool, int, int]]:
    """(application_name, granted, classid, objid) of every advisory lock in the test database
    but the lease table's creation lock, which a lease connection holds for a moment
    when it first makes the table (a two-int key: objsubid 2)."""
    key1, key2 = LEASE_TABLE_LOCK
    out = await asyncio.to_thread(
        server.psql,
        "SELECT a.application_name, l.granted, l.classid::bigint, l.objid::bigint"
        " FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
        " WHERE l.locktype = 'advisory' AND l.database ="
        " (SELECT oid FROM pg_database WHERE datname = current_database())"
        f" AND NOT (l.objsubid = 2 AND l.classid = {key1} AND l.objid = {key2})"
        " ORDER BY 1",
        _dbname(url),
    )
    rows = []
    for line in out.splitlines():
        name, granted, classid, objid = line.split("|")
        rows.append((name, granted == "t", int(classid), int(objid)))
    return rows


def _app(group: str, node: str) -> str:
    return f"{APPLICATION_NAME_PREFIX}:{group}:{node}"


def test_second_contender_waits_on_the_server_and_takes_over_on_release(
    postgres_server: PostgresServer, pg_url: str
) -> None:
    async def main() -> None:
        a = open_locker(pg_url, "g", node="a")
        b = open_locker(pg_url, "g", node="b")
        assert await a.try_acquire()
        assert not await b.try_acquire()
        waiting = asyncio.create_task(b.acquire())
        # b waits inside PostgreSQL (a lock request that is not granted), not in a poll loop.
        await eventually(
            lambda: _has(advisory_rows(postgres_server, pg_url), (_app("g", "b"), False)),
            10.0, "b waits on the server",
        )
        start = time.monotonic()
        await a.release()
        await asyncio.wait_for(waiting, TAKEOVER_LIMIT)
        took = time.monotonic() - start
        print(f"\npostgres: takeover after release {took * 1000:.0f} ms")
        await b.keepalive()
        with pytest.raises(LockLost):
            await a.keepalive()
        await a.close()
        await b.close()

    run(main())


async def _has(rows_coro, wanted: tuple[str, bool]) -> bool:
    return any((r[0], r[1]) == wanted for r in await rows_coro)


def test_try_acquire_twice_does_not_stack(postgres_server: PostgresServer, pg_url: str) -> None:
    async def main() -> None:
        a = open_locker(pg_url, "g", node="a")
        assert await a.try_acquire()
        assert await a.try_acquire()
        assert [(r[0], r[1]) for r in await advisory_rows(postgres_server, pg_url)] == [
            (_app("g", "a"), True)
        ]
        await a.release()
        # A stacked lock would still be listed after one release.
        assert await advisory_rows(postgres_server, pg_url) == []
        await a.close()

    run(main())


def test_keepalive_finds_keys_of_either_sign_in_pg_locks(
    postgres_server: PostgresServer, pg_url: str
) -> None:
    groups = [f"g{i}" for i in range(50)]
    negative = next(g for g in groups if advisory_key(g) < 0)
    positive = next(g for g in groups if advisory_key(g) > 0)

    async def main() -> None:
        for group in (negative, positive):
            locker = open_locker(pg_url, group, node="n")
            assert await locker.try_acquire()
            await locker.keepalive()  # finds the lock by classid/objid
            rows = await advisory_rows(postgres_server, pg_url)
            assert [(r[2], r[3]) for r in rows] == [key_parts(advisory_key(group))]
            await locker.close()

    run(main())


def test_killed_holder_process_is_replaced_at_once(
    postgres_server: PostgresServer, pg_url: str
) -> None:
    async def main() -> None:
        holder = await Holder.start(pg_url, "g")
        contender = open_locker(pg_url, "g", node="slave")
        try:
            waiting = asyncio.create_task(contender.acquire())
            await eventually(
                lambda: _has(advisory_rows(postgres_server, pg_url), (_app("g", "slave"), False)),
                10.0, "the slave waits on the server",
            )
            start = time.monotonic()
            await holder.kill()
            await asyncio.wait_for(waiting, TAKEOVER_LIMIT)
            took = time.monotonic() - start
            print(f"\npostgres: takeover after SIGKILL of the holder {took * 1000:.0f} ms")
            await contender.keepalive()
        finally:
            await holder.kill()
            await contender.close()

    run(main())


def test_cancelled_acquire_cancels_the_server_side_wait(
    postgres_server: PostgresServer, pg_url: str
) -> None:
    async def main() -> None:
        a = open_locker(pg_url, "g", node="a")
        b = open_locker(pg_url, "g", node="b")
        assert await a.try_acquire()
        waiting = asyncio.create_task(b.acquire())
        await eventually(
            lambda: _has(advisory_rows(postgres_server, pg_url), (_app("g", "b"), False)),
            10.0, "b waits on the server",
        )
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        # The server-side wait is gone at once, not at the end of its slice.
        assert [(r[0], r[1]) for r in await advisory_rows(postgres_server, pg_url)] == [
            (_app("g", "a"), True)
        ]
        await a.release()
        assert await advisory_rows(postgres_server, pg_url) == []
        # b is still usable, and takes the lock exactly once.
        assert await b.try_acquire()
        await b.release()
        assert await advisory_rows(postgres_server, pg_url) == []
        await a.close()
        await b.close()

    run(main())


def test_slave_waits_in_slices_bounded_by_lock_timeout(
    postgres_server: PostgresServer, pg_url: str
) -> None:
    async def main() -> None:
        a = open_locker(pg_url, "g", node="a")
        b = PostgresLocker(pg_url, "g", node="b", wait_slice=0.2)
        assert await a.try_acquire()
        waiting = asyncio.create_task(b.acquire())
        sql = (
            "SELECT query_start FROM pg_stat_activity WHERE datname = current_database()"
            f" AND application_name = '{_app('g', 'b')}' AND wait_event_type = 'Lock'"
        )
        first = await eventually(
            lambda: asyncio.to_thread(postgres_server.psql, sql, _dbname(pg_url)),
            10.0, "b waits on the server",
        )
        # A new wait began: lock_timeout ended the previous one and the slave went on.
        await eventually(
            lambda: _new_wait(postgres_server, sql, pg_url, first), 10.0, "a second slice"
        )
        assert not waiting.done()
        start = time.monotonic()
        await a.release()
        await asyncio.wait_for(waiting, TAKEOVER_LIMIT)
        print(f"\npostgres: takeover while waiting in slices {time.monotonic() - start:.3f} s")
        await a.close()
        await b.close()

    run(main())


async def _new_wait(server: PostgresServer, sql: str, url: str, first: str) -> bool:
    now = await asyncio.to_thread(server.psql, sql, _dbname(url))
    return bool(now) and now != first


def test_terminated_lock_session_is_a_lost_lock(
    postgres_server: PostgresServer, pg_url: str
) -> None:
    async def main() -> None:
        a = open_locker(pg_url, "g", node="a")
        recorder = StateRecorder()
        a.add_listener(recorder)
        assert await a.try_acquire()
        await a.keepalive()
        killed = await asyncio.to_thread(
            postgres_server.psql,
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            f" WHERE datname = current_database() AND application_name = '{_app('g', 'a')}'",
            _dbname(pg_url),
        )
        assert killed == "1"
        with pytest.raises(LockLost):
            await a.keepalive()
        assert recorder.states == [LockState.LOST]
        b = open_locker(pg_url, "g", node="b")
        assert await b.try_acquire()
        with pytest.raises(LockLost):  # and it stays lost: no silent re-take
            await a.keepalive()
        await a.close()
        await b.close()

    run(main())


def test_unreachable_server(postgres_server: PostgresServer) -> None:
    async def main() -> None:
        postgres_server_down = "postgresql://postgres@127.0.0.1:1/postgres"
        locker = open_locker(postgres_server_down, "g")
        with pytest.raises(LockerError) as info:
            await locker.try_acquire()
        assert "cannot connect" in str(info.value)
        # A slave keeps trying; it stays cancellable meanwhile.
        waiting = asyncio.create_task(locker.acquire())
        done, _ = await asyncio.wait({waiting}, timeout=0.5)
        assert not done
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await locker.close()

    run(main())


def test_database_restart_loses_the_lock_and_the_slave_takes_over(
    postgres_server: PostgresServer, pg_url: str
) -> None:
    async def main() -> None:
        a = open_locker(pg_url, "g", node="a")
        b = open_locker(pg_url, "g", node="b")
        recorder = StateRecorder()
        a.add_listener(recorder)
        assert await a.try_acquire()
        waiting = asyncio.create_task(b.acquire())
        await eventually(
            lambda: _has(advisory_rows(postgres_server, pg_url), (_app("g", "b"), False)),
            10.0, "b waits on the server",
        )
        await asyncio.to_thread(postgres_server.restart)
        restarted = time.monotonic()
        with pytest.raises(LockLost):
            await a.keepalive()
        assert recorder.states == [LockState.LOST]
        await asyncio.wait_for(waiting, RESTART_TAKEOVER_LIMIT)
        print(
            f"\npostgres: slave took over {time.monotonic() - restarted:.2f} s"
            " after the server was back"
        )
        await b.keepalive()
        rows = await advisory_rows(postgres_server, pg_url)
        assert [(r[0], r[1]) for r in rows] == [(_app("g", "b"), True)]
        await a.close()
        await b.close()

    run(main())


def test_lock_session_has_tcp_settings_on_both_sides(pg_url: str) -> None:
    async def main() -> None:
        a = PostgresLocker(pg_url, "g", node="a", dead_peer_timeout=5)
        assert await a.try_acquire()
        session = a._session  # white box: what libpq and the server were told
        assert session is not None
        conn = session.conn
        wanted = tcp_settings(5)
        client = conn.info.get_parameters()
        for name in ("keepalives", "keepalives_idle", "keepalives_interval",
                     "keepalives_count", "tcp_user_timeout", "connect_timeout"):
            assert client[name] == str(wanted[name]), name

        def server_side() -> dict[str, str]:
            names = ("tcp_keepalives_idle", "tcp_keepalives_interval",
                     "tcp_keepalives_count", "tcp_user_timeout")
            return {n: conn.execute(f"SHOW {n}").fetchone()[0] for n in names}

        shown = await asyncio.to_thread(server_side)
        assert shown == {
            "tcp_keepalives_idle": str(wanted["keepalives_idle"]),
            "tcp_keepalives_interval": str(wanted["keepalives_interval"]),
            "tcp_keepalives_count": str(wanted["keepalives_count"]),
            "tcp_user_timeout": str(wanted["tcp_user_timeout"]),  # SHOW gives the socket's ms
        }
        await a.close()

    run(main())


def test_stalled_lock_session_is_a_lost_lock(
    postgres_server: PostgresServer, pg_url: str
) -> None:
    """A backend that stops answering (TCP still up) must not keep a master waiting."""

    async def main() -> None:
        a = open_locker(pg_url, "g", node="a")
        recorder = StateRecorder()
        a.add_listener(recorder)
        assert await a.try_acquire()
        pid = int(
            await asyncio.to_thread(
                postgres_server.psql,
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                f" AND application_name = '{_app('g', 'a')}'",
                _dbname(pg_url),
            )
        )
        os.kill(pid, signal.SIGSTOP)
        try:
            start = time.monotonic()
            with pytest.raises(LockLost):
                await a.keepalive()
            took = time.monotonic() - start
            print(f"\npostgres: stalled lock session noticed in {took:.2f} s")
            assert took < PG_CALL_TIMEOUT + 2.0
            assert recorder.states == [LockState.LOST]
        finally:
            os.kill(pid, signal.SIGCONT)
        # The abandoned session is closed, so its lock goes with it.
        b = open_locker(pg_url, "g", node="b")
        await asyncio.wait_for(b.acquire(), 10.0)
        await a.close()
        await b.close()

    run(main())


def test_cancel_racing_a_grant_never_leaves_or_stacks_a_lock(
    postgres_server: PostgresServer, pg_url: str
) -> None:
    """Cancel the slave's wait at varied moments around the master's release."""
    rng = random.Random(20_26)  # fixed seed: the same interleavings on every run

    async def main() -> None:
        a = open_locker(pg_url, "g", node="a")
        b = open_locker(pg_url, "g", node="b")
        outcomes = {"took it": 0, "cancelled": 0}
        for _ in range(RACE_ROUNDS):
            assert await a.try_acquire()
            took = await cancel_wait_around_release(a, b, rng, 0.01)
            outcomes["took it" if took else "cancelled"] += 1
            rows = [(r[0], r[1]) for r in await advisory_rows(postgres_server, pg_url)]
            if took:
                assert rows == [(_app("g", "b"), True)]
                await b.keepalive()
                await b.release()
            else:
                assert rows == []
            assert await advisory_rows(postgres_server, pg_url) == []
        print(f"\npostgres: cancel races {outcomes}")
        await a.close()
        await b.close()

    run(main())



def test_close_interrupts_a_waiting_slave(postgres_server: PostgresServer, pg_url: str) -> None:
    async def main() -> None:
        a = open_locker(pg_url, "g", node="a")
        b = open_locker(pg_url, "g", node="b")
        assert await a.try_acquire()
        waiting = asyncio.create_task(b.acquire())
        await eventually(
            lambda: _has(advisory_rows(postgres_server, pg_url), (_app("g", "b"), False)),
            10.0, "b waits on the server",
        )
        start = time.monotonic()
        await b.close()
        took = time.monotonic() - start
        with pytest.raises(LockerError, match="closed"):
            await waiting
        # Not the rest of a 10 s wait slice.
        assert took < PG_CANCEL_GRACE, took
        await a.release()
        await eventually(
            lambda: _empty(advisory_rows(postgres_server, pg_url)), 10.0, "no lock left"
        )
        assert not await _can_try(b)
        await a.close()

    run(main())


async def _empty(rows_coro) -> bool:
    return await rows_coro == []


async def _can_try(locker) -> bool:
    try:
        return await locker.try_acquire()
    except LockerError:
        return False
