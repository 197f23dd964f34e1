"""The PostgreSQL locker's keepalive proves the lease too (issue 22): a holder whose lease ran
out by its own clock (a pause no slave has acted on yet) is not told "still yours" because
its session still shows the lock in pg_locks; it gives the lock up at once."""

from __future__ import annotations

import asyncio
import time

from lockers import LockLost, LockState, open_locker
from lockers.postgres import PostgresLocker
from tests.helpers.lockers import StateRecorder, eventually, run

#: Short lease, so the test waits about a second for it to run out.
SHORT_LEASE = 1.0


def test_keepalive_refuses_a_lease_that_ran_out(pg_url: str) -> None:
    async def main() -> None:
        holder = open_locker(pg_url, "g", node="holder", lease=SHORT_LEASE)
        other = open_locker(pg_url, "g", node="other", lease=SHORT_LEASE)
        assert isinstance(holder, PostgresLocker)
        recorder = StateRecorder()
        holder.add_listener(recorder)
        try:
            assert await holder.try_acquire()
            await holder.keepalive()
            keeper = holder._keeper
            assert keeper is not None
            # What a SIGSTOP does to the renewals, without stopping this process: the
            # keeper stops renewing (stopped: it reports nothing itself either).
            keeper.stop()
            await eventually(lambda: time.monotonic() >= keeper.valid_until, 10.0,
                             "the lease to run out by the holder's clock")
            try:
                await holder.keepalive()
            except LockLost as exc:
                assert "lease ran out" in str(exc)
            else:
                raise AssertionError("keepalive passed with a lease that ran out")
            assert recorder.states == [LockState.LOST]
            # Given up for real: the session that held it is ended, another node gets it.
            await eventually(other.try_acquire, 10.0, "the other node to get the lock")
        finally:
            await other.close()
            await holder.close()

    run(main())


def test_keepalive_with_the_lease_in_force_passes(pg_url: str) -> None:
    async def main() -> None:
        holder = open_locker(pg_url, "g", node="holder", lease=SHORT_LEASE)
        recorder = StateRecorder()
        holder.add_listener(recorder)
        try:
            assert await holder.try_acquire()
            for _ in range(3):
                await holder.keepalive()
                await asyncio.sleep(0)
            assert recorder.states == []
        finally:
            await holder.close()

    run(main())
