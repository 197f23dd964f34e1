"""Per-destination totals that survive a takeover: every way a message enters or
leaves a destination (ActiveMQ's EnqueueCount, DequeueCount, ExpiredCount; the
dead-letter queue's own EnqueueCount; moves and purges).

The broker counts in memory as it stages the writes it counts (one dict increment
per message), and the write buffer's flush carries what was counted since the last
one in its batch (``Batch.counters``): the store adds it in the same fenced
transaction as the messages it counts, one row per destination touched, so what a
new master loads (``Recovery.counters``) is what the last one committed. A
destination with no store row (only non-persistent traffic, a temporary one) is
counted in memory only: nothing of it survives a takeover, its totals neither.
Expired messages reaped by the store are counted by the store (``reaped``).
"""

from __future__ import annotations

import asyncio
import enum
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from amqlite.validation import is_temporary
from store.schema import COUNTER_KINDS

if TYPE_CHECKING:
    from store.api import Batch, Ref

#: How long counts of traffic that writes nothing (non-persistent messages) wait
#: before a commit of their own carries them (s). Persistent traffic carries them
#: with its own writes at once; a second keeps an idle store idle.
FLUSH_DELAY = 1.0


class Kind(enum.IntEnum):
    """What a count is of; the value indexes ``Batch.counters``' lists, whose order
    is ``store.schema.COUNTER_KINDS``."""

    ENQUEUED = 0  # sent to it, moved into it, dead-lettered into it
    DEQUEUED = 1  # acknowledged (or auto-acked) by a consumer
    EXPIRED = 2
    DEAD_LETTERED = 3  # sent on to the dead-letter queue
    MOVED = 4  # moved out by an operator (move, retry)
    PURGED = 5  # removed by an operator (purge)
    OVERFLOW_DROPPED = 6  # dropped by its policy's drop-head overflow (amqlite.broker.limits)


assert tuple(k.name.lower() for k in Kind) == COUNTER_KINDS


class Counters:
    """The broker's totals by destination name, and what is not committed yet."""

    def __init__(self, loop: asyncio.AbstractEventLoop, rows: dict[str, int],
                 stage: Callable[[], object]) -> None:
        self._loop = loop
        #: The broker's destination name -> store id (rows staged count: the counts
        #: go in the same batch as the row, or a later one).
        self._rows = rows
        self._stage = stage
        self.totals: dict[Kind, defaultdict[str, int]] = {k: defaultdict(int) for k in Kind}
        #: name -> deltas per Kind since the last flush.
        self.pending: dict[str, list[int]] = {}
        #: Deliveries in flight whose row the store's reaper deleted (and counted as
        #: expired): their ACK, or their expiry once released, counts nothing more.
        self.gone: set[Ref] = set()

    def load(self, names: dict[int, str], stored: dict[int, tuple[int, ...]]) -> None:
        """A new master starts from what the store holds (destination id -> totals)."""
        for did, values in stored.items():
            name = names.get(did)
            if name is None:
                continue  # a row whose destination was never committed
            for kind in Kind:
                if values[kind]:
                    self.totals[kind][name] = values[kind]

    def add(self, name: str, kind: Kind, n: int = 1) -> None:
        if not n:
            return
        self.totals[kind][name] += n
        deltas = self.pending.get(name)
        if deltas is None:
            if is_temporary(name):
                return
            if not self.pending:  # writes that carry nothing of their own: see FLUSH_DELAY
                self._loop.call_later(FLUSH_DELAY, self._flush_due)
            deltas = self.pending[name] = [0] * len(Kind)
        deltas[kind] += n

    def _flush_due(self) -> None:
        if self.pending:
            self._stage()

    def take(self, batch: Batch) -> None:
        """Move what was counted since the last flush into ``batch`` (the write
        buffer calls it as it flushes)."""
        if not self.pending:
            return
        rows, into = self._rows, batch.counters
        for name, deltas in self.pending.items():
            did = rows.get(name)
            if did is None:
                continue  # no store row: memory only
            have = into.get(did)
            if have is None:
                into[did] = deltas
            else:
                for k, n in enumerate(deltas):
                    have[k] += n
        self.pending = {}

    def settle_gone(self, refs: Iterable[Ref | None]) -> int:
        """How many of ``refs`` the reaper already counted (each only once)."""
        n = 0
        for ref in refs:
            if ref in self.gone:
                self.gone.discard(ref)
                n += 1
        return n

    def forget(self, name: str) -> None:
        """A destination leaves (deleted, or out of memory): its totals go with it (its
        store row goes with the destination's row)."""
        for totals in self.totals.values():
            totals.pop(name, None)
        self.pending.pop(name, None)

    def reaped(self, names: dict[int, str], by_destination: dict[int, list[Ref]]) -> None:
        """Messages the store's reaper deleted, by destination id: the store counted
        them with the delete, so only the totals in memory grow."""
        for did, refs in by_destination.items():
            name = names.get(did)
            if name is not None:
                self.totals[Kind.EXPIRED][name] += len({mid for _, mid in refs})

    def of(self, name: str) -> dict[str, int]:
        """One destination's totals, by ``COUNTER_KINDS`` name (the API, the console)."""
        return {k.name.lower(): self.totals[k].get(name, 0) for k in Kind}
