"""The PostgreSQL locker's lease (lockers/pg_lease.py): a paused holder loses the lock in
bounded time, a busy one does not. Real PostgreSQL, a real holder process."""

from __future__ import annotations

import asyncio
import time

import pytest

from lockers import LockerError, LockLost, LockState, open_locker
from lockers.pg_lease import LEASE_TABLE, PG_LEASE, PG_LEASE_CHECKS, PG_UNLEASED_GRACE_SHARE
from lockers.postgres import PostgresLocker
from tests.helpers.lockers import Holder, StateRecorder, eventually, run
from tests.helpers.servers import PostgresServer
from tests.lockers.test_postgres import _app, _dbname

#: The issue's bound on a paused master's takeover (the lock part of it).
PAUSED_TAKEOVER_LIMIT = 5.0

#: Short lease for the in-process tests, so they take seconds.
SHORT_LEASE = 1.0

#: How long the event loop is kept busy: several leases, far beyond a takeover.
BUSY_LEASES = 4


async def _psql(server: PostgresServer, url: str, query: str) -> str:
    return (await asyncio.to_thread(server.psql, query, _dbname(url))).strip()


def test_paused_holder_is_ended_and_the_slave_takes_over(
    postgres_server: PostgresServer, pg_url: str
) -> None:
    """SIGSTOP the holder process (its kernel keeps its session alive): the waiting slave
    takes over once the lease ran out; on SIGCONT the holder learns it lost the lock."""

    async def main() -> None:
        holder = await Holder.start(pg_url, "g")
        slave = open_locker(pg_url, "g", node="slave")
        try:
            waiting = asyncio.create_task(slave.acquire())
            await eventually(
                lambda: _leased(postgres_server, pg_url, "holder"), 10.0,
                "the holder renews its lease",
            )
            holder.pause()
            paused = time.monotonic()
            await asyncio.wait_for(waiting, PAUSED_TAKEOVER_LIMIT + 5)
            took = time.monotonic() - paused
            print(f"\npostgres lease: takeover {took:.2f} s after SIGSTOP of the holder")
            await slave.keepalive()
            # Not before the lease could have run out (renewed every lease / 3 at most).
            assert took >= PG_LEASE * 2 / 3 - 0.1, took
            assert took <= PAUSED_TAKEOVER_LIMIT, took
            holder.resume()
            assert await holder.said(10.0) == b"LOST"
            assert await asyncio.wait_for(holder.proc.wait(), 10.0) == 3
            await slave.keepalive()  # the woken holder took nothing back
        finally:
            holder.resume()
            await holder.kill()
            await slave.close()

    run(main())


async def _waits_for_the_lock(server: PostgresServer, url: str, node: str) -> bool:
    """``node``'s lock session of group "g" is blocked in pg_advisory_lock right now."""
    out = await _psql(server, url, "SELECT count(*) FROM pg_stat_activity"
                                   f" WHERE application_name = '{_app('g', node)}'"
                                   " AND wait_event_type = 'Lock'")
    return out == "1"


async def _leased(server: PostgresServer, url: str, holder: str) -> bool:
    # The holder creates the lease table itself: until it has, nobody holds a lease
    # (asking the table first would be an error, not a "no").
    if await _psql(server, url, f"SELECT to_regclass('{LEASE_TABLE}') IS NULL") == "t":
        return False
    out = await _psql(server, url, f"SELECT count(*) FROM {LEASE_TABLE} WHERE holder = '{holder}'"
                                   " AND lease_until > clock_timestamp()")
    return out == "1"


def test_busy_event_loop_keeps_the_lease(postgres_server: PostgresServer, pg_url: str) -> None:
    """The lease is renewed from a thread: a master whose event loop is blocked for several
    leases is not taken over, and its lease is always in force by the database clock."""

    async def main() -> None:
        master = open_locker(pg_url, "g", node="master", lease=SHORT_LEASE)
        slave = open_locker(pg_url, "g", node="slave", lease=SHORT_LEASE)
        recorder = StateRecorder()
        master.add_listener(recorder)
        try:
            assert await master.try_acquire()
            waiting = asyncio.create_task(slave.acquire())
            await eventually(lambda: _leased(postgres_server, pg_url, "master"), 10.0,
                             "the master renews its lease")
            await eventually(lambda: _waits_for_the_lock(postgres_server, pg_url, "slave"),
                             10.0, "the slave waits for the lock on the server")
            end = time.monotonic() + SHORT_LEASE * BUSY_LEASES
            spins = 0
            while time.monotonic() < end:  # the loop is blocked: no keepalive, no callbacks
                spins += 1
            assert spins > 0
            await asyncio.sleep(0)
            assert not waiting.done(), "the slave took over from a busy master"
            await master.keepalive()
            assert await _leased(postgres_server, pg_url, "master")
            assert recorder.states == []
            waiting.cancel()
        finally:
            await slave.close()
            await master.close()

    run(main())


def test_holder_without_a_lease_is_ended_after_the_grace(
    postgres_server: PostgresServer, pg_url: str
) -> None:
    """A holder that never writes a lease (paused right after its grant, or a broker with
    lock_lease = 0) is ended once it held the lock for the grace without one."""

    async def main() -> None:
        old = open_locker(pg_url, "g", node="old", lease=0)
        slave = open_locker(pg_url, "g", node="slave", lease=SHORT_LEASE)
        recorder = StateRecorder()
        old.add_listener(recorder)
        try:
            assert await old.try_acquire()
            start = time.monotonic()
            await asyncio.wait_for(slave.acquire(), 15.0)
            took = time.monotonic() - start
            grace = SHORT_LEASE * PG_UNLEASED_GRACE_SHARE
            assert grace <= took <= grace + 2 * SHORT_LEASE / PG_LEASE_CHECKS + 2.0, took
            with pytest.raises(LockLost):
                await old.keepalive()  # its session was ended
            assert recorder.states == [LockState.LOST]
        finally:
            await slave.close()
            await old.close()

    run(main())


@pytest.mark.parametrize("lease", [-1.0, 0.5, float("nan"), float("inf")])
def test_bad_lease_is_refused(lease: float) -> None:
    with pytest.raises(LockerError, match="lease"):
        open_locker("postgresql://u@127.0.0.1/db", "g", node="n", lease=lease)


def test_lease_defaults_and_off() -> None:
    on = open_locker("postgresql://u@127.0.0.1/db", "g", node="n")
    off = open_locker("postgresql://u@127.0.0.1/db", "g", node="n", lease=0)
    assert isinstance(on, PostgresLocker) and isinstance(off, PostgresLocker)
    assert (on.lease, off.lease) == (PG_LEASE, 0)
