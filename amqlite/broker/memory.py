"""Memory is a budget in bytes: what waits in sources, and the producers held back.

``Settings.max_memory`` is broker-wide, ``Settings.max_destination_memory`` per
destination (a queue, a durable or a non-durable topic subscription). Sources add
and subtract ``Message.size`` as messages wait (``Source.bytes``), and here
(``MemoryBudget.waiting_bytes``) what they really take: a topic message waiting in many
subscriptions is one body, counted once, plus each copy's own object
(``message.hold``); subscriptions count what is in flight
(``Subscription.inflight_bytes``). Past a budget: persistent messages stay in the
store, producers of non-persistent messages are paused (flow control) until below
``RESUME_FRACTION`` of it, and a slow non-durable topic subscriber misses messages.

What a client makes the broker hold for it counts too (``held_bytes``), in the same
budget: waiting messages and held bytes together (``used``) stay within ``max_memory``
plus a frame per reading connection. When held bytes need room that waiting messages
take, stored messages waiting in memory are given back to the store (``reclaim``,
``Source.evict``: the newest first, paged in again later), so a transaction is refused
only when what fills the budget cannot be given back (non-persistent messages, other
transactions, partial frames, deliveries, SENDs awaiting commit, unsent frames):

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
* unacknowledged deliveries (``Subscription.track``): a consumer in a client ack mode
  gets no more past the budget or its connection's share, whatever its prefetch (the
  message stays waiting, or in the store); the same message left its source's waiting
  bytes as it was taken, so it is counted once. Releases dispatch those sources again
  (``starved``, ``redispatch``);
* persistent SENDs awaiting their commit (``hold_pending``): past the budget (after
  ``reclaim``) the producer is not read from until its commits land with room to spare
  (``Session.pending_bytes`` bounds each connection too). A message handed to a
  consumer in its commit counts as that consumer's delivery only;
* encoded frames not yet taken by a socket (``output_bytes``, ``amqlite.server``): a
  MESSAGE frame is a copy of its body, counted apart from the message. A connection
  gets no more frames past its ``WRITE_SHARE``, nor past the broker-wide
  ``output_budget`` unless nothing of its own is waiting (a client that reads keeps
  getting messages, one that does not keeps what it has); a close releases them.

A producer paused for the budget cannot send its ACKs: what its own connection holds
unacknowledged does not keep it paused (``_paused_own``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from amqlite.broker import heap
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
#: The pause reason of a producer whose persistent SENDs awaiting their commit found
#: the budget full (``hold_pending``).
PENDING_REASON = "memory:pending"
#: Past the budget, stored messages are given back this much beyond what one SEND
#: needs (an eighth of the budget): the next ones fit without a walk of the sources each.
RECLAIM_SLACK_DIVISOR = 8
#: Unacknowledged deliveries: one connection may hold ``max_memory //
#: DELIVERY_SHARE_DIVISOR`` (8 MiB of the default 256 MiB: one subscription's
#: MAX_INFLIGHT_BYTES), so that many consumers that never ACK are needed to fill the
#: budget; and they may fill it only up to ``1 - 1/DELIVERY_RESERVE_DIVISOR``: the rest is
#: kept for connections holding less than ``max_memory // DELIVERY_FLOOR_DIVISOR`` (a
#: consumer that ACKs as it goes), which keep getting messages (one client never
#: starves another of deliveries).
DELIVERY_SHARE_DIVISOR = 32
DELIVERY_RESERVE_DIVISOR = 4
DELIVERY_FLOOR_DIVISOR = 64
#: Encoded frames one connection may have waiting to be written (its share of
#: ``output_budget``): past it, no more MESSAGEs are written to it until its socket
#: takes what it has. 4 MiB keeps a fast reader's pipe full (a loopback socket takes
#: about as much again in the kernel).
WRITE_SHARE = 4 * 1024 * 1024
#: Encoded frames waiting to be written, broker-wide, may take ``max_memory //
#: OUTPUT_SHARE_DIVISOR``: past it, only connections with nothing waiting get a frame
#: (clients that read keep getting messages; those that do not keep what they have),
#: and the rest of the budget stays for deliveries, transactions and waiting messages.
OUTPUT_SHARE_DIVISOR = 4
#: Every ``max_memory // TRIM_DIVISOR`` bytes released or newly held, the heap's free
#: bytes are looked at (``amqlite.broker.heap``): if what is counted and what the heap
#: keeps free exceed the budget, its free pages go back to the kernel (``trim``). glibc
#: gives back only its heap's top: a hole freed by one kind of block (evicted 256 KiB
#: bodies, a partial frame moved as it grew) stays resident when the next does not fit
#: in it (a 4 MiB SEND) or is made by another thread (the store's, paging messages in).
#: Below the budget the holes stay, reused without a page fault: trimming at every
#: step, or pinning glibc's mmap threshold so that big blocks are mapped afresh, cost
#: 256 KiB messages 30-70% more broker CPU (a fault per fresh 4 KiB, ~0.45 us a KiB).
TRIM_DIVISOR = 8


class MemoryBudget:
    """The byte budgets, the bytes waiting broker-wide, and the producers paused for
    them (ActiveMQ's producer flow control, RabbitMQ's memory alarm)."""

    def __init__(self, max_memory: int, max_destination_memory: int) -> None:
        self.memory_budget = max_memory
        self.memory_resume = int(max_memory * RESUME_FRACTION)
        self.destination_budget = max_destination_memory
        self.destination_resume = int(max_destination_memory * RESUME_FRACTION)
        #: Messages waiting in sources, a body shared by copies once (``message.hold``).
        self.waiting_bytes = 0
        #: Producers paused because the broker-wide budget was reached.
        self.blocked_producers: set[Client] = set()
        #: Producers paused for any memory reason -> the sources that paused them
        #: (None: the broker-wide budget); see ``may_overdraw``.
        self.blocked_producers_all: dict[Client, set[Source | None]] = {}
        #: Bytes clients make the broker hold: open transactions and partial frames.
        self.held_bytes = 0
        self.connection_share = max_memory // CONNECTION_SHARE_DIVISOR
        self.delivery_share = max_memory // DELIVERY_SHARE_DIVISOR
        self.delivery_budget = max_memory - max_memory // DELIVERY_RESERVE_DIVISOR
        self.delivery_floor = max_memory // DELIVERY_FLOOR_DIVISOR
        #: Encoded frames not yet taken by the sockets (in held_bytes too): a MESSAGE
        #: frame is a copy of its message's body, so it counts apart from the message.
        self.output_bytes = 0
        self.output_budget = max_memory // OUTPUT_SHARE_DIVISOR
        #: Connections buffering a partial frame -> its bytes so far.
        self.partial: dict[Client, int] = {}
        #: Producers not read from because their SENDs awaiting commit found the
        #: budget full.
        self.pending_paused: set[Client] = set()
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
        #: Sources a consumer could not take from for the held bytes (the budget or
        #: its connection's share of unacknowledged deliveries): dispatched again, once,
        #: soon after bytes are released (``redispatch``, set by the broker).
        self.starved: set[Source] = set()
        self.redispatch: Callable[[], None] | None = None
        #: Unacknowledged bytes by connection (the broker's sessions): a producer paused
        #: for the budget cannot send its ACKs, so its own are not in its way to resume.
        self.delivered_to: Callable[[Client], int] = lambda conn: 0
        #: Bytes released or held since the heap was last looked at (``TRIM_DIVISOR``).
        self.churn = 0
        self.trim_step = max(max_memory // TRIM_DIVISOR, 1)
        self.trim_pending = False

    @property
    def used(self) -> int:
        """Bytes counted against ``max_memory``: waiting messages and held bytes."""
        return self.waiting_bytes + self.held_bytes

    def make_room(self, size: int, slack: int = 0) -> bool:
        """Whether ``size`` more bytes fit in the budget, after giving back stored
        messages waiting in memory if need be (``reclaim``, ``slack`` more if it can)."""
        over = self.used + size - self.memory_budget
        if over <= 0:
            return True
        if self.reclaim is None or self.waiting_bytes <= self.reclaim_exhausted_at:
            return False
        freed = self.reclaim(over + slack)
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
        """Messages left ``source`` (its own ``bytes`` are down already), ``size`` bytes
        of ``waiting_bytes`` with them (``message.unhold``: maybe only their objects,
        when other sources hold copies): let producers held back for it (or for the
        whole broker) read again once below the resume levels."""
        self.waiting_bytes -= size
        self._churned(size)
        if (source.blocked_producers
                and source.nonpersistent <= RESUME_NONPERSISTENT_BACKLOG
                and source.bytes <= self.destination_resume):
            for producer in source.blocked_producers:
                self._unblocked(producer, source)
                producer.resume_reading(f"flow:{source.name}")
            source.blocked_producers.clear()
        self._maybe_resume()

    def release_held(self, size: int) -> None:
        """``size`` held bytes (unacknowledged deliveries) were released: consumers left
        without credit for the budget may take again, producers may resume."""
        self.held_bytes -= size
        self._churned(size)
        if self.starved and self.held_bytes < self.memory_budget \
                and self.redispatch is not None:
            self.redispatch()
        self._maybe_resume()

    def output_changed(self, delta: int) -> None:
        """Encoded frames waiting to be written grew (or shrank) by ``delta`` bytes."""
        self.output_bytes += delta
        if delta > 0:
            self.held_bytes += delta
        else:
            self.release_held(-delta)

    def _churned(self, size: int) -> None:
        """``size`` bytes were released or held: past ``trim_step`` since the last look,
        look at the heap once the callbacks running now have dropped their references."""
        self.churn += size
        if self.churn < self.trim_step or self.trim_pending:
            return
        self.churn = 0
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a unit test): at once
            self.trim()
            return
        self.trim_pending = True
        loop.call_soon(self.trim)

    def trim(self) -> bool:
        """Give the heap's free pages back if what is counted and what the heap keeps
        free exceed the budget (``TRIM_DIVISOR``); whether it did."""
        self.trim_pending = False
        free = heap.heap_free()
        if free is None or self.used + free <= self.memory_budget:
            return False
        heap.trim_malloc()
        return True

    def take_starved(self) -> list[Source]:
        """The sources to dispatch again (``redispatch`` runs them a loop turn later)."""
        starved, self.starved = list(self.starved), set()
        return starved

    def _maybe_resume(self) -> None:
        """Below the resume level: paused producers and partial frames read again."""
        if self.pending_paused and (self.held_bytes - self._own(self.pending_paused)
                                    <= self.memory_resume):
            self._resume_pending()
        if self.used > self.memory_resume:
            if not self.blocked_producers or self._paused_own() <= self.memory_resume:
                return
            self.resume_producers()  # the rest is theirs: their ACKs must be read
            return
        if self.blocked_producers:
            self.resume_producers()
        if self.partial_paused:
            paused, self.partial_paused = self.partial_paused, set()
            for c in paused:
                c.resume_reading(PARTIAL_REASON)

    def _own(self, producers: set[Client]) -> int:
        """The unacknowledged deliveries of ``producers``, paused for the budget: they
        can only go once those connections are read again (their ACKs). Each counts its
        whole copies; a topic message others hold unacknowledged too is in
        ``held_bytes`` once (``message.track``): this may take off more, resuming
        sooner, never later."""
        return sum(self.delivered_to(c) for c in producers)

    def _paused_own(self) -> int:
        """``used`` but for what the producers paused for the budget hold unacknowledged."""
        return self.used - self._own(self.blocked_producers)

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
            if self._paused_own() <= self.memory_resume:
                self.resume_producers()  # its own unacknowledged bytes fill the budget
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

    # -- what clients make the broker hold: pending SENDs, transactions, partial frames ---
    def hold_pending(self, producer: Client, size: int) -> None:
        """A persistent SEND's ``size`` bytes are held until its commit. Past the budget,
        stored messages waiting in memory are given back to the store; once what clients
        hold is past it, the producer is no longer read from until its commits land
        (``release_pending``) or held bytes are below the resume level. What cannot be
        given back (a queue's MIN_IN_MEMORY floor, non-persistent messages) does not hold
        a persistent producer: it would wait for consumers that may never come, while
        its messages need memory only until they are stored. Nothing is refused: the
        bytes were read already."""
        self.held_bytes += size
        if self.used <= self.memory_budget:
            return
        self.make_room(0, self.memory_budget // RECLAIM_SLACK_DIVISOR)
        if (self.held_bytes > self.memory_budget and producer not in self.pending_paused
                and not producer.closed):
            if not self.pending_paused:  # one line per episode, not per producer
                log.info("memory budget reached (%d bytes waiting, %d held): pausing "
                         "producers until their persistent SENDs commit",
                         self.waiting_bytes, self.held_bytes)
            self.pending_paused.add(producer)
            producer.pause_reading(PENDING_REASON)

    def release_pending(self, producer: Client, size: int, left: int) -> None:
        """``size`` bytes of ``producer``'s SENDs committed (or failed), ``left`` are still
        pending: with none left and held bytes within the budget, it is read again."""
        self.release_held(size)
        if (not left and producer in self.pending_paused
                and self.held_bytes <= self.memory_budget):
            self.pending_paused.discard(producer)
            producer.resume_reading(PENDING_REASON)

    def _resume_pending(self) -> None:
        paused, self.pending_paused = self.pending_paused, set()
        for producer in paused:
            producer.resume_reading(PENDING_REASON)

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
        self._churned(size)

    def release_transaction(self, session: Session, size: int) -> None:
        """A transaction holding ``size`` bytes was committed, aborted or dropped."""
        session.tx_bytes -= size
        self.held_bytes -= size
        self._churned(size)
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
            self._churned(new - old)
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
        self._churned(old - new)
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
        self.pending_paused.discard(conn)
        if self.partial_reader is conn:
            self.partial_reader = None

    def may_overdraw(self, conn: Client, inflight_bytes: int, limit: int) -> bool:
        """A consumer whose connection we stopped reading (it also produces) cannot
        send its ACKs: let it take what waits, up to one destination budget past
        ``limit``, so the waiting bytes drop, its reading resumes, its ACKs arrive."""
        return (conn in self.blocked_producers_all
                and inflight_bytes < limit + self.destination_budget)
