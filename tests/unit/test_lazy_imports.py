"""The CLI and a frame's checks do not load the store's machinery: SQLAlchemy, the
database drivers and aiohttp take about 0.4 s to import, which every ``amqlite``
command that never opens the store (``--help``, ``user``, ``container``) paid before
``store`` loaded its modules on first use (``store.__getattr__``) and the column sizes
moved to ``store.limits``. A fresh interpreter each, as a command runs."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("sqlalchemy", "psycopg", "aiohttp")


def loaded_after(statement: str) -> list[str]:
    code = (f"import sys; {statement}; "
            f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    return [m for m in out.stdout.strip().split(",") if m]


@pytest.mark.parametrize("statement", [
    "import cli.main",
    "import amqlite.validation",
    "import store.limits, store.api",
])
def test_nothing_heavy_is_imported(statement: str) -> None:
    assert loaded_after(statement) == []


def test_the_store_package_still_hands_out_every_name() -> None:
    """What ``from store import X`` gave before, each from its module, loaded then."""
    import store

    for name in store.__all__:
        assert getattr(store, name) is not None, name
    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        store.Nothing  # noqa: B018 - the lookup is the test
    assert "sqlalchemy" in loaded_after("import store; store.SqlStore")
