"""Memory is a budget in bytes: what waits in sources, and the producers held back.

``Settings.max_memory`` is broker-wide, ``Settings.max_destination_memory`` per
destination (a queue, a durable or a non-durable topic subscription). Sources add
and subtract ``Message.size`` as messages wait (``Source.bytes``, and
``MemoryBudget.waiting_bytes`` here); subscriptions count what is in flight
(``Subscription.inflight_bytes``). Past a budget: persistent messages stay in the
store, producers of non-persistent messages are paused (flow control) until below
``RESUME_FRACTION`` of it, and a slow non-durable topic subscriber misses messages.

What a client makes the broker hold for it counts too (``held_bytes``), in the same
budget: waiting messages and held bytes together (``used``) stay within ``max_memory``
plus a frame per reading connection. When held bytes need room that waiting messages
take, stored messages waiting in memory are given back to the store (``reclaim``,
``Source.evict``: the newest first, paged in again later), so a transaction is refused
only when what fills the budget cannot be given back (non-persistent messages, other
transactions, partial frames):

* transaction contents (``hold_transaction``): a SEND, ACK or NACK in a transaction
  past the broker-wide budget (after ``reclaim``) or the connection's share (``max_memory //
  CONNECTION_SHARE_DIVISOR``) is an ERROR naming the limit, nothing applied; COMMIT,
  ABORT and the connection's end release them (``release_transaction``);
* partial frames, bytes received but not yet a frame (``partial_changed``): past the
  budget, a connection that receives more is no longer read from unless it holds the
  largest partial frame (when the total crosses the budget, every smaller one at
  once). The largest always reads, so it completes and frees its bytes; each
  completion (or close) resumes the largest paused connection, and below
  ``RESUME_FRACTION`` of the budget every one of them. A hostile largest one is
  closed by ``frame_timeout`` like any trickler.
* unacknowledged deliveries are ``Subscription.inflight_bytes`` (bounded per
  subscription), pending writes ``Session.pending_bytes`` (persistent sends until
  their commit) and the transport's write buffer (``WRITE_BUFFER_HIGH`` per
  connection, dispatch stops above it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from amqlite.validation import BrokerError

if TYPE_CHECKING:
    from amqlite.broker.session import Client, Session
    from amqlite.broker.source import Source

log = logging.getLogger("amqlite.broker")

#: Flow control resumes when usage drops below this fraction of the budget
#: (hysteresis, so a producer is not paused and resumed on every message).
RESUME_FRACTION = 0.75
#: Non-persistent messages live only in memory: past this many waiting in one
#: queue, the connections sending to it are paused until it drains to
#: RESUME_NONPERSISTENT_BACKLOG (ActiveMQ's producer flow control). 20 000 1 KB
#: messages are ~50 MB of Python objects: a few busy queues stay well inside
#: the 200 MB a broker should need.
MAX_NONPERSISTENT_BACKLOG = 20_000
RESUME_NONPERSISTENT_BACKLOG = MAX_NONPERSISTENT_BACKLOG // 2
#: One connection may hold at most ``max_memory // CONNECTION_SHARE_DIVISOR`` bytes
#: in its open transactions (128 MiB of the default 256 MiB): two such connections
#: fill the broker-wide ledger, and no one connection can fill it alone.
CONNECTION_SHARE_DIVISOR = 2
#: The pause reason of a connection not read from for the partial-frame budget.
PARTIAL_REASON = "memory:partial"


class MemoryBudget:
    """The byte budgets, the bytes waiting broker-wide, and the producers paused for
    them (ActiveMQ's producer flow control, RabbitMQ's memory alarm)."""

    def __init__(self, max_memory: int, max_destination_memory: int) -> None:
        self.memory_budget = max_memory
        self.memory_resume = int(max_memory * RESUME_FRACTION)
        self.destination_budget = max_destination_memory
        self.destination_resume = int(max_destination_memory * RESUME_FRACTION)
        self.waiting_bytes = 0  # Message.size of every message waiting in a source
        #: Producers paused because the broker-wide budget was reached.
        self.blocked_producers: set[Client] = set()
        #: Producers paused for any memory reason -> the sources that paused them
        #: (None: the broker-wide budget); see ``may_overdraw``.
        self.blocked_producers_all: dict[Client, set[Source | None]] = {}
        #: Bytes clients make the broker hold: open transactions and partial frames.
        self.held_bytes = 0
        self.connection_share = max_memory // CONNECTION_SHARE_DIVISOR
        #: Connections buffering a partial frame -> its bytes so far.
        self.partial: dict[Client, int] = {}
        #: Connections not read from for the partial-frame budget.
        self.partial_paused: set[Client] = set()
        #: Past the budget, the one connection still read from for its partial frame.
        self.partial_reader: Client | None = None
        #: Gives back up to N bytes of stored messages waiting in memory (they stay in
        #: the store and are paged in again); returns the bytes freed. Set by the broker.
        self.reclaim: Callable[[int], int] | None = None
        #: ``waiting_bytes`` when a reclaim last fell short: nothing more can be given
        #: back until more stored messages came into memory (saves a walk per chunk).
        self.reclaim_exhausted_at = -1

    @property
    def used(self) -> int:
        """Bytes counted against ``max_memory``: waiting messages and held bytes."""
        return self.waiting_bytes + self.held_bytes

    def make_room(self, size: int) -> bool:
        """Whether ``size`` more bytes fit in the budget, after giving back stored
        messages waiting in memory if need be (``reclaim``)."""
        over = self.used + size - self.memory_budget
        if over <= 0:
            return True
        if self.reclaim is None or self.waiting_bytes <= self.reclaim_exhausted_at:
            return False
        freed = self.reclaim(over)
        if freed < over:
            self.reclaim_exhausted_at = self.waiting_bytes
            return False
        return True

    def full(self, source_bytes: int) -> bool:
        """A source holding ``source_bytes``, or the whole broker, is at its budget."""
        return (source_bytes >= self.destination_budget
                or self.used >= self.memory_budget)

    def room(self, source_bytes: int) -> int:
        """Bytes a source holding ``source_bytes`` may still take (maybe negative)."""
        return min(self.destination_budget - source_bytes,
                   self.memory_budget - self.used)

    def released(self, source: Source, size: int) -> None:
        """``size`` bytes left ``source``: let producers held back for it (or for the
        whole broker) read again once below the resume levels."""
        self.waiting_bytes -= size
        if (source.blocked_producers
                and source.nonpersistent <= RESUME_NONPERSISTENT_BACKLOG
                and source.bytes <= self.destination_resume):
            for producer in source.blocked_producers:
                self._unblocked(producer, source)
                producer.resume_reading(f"flow:{source.name}")
            source.blocked_producers.clear()
        self._maybe_resume()

    def _maybe_resume(self) -> None:
        """Below the resume level: paused producers and partial frames read again."""
        if self.used > self.memory_resume:
            return
        if self.blocked_producers:
            self.resume_producers()
        if self.partial_paused:
            paused, self.partial_paused = self.partial_paused, set()
            for c in paused:
                c.resume_reading(PARTIAL_REASON)

    def block_producer(self, producer: Client, source: Source) -> None:
        """Stop reading from a producer whose message put ``source`` or the broker
        at its byte budget; ``released`` resumes it below the resume level."""
        if producer.closed:
            return
        reasons = self.blocked_producers_all.setdefault(producer, set())
        if (source.bytes >= self.destination_budget
                or source.nonpersistent >= MAX_NONPERSISTENT_BACKLOG) \
                and producer not in source.blocked_producers:
            source.blocked_producers.add(producer)
            reasons.add(source)
            producer.pause_reading(f"flow:{source.name}")
        if self.used >= self.memory_budget and producer not in self.blocked_producers:
            self.blocked_producers.add(producer)
            reasons.add(None)
            log.info("memory budget reached (%d bytes waiting, %d held): pausing producers",
                     self.waiting_bytes, self.held_bytes)
            producer.pause_reading("memory")
        if not reasons:
            del self.blocked_producers_all[producer]

    def resume_producers(self) -> None:
        """The broker is below its resume level: read from its producers again."""
        blocked, self.blocked_producers = self.blocked_producers, set()
        for producer in blocked:
            self._unblocked(producer, None)
            producer.resume_reading("memory")

    def _unblocked(self, producer: Client, source: Source | None) -> None:
        reasons = self.blocked_producers_all.get(producer)
        if reasons is not None:
            reasons.discard(source)
            if not reasons:
                del self.blocked_producers_all[producer]

    # -- what clients make the broker hold: transactions, partial frames ----------------
    def hold_transaction(self, session: Session, size: int) -> None:
        """Count ``size`` bytes a transaction of ``session`` now holds; BrokerError (and
        nothing counted) past the connection's share or the broker-wide budget."""
        if session.tx_bytes + size > self.connection_share:
            raise BrokerError(
                f"transactions hold more than this connection's share of max_memory: "
                f"{self.connection_share} bytes (1/{CONNECTION_SHARE_DIVISOR}); commit or abort")
        if not self.make_room(size):
            raise BrokerError(
                f"the broker's memory budget (max_memory, {self.memory_budget} bytes) is "
                f"full: {self.held_bytes} bytes held by open transactions and partial "
                f"frames, {self.waiting_bytes} by waiting messages; commit or abort")
        session.tx_bytes += size
        self.held_bytes += size

    def release_transaction(self, session: Session, size: int) -> None:
        """A transaction holding ``size`` bytes was committed, aborted or dropped."""
        session.tx_bytes -= size
        self.held_bytes -= size
        self._maybe_resume()

    def partial_changed(self, conn: Client, old: int, new: int) -> None:
        """``conn`` now buffers ``new`` bytes of a partial frame instead of ``old``
        (callers only call when they differ)."""
        self.held_bytes += new - old
        partial = self.partial
        if new:
            partial[conn] = new
        else:
            partial.pop(conn, None)
        paused = self.partial_paused
        if new > old:
            if self.used > self.memory_budget:
                # One connection reads on: the largest partial frame (when the total
                # crosses the budget, every other one is stopped at once; later ones
                # at their next chunk). Ties would let a symmetric flood read on.
                crossed = self.used - (new - old) <= self.memory_budget
                reader = self.partial_reader
                if crossed or reader is None:
                    reader = self.partial_reader = max(partial, key=partial.__getitem__)
                    if reader in paused:
                        paused.discard(reader)
                        reader.resume_reading(PARTIAL_REASON)
                for c in (partial if crossed else (conn,)):
                    if c is not reader and c not in paused:
                        paused.add(c)
                        c.pause_reading(PARTIAL_REASON)
            return
        if conn is self.partial_reader:
            self.partial_reader = None  # its frame completed (or it closed)
        if not paused:
            return
        paused.discard(conn)
        if self.used <= self.memory_resume:
            self.partial_paused = set()
            for c in paused:
                c.resume_reading(PARTIAL_REASON)
            return
        # The largest partial frame must be able to complete: resume the largest paused.
        largest = max(paused, key=lambda c: partial.get(c, 0))
        paused.discard(largest)
        self.partial_reader = largest
        largest.resume_reading(PARTIAL_REASON)

    def forget(self, conn: Client) -> None:
        """A connection went away: it is no longer held back anywhere."""
        for source in self.blocked_producers_all.pop(conn, ()):
            (self if source is None else source).blocked_producers.discard(conn)
        self.partial_paused.discard(conn)
        if self.partial_reader is conn:
            self.partial_reader = None

    def may_overdraw(self, conn: Client, inflight_bytes: int, limit: int) -> bool:
        """A consumer whose connection we stopped reading (it also produces) cannot
        send its ACKs: let it take what waits, up to one destination budget past
        ``limit``, so the waiting bytes drop, its reading resumes, its ACKs arrive."""
        return (conn in self.blocked_producers_all
                and inflight_bytes < limit + self.destination_budget)
