"""Issue 15: a keepalive abandoned on timeout (a partitioned PostgreSQL) has its late
outcome collected: no "Future exception was never retrieved" once the partition heals."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import threading
import time
from typing import Any

import pytest

from lockers import Locker, LockLost, open_locker
from tests.helpers.lockers import eventually, run
from tests.helpers.servers import PostgresServer
from tests.lockers.test_postgres import _app, _dbname

#: The abandoned call ends as soon as its backend resumes and is terminated.
LATE_OUTCOME_TIMEOUT = 30.0


async def _holder(postgres_server: PostgresServer, pg_url: str) -> tuple[Locker, int]:
    """A locker holding group "g", and the server pid of its lock session."""
    a = open_locker(pg_url, "g", node="a")
    assert await a.try_acquire()
    pid = int(await asyncio.to_thread(
        postgres_server.psql,
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
        f" AND application_name = '{_app('g', 'a')}'", _dbname(pg_url)))
    return a, pid


def test_abandoned_keepalive_outcome_is_collected(
    postgres_server: PostgresServer, pg_url: str
) -> None:
    reported: list[dict[str, Any]] = []

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: reported.append(ctx))
        a, pid = await _holder(postgres_server, pg_url)
        os.kill(pid, signal.SIGSTOP)  # the partition: TCP up, no answer
        try:
            with pytest.raises(LockLost):
                await a.keepalive()  # abandons the call after PG_CALL_TIMEOUT
        finally:
            # The partition heals as an error for the abandoned call.
            await asyncio.to_thread(postgres_server.psql, f"SELECT pg_terminate_backend({pid})")
            os.kill(pid, signal.SIGCONT)
        await eventually(
            lambda: not any(t.name == "amqlite-pg-call" for t in threading.enumerate()),
            LATE_OUTCOME_TIMEOUT, "the abandoned call to end")
        for _ in range(3):  # let the thread's call_soon_threadsafe settle the future
            await asyncio.sleep(0)
        await a.close()
        gc.collect()  # an unretrieved exception is reported when its future is freed
        await asyncio.sleep(0)

    run(main())
    assert not [c for c in reported if "never retrieved" in str(c.get("message"))], reported


def test_a_pause_of_the_process_is_not_the_servers_silence(
    postgres_server: PostgresServer, pg_url: str
) -> None:
    """CI, stop 32: a master SIGSTOPped with a lock check in flight gave its lock up on
    SIGCONT although the server had answered — the loop's wall-clock timer expired during
    the pause and fired before the resumed thread could read the answer. Here the loop
    stands still (time.sleep on it: nothing of this process waits) longer than
    PG_CALL_TIMEOUT while the backend is stopped, and the backend resumes with it: the
    check must succeed, the lock still ours."""
    from lockers.postgres import PG_CALL_TIMEOUT

    async def main() -> None:
        a, pid = await _holder(postgres_server, pg_url)
        os.kill(pid, signal.SIGSTOP)
        try:
            check = asyncio.create_task(a.keepalive())
            await asyncio.sleep(0)  # the check's thread is started and waits on the backend
            time.sleep(PG_CALL_TIMEOUT + 1.0)  # the pause: the loop does not run
        finally:
            os.kill(pid, signal.SIGCONT)  # and the backend answers as the loop resumes
        await check  # LockLost before the fix: "no answer within 3s"
        await a.keepalive()
        await a.close()

    run(main())
