"""The write buffer in front of the group committer: every write the broker's
loop produces in one iteration, gathered into one ``Batch`` (and, while the
committer has a commit underway on the loop, every write until it is over:
``Committer.defer``).

It lives next to ``group_commit`` (which it feeds) rather than in the broker:
it knows batches, unit spans and refusals, nothing about STOMP. The client a
unit is blamed on is opaque here (``C``: the broker's ``Client``); the store
package still imports nothing from ``amqlite``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

from store.api import (
    OUTSIDE_UNITS,
    Batch,
    BatchResult,
    DestinationRow,
    Ref,
    Store,
    StoreRejected,
    UnitSpan,
)

__all__ = ["CommitUnit", "Committer", "ResultCallback", "StagedCallback", "WriteBuffer",
           "WriteUnit"]

log = logging.getLogger(__name__)

#: Whoever a unit's data came from (the broker's client connection).
C = TypeVar("C")

StagedCallback = Callable[[bool], None]
ResultCallback = Callable[[BatchResult | None], None]
T = TypeVar("T")


class Committer(Protocol):
    """What the broker's loop uses of the group committer
    (``store.group_commit.GroupCommitter``). A protocol rather than the class: in the
    compiled build the class is native, and a compiled attribute typed with it would
    refuse a stand-in (a benchmark's stub committer, a test's wrapper)."""

    @property
    def store(self) -> Store: ...

    def submit(self, batch: Batch, units: list[UnitSpan] | None = None
               ) -> asyncio.Future[BatchResult]: ...

    def call(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]: ...

    def defer(self, flush: Callable[[bool], None]) -> bool: ...


class WriteUnit(Generic[C]):
    """The data one client frame brings (a SEND's or COMMIT's inserts and
    identities, a COMMIT's ack rows too (``CommitUnit``), a durable SUBSCRIBE's
    row, the destination rows they need): a
    span of the flush's batch. The batch commits whole as long as the store
    takes it; when the store refuses it, the group committer splits it along
    the spans, and only a unit the store refuses on its own fails
    (``rejected``), so only that frame's client gets an ERROR."""

    __slots__ = ("conn", "receipt", "rejected", "span", "start")

    def __init__(self, conn: C | None, batch: Batch) -> None:
        #: The client to blame when the store refuses the unit, and the
        #: receipt its frame asked for (the ERROR carries it).
        self.conn = conn
        self.receipt: str | None = None
        self.start = (len(batch.destinations), len(batch.subscriptions), len(batch.inserts),
                      len(batch.identities))
        self.span: UnitSpan | None = None
        #: The store refused this unit's data (nothing of it was written).
        self.rejected: StoreRejected | None = None

    def end(self, batch: Batch) -> UnitSpan:
        if self.span is None:
            d, s, i, y = self.start
            self.span = (d, len(batch.destinations), s, len(batch.subscriptions),
                         i, len(batch.inserts), y, len(batch.identities))
        return self.span


class CommitUnit(WriteUnit[C]):
    """A COMMIT's unit: its span covers the ack rows of the transaction's ACKs
    too, so the store takes them with its SENDs or refuses them with them (a
    refused COMMIT applies nothing). A subclass so that a SEND's unit, on the
    hot path, stays as it was."""

    __slots__ = ("acks_start",)

    def __init__(self, conn: C | None, batch: Batch) -> None:
        super().__init__(conn, batch)
        self.acks_start = len(batch.acks)

    def end(self, batch: Batch) -> UnitSpan:
        if self.span is None:
            self.span = (*super().end(batch), self.acks_start, len(batch.acks))
        return self.span


class WriteBuffer(Generic[C]):
    """Gathers every write of one loop iteration (or, while the committer has a commit
    underway, of every iteration until it is over) into one Batch for the committer.

    What a client frame brings is staged between ``begin_unit`` and
    ``end_unit`` (see ``WriteUnit``). Callbacks run on the loop, in staging
    order, once the batch committed (``ok=True``) or failed (``ok=False``;
    for a unit's own callbacks also when the store refused that unit).
    ``stage_unit`` callbacks get the ``BatchResult`` (for dedup) or None.
    """

    def __init__(self, committer: Committer | None, loop: asyncio.AbstractEventLoop) -> None:
        self.committer = committer
        self.loop = loop
        self.batch = Batch()
        self.units: list[WriteUnit[C]] = []
        #: (the unit whose outcome the callback gets, or None: the whole batch's)
        self.callbacks: list[tuple[WriteUnit[C] | None, ResultCallback]] = []
        self._flush_scheduled = False
        self.failed = False
        self.held = False  # paused: stage but do not commit (ZooKeeper SUSPENDED)
        self.inflight_batches = 0
        self._released: set[Ref] = set()
        #: The unit being staged, if any.
        self.current: WriteUnit[C] | None = None
        #: Called with the destination rows that committed, so the broker
        #: stops staging them (see ``Broker._destination_id``).
        self.on_destinations: Callable[[list[DestinationRow]], None] | None = None
        #: Called with each batch as it goes to the committer (the broker's bounded
        #: queues forget what its acks settle: ``amqlite.broker.limits``).
        self.on_flush: Callable[[Batch], None] | None = None
        #: Management metrics: called once per committed batch with (seconds the commit
        #: took, seconds since the batch's first write was staged: the longest any
        #: RECEIPT in it waited). None costs one attribute test per batch.
        self.observer: Callable[[float, float], None] | None = None
        self._first_staged = 0.0
        #: Called with the batch as it is flushed, to add what it carries besides the
        #: staged writes (the broker's per-destination totals, ``Batch.counters``).
        self.before_flush: Callable[[Batch], None] | None = None

    def stage(self, callback: StagedCallback | None = None) -> Batch:
        if callback is not None:
            self.callbacks.append((None, lambda result: callback(result is not None)))
        self._schedule()
        return self.batch

    def begin_unit(self, conn: C | None, covers_acks: bool = False) -> WriteUnit[C]:
        """Start staging one frame's data, blamed on ``conn`` if refused;
        ``covers_acks``: the ack rows staged until ``end_unit`` are the unit's
        too (a COMMIT's, see ``CommitUnit``)."""
        unit: WriteUnit[C] = (CommitUnit if covers_acks else WriteUnit)(
            conn, self.batch)
        self.units.append(unit)
        self.current = unit
        self._schedule()
        return unit

    def end_unit(self, unit: WriteUnit[C]) -> None:
        unit.end(self.batch)
        self.current = None

    def in_current_unit(self, row: DestinationRow) -> bool:
        """Whether the unit being staged already carries ``row`` (a destination row
        staged by an earlier unit that may yet be refused must be in this one too)."""
        unit = self.current
        return unit is not None and row in self.batch.destinations[unit.start[0]:]

    def stage_point(self, callback: ResultCallback) -> None:
        """A commit point: ``callback(result)`` once everything staged so far outside
        units committed, ``callback(None)`` when that failed."""
        self.callbacks.append((None, callback))
        self._schedule()

    def stage_unit(self, unit: WriteUnit[C], callback: ResultCallback) -> None:
        """``callback(result)`` once ``unit`` committed, ``callback(None)``
        when it failed (``unit.rejected`` says whether the store refused it)."""
        self.callbacks.append((unit, callback))

    def stage_releases(self, refs: list[Ref]) -> None:
        """Deliverable again. Remembered so a redelivery of the same message is
        never merged into this batch (the store applies deliveries first)."""
        self.stage().releases.extend(refs)
        self._released.update(refs)

    def stage_delivery(self, ref: Ref, callback: StagedCallback) -> None:
        if ref in self._released:
            self.flush(now=True)  # release first, in its own batch, then the delivery
        self.stage(callback).deliveries.append(ref)

    def _schedule(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            if self.observer is not None:
                self._first_staged = time.monotonic()
            self.loop.call_soon(self.flush)

    def flush(self, now: bool = False) -> None:
        """Hand what is staged to the committer; unless ``now``, when it has a commit
        underway it may hold the flush until that one is over (``Committer.defer``)."""
        self._flush_scheduled = False
        if self.held:
            return
        committer = self.committer
        if not now and committer is not None and not self.failed and committer.defer(self.flush):
            self._flush_scheduled = True  # staging more schedules nothing: the committer will
            return
        if self.before_flush is not None:
            self.before_flush(self.batch)
        batch, callbacks, units = self.batch, self.callbacks, self.units
        if not len(batch) and not callbacks:
            self.units = []
            return
        if self.current is not None:  # never mid-frame; a frame that raised
            self.end_unit(self.current)
        self.batch, self.callbacks, self.units = Batch(), [], []
        self._released.clear()
        if self.failed or self.committer is None:
            for _, cb in callbacks:
                cb(None)
            return
        if not len(batch):
            empty = BatchResult()
            for _, cb in callbacks:
                cb(empty)
            return
        self.inflight_batches += 1
        if self.on_flush is not None:
            self.on_flush(batch)
        spans = [u.end(batch) for u in units] if units else None
        future = self.committer.submit(batch, spans)
        future.add_done_callback(lambda f: self._done(f, batch, units, callbacks))
        if self.observer is not None:
            observer, staged, submitted = self.observer, self._first_staged, time.monotonic()

            def observe(f: asyncio.Future[BatchResult]) -> None:
                if not f.cancelled() and f.exception() is None:
                    now = time.monotonic()
                    observer(now - submitted, now - (staged or submitted))

            future.add_done_callback(observe)

    def _done(self, future: asyncio.Future[BatchResult], batch: Batch,
              units: list[WriteUnit[C]],
              callbacks: list[tuple[WriteUnit[C] | None, ResultCallback]]) -> None:
        self.inflight_batches -= 1
        result: BatchResult | None = None
        exc = None if future.cancelled() else future.exception()
        if future.cancelled() or (exc is not None and not isinstance(exc, StoreRejected)):
            self.failed = True
        elif exc is not None:  # refused whole, and no unit to pin it on
            log.error("the store refused a write no client can be told of: %s", exc)
        else:
            result = future.result()
        rest_ok = result is not None
        if result is not None and result.rejected:
            for i, refused in result.rejected.items():
                if i == OUTSIDE_UNITS:
                    rest_ok = False
                    log.error("the store refused a write no client can be told of: %s",
                              refused)
                else:
                    units[i].rejected = refused
        if batch.destinations and self.on_destinations is not None and result is not None:
            self.on_destinations(_committed_destinations(batch, units, rest_ok)
                                 if result.rejected else batch.destinations)
        for unit, cb in callbacks:
            ok = rest_ok if unit is None else result is not None and unit.rejected is None
            try:
                cb(result if ok else None)
            except Exception:
                log.exception("commit callback failed")

    def release(self) -> None:
        self.held = False
        self._schedule()


def _committed_destinations(batch: Batch, units: list[WriteUnit[C]],
                            rest_ok: bool) -> list[DestinationRow]:
    """The destination rows of a split batch that did commit."""
    rows = batch.destinations
    inside = [False] * len(rows)
    committed = []
    for u in units:
        assert u.span is not None
        d0, d1 = u.span[0], u.span[1]
        for k in range(d0, d1):
            inside[k] = True
            if u.rejected is None:
                committed.append(rows[k])
    if rest_ok:
        committed.extend(r for r, taken in zip(rows, inside, strict=True) if not taken)
    return committed
