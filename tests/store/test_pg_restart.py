"""A PostgreSQL restart under a running master: the next commit fails with
StoreError (the master demotes) instead of hanging. Restarts a PostgreSQL of
its own (``private_postgres_server``), so it may run in any order."""

from __future__ import annotations

import asyncio
import subprocess

import pytest

from store import Batch, GroupCommitter, SqlStore, StoreError, open_store
from tests.helpers.servers import PostgresServer
from tests.helpers.store import QUEUE, msg, one

#: A commit on a dead connection fails at once; this only bounds a regression.
DEADLINE_S = 30.0


def _ensure_up(server: PostgresServer) -> None:
    try:
        server.psql("SELECT 1")
    except subprocess.CalledProcessError:
        server.start()


def test_postgres_restart_fails_the_commit_instead_of_hanging(
    private_postgres_server: PostgresServer,
) -> None:
    postgres_server = private_postgres_server
    pg_url = postgres_server.create_database()
    s = open_store(pg_url, "g1")
    assert isinstance(s, SqlStore)
    s.open()
    epoch = s.claim_epoch("node-a")
    s.commit_batch(epoch, Batch(destinations=[QUEUE], inserts=[msg(1)]))
    failures: list[BaseException] = []

    async def scenario() -> None:
        gc = GroupCommitter(s, epoch, asyncio.get_running_loop(), failures.append)
        await gc.submit(Batch(inserts=[msg(2)]))
        try:
            postgres_server.restart()
        finally:
            _ensure_up(postgres_server)
        with pytest.raises(StoreError):
            await asyncio.wait_for(gc.submit(Batch(inserts=[msg(3)])), DEADLINE_S)
        await gc.drain()
        assert len(failures) == 1 and isinstance(failures[0], StoreError)
        gc.close()
        await gc.wait_closed()

    try:
        asyncio.run(scenario())
    finally:
        s.close()
        _ensure_up(postgres_server)
    # The server is back; what was committed survived, the failed batch did not.
    fresh = open_store(pg_url, "g1")
    assert isinstance(fresh, SqlStore)
    fresh.open()
    try:
        assert [m.id for m in fresh.load_page(QUEUE.id, 0, 10)] == [1, 2]
        assert one(fresh, "SELECT msg_count FROM amq_groups") == 2
    finally:
        fresh.close()
