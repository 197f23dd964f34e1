"""Fixtures shared by the broker tests: a store URL (SQLite, or PostgreSQL when a test asks
for it), the settings over it and the opened store. Modules that need other settings (tiny
memory budgets) override ``settings`` and keep this ``store``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from amqlite.settings import Settings
from store import SqlStore, open_store


@pytest.fixture
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """SQLite unless a test asks for PostgreSQL (indirect parametrisation)."""
    if getattr(request, "param", "sqlite") == "postgresql":
        return request.getfixturevalue("pg_url")
    return f"sqlite:///{tmp_path / 'amqlite.db'}"


@pytest.fixture
def settings(tmp_path: Path, store_url: str) -> Settings:
    return Settings(group="g1", data_dir=str(tmp_path), store=store_url).resolved()


@pytest.fixture
def store(settings: Settings) -> Iterator[SqlStore]:
    s = open_store(settings.store, settings.group)
    assert isinstance(s, SqlStore)
    s.open()
    yield s
    s.close()
