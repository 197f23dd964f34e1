"""Fixtures shared by the whole suite: real servers on loopback, started once."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from tests.helpers.servers import PostgresServer, ZooKeeperServer, running_postgres


def pytest_configure(config: pytest.Config) -> None:
    """Tests press Ctrl-C on the CLI (SIGINT to `consume`, `container logs -f`). A suite
    started in the background by a shell without job control (`.ci/run &`, nohup) has
    SIGINT ignored, and an ignored signal stays ignored in every child across exec:
    those CLIs would never see it. A handled one is reset to the default in children."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One throwaway PostgreSQL for the session; tests get their own database."""
    with running_postgres() as server:
        yield server


@pytest.fixture
def private_postgres_server() -> Iterator[PostgresServer]:
    """A PostgreSQL of the test's own, for tests that restart or stop the server: the
    session's server stays up for every other test, whatever order they run in."""
    with running_postgres() as server:
        yield server


@pytest.fixture
def pg_url(postgres_server: PostgresServer) -> str:
    """A fresh, empty database on the session's PostgreSQL."""
    return postgres_server.create_database()


@pytest.fixture(scope="session")
def zookeeper_server() -> Iterator[ZooKeeperServer]:
    """One throwaway ZooKeeper for the session; tests use their own chroot paths."""
    server = ZooKeeperServer()
    server.start()
    try:
        yield server
    finally:
        server.cleanup()
