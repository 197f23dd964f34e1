"""The statements pushed into PostgreSQL, run by the driver itself: a few psycopg
connections, each importing the audit's exported snapshot, take them longest first.
They start before the JVM does and run while it (and, on a cluster, its executors)
starts; Spark then gets only what they returned: runs and rows at fault.

A read whose rows would not fit ``DRIVER_READ_MAX_ROWS`` is given up and left to
Spark's partitions (``StoreReader.arms``), in the same snapshot.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from spark.audit.limits import DRIVER_READ_MAX_ROWS, POOL_FETCH_ROWS
from spark.audit.session import QUIET, Progress
from spark.audit.snapshot import import_statement
from spark.audit.source import StoreSource


@dataclass
class PushedRead:
    """One read of the audit as statements for the store, and what they returned
    when the driver ran them (``rows`` None: Spark's partitions read it)."""

    statements: list[str]
    types: dict[str, str]
    columns: list[str] = field(default_factory=list)
    rows: list[tuple[Any, ...]] | None = None
    #: Over ``DRIVER_READ_MAX_ROWS``: left to Spark.
    overflowed: bool = False


class StatementPool:
    """``connections`` threads, each on its own connection in the snapshot, running
    every statement of ``reads`` (in the order given: longest first is the caller's
    job); ``wait`` returns when all are done and raises the first error."""

    def __init__(
        self,
        source: StoreSource,
        snapshot_id: str,
        reads: dict[str, PushedRead],
        connections: int,
        progress: Progress = QUIET,
        max_rows: int | None = None,
    ) -> None:
        self.source = source
        self.snapshot_id = snapshot_id
        self.reads = reads
        self.progress = progress
        self.max_rows = DRIVER_READ_MAX_ROWS if max_rows is None else max_rows
        self._work: queue.SimpleQueue[tuple[str, str]] = queue.SimpleQueue()
        for name, read in reads.items():
            read.rows, read.overflowed = [], False
            for sql in read.statements:
                self._work.put((name, sql))
        total = sum(len(r.statements) for r in reads.values())
        self._lock = threading.Lock()
        self._errors: list[BaseException] = []
        self._failed = threading.Event()
        self.started = time.monotonic()
        #: When the last connection finished, from ``started``.
        self.seconds = 0.0
        self._done = threading.Event()
        self._alive = 0
        n = max(1, min(connections, total))
        self.statements, self.connections = total, n
        progress.say(f"running {total} statements in the store on {n} connections")
        self._threads = [
            threading.Thread(target=self._run, name=f"audit-sql-{i}", daemon=True)
            for i in range(n)
        ]
        self._alive = len(self._threads)
        for t in self._threads:
            t.start()

    def _run(self) -> None:
        import psycopg

        try:
            with psycopg.connect(**self.source.libpq, autocommit=True) as conn:  # type: ignore[arg-type]
                for sql in import_statement(self.snapshot_id).split("; "):
                    conn.execute(sql.encode())
                # A cursor's plan is made for all its rows, not for the first ones.
                conn.execute(b"SET LOCAL cursor_tuple_fraction = 1")
                while not self._failed.is_set():
                    try:
                        name, sql = self._work.get_nowait()
                    except queue.Empty:
                        break
                    self._statement(conn, name, sql)
                with contextlib.suppress(Exception):
                    conn.execute(b"ROLLBACK")
        except BaseException as exc:  # the first error is the audit's
            with self._lock:
                self._errors.append(exc)
            self._failed.set()
        finally:
            with self._lock:
                self._alive -= 1
                if not self._alive:
                    self.seconds = time.monotonic() - self.started
                    self._done.set()

    def _statement(self, conn: Any, name: str, sql: str) -> None:
        read = self.reads[name]
        if read.overflowed:
            return
        with conn.cursor(name="audit_pool") as cur:
            cur.execute(sql.encode())
            while batch := cur.fetchmany(POOL_FETCH_ROWS):
                with self._lock:
                    if read.overflowed:
                        return
                    if not read.columns and cur.description:
                        read.columns = [d.name for d in cur.description]
                    assert read.rows is not None
                    if len(read.rows) + len(batch) > self.max_rows:
                        read.overflowed, read.rows = True, []
                        return
                    read.rows.extend(tuple(r) for r in batch)

    def running(self) -> bool:
        return not self._done.is_set()

    def wait_done(self, timeout: float | None = None) -> bool:
        """Whether every connection has finished (within ``timeout``)."""
        return self._done.wait(timeout)

    def wait(self) -> dict[str, PushedRead]:
        """Every statement run (or a read given up); the first error raised."""
        for t in self._threads:
            t.join()
        if self._errors:
            raise self._errors[0]
        for read in self.reads.values():
            if read.overflowed:
                read.rows = None
        done = sum(len(r.rows) for r in self.reads.values() if r.rows is not None)
        self.progress.say(f"the store's statements took {self.seconds:.1f}s: {done} rows back")
        return self.reads
