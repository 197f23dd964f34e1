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


#: What a PostgreSQL server says while it cannot take connections *yet*: these
#: are worth waiting for; any other FATAL at connect time is final.
TRANSIENT_CONNECT_ERRORS = (
    "the database system is starting up",
    "the database system is shutting down",
    "the database system is in recovery mode",
    "too many connections",
    "remaining connection slots are reserved",
    "terminating connection due to administrator command",
)


def refused_for_good(e: BaseException) -> bool:
    """A connect that the server refused for what the settings name (a wrong password, no
    such role or database, no pg_hba.conf entry): a FATAL that is not one of
    TRANSIENT_CONNECT_ERRORS. Retrying changes nothing. psycopg gives no SQLSTATE for a
    refused connection, so the server's FATAL message is what tells."""
    text_ = str(e)
    return "FATAL:" in text_ and not any(m in text_ for m in TRANSIENT_CONNECT_ERRORS)
