"""The CLI and a frame's checks do not load the store's machinery: SQLAlchemy, the
database drivers and aiohttp take about 0.4 s to import, which every ``amqlite``
command that never opens the store (``--help``, ``user``, ``container``) paid before
``store`` loaded its modules on first use (``store.__getattr__``) and the column sizes
moved to ``store.limits``. A fresh interpreter each, as a command runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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


def test_version_tells_the_build_without_importing_the_broker() -> None:
    """``amqlite --version`` names the build (amqlite.native) without importing
    ``amqlite.broker``, whose package imports the whole broker."""
    code = ("import sys; from cli.main import cli\n"
            "try:\n    cli(['--version'])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in ('amqlite.broker', 'store.api', 'sqlalchemy') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert out[0].startswith("amqlite, version ")
    assert out[0].endswith(("(compiled (mypyc))", "(pure Python)")), out[0]
    assert out[-1] == "[]"


def test_is_compiled_finds_an_extension_without_importing_its_packages(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An extension module beside its ``.py`` is what Python imports: reported
    compiled, found where the finder would look, with no package run."""
    from importlib.machinery import EXTENSION_SUFFIXES

    from amqlite.native import is_compiled

    sub = tmp_path / "lazypkg" / "sub"
    sub.mkdir(parents=True)
    for d in (tmp_path / "lazypkg", sub):
        (d / "__init__.py").write_text("raise ImportError('a package was imported')\n")
    (sub / "hot.py").write_text("")
    (sub / "cold.py").write_text("")
    (sub / f"hot{EXTENSION_SUFFIXES[0]}").write_bytes(b"")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert is_compiled("lazypkg.sub.hot")
    assert not is_compiled("lazypkg.sub.cold")
    assert not is_compiled("lazypkg.sub.missing")
    assert not is_compiled("nosuchpackage.sub.hot")
    assert "lazypkg" not in sys.modules
