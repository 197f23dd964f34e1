"""Store URLs: which backend, the SQLAlchemy URL to give it, and a log-safe description.

Users write the URLs they know (``sqlite:///path``, ``postgresql://...``);
SQLAlchemy needs the driver spelled out. A bad URL is a one-line
``StoreError`` because the CLI prints it as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from store.api import StoreError

#: Schemes a user may write for PostgreSQL; all map to psycopg 3.
POSTGRES_SCHEMES = ("postgresql", "postgres", "postgresql+psycopg")
#: Query parameters that can carry a secret and must never reach a log line.
SECRET_QUERY_KEYS = ("password", "sslpassword")

USAGE = "expected sqlite:///PATH or postgresql://USER[:PASSWORD]@HOST[:PORT]/DB"


@dataclass(frozen=True, slots=True)
class StoreURL:
    """A parsed store URL."""

    dialect: str  # "sqlite" | "postgresql"
    url: URL  # what create_engine gets
    description: str  # password removed: safe for logs
    path: Path | None = None  # the database file, for SQLite


def describe(url: URL) -> str:
    """The URL with its password (also one given as a query parameter) masked."""
    safe = url
    if any(k in url.query for k in SECRET_QUERY_KEYS):
        safe = url.update_query_dict(
            {k: "***" for k in SECRET_QUERY_KEYS if k in url.query}
        )
    return safe.render_as_string(hide_password=True)


def parse_store_url(raw: str) -> StoreURL:
    """Map a user's store URL to SQLAlchemy's; raise ``StoreError`` with one clear line."""
    try:
        url = make_url(raw)
    except (ArgumentError, ValueError):
        # The raw text may hold a password: do not echo it.
        raise StoreError(f"cannot parse store URL: {USAGE}") from None
    scheme = url.drivername
    if scheme in ("sqlite", "sqlite+pysqlite"):
        if not url.database or url.database == ":memory:" or url.database.startswith("file:"):
            raise StoreError(
                "store URL needs a database file (an in-memory SQLite store cannot be "
                f"shared between brokers): {USAGE}"
            )
        path = Path(url.database).expanduser().resolve()
        url = url.set(drivername="sqlite+pysqlite", database=str(path))
        return StoreURL("sqlite", url, describe(url), path)
    if scheme in POSTGRES_SCHEMES:
        if not url.database:
            raise StoreError(f"store URL {describe(url)} names no database: {USAGE}")
        url = url.set(drivername="postgresql+psycopg")
        return StoreURL("postgresql", url, describe(url))
    raise StoreError(f"unsupported store URL scheme {scheme!r} in {describe(url)}: {USAGE}")
