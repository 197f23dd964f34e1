"""Fixtures for client tests that need real broker processes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.broker_proc import BrokerFactory


@pytest.fixture
def broker_factory(tmp_path: Path) -> Iterator[BrokerFactory]:
    """Brokers for one test; all killed at teardown."""
    factory = BrokerFactory(tmp_path)
    try:
        yield factory
    finally:
        factory.close()
