"""Fixtures for the cluster tests (registry, cluster-list, containers, ZooKeeper HA):
the integration harness's broker factory and clients, store URLs, ZooKeeper roots, and
a private ZooKeeper for tests that stop it."""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.containers import broker_runs

# The broker harness's fixtures and its failure hook (broker logs on failure).
from tests.helpers.broker_fixtures import (  # noqa: F401
    broker_factory,
    clients,
    pytest_runtest_makereport,
)
from tests.helpers.servers import ZooKeeperServer

_roots = itertools.count()


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty store: a SQLite file in tmp_path or a new PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store' / 'amqlite.db'}"
    return request.getfixturevalue("pg_url")


@pytest.fixture
def zk_url(zookeeper_server: ZooKeeperServer) -> str:
    """A fresh root on the session's ZooKeeper, so tests never see each other's nodes."""
    return f"zk://{zookeeper_server.hosts}/amqcluster{next(_roots)}"


@pytest.fixture
def private_zookeeper() -> Iterator[ZooKeeperServer]:
    """A ZooKeeper of this test's own, for tests that stop and restart it (the
    session's server is shared by every other ZooKeeper test)."""
    server = ZooKeeperServer()
    server.start()
    try:
        yield server
    finally:
        server.cleanup()


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    """AMQLITE_HOME for one test; every container still running at the end is killed."""
    path = tmp_path / "home"
    yield path
    for pid_file in path.glob("*/broker.pid"):
        with contextlib.suppress(ValueError, OSError):
            pid = int(pid_file.read_text())
            if broker_runs(pid, str(pid_file.parent / "config.toml")):
                os.kill(pid, signal.SIGKILL)
