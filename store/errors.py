"""What a database error means for the store: the data refused (``StoreRejected``,
the store still usable), settings that no retry will fix (``StoreUnusable`` at open),
or a lock wait that ran out (a claim then looks for a deposed master's session).

SQLSTATE classes and server messages decide; the exception types (``store.api``)
say what the broker does about it.
"""

from __future__ import annotations

import sqlite3

import psycopg
from sqlalchemy.exc import StatementError

from lockers.connections.errors import TRANSIENT_CONNECT_ERRORS, one_line
from store import pg_batch
from store.api import StoreError, StoreRejected

#: SQLSTATE classes that blame the data, not the server: 22 data exception
#: (string too long, numeric out of range, untranslatable character, ...) and
#: 23 integrity constraint violation.
REJECTED_SQLSTATE_CLASSES = ("22", "23")


def is_rejection(exc: BaseException) -> bool:
    """True when ``exc`` says the store refused the data, not that it is gone.

    A driver refuses some values before they leave Python: sqlite3 raises
    OverflowError for an int past 2**63, psycopg a DataError without SQLSTATE
    for a NUL in text, both UnicodeEncodeError for a lone surrogate (a
    ValueError). Errors SQLAlchemy raised for a DBAPI error (DBAPIError) or
    for a bound value (StatementError) are judged by what they wrap."""
    if isinstance(exc, StatementError):  # DBAPIError included (a subclass)
        return exc.orig is not None and is_rejection(exc.orig)
    if isinstance(exc, (OverflowError, ValueError)):
        return True
    if isinstance(exc, (sqlite3.DataError, sqlite3.IntegrityError)):
        return True
    if isinstance(exc, psycopg.Error):
        state = exc.sqlstate
        if state is None:  # refused in psycopg itself, before the server saw it
            return isinstance(exc, psycopg.DataError)
        return state[:2] in REJECTED_SQLSTATE_CLASSES and state != pg_batch.FENCED_SQLSTATE
    return False


#: SQLSTATE classes that opening a store will meet again however often it retries:
#: 28 invalid authorization, 42 access rule violation (42501 insufficient_privilege:
#: a role that does not own the tables cannot ALTER them for a schema upgrade).
PERMANENT_SQLSTATE_CLASSES = ("28", "42")
#: What SQLite says when the file cannot be used at all (permissions, a directory).
SQLITE_PERMANENT_ERRORS = (
    "unable to open database file",
    "attempt to write a readonly database",
    "file is not a database",
)


def is_permanent(exc: StoreError) -> bool:
    """True when opening failed because of what the settings name (no such
    database or role, a refused password, an unwritable file), not because the
    server is not there yet. psycopg gives no SQLSTATE for a refused connection,
    so the server's FATAL message is what tells."""
    cause = exc.__cause__
    orig = getattr(cause, "orig", None) or cause
    if isinstance(orig, sqlite3.Error):
        text_ = str(orig).lower()
        return any(m in text_ for m in SQLITE_PERMANENT_ERRORS)
    if isinstance(orig, psycopg.OperationalError):
        text_ = str(orig)
        if "FATAL:" not in text_:
            return False  # refused, timed out, unresolvable: the network, not the settings
        return not any(m in text_ for m in TRANSIENT_CONNECT_ERRORS)
    if isinstance(orig, psycopg.Error) and orig.sqlstate is not None:
        # A role that may not create or upgrade the schema: retrying changes nothing.
        return orig.sqlstate.startswith(PERMANENT_SQLSTATE_CLASSES)
    return False


def store_error(description: str, what: str, exc: BaseException) -> StoreError:
    """``StoreRejected`` or ``StoreError`` for a failed ``what``, caused by ``exc``."""
    cls = StoreRejected if is_rejection(exc) else StoreError
    err = cls(f"{description}: {what} failed: {one_line(exc)}")
    err.__cause__ = exc
    return err


#: SQLSTATE lock_not_available (lock_timeout expired).
LOCK_NOT_AVAILABLE = "55P03"


def is_lock_timeout(exc: BaseException) -> bool:
    cause: BaseException | None = exc
    while cause is not None:
        if getattr(cause, "sqlstate", None) == LOCK_NOT_AVAILABLE:
            return True
        cause = cause.__cause__ or getattr(cause, "orig", None)
    return False
