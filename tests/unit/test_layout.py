"""The layout's one hard rule: no module over 700 lines, so that each stays a room someone
can read in an afternoon (amqlite/codec.py grew to 705 before this test; its version
rules went to amqlite/frame_rules.py)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: The limit, from the project's style rules.
MAX_MODULE_LINES = 700
#: Where the project's modules are: its packages and the files at its top (setup.py).
PACKAGES = ("amqlite", "store", "lockers", "cli", "spark", "bench", "tests", "scripts")


def project_modules() -> list[Path]:
    return [*ROOT.glob("*.py"), *(p for d in PACKAGES for p in (ROOT / d).rglob("*.py"))]


def test_no_module_over_700_lines() -> None:
    modules = project_modules()
    assert len(modules) > 100  # the listing worked: every module is counted
    sizes = {str(p.relative_to(ROOT)): len(p.read_text(encoding="utf-8").splitlines())
             for p in modules}
    assert {f: n for f, n in sizes.items() if n > MAX_MODULE_LINES} == {}
