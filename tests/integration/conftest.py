"""Fixtures for end-to-end tests: the shared broker harness's fixtures and failure hook,
and the console tests' browser."""

from tests.helpers.broker_fixtures import (  # noqa: F401 (fixtures and hooks, used by name)
    broker_factory,
    clients,
    module_factory,
    pytest_runtest_makereport,
)
from tests.helpers.browser import browser, chromium, shots  # noqa: F401 (the console tests' fixtures)
from tests.helpers.sockets import sockets  # noqa: F401 (raw sockets closed after a test)
