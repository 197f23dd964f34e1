"""Fixtures for end-to-end tests: broker factories that never leak a process, client pools,
and broker logs attached to every failure report.

Shared by the integration, client, cluster and fuzz folders: each conftest imports what it
uses from here, so the fixtures are written once."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.broker_proc import ACTIVE_FACTORIES, BrokerFactory, ClientPool


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """On failure, show what every live broker logged: the test's assertion alone rarely
    explains why a broker misbehaved."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.failed and ACTIVE_FACTORIES:
        logs = "\n".join(f.dump_logs() for f in ACTIVE_FACTORIES)
        report.sections.append(("amqlite broker logs", logs))


@pytest.fixture
def broker_factory(tmp_path: Path) -> Iterator[BrokerFactory]:
    """Brokers for one test; all killed at teardown."""
    factory = BrokerFactory(tmp_path)
    try:
        yield factory
    finally:
        factory.close()


@pytest.fixture(scope="module")
def module_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerFactory]:
    """Brokers shared by a module's tests (each test uses its own destinations)."""
    factory = BrokerFactory(tmp_path_factory.mktemp("brokers"))
    try:
        yield factory
    finally:
        factory.close()


@pytest.fixture
def clients() -> Iterator[ClientPool]:
    """stomp.py clients for one test; all disconnected at teardown."""
    pool = ClientPool()
    try:
        yield pool
    finally:
        pool.close()


def store_args(kind: str, request: pytest.FixtureRequest) -> list[str]:
    """``amqlite start`` arguments for a test run on each store: none for the embedded
    SQLite, a fresh database on the session's PostgreSQL (store and locker) for
    ``"postgresql"``. Works from fixtures of any scope."""
    if kind == "sqlite":
        return []
    url = request.getfixturevalue("postgres_server").create_database()
    return ["--store", url, "--locker", url]
