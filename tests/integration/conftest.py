"""Fixtures for end-to-end tests: the shared broker harness's fixtures and failure hook."""

from tests.helpers.broker_fixtures import (  # noqa: F401 (fixtures and hooks, used by name)
    broker_factory,
    clients,
    module_factory,
    pytest_runtest_makereport,
)
