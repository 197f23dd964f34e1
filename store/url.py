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

from lockers.connections.pg_url import PgUrlError, hosts_text, parse_pg_url, split_hosts
from store.api import StoreError

#: Schemes a user may write for PostgreSQL; all map to psycopg 3.
POSTGRES_SCHEMES = ("postgresql", "postgres", "postgresql+psycopg")
#: Query parameters that can carry a secret and must never reach a log line.
SECRET_QUERY_KEYS = ("password", "sslpassword")

USAGE = ("expected sqlite:///PATH or postgresql://USER[:PASSWORD]@HOST[:PORT][,HOST[:PORT]...]"
         "/DB[?target_session_attrs=read-write]")


@dataclass(frozen=True, slots=True)
class StoreURL:
    """A parsed store URL."""

    dialect: str  # "sqlite" | "postgresql"
    url: URL  # what create_engine gets
    description: str  # password removed: safe for logs
    path: Path | None = None  # the database file, for SQLite


def describe(url: URL) -> str:
    """The URL with its password (also one given as a query parameter) masked; several
    hosts in libpq's spelling (``@db1:5432,db2:5432/amq``), whichever one was given."""
    safe = url
    if any(k in url.query for k in SECRET_QUERY_KEYS):
        safe = url.update_query_dict(
            {k: "***" for k in SECRET_QUERY_KEYS if k in url.query}
        )
    host = url.query.get("host")
    if not isinstance(host, str) or "," not in host:
        return safe.render_as_string(hide_password=True)
    port = url.query.get("port")
    hosts = hosts_text(split_hosts(host, port if isinstance(port, str) else ""))
    text = safe.difference_update_query(["host", "port"]).render_as_string(hide_password=True)
    scheme, _, rest = text.partition("://")
    userinfo, at, tail = rest.partition("@")  # rendered: an "@" elsewhere is escaped
    if not at:
        userinfo, tail = "", rest
    return f"{scheme}://{userinfo}{at}{hosts}{tail}"


def _several_hosts(url: URL) -> bool:
    """``db1,db2`` (make_url takes it as one host when no port follows), or a list in
    the query (libpq's ``host=db1,db2`` or SQLAlchemy's ``host=db1:5432&host=db2:5432``)."""
    host = url.query.get("host")
    return ("," in (url.host or "") or isinstance(host, tuple)
            or (isinstance(host, str) and "," in host))


def _libpq_spelling(url: URL) -> str:
    """SQLAlchemy's own multi-host spelling (``?host=db1:5432&host=db2:5432``) as libpq's
    (``?host=db1,db2&port=5432,5432``), so one parser reads every spelling."""
    pairs = [entry.rpartition(":")[::2] if entry.rpartition(":")[2].isdigit() else (entry, "")
             for entry in url.query["host"]]
    query = {"host": ",".join(h for h, _ in pairs)}
    if any(p for _, p in pairs):
        query["port"] = ",".join(p for _, p in pairs)
    return url.update_query_dict(query).render_as_string(hide_password=False)


def _postgres_hosts(raw: str) -> URL:
    """A URL naming several hosts, read by libpq (``lockers.connections.pg_url``), as the
    SQLAlchemy URL that hands them to psycopg: ``host`` and ``port`` lists in the query,
    one port per host (SQLAlchemy wants as many as hosts), ``target_session_attrs``
    defaulted to read-write."""
    try:
        target = parse_pg_url(raw)
    except PgUrlError as e:
        raise StoreError(f"cannot parse store URL: {e}: {USAGE}") from None
    params = dict(target.params)
    user, password, database = (params.pop(k, None) for k in ("user", "password", "dbname"))
    params["host"] = ",".join(h for h, _ in target.hosts)
    params.pop("port", None)
    if any(p for _, p in target.hosts):
        params["port"] = ",".join(p for _, p in target.hosts)
    return URL.create("postgresql+psycopg", username=user, password=password,
                      database=database, query=params)


def parse_store_url(raw: str) -> StoreURL:
    """Map a user's store URL to SQLAlchemy's; raise ``StoreError`` with one clear line."""
    scheme = raw.partition("://")[0].lower() if "://" in raw else ""
    try:
        url = make_url(raw)
    except (ArgumentError, ValueError):
        if scheme not in POSTGRES_SCHEMES:
            # The raw text may hold a password: do not echo it.
            raise StoreError(f"cannot parse store URL: {USAGE}") from None
        url = _postgres_hosts(raw)  # libpq's db1:5432,db2:5432, or a bad URL
    else:
        if url.drivername in POSTGRES_SCHEMES and _several_hosts(url):
            tuple_form = isinstance(url.query.get("host"), tuple)
            url = _postgres_hosts(_libpq_spelling(url) if tuple_form else raw)
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
