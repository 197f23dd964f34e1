"""The suite's lists of tests that run timed or alone (tests/conftest.py, scripts/test)
name files that exist: a renamed file would otherwise drop silently into the parallel
pass, beside tests that take both cores."""

from __future__ import annotations

from tests.conftest import ALONE_FILES, TESTS, TIMED_DIRS, TIMED_FILES


def test_every_listed_file_and_directory_exists() -> None:
    missing = [name for name in sorted(TIMED_FILES | ALONE_FILES)
               if not (TESTS / name).is_file()]
    missing += [name for name in TIMED_DIRS if not (TESTS / name).is_dir()]
    assert missing == []


def test_no_file_is_listed_twice() -> None:
    assert TIMED_FILES.isdisjoint(ALONE_FILES)
