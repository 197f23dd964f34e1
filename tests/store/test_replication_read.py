"""store.replication.read_replication on a pool whose connections lost their server (a
PostgreSQL failover: the node taking over reads this first, on connections pooled
before): read again on a new connection, not refused."""

from __future__ import annotations

import psycopg
import pytest
from sqlalchemy import text

from store import open_store
from store.api import StoreError
from store.replication import read_replication

pytestmark = pytest.mark.integration

#: Every session of the test's database but the caller's.
TERMINATE_OTHERS = ("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()")


def test_pooled_connections_whose_server_went_away_are_replaced(pg_url: str) -> None:
    store = open_store(pg_url, "g")
    store.open()  # its pool holds the connections that made the schema
    try:
        engine = store.engine
        with psycopg.connect(pg_url, autocommit=True) as admin:
            killed = admin.execute(TERMINATE_OTHERS).fetchone()
        assert killed is not None and killed[0] >= 1
        state = read_replication(engine, store.description)
        assert not state.in_recovery
        with engine.connect() as conn:
            assert conn.execute(text("SELECT 1")).scalar_one() == 1
    finally:
        store.close()


def test_a_database_that_takes_no_sessions_is_a_store_error(pg_url: str) -> None:
    """The retry is once: when the new connection fails too, the read fails."""
    store = open_store(pg_url, "g")
    store.open()
    base, db = pg_url.rsplit("/", 1)
    try:
        with psycopg.connect(f"{base}/postgres", autocommit=True) as admin:
            admin.execute(f'ALTER DATABASE "{db}" ALLOW_CONNECTIONS false')
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                          "WHERE datname = %s", (db,))
            try:
                with pytest.raises(StoreError, match="reading the replication state failed"):
                    read_replication(store.engine, store.description)
            finally:
                admin.execute(f'ALTER DATABASE "{db}" ALLOW_CONNECTIONS true')
    finally:
        store.close()
