"""The store URL: which backend, JDBC URL and driver, and a one-line check that
the driver jar is installed and the store reachable before any JVM starts.
"""

from __future__ import annotations

import getpass
import os
import socket
import urllib.parse
from dataclasses import dataclass, field

from spark.audit.limits import (
    DEFAULT_PG_JAR,
    DEFAULT_SQLITE_JAR,
    JDBC_CONNECT_TIMEOUT_S,
    PG_DRIVER,
    PG_IDLE_IN_TRANSACTION_TIMEOUT_MS,
    PG_JAR_PACKAGE,
    PG_STATEMENT_TIMEOUT_MS,
    PG_WORK_MEM,
    SQLITE_BUSY_TIMEOUT_MS,
    SQLITE_DRIVER,
    SQLITE_JAR_PACKAGE,
    AuditError,
)

# --------------------------------------------------------------------------- store URL


@dataclass(frozen=True)
class StoreSource:
    """How Spark reaches the store; ``properties`` holds secrets and is never printed."""

    backend: str  # "postgresql" | "sqlite"
    jdbc_url: str
    driver: str
    default_jar: str
    description: str  # the URL without its password
    #: The Debian package that provides ``default_jar``.
    jar_package: str = ""
    #: (host, port) a TCP connection must reach (None: a file store).
    address: tuple[str, int] | None = None
    properties: dict[str, str] = field(default_factory=dict, repr=False)
    #: The same connection as libpq keywords (PostgreSQL), for the driver's own
    #: connections (psycopg: the snapshot and the statements run before Spark).
    libpq: dict[str, str] = field(default_factory=dict, repr=False)

    @property
    def secrets(self) -> tuple[str, ...]:
        pw = self.properties.get("password")
        return (pw,) if pw else ()


PG_SCHEMES = ("postgresql", "postgres", "postgresql+psycopg", "postgresql+psycopg2")
SQLITE_SCHEMES = ("sqlite", "sqlite+pysqlite")
#: libpq URL parameters the JDBC driver understands (name there).
PG_PARAMS = {
    "sslmode": "sslmode",
    "sslrootcert": "sslrootcert",
    "sslcert": "sslcert",
    "sslkey": "sslkey",
    "options": "options",
    "application_name": "ApplicationName",
    "connect_timeout": "connectTimeout",
}


def strip_password(url: str) -> str:
    """The URL as people may see it: any password replaced by nothing."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{parts.username or ''}@{host}" + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def parse_store_url(url: str) -> StoreSource:
    """Map the broker's store URL (SQLAlchemy form) onto a JDBC source."""
    try:
        parts = urllib.parse.urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme in SQLITE_SCHEMES:
            return _sqlite_source(url, parts)
        if scheme in PG_SCHEMES:
            return _pg_source(url, parts)
    except ValueError as exc:  # bad port, bad IPv6 literal...
        raise AuditError(f"bad store URL {strip_password(url)!r}: {exc}") from None
    raise AuditError(
        f"bad store URL {strip_password(url)!r}: expected postgresql://... or sqlite:///path"
    )


def _sqlite_source(url: str, parts: urllib.parse.SplitResult) -> StoreSource:
    # SQLAlchemy: sqlite:///relative.db, sqlite:////absolute.db
    if parts.netloc or not parts.path.startswith("/") or len(parts.path) < 2:
        raise AuditError(f"bad store URL {url!r}: expected sqlite:///path/to/amqlite.db")
    path = os.path.abspath(urllib.parse.unquote(parts.path[1:]))
    if not os.path.isfile(path):
        raise AuditError(f"SQLite store {path} does not exist")
    return StoreSource(
        backend="sqlite",
        jdbc_url=f"jdbc:sqlite:{path}",
        driver=SQLITE_DRIVER,
        default_jar=DEFAULT_SQLITE_JAR,
        jar_package=SQLITE_JAR_PACKAGE,
        description=f"sqlite:///{path}",
        # xerial: open_mode 1 = SQLITE_OPEN_READONLY; the audit never writes.
        properties={"open_mode": "1", "busy_timeout": str(SQLITE_BUSY_TIMEOUT_MS)},
    )


def _pg_source(url: str, parts: urllib.parse.SplitResult) -> StoreSource:
    host = parts.hostname
    if not host:
        raise AuditError(f"bad store URL {strip_password(url)!r}: no host (JDBC needs TCP)")
    port = parts.port or 5432
    user = urllib.parse.unquote(parts.username or "") or os.environ.get("PGUSER") or _os_user()
    password = (
        urllib.parse.unquote(parts.password)
        if parts.password is not None
        else os.environ.get("PGPASSWORD", "")
    )
    dbname = urllib.parse.unquote(parts.path.lstrip("/")) or user
    props: dict[str, str] = {
        "user": user,
        "ApplicationName": "amqlite-audit",
        "connectTimeout": str(JDBC_CONNECT_TIMEOUT_S),
    }
    guards = (
        "-c default_transaction_read_only=on"
        f" -c statement_timeout={PG_STATEMENT_TIMEOUT_MS}"
        f" -c idle_in_transaction_session_timeout={PG_IDLE_IN_TRANSACTION_TIMEOUT_MS}"
        f" -c work_mem={PG_WORK_MEM}"
        # The audit's parallelism is Spark's partitions, a connection each: a
        # statement's own workers recomputed a subquery in each of them (the content
        # check's hash aggregate ran three times over), and JIT compiled for 0.2 s
        # a statement (bench/audit_bench.py, a million messages).
        " -c max_parallel_workers_per_gather=0 -c jit=off"
    )
    props["options"] = guards
    for key, values in urllib.parse.parse_qs(parts.query, keep_blank_values=True).items():
        if key not in PG_PARAMS:
            raise AuditError(
                f"bad store URL {strip_password(url)!r}: parameter {key!r} is not supported "
                f"over JDBC (supported: {', '.join(sorted(PG_PARAMS))})"
            )
        value = values[-1]
        if key == "options":
            props["options"] = f"{value} {guards}"
        else:
            props[PG_PARAMS[key]] = value
    if password:
        props["password"] = password
    libpq = {
        "host": host, "port": str(port), "dbname": dbname, "user": user,
        "application_name": props.get("ApplicationName", "amqlite-audit"),
        "connect_timeout": props["connectTimeout"], "options": props["options"],
    }  # fmt: skip
    libpq.update({k: v for k, v in props.items() if k in ("sslmode", "sslrootcert", "sslcert",
                                                           "sslkey", "password")})
    host_part = f"[{host}]" if ":" in host else host
    db = urllib.parse.quote(dbname, safe="")
    return StoreSource(
        backend="postgresql",
        jdbc_url=f"jdbc:postgresql://{host_part}:{port}/{db}",
        driver=PG_DRIVER,
        default_jar=DEFAULT_PG_JAR,
        jar_package=PG_JAR_PACKAGE,
        address=(host, port),
        description=strip_password(url),
        properties=props,
        libpq=libpq,
    )


def _os_user() -> str:
    """libpq's default user; containers may have no passwd entry for our uid."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "postgres"


def sql_literal(value: str) -> str:
    """A SQL string literal: both dialects double the quote."""
    return "'" + value.replace("'", "''") + "'"


# --------------------------------------------------------------------------- JDBC driver, reach


def check_driver(source: StoreSource, jdbc_jar: str | None) -> list[str]:
    """The jars to give Spark, checked before a JVM starts (which takes seconds and
    would only then fail with a ClassNotFoundException). Under spark-submit the driver
    may come from ``--jars``/``--packages``, so a missing default jar is not an error
    there."""
    if jdbc_jar:
        if not os.path.isfile(jdbc_jar):
            raise AuditError(f"JDBC jar {jdbc_jar} does not exist")
        return [jdbc_jar]
    if os.path.isfile(source.default_jar):
        return [source.default_jar]
    if "PYSPARK_GATEWAY_PORT" in os.environ:  # spark-submit: its --jars may have it
        return []
    raise AuditError(
        f"the {source.backend} JDBC driver {source.default_jar} is not installed: "
        f"apt-get install {source.jar_package} (Debian/Ubuntu), or pass --jdbc-jar"
    )


def check_reachable(source: StoreSource, timeout: float = JDBC_CONNECT_TIMEOUT_S) -> None:
    """Fail early, naming host and port, when the store's server cannot be reached
    (before the JVM starts; the JDBC error would come later and vaguer)."""
    if source.address is None:
        return
    host, port = source.address
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as exc:
        reason = exc.strerror or str(exc) or type(exc).__name__
        if isinstance(exc, socket.gaierror):
            reason = f"host not found ({reason})"
        elif isinstance(exc, TimeoutError):
            reason = f"no answer within {timeout:g}s"
        raise AuditError(
            f"cannot reach the store {source.description} at {host}:{port}: {reason}"
        ) from None
