"""The broker's view of the store: value types, the batch, and the ``Store`` seam.

The broker is single-threaded asyncio; a ``Store`` is synchronous and is
driven by one thing at a time (the group committer: its thread, or for
``start_commit`` its event loop), so it needs no locking of its own. Every write
goes through ``commit_batch`` or ``start_commit``, which prove the epoch in the
same transaction and raise ``Fenced`` when the group has moved on.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Protocol


class StoreError(Exception):
    """The store could not be reached or failed; the master must demote."""


class StoreRejected(StoreError):
    """The store refused this batch's data (a value too long, out of range, not
    encodable, a constraint): the transaction was rolled back and the store is
    still usable. Not a reason to demote; the group committer splits a merged
    commit so that only the batch refused on its own fails. A subclass of
    ``StoreError`` so that code which does not know the difference stays safe
    (it treats it as a failure)."""


class StoreUnusable(StoreError):
    """The store answered and said no for good (no such database, login refused,
    a file that cannot be written): retrying will not help, the setting must change."""


class Fenced(StoreError):  # not FencedError: the name says what happened
    """The group's epoch is no longer ours: another master took over."""


class StaleClaim(Fenced):
    """A claim refused: the group's epoch moved past the one this node read when it
    acquired the lock, so another node has claimed since (we lost the lock)."""


@dataclass(slots=True)
class NewMessage:
    """A persistent message to insert. ``id`` is allocated by the master."""

    id: int
    destination_id: int
    message_id: str
    headers: dict[str, str]
    body: bytes
    priority: int = 4
    expires_at: int = 0  # ms since the Unix epoch; 0 = never
    enqueued_at: int = 0  # ms since the Unix epoch
    producer_id: str | None = None
    producer_seq: int | None = None
    dedup_key: str | None = None
    #: For a topic message: the durable subscriptions that are owed it.
    subscriber_ids: tuple[int, ...] = ()
    #: 1 when a queue message is handed to a waiting consumer in the same
    #: commit that stores it (stored as delivered, in flight under the epoch):
    #: the delivery needs no write of its own.
    delivery_count: int = 0
    #: > 0: a scheduled message, due at this time (ms): stored but not deliverable, no
    #: queue depth, no subscription owed it (see ``ScheduleStep``). 0: an ordinary one.
    deliver_at: int = 0
    #: A scheduled message's plan (JSON, ``amqlite.broker.schedule.Plan``).
    schedule: str | None = None


@dataclass(slots=True)
class StoredMessage:
    """A message row paged in from the store."""

    id: int
    destination_id: int
    message_id: str
    headers: dict[str, str]
    body: bytes
    priority: int
    expires_at: int
    enqueued_at: int
    delivery_count: int  # for a durable subscription: that subscription's count
    producer_id: str | None = None
    producer_seq: int | None = None
    dedup_key: str | None = None


@dataclass(slots=True, frozen=True)
class ScheduleStep:
    """A scheduled message's occurrence was made deliverable (a copy inserted in the
    same batch): its row moves on to the next occurrence, ``next_due`` (ms) with
    ``schedule`` as its plan, or goes (``next_due`` None: that was the last)."""

    id: int
    next_due: int | None = None
    schedule: str | None = None


@dataclass(slots=True)
class ScheduledRow:
    """A scheduled message as stored (``Store.due_scheduled``). ``destination`` and
    ``kind`` are None when its destination row is gone."""

    id: int
    destination_id: int
    destination: str | None
    kind: str | None
    message_id: str
    headers: dict[str, str]
    body: bytes
    priority: int
    enqueued_at: int
    deliver_at: int
    schedule: str | None
    #: A delayed redelivery's (``Batch.delays``): deliveries so far and its expiry.
    delivery_count: int = 0
    expires_at: int = 0
    producer_id: str | None = None
    producer_seq: int | None = None


@dataclass(slots=True, frozen=True)
class DestinationRow:
    id: int
    name: str
    kind: str  # "queue" | "topic"
    depth: int = 0


@dataclass(slots=True, frozen=True)
class SubscriptionRow:
    id: int
    client_id: str
    name: str
    destination_id: int
    selector: str | None = None
    pending: int = 0
    #: The login that created it; None without authentication or from before schema v2.
    owner: str | None = None


#: A reference to one stored delivery: (subscription id or None for a queue, message id).
Ref = tuple[int | None, int]

#: One client frame's part of a batch, which the store may refuse on its own:
#: [start, end) of ``destinations``, ``subscriptions``, ``inserts`` and
#: ``identities``, in that order (see ``GroupCommitter.submit``), and for a
#: COMMIT (whose ACKs must not apply when its SENDs are refused) also of
#: ``acks``: 8 or 10 numbers, pairs in ``_UNIT_FIELDS`` order.
UnitSpan = tuple[int, ...]
#: A conjunction of ``(kind, field, op, value)`` terms a page of messages must satisfy:
#: kind ``"column"`` (priority, enqueued_at, expires_at, message_id) or ``"header"``
#: (a user header, text; NULL when absent); op one of = <> < > <= >= in, not in,
#: is null, is not null. The broker's selectors make them (``amqlite.broker.selective``).
PageFilter = tuple[tuple[str, str, str, object], ...]
#: ``BatchResult.rejected`` key of the part of a batch outside every unit.
OUTSIDE_UNITS = -1


@dataclass(slots=True)
class Batch:
    """Writes committed together in one fenced transaction.

    Order of application inside the transaction: destinations, subscriptions
    (created), subscriptions (claimed), inserts, schedule steps, redeliveries,
    undeliveries, deliveries, releases, delays, moves, acks, subscriptions (removed).
    An insert whose ``dedup_key`` is already in the dedup window (or earlier in the same batch)
    is skipped and reported in ``BatchResult.duplicates``.

    Because of that fixed order, one batch must not release or move a message
    and then deliver it again, nor remove a durable subscription and create
    one with the same (client_id, name): split such work over two batches.
    ``merge_safe`` tells the group committer when two batches may become one.
    """

    destinations: list[DestinationRow] = field(default_factory=list)
    subscriptions: list[SubscriptionRow] = field(default_factory=list)
    inserts: list[NewMessage] = field(default_factory=list)
    #: Persistent sends that store no message (a topic with no durable
    #: subscriber, an aborted transaction): only their producer identity goes
    #: into the dedup window, so a replay is dropped and the audit sees no gap.
    identities: list[NewMessage] = field(default_factory=list)
    #: Queue messages stored as delivered with their insert (handed over) whose
    #: consumer left before the MESSAGE could be written: delivery_count -= 1,
    #: inflight_epoch = NULL, as if never handed over.
    undeliveries: list[int] = field(default_factory=list)
    #: Delivered and awaiting an ack: delivery_count += 1, inflight_epoch = epoch.
    deliveries: list[Ref] = field(default_factory=list)
    #: Back to deliverable (NACK, consumer gone): inflight_epoch = NULL.
    releases: list[Ref] = field(default_factory=list)
    #: Queue message -> another queue (the DLQ): (message id, new destination id).
    moves: list[tuple[int, int]] = field(default_factory=list)
    #: Consumed: a queue message row is deleted; a durable subscription's
    #: pending row is deleted, and the message row with its last pending row.
    acks: list[Ref] = field(default_factory=list)
    #: Durable subscriptions removed, with their pending rows.
    removed_subscriptions: list[int] = field(default_factory=list)
    #: (subscription id, login): an ownerless subscription (from before owners
    #: were stored, or made without authentication) gets its first owner. Only a
    #: NULL owner is set, so a replayed claim cannot take one over.
    claimed_subscriptions: list[tuple[int, str]] = field(default_factory=list)
    #: Scheduled messages whose due occurrence this batch makes deliverable (applied
    #: with the inserts of their copies, so a takeover delivers each occurrence once).
    schedule_steps: list[ScheduleStep] = field(default_factory=list)
    #: Per-destination totals to add (``schema.counters``): destination id -> one
    #: delta per ``schema.COUNTER_KINDS``. The broker fills it from what it counted
    #: since the last flush (``amqlite.broker.counters``), so the totals commit with
    #: the writes they count: one row per destination touched, not per message.
    counters: dict[int, list[int]] = field(default_factory=dict)
    #: Queue messages NACKed under a redelivery delay (``amqlite.policy``): (message id,
    #: due ms, plan JSON): out of flight and scheduled in place (``deliver_at``), still
    #: counted in the queue's depth. The scheduler's timer brings them back
    #: (``redeliveries``), on this master or the next.
    delays: list[tuple[int, int, str]] = field(default_factory=list)
    #: Delayed redeliveries that are due: deliverable again (``deliver_at`` cleared), the
    #: same row with its delivery count.
    redeliveries: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return (
            len(self.destinations)
            + len(self.subscriptions)
            + len(self.inserts)
            + len(self.identities)
            + len(self.undeliveries)
            + len(self.deliveries)
            + len(self.releases)
            + len(self.moves)
            + len(self.acks)
            + len(self.removed_subscriptions)
            + len(self.claimed_subscriptions)
            + len(self.schedule_steps)
            + len(self.counters)
            + len(self.delays)
            + len(self.redeliveries)
        )

    def extend(self, other: Batch) -> None:
        self.destinations += other.destinations
        self.subscriptions += other.subscriptions
        self.inserts += other.inserts
        self.identities += other.identities
        self.undeliveries += other.undeliveries
        self.deliveries += other.deliveries
        self.releases += other.releases
        self.moves += other.moves
        self.acks += other.acks
        self.removed_subscriptions += other.removed_subscriptions
        self.claimed_subscriptions += other.claimed_subscriptions
        self.schedule_steps += other.schedule_steps
        if other.counters:
            add_counts(self.counters, other.counters)
        self.delays += other.delays
        self.redeliveries += other.redeliveries

    def carve(self, spans: list[UnitSpan]) -> tuple[Batch, list[Batch]]:
        """Split into the part outside every span and one batch per span
        (disjoint spans; only when the store refused the whole)."""
        inside: list[set[int]] = [set() for _ in _UNIT_FIELDS]
        units = []
        for span in spans:
            unit = Batch()
            for k in range(len(span) // 2):  # a span without acks covers none
                name, start, end = _UNIT_FIELDS[k], span[2 * k], span[2 * k + 1]
                getattr(unit, name).extend(getattr(self, name)[start:end])
                inside[k].update(range(start, end))
            units.append(unit)
        rest = Batch()
        rest.extend(self)  # every list copied, so none is forgotten; the units' filtered below
        for name, taken in zip(_UNIT_FIELDS, inside, strict=True):
            setattr(rest, name, [x for i, x in enumerate(getattr(self, name)) if i not in taken])
        return rest, units

    def merge_safe(self, later: Batch) -> bool:
        """True when applying ``self.extend(later)`` in the fixed order gives the
        same rows as committing ``self`` and then ``later``.

        The order puts deliveries before releases and moves, and created
        subscriptions before removed ones, so a later delivery of something
        this batch releases or moves (or a re-created subscription name) would
        come out wrong; every other pair commutes.
        """
        if later.subscriptions and self.removed_subscriptions:
            return False
        if not later.deliveries or not (self.releases or self.moves):
            return True
        undone = set(self.releases)
        undone.update((None, mid) for mid, _ in self.moves)
        undone.update((None, mid) for mid, _, _ in self.delays)
        return undone.isdisjoint(later.deliveries)


def add_counts(into: dict[int, list[int]], more: dict[int, list[int]]) -> None:
    """Add the per-destination deltas ``more`` to ``into`` (``Batch.counters``)."""
    for did, deltas in more.items():
        have = into.get(did)
        if have is None:
            into[did] = list(deltas)
        else:
            for k, n in enumerate(deltas):
                have[k] += n


#: The lists of a ``Batch`` a ``UnitSpan`` indexes, in its order (``acks``
#: only in a COMMIT's span: see ``store.write_buffer.CommitUnit``).
_UNIT_FIELDS = ("destinations", "subscriptions", "inserts", "identities", "acks")


@dataclass(slots=True)
class BatchResult:
    #: dedup keys of inserts that were dropped as already stored.
    duplicates: set[str] = field(default_factory=set)
    #: ids of the ``NewMessage``s dropped as duplicates (unambiguous when the
    #: group committer merged several callers' batches into one commit).
    duplicate_ids: set[int] = field(default_factory=set)
    #: Units of the batch the store refused (nothing of them was written), by
    #: index into the spans given to ``submit``; ``OUTSIDE_UNITS``: the rest.
    rejected: dict[int, StoreRejected] = field(default_factory=dict)


@dataclass(slots=True, frozen=True)
class DeletedDestination:
    """What ``Store.delete_destination`` removed (counted by the store, not predicted)."""

    existed: bool  # False: there was no such row (nothing was removed)
    messages: int = 0  # message rows: a queue's, or a topic's kept for its subscriptions
    subscriptions: int = 0  # durable subscriptions of a topic


@dataclass(slots=True)
class Integrity:
    """The activation check: the counters the last master committed vs. reality."""

    expected_count: int
    expected_max_id: int
    actual_count: int
    actual_max_id: int

    @property
    def mismatch(self) -> bool:
        """The count must match exactly. ``expected_max_id`` is the highest id
        ever committed (acks delete the newest rows too), so a healthy store has
        ``actual_max_id <= expected_max_id``; a larger one was written by nobody
        who kept the counters."""
        return (
            self.actual_count != self.expected_count
            or self.actual_max_id > self.expected_max_id
        )


@dataclass(slots=True)
class Recovery:
    """What a new master needs to serve; its cost must not grow with the backlog."""

    epoch: int
    destinations: list[DestinationRow]
    subscriptions: list[SubscriptionRow]
    next_message_id: int
    next_destination_id: int
    next_subscription_id: int
    #: Per-destination totals (``schema.counters``): destination id -> one value per
    #: ``schema.COUNTER_KINDS``.
    counters: dict[int, tuple[int, ...]] = field(default_factory=dict)


class LoopCommit(Protocol):
    """A commit sent by ``Store.start_commit``, its answer not yet read. The loop
    calls ``flush`` while the socket is writable and not all is sent (``sent``
    False), ``receive`` when it is readable; after an exception from either, once
    it no longer watches ``fd``, ``failed`` (which closes the connection)."""

    sent: bool

    @property
    def fd(self) -> int: ...

    def flush(self) -> bool:
        """Send more (never blocks); True when all of it went."""

    def receive(self) -> BatchResult | None:
        """Read what came (never blocks): the result once the answer is in. A commit
        may send itself again meanwhile (then ``sent`` says whether all of it went)."""

    def failed(self, exc: BaseException) -> StoreError:
        """What ``commit_batch`` would have raised for ``exc``."""


class Store(abc.ABC):
    """Synchronous persistence for one group, driven by one caller at a time (the
    group committer's thread, or its event loop for ``start_commit``)."""

    #: URL with the password removed, for log lines.
    description: str = "store"

    def __init__(self, group: str) -> None:
        self.group = group

    @abc.abstractmethod
    def open(self) -> None:
        """Connect, and create or upgrade the schema (idempotent, safe to race)."""

    @abc.abstractmethod
    def close(self) -> None: ...

    @abc.abstractmethod
    def read_epoch(self) -> int:
        """The group's current epoch (0: never claimed)."""

    @abc.abstractmethod
    def claim_epoch(self, node: str, token: int | None = None, dedup_window_ms: int = 0,
                    *, expected: int | None = None) -> int:
        """Make this node the group's master: epoch := max(epoch + 1, token). Call
        only while holding the lock. Records an activation row. Returns the epoch.
        With ``expected`` (the epoch read on acquiring the lock) the group must still
        be at it, else ``StaleClaim`` and nothing changes."""

    @abc.abstractmethod
    def recover(self, epoch: int) -> Recovery:
        """Read what a new master needs: O(destinations + subscriptions), never
        O(messages). Messages in flight under older epochs need no rewrite: the
        new master pages every row in and flags ``delivery_count > 0`` as redelivered."""

    @abc.abstractmethod
    def check_integrity(self, epoch: int) -> Integrity:
        """Compare the group's committed counters with count(*)/max(id) and record
        the result on the activation row. O(messages): run it in the background,
        on a thread of its own rather than the group committer's (it uses its
        own connection and one snapshot, so commits may go on meanwhile)."""

    @abc.abstractmethod
    def commit_batch(self, epoch: int, batch: Batch) -> BatchResult:
        """Apply ``batch`` in one transaction that first proves ``epoch`` is the
        group's current one. Raises ``Fenced`` (nothing written), ``StoreRejected``
        (the data, not the store, is at fault: nothing written, the store is
        usable) or ``StoreError``."""

    #: Whether ``start_commit`` may take batches at all (PostgreSQL): the group
    #: committer then orders its work on the event loop (``store.group_commit``).
    loop_commits: bool = False

    def loop_fits(self, batch: Batch) -> bool:
        """Whether ``start_commit`` takes batches of this shape."""
        return False

    def start_commit(self, epoch: int, batch: Batch) -> LoopCommit | None:
        """``commit_batch`` without waiting: the transaction sent, its answer read
        by an event loop that watches ``LoopCommit.fd``. None when the batch cannot
        go this way now (``commit_batch`` then, on the store thread). Raises as
        ``commit_batch`` does when sending fails."""
        return None

    @abc.abstractmethod
    def load_page(
        self, destination_id: int, after_id: int, limit: int
    ) -> list[StoredMessage]:
        """Queue messages with id > after_id, by id (in flight or not).

        Deliberately no ``FOR UPDATE SKIP LOCKED``: see ``store.recovery``."""

    def load_page_matching(
        self, destination_id: int, after_id: int, limit: int, terms: PageFilter
    ) -> list[StoredMessage]:
        """``load_page`` narrowed by ``terms`` where the store can check them: the rows
        are candidates, which the caller still checks (a selective consumer's scan).
        Without a filter of its own, a store returns the plain page."""
        return self.load_page(destination_id, after_id, limit)

    def queue_members(self, destination_id: int) -> list[tuple[int, int]]:
        """(id, body bytes) of a queue's deliverable messages, by id (a bounded queue's
        count at activation); a store without it reports none."""
        return []

    @abc.abstractmethod
    def load_subscription_page(
        self, subscription_id: int, after_id: int, limit: int
    ) -> list[StoredMessage]:
        """Messages a durable subscription is owed, id > after_id, by id."""

    @abc.abstractmethod
    def reap_expired(self, epoch: int, now_ms: int, limit: int) -> list[Ref]:
        """Delete up to ``limit`` expired rows (fenced); return what went."""

    def reap_expired_counted(self, epoch: int, now_ms: int,
                             limit: int) -> dict[int, list[Ref]]:
        """``reap_expired``, by destination id (the store counted them in its totals
        with the delete; the broker adds them to its own). A store that cannot tell
        the destinations reaps and says nothing went."""
        self.reap_expired(epoch, now_ms, limit)
        return {}

    @abc.abstractmethod
    def prune_dedup(self, epoch: int, older_than_ms: int, limit: int) -> int:
        """Forget dedup keys older than the window (fenced); return how many."""

    @abc.abstractmethod
    def delete_destination(self, epoch: int, destination_id: int) -> DeletedDestination:
        """Remove a destination for good, in one fenced transaction: its row, its
        messages (in flight or not), and for a topic its durable subscriptions with
        what they were owed (ActiveMQ removes a topic's durable subscriptions with it).
        Raises ``Fenced`` (nothing removed) like ``commit_batch``."""

    def holds_messages(self, destination_id: int) -> bool:
        """Does the destination have any message row, in flight or scheduled? The idle
        queue GC (``amqlite.broker.inactive``) asks before it deletes one. Not abstract:
        a store that cannot tell says True, so nothing is deleted."""
        return True

    def vacuum_messages(self) -> None:
        """Make the space of deleted message rows reusable now, outside any commit (a
        thread of its own may call it); nothing when no commit deleted a row since the
        last time. Not abstract: a no-op for a store that reuses the space by itself
        (SQLite's free pages)."""
        return None

    # Scheduled delivery. Not abstract so that test doubles of the store need not.
    def next_scheduled(self) -> int | None:
        """The earliest ``deliver_at`` of a scheduled message (ms), or None: one index
        probe, whatever the number of scheduled messages."""
        return None

    def due_scheduled(self, now_ms: int, limit: int) -> list[ScheduledRow]:
        """Up to ``limit`` scheduled messages due at ``now_ms``, earliest first."""
        return []

    def cancel_scheduled(self, epoch: int, message_id: int) -> bool:
        """Remove a scheduled message (fenced); False when there is no such one."""
        return False

    @abc.abstractmethod
    def end_activation(self, epoch: int) -> None:
        """Mark a graceful stop on the activation row (fenced; a no-op if fenced)."""

    # Registry rows (when ZooKeeper is not the registry). Not fenced: slaves
    # write them too. Not abstract so that test doubles of the store need not.
    def register(
        self,
        name: str,
        role: str,
        services: str | list[str] | tuple[str, ...],
        host: str | None,
        pid: int | None,
        epoch: int | None,
    ) -> None:
        """Upsert this node's registry row with heartbeat_at = now."""
        raise NotImplementedError

    def unregister(self, name: str) -> None:
        """Remove this node's registry row (graceful stop)."""
        raise NotImplementedError
