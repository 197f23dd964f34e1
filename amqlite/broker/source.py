"""Sources: the ordered backlogs consumers take from.

A source is a queue, a durable topic subscription (stored once, owed per
subscription) or a non-durable topic subscription (memory only, one consumer).
Queues are never loaded whole: each keeps stored messages in memory while the
destination and the broker are under their byte budgets (at most
``MAX_IN_MEMORY``, at least ``MIN_IN_MEMORY``) and pages the rest in by id (ids
are allocated in commit order). Bytes are accounted in ``amqlite.broker.memory``.

Two figures per waiting message: ``Source.bytes`` adds its whole ``Message.size`` to
each source holding it, for that source's own limits (``max_destination_memory``: how
far one queue or subscriber may fall behind, what its producers are paused for); the
broker-wide ``MemoryBudget.waiting_bytes`` adds what ``message.hold`` says, the shared
body and headers of a topic message once however many subscriptions hold copies (real
memory: one body), and each further copy's own object.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from amqlite.broker import choice, limits, memory, selective
from amqlite.broker.message import Message, hold, holding, now_ms, releases, unhold
from amqlite.wildcard import Pattern
from amqlite.wire import ACK_AUTO, AMQ_GROUP_ID
from store.api import Ref, StoredMessage

if TYPE_CHECKING:
    from amqlite.broker.core import Broker
    from amqlite.broker.selector import Selector
    from amqlite.broker.session import Client
    from amqlite.broker.subscription import Subscription

log = logging.getLogger("amqlite.broker")

#: Stored messages a destination keeps in memory at most, when its byte
#: budget allows; the rest stay in the store and are paged in by id.
#: ActiveMQ's store cursor pages 200 at a time with a memory limit per
#: destination; 1000 keeps a fast consumer busy between pages.
MAX_IN_MEMORY = 1000
#: Stored messages a destination may keep (and page in) even over its byte
#: budget, so its consumers never starve while other destinations fill the
#: broker: 16 x the largest frame is the worst case above the budget.
MIN_IN_MEMORY = 16
#: Page size for loading from the store (at most; fewer when bytes are short),
#: and the level below which we load.
PAGE_SIZE = 500
LOW_WATER = 250
#: A non-durable topic subscriber that falls this far behind (in messages, or
#: in bytes: the destination budget) misses what is published until it catches
#: up (ActiveMQ's slow-consumer limit for topics: a publisher is never held
#: back by one slow subscriber).
MAX_TOPIC_BACKLOG = 10_000
#: Log a slow topic subscriber's drops on the first and then every this many.
DROP_LOG_EVERY = 1000


class Source:
    """An ordered backlog with consumers: a queue, a durable subscription, or a
    non-durable topic subscription (memory only, one consumer)."""

    #: Consumers' selectors choose among this source's messages at dispatch (a queue).
    #: A topic subscription's selector filters when a message is routed to it instead.
    SELECTS_AT_DISPATCH = True

    def __init__(self, broker: Broker, name: str, store_id: int | None, stored: bool) -> None:
        self.broker = broker
        self.memory = broker.memory
        self.name = name
        self.store_id = store_id  # destination id (queue) or subscription id (durable)
        self.stored = stored  # pages from the store
        self.heap: list[tuple[int, int, Message]] = []
        self.in_memory_stored = 0  # stored messages in the heap
        self.nonpersistent = 0
        #: Message.size of everything in the heap, whoever else holds copies: this
        #: source's own limits (the broker-wide figure counts shared bytes once).
        self.bytes = 0
        #: Size of a stored row, to page in no more than the budget holds: the
        #: largest seen (a recovered queue starts from the largest frame).
        self.row_size = broker.settings.max_frame_size
        self.cursor = 0  # highest stored id paged in or appended
        self.store_has_more = stored
        self.paging = False
        self.consumers: list[Subscription] = []
        self.turn = 0
        self.blocked_producers: set[Client] = set()
        #: Inserts staged for this queue and not yet committed that were not
        #: handed to a consumer up front: while any is pending, a newer
        #: message must not be handed over first (a consumer sees queue order).
        self.pending_inserts = 0
        #: A topic subscription's wildcard pattern (``amqlite.wildcard``), if any.
        self.pattern: Pattern | None = None
        #: Consumers with a selector (a queue: see ``amqlite.broker.selective``).
        self.selective = 0
        #: A topic subscription's selector: what is routed to it must match.
        self.selector: Selector | None = None
        #: Consumer choice (``amqlite.broker.choice``): consumers with a priority or
        #: exclusive, the exclusive ones, whether a grouped message was seen, and the
        #: groups' consumers.
        self.ranked = 0
        self.exclusive = 0
        self.groups_seen = False
        self.groups: dict[str, Subscription] = {}
        #: A topic subscription that takes nothing its own connection published.
        self.no_local = False
        #: Stored ids past ``cursor`` a selective scan brought in (in memory or in
        #: flight): the pager steps over them until its cursor passes them.
        self.ahead: set[int] = set()
        #: The highest stored id that left the heap (delivered, dropped, handed over):
        #: ``evict`` gives back only newer ones, so a page cannot load again what is in
        #: flight or acknowledged.
        self.taken_max = 0
        #: A bounded queue's ledger (``amqlite.broker.limits``); None: not bounded.
        self.ledger: limits.Ledger | None = None

    # Queues store with ref (None, id); durable subscriptions with (sub_id, id).
    def ref(self, message: Message) -> Ref:
        return (None, message.id)

    def push(self, message: Message) -> None:
        if self.ledger is not None:
            limits.admit(self.broker, self, message)
        heapq.heappush(self.heap, (-message.priority, message.id, message))
        if (not self.groups_seen and AMQ_GROUP_ID in message.headers
                and self.SELECTS_AT_DISPATCH):
            self.groups_seen = True
        self.bytes += message.size
        self.memory.waiting_bytes += hold(message)
        if message.persistent:
            self.in_memory_stored += 1
        else:
            self.nonpersistent += 1

    def over_budget(self) -> bool:
        """This destination or the whole broker holds as many bytes as allowed."""
        return self.memory.full(self.bytes)

    def append_committed(self, message: Message) -> None:
        """A freshly committed message: keep it in memory unless the store pages
        (it does once this destination or the broker is out of bytes).

        Every caller (``routing.route_committed``: a SEND's, a dead letter's, an
        operator's move, the scheduler's copies) calls it in the callback of the commit
        that stored ``message``, never a loop turn later: a page read after that commit
        is handled after this call (the group committer resolves in store order), so it
        steps over what this pushed (``cursor``) or finds what it left to the pager.
        Later, a page could have brought it in first: twice in memory, delivered twice
        (tests/broker/test_paged_while_committing.py)."""
        if self.ledger is not None and limits.dropped_meanwhile(self, message):
            return  # drop-head took it while it committed (its ack deletes the row)
        if self.store_has_more or (
            self.in_memory_stored >= MIN_IN_MEMORY
            and (self.in_memory_stored >= MAX_IN_MEMORY or self.over_budget())
        ):
            self.store_has_more = True  # the pager will find it by id
            self.row_size = max(self.row_size, message.size)
            if self.selective:
                selective.store_grew(self)
            return
        self.cursor = max(self.cursor, message.id)
        self.push(message)

    def add_nonpersistent(self, message: Message, producer: Client | None = None) -> None:
        """Queue a memory-only message; past the limits, hold its producer back."""
        self.push(message)
        if producer is not None and (
            self.nonpersistent >= memory.MAX_NONPERSISTENT_BACKLOG or self.over_budget()
        ):
            self.memory.block_producer(producer, self)

    def pop(self) -> Message | None:
        if not self.heap:
            return None
        message = heapq.heappop(self.heap)[2]
        if message.id > self.taken_max:
            self.taken_max = message.id
        if message.persistent:
            self._released(message.size, 1, 0, unhold(message))
        else:
            self._released(message.size, 0, 1, unhold(message))
            if self.ledger is not None:
                limits.forget(self.broker, self, message.id)
        return message

    def _released(self, size: int, stored: int, nonpersistent: int, freed: int) -> None:
        """Messages left this source: ``size`` bytes of its own figure, ``freed`` of the
        broker-wide one (``unhold``'s); let producers that were held back for this
        destination (or the whole broker) read again."""
        self.bytes -= size
        self.in_memory_stored -= stored
        self.nonpersistent -= nonpersistent
        self.memory.released(self, freed)

    def __len__(self) -> int:
        return len(self.heap)

    def discard(self) -> None:
        """The source is gone (its subscription ended): free what waited in it,
        in the budgets too, and let its paused producers go."""
        freed = 0
        for entry in self.heap:
            freed += unhold(entry[2])
        self.heap.clear()
        self._released(self.bytes, self.in_memory_stored, self.nonpersistent, freed)

    # -- consumers ----------------------------------------------------------
    def add_consumer(self, sub: Subscription) -> None:
        """In priority order (highest first, then arrival): ``choice`` relies on it."""
        at = len(self.consumers)
        while at and self.consumers[at - 1].priority < sub.priority:
            at -= 1
        self.consumers.insert(at, sub)
        self._count(sub, 1)
        self.dispatch()

    def remove_consumer(self, sub: Subscription) -> None:
        if sub in self.consumers:
            self.consumers.remove(sub)
            self._count(sub, -1)
            choice.consumer_left(self, sub)

    def _count(self, sub: Subscription, step: int) -> None:
        if not self.SELECTS_AT_DISPATCH:
            return
        if sub.selector is not None:
            self.selective += step
        if sub.priority or sub.exclusive:
            self.ranked += step
        if sub.exclusive:
            self.exclusive += step

    def _next_consumer(self) -> Subscription | None:
        n = len(self.consumers)
        for i in range(n):
            sub = self.consumers[(self.turn + i) % n]
            if sub.has_credit():
                self.turn = (self.turn + i + 1) % n
                return sub
        return None

    def hand_over_to(self, message: Message) -> Subscription | None:
        """The consumer a new message may go to in the commit that stores it:
        one in a client ack mode whose turn it is, when nothing is ahead of the
        message (in memory, in the store, or committing). Auto-ack consumers
        take theirs after the commit, as before (the turn is kept for them)."""
        if AMQ_GROUP_ID in message.headers and self.SELECTS_AT_DISPATCH:
            self.groups_seen = True
        if (self.broker.paused or self.heap or self.store_has_more or self.paging
                or self.pending_inserts or self.groups_seen
                or message.expired(message.enqueued_at)):
            return None  # grouped: its dispatch pins the group's consumer (``choice``)
        turn = self.turn
        if self.selective or self.ranked:  # the consumer ``choice`` would pick
            sub = choice.next_in_turn(self, message)
        else:
            sub = self._next_consumer()
        if sub is None or sub.ack_mode == ACK_AUTO:
            self.turn = turn
            return None
        return sub

    def dispatch(self) -> None:
        """Hand waiting messages to consumers with credit, round robin (fair)."""
        if self.broker.paused or not self.consumers:
            return
        if self.selective or self.ranked or self.groups_seen:
            choice.dispatch(self)
            return
        now = now_ms()
        while self.heap:
            sub = self._next_consumer()
            if sub is None:
                break
            message = self.pop()
            assert message is not None
            if message.expired(now):
                self.broker.expire(self, message)
                continue
            sub.deliver(message)
        self.maybe_page()

    # -- paging ---------------------------------------------------------------
    def maybe_page(self) -> None:
        if (
            self.stored
            and self.store_id is not None
            and self.store_has_more
            and not self.paging
            and self.in_memory_stored < LOW_WATER
            and self.consumers
        ):
            limit = self.page_limit()
            if limit > 0:
                self.paging = True
                self.broker.load_page(self, limit)

    def page_limit(self) -> int:
        """Rows to page in: what the byte budgets leave room for (by the largest
        row seen), at most PAGE_SIZE, at least up to the MIN_IN_MEMORY floor (not
        while its consumers are refused for the held bytes: they could not take it)."""
        free = self.memory.room(self.bytes)
        limit = min(PAGE_SIZE, LOW_WATER * 2 - self.in_memory_stored,
                    max(free, 0) // max(self.row_size, 1))
        if self in self.memory.starved:
            return limit
        return max(limit, MIN_IN_MEMORY - self.in_memory_stored)

    def page_loaded(self, rows: list[StoredMessage], limit: int) -> None:
        self.paging = False
        largest = 0
        ahead = self.ahead
        for row in rows:
            if row.id <= self.cursor:
                continue  # already in memory (appended after commit)
            self.cursor = row.id
            if ahead and row.id in ahead:
                continue  # a selective scan has it (in memory or in flight)
            message = Message.from_row(row, self.name)
            largest = max(largest, message.size)
            self.push(message)
        if largest:
            self.row_size = largest
        self.store_has_more = len(rows) >= limit
        if ahead:
            self.ahead = {i for i in ahead if i > self.cursor}
        self.dispatch()

    def take(self, entry: tuple[int, int, Message]) -> Message:
        """Remove one heap ``entry`` (``selective.dispatch`` walks the heap itself) and
        give its bytes back, as ``pop`` does."""
        message = entry[2]
        if message.id > self.taken_max:
            self.taken_max = message.id
        if message.persistent:
            self._released(message.size, 1, 0, unhold(message))
        else:
            self._released(message.size, 0, 1, unhold(message))
            if self.ledger is not None:
                limits.forget(self.broker, self, message.id)
        return message

    def evict(self, want: int) -> int:
        """Give back up to ``want`` bytes (``MemoryBudget.reclaim``) of stored messages
        waiting in memory, the newest ids first, keeping MIN_IN_MEMORY: they stay in the
        store, and the pager's cursor goes back to below them so a consumer pages them
        in again; returns what that took off the broker-wide figure (a message other
        durable subscriptions hold copies of gives back only its own object). Only ids
        past ``taken_max`` (none of them was delivered or acked), and
        not while a page or a selective scan is under way (it would move the cursor), nor
        from a bounded queue (its policy's ledger bounds it; drop-head takes its head)."""
        if (not self.stored or self.store_id is None or self.paging or self.ahead
                or self.selective or self.pending_inserts or self.ledger is not None
                or self.in_memory_stored <= MIN_IN_MEMORY):
            return 0
        floor = self.taken_max
        newest = sorted((e[2] for e in self.heap if e[2].persistent and e[2].id > floor),
                        key=lambda m: m.id, reverse=True)
        chosen: set[int] = set()
        freed = 0
        for m in newest[:self.in_memory_stored - MIN_IN_MEMORY]:
            if freed >= want:
                break
            chosen.add(m.id)
            freed += releases(m)  # a copy other sources hold frees only its own object
        if not chosen:
            return 0
        floor_kept = self.taken_max
        freed = self._drop(lambda m: m.id in chosen)[1]
        self.taken_max = floor_kept  # given back, not taken: they may be again
        self.cursor = min(chosen) - 1  # every older one is in the heap or was taken
        self.store_has_more = True
        return freed

    # -- the operator API (amqlite.broker.operations) ------------------------------------------
    def drop(self, predicate: Callable[[Message], bool]) -> list[Message]:
        """Remove the waiting messages ``predicate`` picks (purge, move, delete by an
        operator), freeing their bytes like ``pop``; what is in flight to consumers is
        not here and is left alone."""
        return self._drop(predicate)[0]

    def _drop(self, predicate: Callable[[Message], bool]) -> tuple[list[Message], int]:
        """``drop``, and the bytes it took off the broker-wide figure."""
        kept: list[tuple[int, int, Message]] = []
        dropped: list[tuple[int, int, Message]] = []
        for entry in self.heap:
            (dropped if predicate(entry[2]) else kept).append(entry)
        if not dropped:
            return [], 0
        heapq.heapify(kept)
        self.heap = kept
        messages = [e[2] for e in dropped]
        self.taken_max = max(self.taken_max, max(m.id for m in messages))
        if self.ledger is not None:
            for m in messages:
                if not m.persistent:
                    limits.forget(self.broker, self, m.id)
        stored = sum(1 for m in messages if m.persistent)
        freed = 0
        for m in messages:
            freed += unhold(m)
        self._released(sum(m.size for m in messages), stored, len(messages) - stored, freed)
        return messages, freed

    def inflight_ids(self) -> set[int]:
        """Ids of this source's messages delivered and not yet acknowledged."""
        return {d.message.id for sub in self.consumers for d in sub.inflight.values()}


class DurableSource(Source):
    """A durable topic subscription's backlog: stored once, owed per subscription."""

    SELECTS_AT_DISPATCH = False

    def __init__(self, broker: Broker, name: str, sub_id: int, client_id: str,
                 sub_name: str, topic: str, owner: str | None = None,
                 selector: Selector | None = None) -> None:
        super().__init__(broker, name, sub_id, stored=True)
        self.selector = selector  # stored with it: a changed selector is a new one
        self.client_id = client_id
        self.sub_name = sub_name
        self.topic = topic
        #: The login that created it: only it may reattach, replace or remove it.
        #: None: made without authentication, or stored before owners were.
        self.owner = owner

    def ref(self, message: Message) -> Ref:
        return (self.store_id, message.id)


class TopicSubscriptionSource(Source):
    """A non-durable topic subscription: memory only, one consumer."""

    SELECTS_AT_DISPATCH = False

    def __init__(self, broker: Broker, name: str, login: str | None = None) -> None:
        super().__init__(broker, name, None, stored=False)
        self.dropped = 0
        #: Its subscriber's login: what a wildcard pattern may deliver is checked
        #: against it per concrete topic.
        self.login = login

    def add_nonpersistent(self, message: Message, producer: Client | None = None) -> None:
        """A subscriber that is behind past the count or byte limits misses this one.
        The broker-wide budget counts what holding it adds (a copy of a message other
        subscriptions hold: its own object only); past it, stored messages waiting in
        memory are given back to the store first (``MemoryBudget.make_room``), as for a
        transaction: they can be paged in again, a missed message cannot."""
        if self.heap and (self.nonpersistent >= MAX_TOPIC_BACKLOG
                          or self.bytes >= self.memory.destination_budget
                          or not self.memory.make_room(holding(message))):
            self.dropped += 1
            self.broker.stats["dropped"] += 1
            if self.dropped % DROP_LOG_EVERY == 1:
                log.warning("%s: slow subscriber %d messages (%d bytes) behind; "
                            "%d dropped so far", self.name, self.nonpersistent, self.bytes,
                            self.dropped)
            return
        self.push(message)
