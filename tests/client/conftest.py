"""Fixtures for client tests that need real broker processes (the shared broker harness's)."""

from tests.helpers.broker_fixtures import broker_factory  # noqa: F401 (a fixture, used by name)
