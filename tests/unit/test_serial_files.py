"""The suite's list of tests that run alone names files that exist: a renamed file would
otherwise drop silently into the parallel pass (tests/conftest.py, scripts/test)."""

from __future__ import annotations

from tests.conftest import SERIAL_DIRS, SERIAL_FILES, TESTS


def test_every_serial_file_and_directory_exists() -> None:
    missing = [name for name in sorted(SERIAL_FILES) if not (TESTS / name).is_file()]
    missing += [name for name in SERIAL_DIRS if not (TESTS / name).is_dir()]
    assert missing == []
