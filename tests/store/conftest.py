"""Store fixtures: every test runs on a real SQLite file and a real PostgreSQL. The helpers
the tests share (sql, msg, QUEUE, ...) are in tests/helpers/store.py."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from store import SqlStore
from tests.helpers.store import store_opener


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path) -> str:
    """A fresh, empty store: a SQLite file in tmp_path or a new PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'data' / 'amqlite.db'}"
    return request.getfixturevalue("pg_url")


@pytest.fixture
def make_store(store_url: str) -> Iterator[Callable[..., SqlStore]]:
    """Open stores on the test's URL (several = several brokers); closed at the end."""
    with store_opener(store_url) as make:
        yield make
