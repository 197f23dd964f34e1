"""Fixtures shared by the whole suite: real servers on loopback, started once."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.servers import PostgresServer, ZooKeeperServer, running_postgres

TESTS = Path(__file__).resolve().parent
#: Tests are run in three passes by ``scripts/test``, so that what a test times is never
#: slowed down for real by a neighbour:
#:
#: 1. the rest (no marker), on two pytest-xdist workers: nothing they assert depends on
#:    how fast the machine is, so Spark, Chromium or the compiled build may take both
#:    cores beside them;
#: 2. ``timed``: they time something (a takeover, a lease, a timeout that must fire, and
#:    not early) or kill, pause and partition masters under clients; two at a time, as
#:    none of them takes more than a core for long;
#: 3. ``alone``: timed and taking both cores themselves (floods of logins, handshakes and
#:    hostile frames, Spark, Chromium, a PostgreSQL promotion, three ZooKeepers, the
#:    compiled build and the tests it runs), one at a time.
#:
#: Whole directories of ``timed`` tests: failover clients, cluster commands and lockers.
TIMED_DIRS = ("client", "cluster", "lockers")
TIMED_FILES = frozenset({
    "integration/test_activation_lock_loss.py",
    "integration/test_consumer_choice.py",
    "integration/test_counters_takeover.py",
    "integration/test_failover_embedded.py",
    "integration/test_held_broker_wide.py",
    "integration/test_held_memory.py",
    "integration/test_management_delete.py",
    "integration/test_management_live.py",
    "integration/test_node_exit_codes.py",
    "integration/test_pg_ha.py",
    "integration/test_pg_lease.py",
    "integration/test_pg_multi_host.py",
    "integration/test_pg_replication.py",
    "integration/test_policies.py",
    "integration/test_protocol_errors.py",
    "integration/test_scheduled.py",
    "integration/test_selectors.py",
    "integration/test_subscription_cli.py",
    "integration/test_tls.py",
    "integration/test_websocket.py",
    "integration/test_wildcards.py",
    "store/test_claim_ends_stale_session.py",
    "store/test_schema_upgrade.py",
    "unit/test_selector.py",
})
ALONE_FILES = frozenset({
    "bench/test_bench_smoke.py",
    "client/test_stress_failover.py",
    "fuzz/test_fuzz_broker.py",
    "integration/test_compiled_build.py",
    "integration/test_http_connection_limits.py",
    "integration/test_login_flood_one_login.py",
    "integration/test_management_login_flood.py",
    "integration/test_pg_promotion.py",
    "integration/test_preauth_limits.py",
    "integration/test_tls_handshake_limits.py",
    "integration/test_websocket_browser.py",
    "integration/test_zk_ensemble.py",
    "spark/test_audit_after_failover.py",
    "spark/test_audit_cluster.py",
})


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        relative = item.path.relative_to(TESTS)
        name = relative.as_posix()
        if name in ALONE_FILES:
            item.add_marker(pytest.mark.alone)
        elif relative.parts[0] in TIMED_DIRS or name in TIMED_FILES:
            item.add_marker(pytest.mark.timed)


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
