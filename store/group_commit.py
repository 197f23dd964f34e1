"""The group committer: the one thread that owns the store.

The broker's event loop must never wait for the database, and one transaction
per message would cap throughput at the disk's fsync rate. So the loop hands
``Batch``es to ``submit`` (a queue put, never blocking) and gets a future; the
store thread takes everything queued, merges it into one ``Batch``, commits
once and resolves all the futures with a single loop wake-up. Nothing waits on
purpose: what arrives while a commit runs goes into the next one, like
PostgreSQL with ``commit_delay = 0``.

Order is global: items are taken from one FIFO queue, so a caller's batches
commit in submission order, and a ``call`` (a read) runs after every write
submitted before it. The pager relies on this: a committed id implies every
smaller id submitted earlier is committed or failed.

Fail-stop: the first ``StoreError`` (``Fenced`` included) fails that commit's
futures, calls ``on_failure`` once on the loop, and from then on every
submit fails at once. The master demotes; it never retries a write whose
outcome it does not know.

On PostgreSQL (``Store.loop_commits``) the usual commit never leaves the event
loop: the work waits in a line on the loop, in submission order, and while the
thread has nothing, the batches heading it that fit one round trip
(``Store.loop_fits``) are merged and sent by the loop itself
(``Store.start_commit``), their answer read when the socket is readable. The
rest (calls, barriers, other shapes, a refused commit to be split) is handed to
the thread, in order, with a mark that comes back once the thread is past it;
until then everything goes to the thread, so nothing overtakes. Under W1 the
loop and the thread handed the GIL to each other about once a message (a futex
call each and a context switch every few), which cost more CPU than the
committer's own work on the loop (bench/README.md, "Issue 25, session 20").
While the loop's commit is underway, the write buffer's flush waits for it
(``defer``): what the loop stages meanwhile comes as one batch, not one per
loop turn, and a call or barrier flushes it first, so it still comes after
those writes.

A refusal is not a failure: when the store refuses a merged commit's data
(``StoreRejected``: nothing was written and the store is fine), the submitted
batches are committed again in halves, in submission order, each half its own
transaction, until every batch the store accepts has committed; only a batch
refused on its own gets ``StoreRejected`` on its future. A batch submitted with
unit spans (the broker: one per client frame) is split further the same way,
into the part outside the units and one batch per unit; its future then
resolves with the refused units in ``BatchResult.rejected``. One client's bad
value thus costs a few extra transactions, not the group.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

from store.api import (
    OUTSIDE_UNITS,
    Batch,
    BatchResult,
    LoopCommit,
    Store,
    StoreError,
    StoreRejected,
    UnitSpan,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Operations merged into one transaction at most. One commit of 5000 small
#: inserts takes tens of milliseconds on PostgreSQL; beyond that latency grows
#: with no gain in throughput (PGMQ's measurements flatten well before this).
MAX_BATCH_OPS = 5000
#: Message bodies merged into one transaction at most (bytes). A burst of pipelined
#: SENDs (W5's preload: eight connections) otherwise merges 5000 1 KiB messages into
#: 5 MiB arrays that glibc keeps resident in the store thread's arena, and libpq's
#: output buffer grows to match and never shrinks: ~12 MB of RSS left after the burst.
#: 1 MiB is still ~1000 such messages a commit, where the fixed cost of a commit is
#: long amortised. A single write larger than this still goes, alone.
MAX_BATCH_BYTES = 2**20
#: Artificial wait for more work before committing (ms): none, as with
#: PostgreSQL's commit_delay = 0. Work arriving during a commit batches itself.
DEFAULT_COMMIT_DELAY_MS = 0

# Queue items are tuples, the cheapest thing to build on the hot path:
#   (future, batch, spans)       a write (spans: list[UnitSpan] or None)
#   (future, fn, args, None)     a read / any call on the store thread
#   (future, None, None, None)   a barrier (drain): resolved even after a failure
#   (future, _MARK)              the loop's mark: resolved once the thread is past it,
#                                with the commit it merged into (no commit of its own)
#   _STOP                        stop
_STOP: tuple[Any, ...] = (None,)
_MARK = "mark"


class GroupCommitter:
    """Merges submitted batches into few transactions on one daemon thread."""

    def __init__(
        self,
        store: Store,
        epoch: int,
        loop: asyncio.AbstractEventLoop,
        on_failure: Callable[[BaseException], None],
        max_batch_ops: int = MAX_BATCH_OPS,
        max_batch_bytes: int = MAX_BATCH_BYTES,
        commit_delay_ms: float = DEFAULT_COMMIT_DELAY_MS,
    ) -> None:
        if max_batch_ops < 1:
            raise ValueError("max_batch_ops must be >= 1")
        self.store = store
        self.epoch = epoch
        self._loop = loop
        self._on_failure = on_failure
        self._max_ops = max_batch_ops
        self._max_bytes = max_batch_bytes
        self._delay_s = max(0.0, commit_delay_ms) / 1000
        self._queue: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._failure: BaseException | None = None
        self._closed = False
        self._stopped: asyncio.Future[None] = loop.create_future()
        #: Transactions committed, and the batches they carried (for tests and metrics).
        self.commits = 0
        self.batches = 0
        #: Of ``commits``, those the event loop sent itself (``Store.start_commit``).
        self.on_loop = 0
        #: Batches the store refused on their own, and merged commits it refused.
        self.rejected = 0
        self.splits = 0
        #: time.monotonic() when the store thread took up the work in hand (a commit, a
        #: call), None while it waits for work; the same for the loop's commit.
        self._thread_busy_since: float | None = None
        self._loop_busy_since: float | None = None
        #: The line on the loop (see the module docstring), or None: every item goes
        #: to the thread at once (SQLite; and with a commit delay, which the thread keeps).
        self._line: deque[tuple[Any, ...]] | None = (
            deque() if store.loop_commits and not self._delay_s else None)
        #: The commit the loop sent and awaits, and the items it carries.
        self._underway: LoopCommit | None = None
        self._underway_items: list[tuple[Any, ...]] = []
        #: Marks handed to the thread and not yet back: while any is out, all goes there.
        self._handed = 0
        self._kick_due = False
        #: A write buffer's flush held while the loop's commit is underway (``defer``).
        self._deferred: Callable[[bool], None] | None = None
        self._worker = threading.Thread(
            target=self._run, name=f"amqlite-store-{store.group}", daemon=True
        )
        self._worker.start()

    # -- loop side -----------------------------------------------------------
    @property
    def busy_since(self) -> float | None:
        """time.monotonic() when the commit or call in hand was taken up, None when
        there is none: how long a commit has been stuck (amqlite.replication
        diagnoses one stuck on a missing synchronous standby)."""
        since = self._loop_busy_since
        return since if since is not None else self._thread_busy_since

    @property
    def failure(self) -> BaseException | None:
        """The error that stopped the committer, if any."""
        return self._failure

    def submit(
        self, batch: Batch, units: list[UnitSpan] | None = None
    ) -> asyncio.Future[BatchResult]:
        """Queue ``batch`` and return the commit's future. Without ``units`` it
        is atomic: committed whole, or refused whole (``StoreRejected``). With
        them, a refusal splits it (see the module docstring), and the units the
        store refused on their own are in the result's ``rejected``."""
        fut: asyncio.Future[BatchResult] = self._loop.create_future()
        self._enqueue(fut, (fut, batch, units))
        return fut

    def call(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """Run ``fn(*args)`` on the store thread after the writes submitted so far."""
        self._flush_deferred()  # a deferred flush's writes were staged before: first
        fut: asyncio.Future[T] = self._loop.create_future()
        self._enqueue(fut, (fut, fn, args, None))
        return fut

    def defer(self, flush: Callable[[bool], None]) -> bool:
        """Hold a write buffer's flush while the loop's commit is underway: True, and
        ``flush(True)`` (flush now) is called once that commit is over, or before a
        call, a drain or the close is queued (they come after those writes), so what
        the loop staged meanwhile comes as one batch instead of one per loop turn, each
        with its future, callbacks and merge (W1: about three a commit). False when
        nothing is underway, or another buffer's flush is held already: flush now."""
        if self._underway is None or (self._deferred is not None and self._deferred != flush):
            return False
        self._deferred = flush
        return True

    def _flush_deferred(self) -> None:
        flush, self._deferred = self._deferred, None
        if flush is not None:
            flush(True)

    def _enqueue(self, fut: asyncio.Future[Any], item: tuple[Any, ...]) -> None:
        """Queue ``item`` for the store thread, or fail ``fut`` at once when the
        committer has failed or is closed."""
        if self._failure is not None:
            fut.set_exception(self._failure)
        elif self._closed:
            fut.set_exception(StoreError("the group committer is closed"))
        else:
            self._put(item)

    def _put(self, item: tuple[Any, ...]) -> None:
        """Into the line, or straight to the thread when there is none."""
        line = self._line
        if line is None:
            self._queue.put(item)
            return
        line.append(item)
        if not self._kick_due and self._underway is None:
            self._kick_due = True
            self._loop.call_soon(self._kick)

    async def drain(self) -> None:
        """Wait until everything submitted so far is committed (or failed)."""
        if self._closed and self._stopped.done():
            return
        self._flush_deferred()
        fut: asyncio.Future[None] = self._loop.create_future()
        self._put((fut, None, None, None))
        await fut

    def close(self) -> None:
        """Stop the thread once it has worked through what is queued. For a
        graceful stop, ``await drain()`` first; ``await wait_closed()`` after."""
        if not self._closed:
            self._flush_deferred()
            self._closed = True
            self._put(_STOP)

    async def wait_closed(self) -> None:
        await asyncio.shield(self._stopped)

    def join(self, timeout: float | None = None) -> bool:
        """Block until the thread ended (for synchronous callers); True if it did."""
        self._worker.join(timeout)
        return not self._worker.is_alive()

    # -- the line, on the loop ---------------------------------------------------
    def _kick(self) -> None:
        """Send what heads the line: a commit of the loop's own when the thread has
        nothing and the head fits one; else hand everything to the thread."""
        self._kick_due = False
        line = self._line
        assert line is not None
        while line and self._underway is None:
            if not (self._handed == 0 and self._failure is None
                    and self._loop_fits(line[0]) and self._start_on_loop(line)):
                self._hand_over(line)

    def _loop_fits(self, item: tuple[Any, ...]) -> bool:
        return len(item) == 3 and self.store.loop_fits(item[1])

    def _start_on_loop(self, line: deque[tuple[Any, ...]]) -> bool:
        """Merge the writes heading ``line`` that fit and send them; False (and the
        line as it was) when the store cannot take them now."""
        items = [line.popleft()]
        merging = _Merging(items[0][1], self._max_ops, self._max_bytes)
        while line and self._loop_fits(line[0]) and merging.add(line[0][1]):
            items.append(line.popleft())
        try:
            commit = self.store.start_commit(self.epoch, merging.batch)
        except StoreError as exc:
            self._loop_failed(exc, items)
            return True
        except Exception as bug:  # one name per clause (mypyc); the outcome is unknown
            log.exception("group committer failed")
            self._loop_failed(StoreError(f"{self.store.description}: commit failed: "
                                         f"{bug!r}"), items)
            return True
        if commit is None:
            line.extendleft(reversed(items))
            return False
        self._underway, self._underway_items = commit, items
        self._loop_busy_since = time.monotonic()
        self._loop.add_reader(commit.fd, self._readable)
        if not commit.sent:
            self._loop.add_writer(commit.fd, self._writable)
        return True

    def _hand_over(self, line: deque[tuple[Any, ...]]) -> None:
        """Everything in ``line`` to the thread, in order, and a mark behind it."""
        put = self._queue.put
        while line:
            put(line.popleft())
        mark: asyncio.Future[Any] = self._loop.create_future()
        mark.add_done_callback(self._mark_back)
        self._handed += 1
        put((mark, _MARK))

    def _mark_back(self, mark: asyncio.Future[Any]) -> None:
        if not mark.cancelled():
            mark.exception()  # retrieved: a failed store fails marks too
        self._handed -= 1
        if self._line:
            self._kick()

    def _writable(self) -> None:
        commit = self._underway
        assert commit is not None
        try:
            sent = commit.flush()
        except Exception as exc:
            self._underway_failed(commit, exc)
            return
        if sent:
            self._loop.remove_writer(commit.fd)

    def _readable(self) -> None:
        commit = self._underway
        assert commit is not None
        try:
            result = commit.receive()
        except Exception as exc:
            self._underway_failed(commit, exc)
            return
        if result is None:
            if not commit.sent:  # sent again (``PipelinedCommit.receive``), not all of it yet
                self._loop.add_writer(commit.fd, self._writable)
            return
        items = self._stop_watching(commit)
        self.commits += 1
        self.on_loop += 1
        self.batches += len(items)
        if result.duplicate_ids and len(items) > 1:
            _resolve_each(items, _split_result(result, items))
        else:
            _resolve_all(items, result)
        self._commit_over()

    def _commit_over(self) -> None:
        """The loop's commit is answered (or failed): the flush it held goes into the
        line, and the line's head is sent."""
        self._flush_deferred()
        if self._line:
            self._kick()

    def _stop_watching(self, commit: LoopCommit) -> list[tuple[Any, ...]]:
        """The commit is over: its socket unwatched (before a failure closes it)."""
        self._loop.remove_reader(commit.fd)
        if not commit.sent:
            self._loop.remove_writer(commit.fd)
        items, self._underway, self._underway_items = self._underway_items, None, []
        self._loop_busy_since = None
        return items

    def _underway_failed(self, commit: LoopCommit, exc: Exception) -> None:
        items = self._stop_watching(commit)
        self._loop_failed(commit.failed(exc), items)
        self._commit_over()

    def _loop_failed(self, exc: StoreError, items: list[tuple[Any, ...]]) -> None:
        """A refusal goes back to the head of the line for the thread, which commits
        those batches again in halves (``_rejected``); anything else stops the
        committer, as on the thread."""
        if isinstance(exc, StoreRejected):
            line = self._line
            assert line is not None
            line.extendleft(reversed(items))
            self._hand_over(line)
        else:
            self._fail(exc, items)

    # -- store thread --------------------------------------------------------
    def _post(self, fn: Callable[..., None], *args: Any) -> None:
        # RuntimeError: the loop is closed, so nobody is waiting any more.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(fn, *args)

    def _run(self) -> None:
        held: tuple[Any, ...] | None = None
        get = self._queue.get
        while True:
            item = held if held is not None else get()
            held = None
            if item is _STOP:
                break
            if len(item) == 2:  # a mark with no commit to ride along
                self._post(_resolve_marks, [item])
                continue
            self._thread_busy_since = time.monotonic()
            try:
                if len(item) == 4:
                    self._run_call(item)
                else:
                    held = self._run_writes(item)
            except BaseException as exc:  # a bug here must not strand futures
                log.exception("group committer failed")
                self._fail(exc, [item])
            finally:
                self._thread_busy_since = None
        self._shutdown(held)

    def _run_writes(self, first: tuple[Any, ...]) -> tuple[Any, ...] | None:
        """Merge ``first`` with what is queued behind it, commit, and return an
        item that was taken but did not fit (it goes next)."""
        items = [first]
        marks: list[tuple[Any, ...]] = []
        merging = _Merging(first[1], self._max_ops, self._max_bytes)
        held = None
        deadline = time.monotonic() + self._delay_s if self._delay_s else 0.0
        while merging.ops < self._max_ops:
            try:
                if deadline:
                    remaining = deadline - time.monotonic()
                    nxt = self._queue.get(timeout=remaining) if remaining > 0 \
                        else self._queue.get_nowait()
                else:
                    nxt = self._queue.get_nowait()
            except queue.Empty:
                break
            if len(nxt) == 2:  # a mark: back with this commit, merging goes on
                marks.append(nxt)
                continue
            if len(nxt) != 3 or not merging.add(nxt[1]):
                held = nxt  # a call, barrier or stop must see this commit first
                break
            items.append(nxt)
        self._commit(merging.batch, items)
        if marks:
            self._post(_resolve_marks, marks)
        return held

    def _commit(self, batch: Batch, items: list[tuple[Any, ...]]) -> None:
        if self._failure is not None:
            self._post(_fail_all, items, self._failure)
            return
        try:
            result = self._commit_batch(batch)
        except StoreRejected as refused:  # one name per clause: mypyc types a shared
            self._rejected(refused, items)  # name as its first clause (no_shared_except)
            return
        except StoreError as exc:
            self._fail(exc, items)
            return
        self.commits += 1
        self.batches += len(items)
        if result.duplicate_ids and len(items) > 1:
            self._post(_resolve_each, items, _split_result(result, items))
        else:
            self._post(_resolve_all, items, result)

    def _commit_batch(self, batch: Batch) -> BatchResult:
        """``store.commit_batch``; an exception that is not a ``StoreError`` (a
        bug, a driver surprise) is raised as one: the outcome is unknown."""
        try:
            return self.store.commit_batch(self.epoch, batch)
        except StoreError:
            raise
        except Exception as exc:
            raise StoreError(f"{self.store.description}: commit failed: {exc!r}") from exc

    def _rejected(self, exc: StoreRejected, items: list[tuple[Any, ...]]) -> None:
        """The store refused this commit's data. One batch: it is refused (the
        committer goes on), or split into its units. Several: bisect, left half
        first, so that the batches still commit in submission order and all the
        good ones do."""
        if len(items) == 1:
            fut, batch, units = items[0]
            if units:
                self._split_units(fut, batch, units)
                return
            self.rejected += 1
            log.warning("%s: a batch was refused: %s", self.store.description, exc)
            self._post(_set_exception, fut, exc)
            return
        self.splits += 1
        mid = len(items) // 2
        for half in (items[:mid], items[mid:]):
            # fails at once if the other half failed
            self._commit(_merged([item[1] for item in half]), half)

    def _split_units(self, fut: asyncio.Future[BatchResult], batch: Batch,
                     units: list[UnitSpan]) -> None:
        """Commit a refused batch as its part outside the units and its units,
        in that order, bisecting; resolve ``fut`` with what was refused."""
        rest, parts = batch.carve(units)
        pieces = [(i, b) for i, b in enumerate(parts) if len(b)]
        # The part outside the units may remove a durable subscription that a
        # unit re-creates (same client-id and name): it goes first. A unit
        # creating one it removes (SUBSCRIBE then UNSUBSCRIBE) goes before it.
        gone = set(rest.removed_subscriptions)
        early: list[tuple[int, Batch]] = []
        late: list[tuple[int, Batch]] = []
        for p in pieces:
            if gone and any(r.id in gone for r in p[1].subscriptions):
                early.append(p)
            else:
                late.append(p)
        ordered = [*early, *([(OUTSIDE_UNITS, rest)] if len(rest) else []), *late]
        result = BatchResult()
        if self._commit_pieces(ordered, result):
            self.batches += 1
            self._post(_set_result, fut, result)
        else:
            self._post(_fail_all, [(fut,)], self._failure)

    def _commit_pieces(self, pieces: list[tuple[int, Batch]], result: BatchResult) -> bool:
        """Commit ``pieces`` merged; when refused, in halves, down to single
        pieces that go into ``result.rejected``. False if the store failed."""
        if self._failure is not None:
            return False
        try:
            done = self._commit_batch(_merged([piece for _, piece in pieces]))
        except StoreRejected as refused:
            if len(pieces) == 1:
                self.rejected += 1
                log.warning("%s: a client's write was refused: %s", self.store.description,
                            refused)
                result.rejected[pieces[0][0]] = refused
                return True
            self.splits += 1
            mid = len(pieces) // 2
            return (self._commit_pieces(pieces[:mid], result)
                    and self._commit_pieces(pieces[mid:], result))
        except StoreError as exc:
            self._fail(exc, [])
            return False
        self.commits += 1
        result.duplicates |= done.duplicates
        result.duplicate_ids |= done.duplicate_ids
        return True

    def _run_call(self, item: tuple[Any, ...]) -> None:
        fut, fn, args, _ = item
        if fn is None:  # barrier
            self._post(_set_result, fut, None)
            return
        if self._failure is not None:
            self._post(_set_exception, fut, self._failure)
            return
        try:
            value = fn(*args)
        except StoreRejected as refused:  # refused, not gone: only this call fails
            self._post(_set_exception, fut, refused)
        except StoreError as lost:  # the store is unusable: same as a failed commit
            self._fail(lost, [item])
        except Exception as exc:
            self._post(_set_exception, fut, exc)
        else:
            self._post(_set_result, fut, value)

    def _fail(self, exc: BaseException, items: list[tuple[Any, ...]]) -> None:
        first = self._failure is None
        if first:
            self._failure = exc
            log.error("%s: store writes stopped: %s", self.store.description, exc)
        self._post(_fail_all, items, self._failure)
        if first:
            self._post(self._notify_failure, exc)

    def _notify_failure(self, exc: BaseException) -> None:
        try:
            self._on_failure(exc)
        except Exception:
            log.exception("on_failure callback failed")

    def _shutdown(self, held: tuple[Any, ...] | None) -> None:
        """Fail what close() left queued (nothing can be added after close)."""
        leftover = [held] if held is not None and held is not _STOP else []
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not _STOP:
                leftover.append(item)
        if leftover:
            self._post(_fail_all, leftover, StoreError("the group committer is closed"))
        self._post(_set_result, self._stopped, None)


def _body_bytes(batch: Batch) -> int:
    """The bytes of the message bodies ``batch`` inserts (``MAX_BATCH_BYTES``)."""
    return sum([len(x.body) for x in batch.inserts])


class _Merging:
    """Batches merged into one commit within the committer's limits; a caller's
    batch is never mutated (the first is copied before a second joins it)."""

    def __init__(self, first: Batch, max_ops: int, max_bytes: int) -> None:
        self.batch = first
        self.ops = len(first)
        self._size = _body_bytes(first)
        self._max_ops, self._max_bytes = max_ops, max_bytes
        self._copied = False

    def add(self, later: Batch) -> bool:
        """Merge ``later`` in, or False when it would pass a limit or is not safe."""
        n, more = len(later), _body_bytes(later)
        if (self.ops + n > self._max_ops or self._size + more > self._max_bytes
                or not self.batch.merge_safe(later)):
            return False
        if not self._copied:
            first, self.batch = self.batch, Batch()
            self.batch.extend(first)
            self._copied = True
        self.batch.extend(later)
        self.ops += n
        self._size += more
        return True


def _merged(batches: list[Batch]) -> Batch:
    """One batch as it is, several extended into a new one (a caller's batch is
    never mutated)."""
    if len(batches) == 1:
        return batches[0]
    acc = Batch()
    for b in batches:
        acc.extend(b)
    return acc


def _split_result(result: BatchResult, items: list[tuple[Any, ...]]) -> list[BatchResult]:
    """Each caller learns only about its own dropped inserts and identities."""
    out = []
    for _, batch, _ in items:
        mine = BatchResult()
        for x in (*batch.inserts, *batch.identities):
            if x.id in result.duplicate_ids:
                mine.duplicate_ids.add(x.id)
                if x.dedup_key is not None:
                    mine.duplicates.add(x.dedup_key)
        out.append(mine)
    return out


# Run on the loop thread, via call_soon_threadsafe: one wake-up per commit.
def _resolve_all(items: list[tuple[Any, ...]], result: BatchResult) -> None:
    for item in items:
        fut = item[0]
        if not fut.done():
            fut.set_result(result)


def _resolve_each(items: list[tuple[Any, ...]], results: list[BatchResult]) -> None:
    for item, result in zip(items, results, strict=True):
        fut = item[0]
        if not fut.done():
            fut.set_result(result)


def _resolve_marks(marks: list[tuple[Any, ...]]) -> None:
    for mark in marks:
        if not mark[0].done():
            mark[0].set_result(None)


def _fail_all(items: list[tuple[Any, ...]], exc: BaseException) -> None:
    for item in items:
        fut = item[0]
        if fut.done():
            continue
        if len(item) == 4 and item[1] is None:  # a barrier: drain is over
            fut.set_result(None)
        else:
            fut.set_exception(exc)


def _set_result(fut: asyncio.Future[Any], value: Any) -> None:
    if not fut.done():
        fut.set_result(value)


def _set_exception(fut: asyncio.Future[Any], exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)
