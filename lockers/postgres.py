"""PostgreSQL session advisory lock on a dedicated connection.

The lock lives exactly as long as one backend session, so three things make
or break it:

* the connection is ours alone: autocommit, outside any pool, never through a
  transaction-mode pooler (PgBouncer & co. hand the session, and the lock with
  it, to whoever runs the next transaction);
* session locks stack (N acquires need N releases), so we take it once and
  prove it afterwards by looking at ``pg_locks``, never by re-taking it;
* a dead network must end the session on *both* sides in seconds, not after
  the kernel's 2 h keepalive: libpq keepalives and ``tcp_user_timeout`` for
  the client, the same settings as session GUCs for the server.

A slave does not poll: it waits inside ``pg_advisory_lock`` (in slices bounded
by ``lock_timeout``, which does apply to advisory-lock waits), so it is granted
the lock the instant the master's session ends.

A *paused* master's session does not end (its kernel still answers TCP), so
the holder also renews a lease and a waiting slave ends the session of a
holder whose lease ran out: ``lockers/pg_lease.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg
from psycopg import errors
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from lockers.base import (
    DEFAULT_KEEPALIVE_INTERVAL,
    DEFAULT_POLL_INTERVAL,
    Locker,
    LockerError,
    LockerUnusable,
    LockLost,
    LockState,
    RetryBackoff,
)
from lockers.connections.blocking import collect_outcome, run_blocking, wait_running
from lockers.connections.errors import one_line, refused_for_good
from lockers.connections.pg_url import hosts_text, libpq_url, split_hosts
from lockers.connections.postgres import (
    PG_DEAD_PEER_TIMEOUT,
    PG_STATEMENT_TIMEOUT,
    idle_session_unlimited,
    server_tcp_settings,
    tcp_settings,
)
from lockers.pg_lease import LEASE_APPLICATION_PREFIX, PG_LEASE, LeaseKeeper, LeaseWatcher

log = logging.getLogger(__name__)

T = TypeVar("T")

#: The lock session's libpq keepalives and timeouts (PG_DEAD_PEER_TIMEOUT,
#: PG_STATEMENT_TIMEOUT, tcp_settings) live in lockers.connections.postgres, beside the store
#: pool's, with the reason they differ.

#: Client-side bound on those same calls: the statement timeout plus a round
#: trip. A server that stopped answering (a stalled backend, a network that
#: drops packets without resetting) would otherwise keep a master waiting until
#: the TCP timeouts fire; past this the lock counts as lost.
PG_CALL_TIMEOUT = PG_STATEMENT_TIMEOUT + 1.0

#: ``lock_timeout`` of one server-side wait of a slave. The wait restarts right
#: away, so this only bounds how long a slave goes without a round trip (and so
#: how stale its connection can get); 10 s keeps the server log quiet.
PG_WAIT_SLICE = 10.0

#: Cancelling a slave's wait: how long one cancel request may take, how often
#: it is re-sent (the query may not have reached the server yet), and how long
#: we wait for the wait to end before abandoning the connection.
PG_CANCEL_TIMEOUT = 2.0
PG_CANCEL_RESEND = 0.2
PG_CANCEL_GRACE = 3.0

#: A cancel request is delivered asynchronously and may hit the *next* query
#: instead of the wait it was meant for; each one hits at most one query, and we
#: send at most PG_CANCEL_GRACE / PG_CANCEL_RESEND of them (15).
PG_SETTLE_TRIES = round(PG_CANCEL_GRACE / PG_CANCEL_RESEND) + 1

#: Reconnect backoff of a waiting slave: start fast (a restarted server is back
#: in well under a second), cap at 2 s so a slave notices a returning server
#: within the Artemis backup's 2 s lock check.
PG_RECONNECT_INITIAL = 0.1
PG_RECONNECT_MAX = 2.0

#: ``application_name`` prefix: operators (and tests) find the lock sessions
#: with ``pg_stat_activity.application_name LIKE 'amqlite-lock:%'``.
APPLICATION_NAME_PREFIX = "amqlite-lock"

#: blake2b personalisation, so our keys differ from anything else hashing the
#: same group names into advisory keys in a shared database.
ADVISORY_KEY_PERSON = b"amqlite-lock"

#: PostgreSQL truncates application_name to NAMEDATALEN - 1 bytes.
MAX_APPLICATION_NAME = 63


def advisory_key(group: str) -> int:
    """The group's signed 64-bit advisory key; stable across processes and hosts.

    Not ``hash()``: it is salted per process, so two brokers would disagree.
    """
    digest = hashlib.blake2b(group.encode(), digest_size=8, person=ADVISORY_KEY_PERSON).digest()
    return int.from_bytes(digest, "big", signed=True)


def key_parts(key: int) -> tuple[int, int]:
    """``(classid, objid)`` under which ``pg_locks`` shows a bigint advisory key.

    PostgreSQL splits the key's two's-complement bits: high 32 bits in
    ``classid``, low 32 bits in ``objid``, and marks the bigint form with
    ``objsubid = 1`` (the two-int4 form uses 2).
    """
    unsigned = key & 0xFFFF_FFFF_FFFF_FFFF
    return unsigned >> 32, unsigned & 0xFFFF_FFFF


def _redacted(e: BaseException) -> str:
    """libpq's URL errors quote the offending token, which may be the password."""
    return re.sub(r'"[^"]*"', '"..."', one_line(e))


class _Aborted(Exception):
    """The call was cancelled before it reached the server."""


class _Session:
    """One dedicated connection, plus who is using it from which thread."""

    def __init__(self, conn: psycopg.Connection) -> None:
        self.conn = conn
        self.guard = threading.Lock()
        self.busy = False  # a thread is inside a call on conn
        self.detached = False  # nobody may use it again; the last user closes it
        self.abort = False  # a pending call must not start
        self.mode: str | None = None  # which timeouts are SET on the session
        self.pid: int = conn.info.backend_pid  # our backend, as pg_locks shows it

    def close_soon(self) -> None:
        with self.guard:
            self.detached = True
            idle = not self.busy
        if idle:
            # conn.close() sends Terminate and may block on a dead socket.
            threading.Thread(target=self.conn.close, name="amqlite-pg-close", daemon=True).start()


class PostgresLocker(Locker):
    """``pg_try_advisory_lock(key)`` on a dedicated autocommit connection.

    Do not point it at a transaction-mode pooler: session locks leak there.
    The keepalive checks ``pg_locks`` for our own backend; a failed or empty
    check is a lost lock. ``acquire()`` waits on the server and is cancellable:
    cancelling it cancels the server-side wait and leaves no lock behind.
    """

    def __init__(
        self,
        url: str,
        group: str,
        *,
        node: str,
        dead_peer_timeout: float = PG_DEAD_PEER_TIMEOUT,
        keepalive_interval: float = DEFAULT_KEEPALIVE_INTERVAL,
        wait_slice: float = PG_WAIT_SLICE,
        lease: float = PG_LEASE,
    ) -> None:
        super().__init__()
        try:
            params = conninfo_to_dict(libpq_url(url))
        except psycopg.Error as e:
            raise LockerError(f"bad PostgreSQL URL: {_redacted(e)}") from None
        for name, value in tcp_settings(dead_peer_timeout).items():
            params.setdefault(name, value)  # an operator's explicit setting wins
        params["application_name"] = f"{APPLICATION_NAME_PREFIX}:{group}:{node}"[
            :MAX_APPLICATION_NAME
        ]
        self._conninfo = make_conninfo("", **params)
        params["application_name"] = f"{LEASE_APPLICATION_PREFIX}:{group}:{node}"[
            :MAX_APPLICATION_NAME
        ]
        self._lease_conninfo = make_conninfo("", **params)
        # The server gets the same numbers as libpq, so both ends give up together.
        try:
            self._server_tcp = server_tcp_settings(params)
        except ValueError:
            raise LockerError("bad PostgreSQL URL: keepalives_* and tcp_user_timeout "
                              "must be whole numbers") from None
        self.group = group
        self.node = node
        self.dead_peer_timeout = dead_peer_timeout
        self.keepalive_interval = keepalive_interval
        self.wait_slice = wait_slice
        #: Seconds a paused holder keeps the lock (lockers.pg_lease); 0: no lease.
        self.lease = lease
        self.key = advisory_key(group)
        self._classid, self._objid = key_parts(self.key)
        host = str(params.get("host") or params.get("hostaddr") or "localhost")
        if "," in host:  # several hosts: libpq's spelling, db1:5432,db2:5432
            hosts = hosts_text(split_hosts(host, str(params.get("port") or "")))
        else:
            hosts = f"{host}:{params.get('port', 5432)}"
        # never the password: it is not in the description at all
        where = f"{params.get('user', '')}@{hosts}/{params.get('dbname', '')}"
        self.description = f"postgres advisory lock {group!r} on {where}"
        self._session: _Session | None = None
        self._io = asyncio.Lock()  # one call at a time on the connection
        self._held_flag = False
        self._keeper: LeaseKeeper | None = None  # renews our lease while we hold the lock
        self._closed = False
        self._waiting: tuple[asyncio.Future[Any], _Session] | None = None  # a slave's wait

    # -- the lease (lockers.pg_lease) -------------------------------------------
    @property
    def _held(self) -> bool:
        return self._held_flag

    @_held.setter
    def _held(self, held: bool) -> None:
        """Holding the lock and renewing its lease go together (set on the loop only)."""
        self._held_flag = held
        keeper = self._keeper
        if not held and keeper is not None:
            self._keeper = None
            keeper.stop()
        elif held and keeper is None and self.lease > 0 and self._session is not None:
            loop = asyncio.get_running_loop()
            keeper = LeaseKeeper(
                pid=self._session.pid, holder=self.node,
                lost=lambda reason: self._lease_lost_threadsafe(loop, keeper, reason),
                **self._lease_args(),
            )
            self._keeper = keeper
            keeper.start()

    def _lease_args(self) -> dict[str, Any]:
        return {"conninfo": self._lease_conninfo, "key": self.key, "classid": self._classid,
                "objid": self._objid, "lease": self.lease, "description": self.description}

    def _lease_lost_threadsafe(
        self, loop: asyncio.AbstractEventLoop, keeper: LeaseKeeper | None, reason: str
    ) -> None:
        """From the keeper thread: stop the broker now, tell the loop to demote."""
        if keeper is not self._keeper:
            return  # the lock was given up and this keeper stopped meanwhile
        self.freeze_now()
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody to tell
            loop.call_soon_threadsafe(self._lease_lost, keeper, reason)

    def _lease_lost(self, keeper: LeaseKeeper | None, reason: str) -> None:
        if keeper is None or keeper is not self._keeper or not self._held:
            return  # an old keeper, or the lock is already given up
        log.error("%s: %s: giving the lock up", self.description, reason)
        s = self._session
        if s is not None:
            self._detach(s)  # ends the lock session, so a slave is granted at once
        else:
            self._held = False
            self._notify(LockState.LOST)

    # -- blocking parts (one thread at a time per session) -------------------
    def _connect_blocking(self) -> _Session:
        conn = psycopg.connect(self._conninfo, autocommit=True)
        try:
            sets = [f"SET {name} = {value}" for name, value in self._server_tcp.items()]
            # An idle-session limit set on the role or database would end our
            # session, and the lock with it, between two keepalives.
            sets.append("SET idle_in_transaction_session_timeout = 0")
            sets += idle_session_unlimited(conn.info.server_version)
            conn.execute("; ".join(sets))
        except BaseException:
            conn.close()
            raise
        return _Session(conn)

    def _set_mode(self, s: _Session, mode: str) -> None:
        if s.mode == mode:
            return
        short = round(PG_STATEMENT_TIMEOUT * 1000)
        if mode == "short":
            statement, lock = short, short
        else:  # "wait": the lock wait is bounded by lock_timeout, the rest by statement_timeout
            lock = round(self.wait_slice * 1000)
            statement = lock + short
        s.mode = None
        s.conn.execute(f"SET statement_timeout = {statement}; SET lock_timeout = {lock}")
        s.mode = mode

    def _use(self, s: _Session, fn: Callable[[_Session], T]) -> T:
        with s.guard:
            if s.detached or s.abort:
                raise _Aborted()
            s.busy = True
        try:
            return fn(s)
        finally:
            with s.guard:
                s.busy = False
                close = s.detached
            if close:
                s.conn.close()

    def _try_lock_blocking(self, s: _Session) -> bool:
        self._set_mode(s, "short")
        row = s.conn.execute("SELECT pg_try_advisory_lock(%s::bigint)", (self.key,)).fetchone()
        return bool(row and row[0])

    def _wait_lock_blocking(self, s: _Session) -> bool:
        self._set_mode(s, "wait")
        try:
            s.conn.execute("SELECT pg_advisory_lock(%s::bigint)", (self.key,))
        except errors.LockNotAvailable:
            return False  # the slice ran out while waiting: nothing granted
        except errors.QueryCanceled:
            # Cancelled, possibly just *after* the grant: a session lock
            # survives the statement's error, so look instead of assuming.
            return self._holds_blocking(s)
        return True

    def _holds_blocking(self, s: _Session) -> bool:
        """Whether our session holds the lock, riding out stray cancel requests."""
        for attempt in range(PG_SETTLE_TRIES):
            try:
                return self._check_blocking(s) > 0
            except errors.QueryCanceled:
                if attempt == PG_SETTLE_TRIES - 1:
                    raise
        raise AssertionError("unreachable")

    def _give_back_blocking(self, s: _Session) -> None:
        """After a cancelled lock call: make sure the session holds nothing."""
        for attempt in range(PG_SETTLE_TRIES):
            try:
                if not self._holds_blocking(s):
                    return
                self._unlock_blocking(s)  # held at most once: we never stack
            except errors.QueryCanceled:
                if attempt == PG_SETTLE_TRIES - 1:
                    raise
        if self._holds_blocking(s):
            raise LockerError(f"{self.description}: cannot give the lock back")

    def _check_blocking(self, s: _Session) -> int:
        self._set_mode(s, "short")
        row = s.conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
            " AND pid = pg_backend_pid() AND granted"
            " AND classid::bigint = %s AND objid::bigint = %s AND objsubid = 1",
            (self._classid, self._objid),
        ).fetchone()
        return int(row[0]) if row else 0

    def _unlock_blocking(self, s: _Session) -> bool:
        self._set_mode(s, "short")
        row = s.conn.execute("SELECT pg_advisory_unlock(%s::bigint)", (self.key,)).fetchone()
        return bool(row and row[0])

    # -- plumbing ------------------------------------------------------------
    def _detach(self, s: _Session) -> None:
        """Stop using a session; closing it releases anything it holds."""
        if self._session is s:
            self._session = None
        s.close_soon()
        if self._held:
            self._held = False
            log.error("%s: lock connection lost: the lock is gone", self.description)
            self._notify(LockState.LOST)

    async def _ensure_session(self) -> _Session:
        s = self._session
        if s is not None and not s.conn.closed and not s.conn.broken:
            return s
        if s is not None:
            self._detach(s)
        fut = run_blocking(self._connect_blocking, name="amqlite-pg-connect")
        try:
            s = await asyncio.shield(fut)
        except asyncio.CancelledError:
            def close_late(f: asyncio.Future[_Session]) -> None:
                if not f.cancelled() and f.exception() is None:
                    f.result().close_soon()

            fut.add_done_callback(close_late)
            raise
        except psycopg.Error as e:
            cls = LockerUnusable if refused_for_good(e) else LockerError
            raise cls(f"{self.description}: cannot connect: {one_line(e)}") from None
        self._session = s
        return s

    async def _op(
        self,
        fn: Callable[[_Session], T],
        *,
        takes_lock: bool = False,
        server_wait: bool = False,
        timeout: float = PG_CALL_TIMEOUT,
    ) -> T:
        """Run ``fn`` on the session in a thread; on cancellation undo what it did.

        A call with no answer within ``timeout`` seconds of this process's running
        time abandons the session (its thread closes it on return), which ends
        whatever lock it held. A pause of the process itself is the lease's business
        (lockers.pg_lease), not a sign the server went quiet.
        """
        if self._closed:
            raise LockerError(f"{self.description}: closed")
        await self._io.acquire()
        handed_off = False
        try:
            s = await self._ensure_session()
            fut = run_blocking(lambda: self._use(s, fn), name="amqlite-pg-call")
            try:
                if server_wait:
                    self._waiting = fut, s
                if not await wait_running(fut, timeout):
                    # Abandoned: its late outcome (an error once the session is
                    # closed) is collected here, never "Future exception was
                    # never retrieved" after a partition.
                    fut.add_done_callback(collect_outcome)
                    self._detach(s)
                    raise LockerError(f"{self.description}: no answer within {timeout:g}s")
                return fut.result()
            except asyncio.CancelledError:
                handed_off = True  # the clean-up task releases self._io
                cleanup = asyncio.create_task(self._after_cancel(s, fut, takes_lock, server_wait))
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.shield(cleanup)
                raise
            except psycopg.Error as e:
                broken = s.conn.broken or s.conn.closed or isinstance(e, psycopg.OperationalError)
                if broken or takes_lock:
                    # A lock call that failed may still have been granted: only
                    # ending the session makes sure nothing is left behind.
                    self._detach(s)
                raise LockerError(f"{self.description}: {one_line(e)}") from None
            except _Aborted:
                raise LockerError(f"{self.description}: connection abandoned") from None
        finally:
            self._waiting = None
            if not handed_off:
                self._io.release()

    async def _interrupt_wait(self) -> None:
        """Cut a slave's server-side wait short (close() must not sit out a slice)."""
        if self._waiting is None:
            return
        fut, s = self._waiting
        deadline = time.monotonic() + PG_CANCEL_GRACE
        while not fut.done() and time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(
                    run_blocking(
                        lambda: s.conn.cancel_safe(timeout=PG_CANCEL_TIMEOUT),
                        name="amqlite-pg-cancel",
                    ),
                    PG_CANCEL_TIMEOUT + 1,
                )
            await asyncio.wait({fut}, timeout=PG_CANCEL_RESEND)

    async def _after_cancel(
        self, s: _Session, fut: asyncio.Future[T], takes_lock: bool, server_wait: bool
    ) -> None:
        try:
            with s.guard:
                s.abort = True
            deadline = time.monotonic() + PG_CANCEL_GRACE
            while not fut.done() and time.monotonic() < deadline:
                if server_wait:
                    try:
                        await asyncio.wait_for(
                            run_blocking(
                                lambda: s.conn.cancel_safe(timeout=PG_CANCEL_TIMEOUT),
                                name="amqlite-pg-cancel",
                            ),
                            PG_CANCEL_TIMEOUT + 1,
                        )
                    except Exception as e:
                        log.warning("%s: cancelling the lock wait: %s", self.description, e)
                await asyncio.wait({fut}, timeout=PG_CANCEL_RESEND)
            if not fut.done():
                log.warning("%s: lock call did not stop; dropping its connection", self.description)
                self._detach(s)  # the thread closes it when it returns
                return
            with s.guard:
                s.abort = False
            exc = fut.exception()
            if s.conn.broken or s.conn.closed:
                self._detach(s)  # closing the session ends whatever it held
                return
            if not takes_lock or isinstance(exc, _Aborted):
                return  # nothing was asked of the server that could leave a lock
            # Whatever the call returned, the lock may have been granted just as
            # we cancelled: look, and give it back.
            try:
                await run_blocking(lambda: self._use(s, self._give_back_blocking))
            except Exception as e:
                log.warning("%s: giving the lock back after cancel: %s", self.description, e)
                self._detach(s)
        except Exception:
            log.exception("%s: clean-up after a cancelled call failed", self.description)
            self._detach(s)
        finally:
            self._io.release()

    # -- Locker ----------------------------------------------------------------
    async def try_acquire(self) -> bool:
        if self._held:
            return True  # never take it twice: session locks stack
        got = await self._op(self._try_lock_blocking, takes_lock=True)
        if got:
            self._held = True
            log.info("acquired %s", self.description)
        return got

    async def acquire(self, poll_interval: float = DEFAULT_POLL_INTERVAL) -> None:
        """Wait on the server until granted; ``poll_interval`` is unused (no polling).

        Connection errors do not end the wait: reconnect with backoff and wait
        again, so a slave survives a database restart.
        """
        watcher = None
        if self.lease > 0 and not self._held:
            watcher = LeaseWatcher(own_pid=self._own_pid, **self._lease_args())
            watcher.start()
        try:
            await self._wait_for_lock()
        finally:
            if watcher is not None:
                watcher.stop()

    def _own_pid(self) -> int:
        """Backend pid of our lock session, 0 when none (read from the watcher thread)."""
        s = self._session
        return s.pid if s is not None else 0

    async def _wait_for_lock(self) -> None:
        backoff = RetryBackoff(PG_RECONNECT_INITIAL, PG_RECONNECT_MAX, log)
        while not self._held:
            try:
                # A backend that stopped answering would never end its slice:
                # bound the wait on our side too, then reconnect.
                got = await self._op(
                    self._wait_lock_blocking,
                    takes_lock=True,
                    server_wait=True,
                    timeout=self.wait_slice + PG_CALL_TIMEOUT,
                )
            except LockerError as e:
                if self._closed or isinstance(e, LockerUnusable):
                    raise
                await backoff.failed(e)
                continue
            if self._closed:  # close() interrupted the wait; it drops the session after us
                raise LockerError(f"{self.description}: closed")
            if backoff.succeeded():
                log.info("%s: connection back, waiting for the lock", self.description)
            if got:
                self._held = True
                log.info("acquired %s", self.description)

    async def keepalive(self) -> None:
        if not self._held:
            raise LockLost(f"{self.description}: not held")
        try:
            count = await self._op(self._check_blocking)
        except LockerError as e:
            # The check could not run: we cannot prove the lock is ours.
            if self._held:
                self._held = False
                self._notify(LockState.LOST)
            s = self._session
            if s is not None:
                self._detach(s)  # ending the session ends any lock it still has
            raise LockLost(str(e)) from None
        if count < 1:
            log.error("%s: pg_locks no longer shows our lock", self.description)
            self._held = False
            self._notify(LockState.LOST)
            raise LockLost(f"{self.description}: lock not in pg_locks")
        keeper = self._keeper
        if keeper is not None and time.monotonic() >= keeper.valid_until:
            # Our session still holds it, but the lease ran out (the process was
            # paused): a slave may end the session any moment. The keeper thread
            # says so too, maybe only after our caller acted on a yes.
            self._lease_lost(keeper, "lease ran out before this check could prove it")
            raise LockLost(f"{self.description}: lease ran out")

    async def release(self) -> None:
        if not self._held:
            return
        self._held = False  # we are giving it up: a broken connection is no loss
        try:
            await self._op(self._unlock_blocking)
        except LockerError as e:
            s = self._session
            if s is not None:
                self._detach(s)
            log.warning("%s: unlock failed (%s); connection dropped instead", self.description, e)
        else:
            log.info("released %s", self.description)

    async def close(self) -> None:
        if self._closed:
            return
        await self.release()
        self._closed = True
        await self._interrupt_wait()
        async with self._io:
            s, self._session = self._session, None
            if s is not None:
                s.close_soon()
