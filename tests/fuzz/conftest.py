"""The fuzz tests use the integration harness: its broker factory and its failure hook
(every live broker's log attached to a failing test's report)."""

from tests.helpers.broker_fixtures import (  # noqa: F401 (fixtures and hooks, used by name)
    broker_factory,
    pytest_runtest_makereport,
)
