"""Fixtures shared by the whole suite: real servers on loopback, started once."""

from __future__ import annotations

import pytest

from tests.helpers.servers import PostgresServer, ZooKeeperServer


@pytest.fixture(scope="session")
def postgres_server():
    """One throwaway PostgreSQL for the session; tests get their own database."""
    server = PostgresServer()
    server.init()
    server.start()
    try:
        yield server
    finally:
        server.cleanup()


@pytest.fixture
def pg_url(postgres_server: PostgresServer) -> str:
    """A fresh, empty database on the session's PostgreSQL."""
    return postgres_server.create_database()


@pytest.fixture(scope="session")
def zookeeper_server():
    server = ZooKeeperServer()
    server.start()
    try:
        yield server
    finally:
        server.cleanup()
