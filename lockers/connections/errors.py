"""``one_line``: an exception as the one line a log, a CLI error or an API answer shows.

Used by the lockers, the store and ``amqlite`` (registry, management), so it sits on the
floor they share (``lockers.connections``): ``store`` already imports ``lockers``, and
neither imports ``amqlite``.
"""

from __future__ import annotations


def one_line(e: BaseException) -> str:
    """The first line of ``e``'s message (psycopg messages carry DETAIL and HINT lines),
    of the driver's own error when SQLAlchemy wraps one (``orig``: its text without
    SQLAlchemy's SQL and background link); the exception's type name when it says
    nothing."""
    orig = getattr(e, "orig", None)
    error = orig if isinstance(orig, BaseException) else e
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__
