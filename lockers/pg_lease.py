"""A lease on top of the PostgreSQL advisory lock, so a *paused* master loses it.

The advisory lock lives as long as the holder's backend session. A master that
is SIGSTOPped, or whose VM is frozen, keeps that session: its kernel still
answers TCP keepalives, so neither side's timeouts fire and a slave would wait
forever. The lease bounds that:

* the master renews ``lease_until`` in ``amqlite_lock_lease`` every
  ``lease / PG_LEASE_RENEWALS`` seconds, from its own thread and its own
  connection (a busy event loop or a slow group commit cannot starve it), and
  only while its lock session still holds the lock;
* a waiting slave reads the lease from another thread and connection; once the
  holder's lease is past expiry *by the database's clock* it ends the holder's
  lock session (``pg_terminate_backend``), so its own ``pg_advisory_lock`` wait
  is granted at once;
* the master that wakes up sees from its own monotonic clock that it has not
  renewed for a whole lease and gives the lock up before it touches anything;
  what it still tries to write fails the store's epoch fence.

Both times are read from the database (``clock_timestamp()``), never from the
nodes, so clock skew between nodes does not matter. A dead master is not the
lease's business: its session ends at once (or after the TCP timeouts), as
before.

The locker's role must be allowed to end the holder's backend: the same role
for every node, or a role with ``pg_signal_backend``. It also creates the
lease table on first use (``CREATE`` on the schema, or create it beforehand).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import psycopg
from psycopg import errors

from lockers.connections.errors import one_line
from lockers.connections.postgres import idle_session_unlimited

log = logging.getLogger(__name__)

#: Default lease, in seconds. Renewed every second (see PG_LEASE_RENEWALS), so
#: two renewals in a row may be late or fail before a slave takes over; with the
#: slave's check period and an activation it keeps a paused master's takeover
#: within the 5 s the issue asks for.
PG_LEASE = 3.0

#: Shortest lease accepted (seconds): a renewal is retried for up to a third of
#: the lease, and a loaded server's round trip plus a thread switch on a busy
#: host must fit in a fraction of that.
PG_MIN_LEASE = 1.0

#: Renewals per lease period: lease 3 s -> renewed every 1 s.
PG_LEASE_RENEWALS = 3

#: Lease reads per lease period of a waiting slave: lease 3 s -> every 0.5 s.
PG_LEASE_CHECKS = 6

#: A renewal or read is one indexed row write or read and a look at pg_locks;
#: a statement taking longer than this share of the lease is abandoned and
#: retried (the lease still has the rest of its time).
PG_LEASE_STATEMENT_SHARE = 0.3

#: After a failed renewal or read, retry after this share of the period.
PG_LEASE_RETRY_SHARE = 0.25

#: A lease write lands within ``lease`` of being sent, but the slave checks only
#: every ``lease / PG_LEASE_CHECKS``: a holder that never wrote a lease (paused
#: right after being granted the lock, or a broker without leases) is ended
#: after ``lease * PG_UNLEASED_GRACE_SHARE`` of being seen without one.
PG_UNLEASED_GRACE_SHARE = 1.5

#: The lease's writes do not wait for a synchronous standby. A lease only says, on the
#: server that holds the lock, that its holder is alive; after a failover the locks are
#: on another server and so is the lease. Waiting would make a missing standby look like
#: a paused master: the renewal hangs in SyncRep (statement_timeout does not end that
#: wait), the lease runs out, a slave ends the holder's session and takes over, its own
#: renewals hang alike, and the group cycles through epochs while nobody serves.
LEASE_SYNCHRONOUS_COMMIT = "local"

LEASE_TABLE = "amqlite_lock_lease"

#: ``application_name`` prefix of the lease connections (not ``amqlite-lock``:
#: those are the sessions that hold or wait for the lock).
LEASE_APPLICATION_PREFIX = "amqlite-lease"

#: Transaction-level advisory key (two-int form, its own key space) that
#: serialises creating the lease table: concurrent CREATE TABLE IF NOT EXISTS
#: can fail on the catalog's unique index. The store's schema lock is (.., 1).
LEASE_TABLE_LOCK = (0x616D716C, 2)

_CREATE = f"""
CREATE TABLE IF NOT EXISTS {LEASE_TABLE} (
    lock_key bigint PRIMARY KEY,
    holder_pid integer NOT NULL,
    holder text NOT NULL,
    lease_until timestamptz NOT NULL
)"""

#: The lock held by backend ``pid`` in this database under our bigint key.
_HOLDS = (
    "l.locktype = 'advisory' AND l.granted AND l.objsubid = 1"
    " AND l.classid::bigint = %(classid)s AND l.objid::bigint = %(objid)s"
    " AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
)

_RENEW = f"""
INSERT INTO {LEASE_TABLE} AS ls (lock_key, holder_pid, holder, lease_until)
SELECT %(key)s, %(pid)s, %(holder)s, clock_timestamp() + %(lease)s * interval '1 second'
WHERE EXISTS (SELECT 1 FROM pg_locks l WHERE l.pid = %(pid)s AND {_HOLDS})
ON CONFLICT (lock_key) DO UPDATE SET holder_pid = excluded.holder_pid,
    holder = excluded.holder, lease_until = excluded.lease_until
RETURNING 1"""

#: Who holds the lock, whether the lease row is theirs, and how long ago it ran out.
_WATCH = f"""
SELECT l.pid, ls.holder, ls.holder_pid = l.pid,
       extract(epoch FROM clock_timestamp() - ls.lease_until)
FROM pg_locks l LEFT JOIN {LEASE_TABLE} ls ON ls.lock_key = %(key)s
WHERE l.pid <> %(own)s AND {_HOLDS}"""

#: End ``pid`` only if it still holds the lock and still has no lease in force:
#: checked in the same statement, so a renewal that just landed saves it.
_TERMINATE = f"""
SELECT pg_terminate_backend(l.pid) FROM pg_locks l
WHERE l.pid = %(pid)s AND {_HOLDS} AND NOT EXISTS (
    SELECT 1 FROM {LEASE_TABLE} ls WHERE ls.lock_key = %(key)s
    AND ls.holder_pid = l.pid AND ls.lease_until >= clock_timestamp())"""


class _LeaseThread(threading.Thread):
    """A daemon thread with its own autocommit connection for the lease table."""

    def __init__(self, *, conninfo: str, key: int, classid: int, objid: int, lease: float,
                 description: str, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self.conninfo = conninfo
        self.lease = lease
        self.description = description
        self.params: dict[str, object] = {"key": key, "classid": classid, "objid": objid}
        self.stopped = threading.Event()
        self._conn: psycopg.Connection | None = None
        self._failing = False

    def stop(self) -> None:
        """Ask the thread to end; it closes its connection itself."""
        self.stopped.set()

    def _connection(self) -> psycopg.Connection:
        if self._conn is not None and not self._conn.closed and not self._conn.broken:
            return self._conn
        self._drop()
        conn = psycopg.connect(self.conninfo, autocommit=True)
        try:
            timeout = round(self.lease * PG_LEASE_STATEMENT_SHARE * 1000)
            sets = [f"SET statement_timeout = {timeout}", f"SET lock_timeout = {timeout}",
                    f"SET synchronous_commit = {LEASE_SYNCHRONOUS_COMMIT}"]
            # A role's or database's idle-session limit must not end us.
            sets += idle_session_unlimited(conn.info.server_version)
            conn.execute("; ".join(sets))
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", LEASE_TABLE_LOCK)
                conn.execute(_CREATE)
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        return conn

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def _failed(self, what: str, e: BaseException) -> None:
        self._drop()
        if not self._failing:
            log.warning("%s: %s: %s; retrying", self.description, what, one_line(e))
            self._failing = True

    def _recovered(self, what: str) -> None:
        if self._failing:
            log.info("%s: %s works again", self.description, what)
            self._failing = False

    def run(self) -> None:
        try:
            self._run()
        except Exception:  # never silently: a dead keeper means a lease running out
            log.exception("%s: lease thread failed", self.description)
            self.on_crash()
        finally:
            self._drop()

    def _run(self) -> None:
        raise NotImplementedError

    def on_crash(self) -> None:
        """The thread died of a bug; subclasses decide what that means."""


class LeaseKeeper(_LeaseThread):
    """The master's side: renew the lease while our lock session ``pid`` holds the lock.

    ``lost(reason)`` is called from this thread, once, when the lease can no
    longer be proven ours: the lock session lost the lock, or no renewal
    succeeded for a whole lease (the process was paused, or the database is
    unreachable) so a slave may already have ended our session.
    """

    def __init__(self, *, pid: int, holder: str, lost: Callable[[str], None],
                 **kwargs: object) -> None:
        super().__init__(name="amqlite-pg-lease", **kwargs)  # type: ignore[arg-type]
        self.params.update(pid=pid, holder=holder, lease=self.lease)
        self.lost = lost
        #: time.monotonic() until which the lease is surely in force. Until the
        #: first renewal lands, a slave gives an unleased holder more than a
        #: lease from when it first sees it; the lock was granted just now.
        self.valid_until = time.monotonic() + self.lease

    def on_crash(self) -> None:
        self._lose("lease thread failed")

    def _lose(self, reason: str) -> None:
        """Report the loss once, unless the lock was given up meanwhile (stop())."""
        if not self.stopped.is_set():
            self.stopped.set()
            self.lost(reason)

    def _run(self) -> None:
        period = self.lease / PG_LEASE_RENEWALS
        retry = period * PG_LEASE_RETRY_SHARE
        while not self.stopped.is_set():
            sent = time.monotonic()
            if sent >= self.valid_until:
                # Asleep (SIGSTOP, VM freeze) or cut off for a whole lease: a
                # slave may have ended our session and taken over already.
                self._lose(f"lease not renewed for {sent - self.valid_until + self.lease:.1f}s"
                          f" (lease {self.lease:g}s): the process was paused or the database"
                          " is out of reach")
                return
            try:
                row = self._connection().execute(_RENEW, self.params).fetchone()
            except psycopg.Error as e:
                self._failed("renewing the lease", e)
                self.stopped.wait(min(retry, max(0.0, self.valid_until - time.monotonic())))
                continue
            if row is None:
                self._lose("the lock session no longer holds the lock")
                return
            self._recovered("renewing the lease")
            # The row says clock_timestamp() at execution + lease, and execution
            # came after `sent`: counting from `sent` never overstates the lease.
            self.valid_until = sent + self.lease
            self.stopped.wait(max(0.0, period - (time.monotonic() - sent)))


class LeaseWatcher(_LeaseThread):
    """A waiting slave's side: end the session of a holder whose lease ran out.

    ``own_pid()`` is the backend pid of our own lock session (0 when none), so
    we never end ourselves in the instant between our grant and ``stop()``.
    """

    def __init__(self, *, own_pid: Callable[[], int], **kwargs: object) -> None:
        super().__init__(name="amqlite-pg-lease-watch", **kwargs)  # type: ignore[arg-type]
        self.own_pid = own_pid
        self.terminated: list[int] = []  # backend pids we ended (for tests and logs)

    def _run(self) -> None:
        period = self.lease / PG_LEASE_CHECKS
        grace = self.lease * PG_UNLEASED_GRACE_SHARE
        unleased: dict[int, float] = {}  # holder pid -> when first seen without a lease
        denied: set[int] = set()
        while not self.stopped.wait(period):
            try:
                conn = self._connection()
                rows = conn.execute(_WATCH, {**self.params, "own": self.own_pid()}).fetchall()
            except psycopg.Error as e:
                self._failed("reading the lease", e)
                continue
            self._recovered("reading the lease")
            now = time.monotonic()
            holders = {int(pid) for pid, *_ in rows}
            for pid in list(unleased):
                if pid not in holders:
                    del unleased[pid]
            for pid, holder, leased, overdue in rows:
                if leased:
                    unleased.pop(pid, None)
                    if overdue is None or overdue <= 0:
                        continue
                    why = f"its lease ran out {float(overdue):.1f}s ago by the database clock"
                else:
                    first = unleased.setdefault(pid, now)
                    if now - first < grace:
                        continue
                    why = f"it has held the lock {now - first:.1f}s without a lease"
                if pid in denied:
                    continue
                try:
                    ended = conn.execute(_TERMINATE, {**self.params, "pid": pid}).fetchone()
                except errors.InsufficientPrivilege as e:
                    denied.add(pid)
                    log.error("%s: cannot end the session of lock holder (backend pid %s): %s;"
                              " give the locker role pg_signal_backend or use one role for"
                              " every node", self.description, pid, one_line(e))
                    continue
                except psycopg.Error as e:
                    self._failed("ending the lock holder's session", e)
                    break
                if ended is not None and ended[0]:
                    self.terminated.append(pid)
                    who = holder if leased else "a holder without a lease"
                    log.warning("%s: ended the lock session of %s (backend pid %s): %s",
                                self.description, who, pid, why)
