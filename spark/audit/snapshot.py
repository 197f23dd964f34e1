"""One snapshot of the store that every read sees (PostgreSQL: an exported
snapshot; SQLite: a backup copy).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import sqlite3
import tempfile
import threading
import urllib.parse
from typing import Any

from pyspark.sql import SparkSession

from spark.audit.limits import SNAPSHOT_KEEPALIVE_S, SQLITE_BUSY_TIMEOUT_MS, AuditError
from spark.audit.source import StoreSource, sql_literal

# --------------------------------------------------------------------------- one snapshot


class Snapshot:
    """One consistent view of the store, shared by every read of the audit, so that
    what a live broker commits meanwhile (sends, acks, the pruner) cannot show up
    half-done. ``source`` is what Spark reads, ``init_statement`` what each of its
    JDBC connections runs first (Spark's ``sessionInitStatement``), ``query`` a
    small query in the same view (counts, quantiles, groups)."""

    #: PostgreSQL: the exported snapshot's id.
    snapshot_id = ""

    def __init__(self, source: StoreSource, init_statement: str | None, pins: str) -> None:
        self.source = source
        self.init_statement = init_statement
        #: What holding the view costs the store, for the summary.
        self.pins = pins

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    def close(self) -> None:
        """Let the view go (also after an error)."""


def import_statement(snapshot_id: str) -> str:
    """What a connection runs first to read in the exported snapshot ``snapshot_id``."""
    return (
        "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; "
        f"SET TRANSACTION SNAPSHOT {sql_literal(snapshot_id)}"
    )


class ExportedSnapshot(Snapshot):
    """A PostgreSQL snapshot exported by a transaction of this process: what readers
    run first to import it, what it pins, and the keep-alive of the exporter."""

    _lock: threading.Lock
    _stop: threading.Event

    def _export(self, source: StoreSource, begin: str) -> None:
        """Begin the transaction on ``self._conn`` with ``begin`` and export its
        snapshot (the connection is closed if that fails)."""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        try:
            self.query(begin)
            rows = self.query("SELECT pg_export_snapshot(), pg_is_in_recovery()")
        except Exception:
            self.close()
            raise
        self.snapshot_id, standby = str(rows[0][0]), bool(rows[0][1])
        feedback = " (and the primary with hot_standby_feedback)"
        where = f"standby{feedback}" if standby else "primary"
        super().__init__(
            source, import_statement(self.snapshot_id),
            f"snapshot {self.snapshot_id}: holds back xmin on the {where}",
        )  # fmt: skip
        threading.Thread(target=self.keep_alive, name="audit-snapshot", daemon=True).start()

    def keep_alive(self) -> None:
        """A statement now and then so that idle_in_transaction_session_timeout (the
        guard against a stalled reader) does not end the exporting transaction while
        this driver is alive; if the driver stalls, the server ends it and the reads
        still to come fail instead of reading another view."""
        while not self._stop.wait(SNAPSHOT_KEEPALIVE_S):
            with contextlib.suppress(Exception):
                self.query("SELECT 1")


class PgSnapshot(ExportedSnapshot):
    """PostgreSQL: the driver's own JDBC connection opens a REPEATABLE READ READ ONLY
    transaction and exports its snapshot (``pg_export_snapshot()``); every partition
    read begins its own REPEATABLE READ transaction and imports it (``SET TRANSACTION
    SNAPSHOT``) before its SELECT. Spark runs ``sessionInitStatement`` in autocommit
    mode and only then turns autocommit off for its cursor: the explicit BEGIN keeps
    the transaction open for the read (the driver sends no BEGIN of its own while one
    is open); tests/spark/test_audit_live.py shows rows written after the export
    are not seen. The exporting transaction holds back the server's xmin (vacuum)
    until everything is read."""

    def __init__(self, spark: SparkSession, source: StoreSource) -> None:
        jvm = spark.sparkContext._jvm
        assert jvm is not None
        props = jvm.java.util.Properties()
        for key, value in source.properties.items():
            props.setProperty(key, value)
        driver: Any = jvm
        for part in source.driver.split("."):
            driver = getattr(driver, part)
        conn = driver().connect(source.jdbc_url, props)
        if conn is None:
            raise AuditError(f"the PostgreSQL driver does not take {source.jdbc_url}")
        self._conn = conn
        try:
            conn.setAutoCommit(False)  # the driver sends BEGIN with the next statement
        except Exception:
            conn.close()
            raise
        self._export(source, "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        with self._lock:
            st = self._conn.createStatement()
            try:
                rows = []
                if st.execute(sql):  # a result set
                    rs = st.getResultSet()
                    width = rs.getMetaData().getColumnCount()
                    while rs.next():
                        rows.append(tuple(rs.getObject(i) for i in range(1, width + 1)))
                return rows
            finally:
                st.close()

    def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(Exception):
            self._conn.rollback()
        with contextlib.suppress(Exception):
            self._conn.close()


class PsycopgSnapshot(ExportedSnapshot):
    """PostgreSQL through psycopg: the same exported snapshot as ``PgSnapshot``, taken
    by this process before (and while) the JVM starts, so that the statements pushed
    into the store (``spark.audit.pool``) run in it meanwhile. Spark's partitions
    import it the same way."""

    def __init__(self, source: StoreSource) -> None:
        import psycopg

        # Autocommit: psycopg sends no BEGIN of its own, so ours sets the isolation.
        self._conn = psycopg.connect(**source.libpq, autocommit=True)  # type: ignore[arg-type]
        self._export(source, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        with self._lock, self._conn.cursor() as cur:
            cur.execute(sql.encode())  # no parameters: %% stays as written
            return [tuple(r) for r in cur.fetchall()] if cur.description else []

    def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(Exception):
            self._conn.close()  # ends (rolls back) the exporting transaction


def psycopg_installed() -> bool:
    """The driver runs the pushed statements itself when it can reach PostgreSQL
    without the JVM (``amqlite`` depends on psycopg; a bare spark-submit may not
    have it, and then Spark's partitions run them)."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return False
    return True


class SqliteSnapshot(Snapshot):
    """SQLite: an online backup of the file (the standard library's ``backup`` in one
    step: one read transaction, so a consistent copy while a broker writes; in WAL
    mode it does not block the writer) into a temporary directory; Spark reads the
    copy, which is removed at the end. Costs a copy's disk space for the audit."""

    def __init__(self, source: StoreSource) -> None:
        path = source.jdbc_url.removeprefix("jdbc:sqlite:")
        self._dir = tempfile.mkdtemp(prefix="amqlite-audit-")
        copy = os.path.join(self._dir, "snapshot.db")
        try:
            uri = f"file:{urllib.parse.quote(path)}?mode=ro"
            with contextlib.closing(
                sqlite3.connect(uri, uri=True, timeout=SQLITE_BUSY_TIMEOUT_MS / 1000)
            ) as src:
                self._conn = sqlite3.connect(copy, check_same_thread=False)
                src.backup(self._conn)
            self._conn.execute("PRAGMA journal_mode = DELETE")  # a plain file for xerial
        except Exception:
            self.close()
            raise
        super().__init__(
            dataclasses.replace(source, jdbc_url=f"jdbc:sqlite:{copy}"),
            None,
            f"a copy of the file in {self._dir} (removed at the end)",
        )

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in self._conn.execute(sql).fetchall()]

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._conn.close()
        shutil.rmtree(self._dir, ignore_errors=True)


def open_snapshot(spark: SparkSession | None, source: StoreSource) -> Snapshot:
    """The one view every read of this audit uses (``spark`` None: psycopg's)."""
    if source.backend == "postgresql":
        if spark is None:
            return PsycopgSnapshot(source)
        return PgSnapshot(spark, source)
    return SqliteSnapshot(source)
