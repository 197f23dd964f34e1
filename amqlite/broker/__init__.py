"""Destinations, subscriptions, dispatch, acknowledgements and transactions.

The broker is single-threaded (the asyncio loop) and never touches the
database itself: every write is staged in a ``WriteBuffer``
(``store.write_buffer``) that the group committer (a thread) commits in one
fenced transaction per batch. The rules
that keep the promise (a RECEIPTed message is never lost nor stored twice):

* A persistent message becomes visible to consumers only after its insert
  committed, and its RECEIPT goes out only then.
* A message delivered in a client ack mode is recorded as delivered
  (``delivery_count + 1``) before its MESSAGE frame is written, so a message
  seen again after a crash is always flagged ``redelivered``. When a consumer
  is waiting for a queue that has nothing else to give, the new message is
  handed to it in the commit that stores it (stored as delivered): one write
  instead of two, and the MESSAGE leaves with the RECEIPT.
* Queues are never loaded whole: each keeps stored messages in memory while
  the destination and the broker are under their byte budgets (at most
  ``MAX_IN_MEMORY``, at least ``MIN_IN_MEMORY``) and pages the rest in by id
  (ids are allocated in commit order).

Memory is a budget in bytes (``Settings.max_memory`` broker-wide,
``Settings.max_destination_memory`` per destination). ``Message.size`` is
computed once; sources add and subtract it as messages wait (``Source.bytes``,
``Broker.waiting_bytes``) and subscriptions as they are in flight
(``Subscription.inflight_bytes``, bounded by ``MAX_INFLIGHT_BYTES``). Past a
budget: persistent messages stay in the store, producers of non-persistent
messages are paused (flow control) until below ``RESUME_FRACTION`` of it, and a
slow non-durable topic subscriber misses messages.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from amqlite.authz import Permission, Policy
from amqlite.codec import Frame
from amqlite.validation import (
    BrokerError,
    check_destination,
    check_subscribe,
    check_user_headers,
    destination_kind,
    header_floor,
    headers_for,
    parse_ack_key,
    parse_send,
)
from amqlite.wire import (
    ACK_AUTO,
    ACK_MODES,
    DELIVERY_COUNT_HEADER,
    STOMP_1_1,
    STOMP_1_2,
)
from store.api import (
    Batch,
    BatchResult,
    DestinationRow,
    NewMessage,
    Ref,
    StoredMessage,
    SubscriptionRow,
)
from store.write_buffer import WriteBuffer, WriteUnit

if TYPE_CHECKING:
    from amqlite.settings import Settings
    from store.api import Recovery
    from store.group_commit import GroupCommitter

log = logging.getLogger(__name__)

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
#: Bytes a Python ``Message`` costs beyond its body and header characters,
#: measured with tracemalloc (Message + Delivery + heap entry + empty headers
#: dict: 497 B; each header: 72 B for 12 characters, so ~60 B beyond them).
MESSAGE_OVERHEAD = 512
HEADER_OVERHEAD = 64
#: Message bytes one subscription may hold unacknowledged, whatever its
#: ``activemq.prefetchSize``: a huge prefetch must not page the backlog into
#: RAM. 8 MiB is ActiveMQ's default prefetch (1000) of 8 KB messages.
MAX_INFLIGHT_BYTES = 8 * 1024 * 1024
#: Flow control resumes when usage drops below this fraction of the budget
#: (hysteresis, so a producer is not paused and resumed on every message).
RESUME_FRACTION = 0.75
#: A non-durable topic subscriber that falls this far behind (in messages, or
#: in bytes: the destination budget) misses what is published until it catches
#: up (ActiveMQ's slow-consumer limit for topics: a publisher is never held
#: back by one slow subscriber).
MAX_TOPIC_BACKLOG = 10_000
#: Log a slow topic subscriber's drops on the first and then every this many.
DROP_LOG_EVERY = 1000
#: Non-persistent messages live only in memory: past this many waiting in one
#: queue, the connections sending to it are paused until it drains to
#: RESUME_NONPERSISTENT_BACKLOG (ActiveMQ's producer flow control). 20 000 1 KB
#: messages are ~50 MB of Python objects: a few busy queues stay well inside
#: the 200 MB a broker should need.
MAX_NONPERSISTENT_BACKLOG = 20_000
RESUME_NONPERSISTENT_BACKLOG = MAX_NONPERSISTENT_BACKLOG // 2
#: Frames of one connection waiting for a commit before we stop reading from
#: it: a producer that sends without receipts cannot pile up unbounded work.
MAX_PENDING_COMMITS = 2000
RESUME_PENDING_COMMITS = MAX_PENDING_COMMITS // 2
#: The same in bytes: persistent messages of one connection held in memory
#: until their commit (a pipelining producer of 1 MB messages would otherwise
#: be read faster than the store writes). 16 MiB keeps a group commit full.
MAX_PENDING_BYTES = 16 * 1024 * 1024
RESUME_PENDING_BYTES = MAX_PENDING_BYTES // 2
#: Headers the broker owns or that only make sense on the SEND frame.
NON_USER_HEADERS = frozenset(
    {
        "destination", "receipt", "transaction", "content-length", "message-id",
        "subscription", "ack", "redelivered", DELIVERY_COUNT_HEADER,
    }
)
DEFAULT_PRIORITY = 4  # JMS default priority
#: The ERROR body when the store refused a frame's data (its own words stay in
#: the broker's log: they name tables and columns).
REJECTED_DETAIL = ("A value in this frame cannot be stored (too long, out of range or not "
                   "representable); nothing of the frame was stored.")


#: Transactions are held in memory until COMMIT: bound them per connection.
#: Frames per transaction: 10 000 is far past any batch a STOMP client commits
#: (ActiveMQ has no limit; RabbitMQ's channel buffers are bounded in bytes).
MAX_TRANSACTION_FRAMES = 10_000
#: Bytes (bodies and headers) per transaction: three maximum-size frames.
MAX_TRANSACTION_BYTES = 32 * 1024 * 1024
#: Open transactions per connection: clients use one at a time; a few to spare.
MAX_OPEN_TRANSACTIONS = 16


def now_ms() -> int:
    return int(time.time() * 1000)


class Client(Protocol):
    """What the broker needs from a client connection (see ``amqlite.server``)."""

    client_id: str | None
    login: str | None
    closed: bool

    @property
    def version(self) -> str: ...

    def write_frame(self, frame: Frame) -> None: ...

    def write_receipt(self, receipt: str) -> None:
        """``write_frame`` of a RECEIPT, the frame every persistent SEND waits for."""

    def can_write(self) -> bool: ...

    def close_with_error(self, message: str, detail: str = "",
                         receipt: str | None = None) -> None: ...

    def close(self) -> None: ...

    def pause_reading(self, reason: str) -> None:
        """Stop reading from this client until every reason is resumed (idempotent)."""

    def resume_reading(self, reason: str) -> None:
        """Drop ``reason``; a reason it was not paused for changes nothing."""


# ---------------------------------------------------------------------------
# messages and sources


def checked_send(frame: Frame) -> Message:
    """The message a SEND asks for, without its ids (``Broker._number`` gives them:
    a transaction keeps its messages unnumbered until COMMIT, so ids follow commit
    order); BrokerError when a header does not fit the store or a consumer's STOMP
    version."""
    h = frame.headers
    destination = h["destination"]
    check_destination(destination)
    persistent, priority, expires, producer_id, producer_seq = parse_send(h, DEFAULT_PRIORITY)
    headers = {k: v for k, v in h.items() if k not in NON_USER_HEADERS}
    chars, floor = check_user_headers(headers)
    return Message(0, destination, "", headers, frame.body, priority, expires, persistent,
                   enqueued_at=now_ms(), producer_id=producer_id, producer_seq=producer_seq,
                   size=message_size(headers, frame.body, chars), floor=floor)


def message_size(headers: dict[str, str], body: bytes, header_chars: int = -1) -> int:
    """What a message costs in memory, for the byte budgets (integer adds only).
    ``header_chars``: the characters of names and values, when a caller counted them."""
    if header_chars < 0:
        header_chars = sum(map(len, headers)) + sum(map(len, headers.values()))
    return len(body) + header_chars + HEADER_OVERHEAD * len(headers) + MESSAGE_OVERHEAD


class Message:
    """A message in memory; ``id`` is its store row id (or a memory-only id)."""

    __slots__ = (
        "body", "delivery_count", "destination", "enqueued_at", "expires_at", "floor",
        "headers", "id", "message_id", "persistent", "priority", "producer_id", "producer_seq",
        "size",
    )

    def __init__(
        self, id: int, destination: str, message_id: str, headers: dict[str, str],
        body: bytes, priority: int, expires_at: int, persistent: bool,
        delivery_count: int = 0, enqueued_at: int = 0,
        producer_id: str | None = None, producer_seq: int | None = None,
        size: int = -1, floor: str | None = None,
    ) -> None:
        self.id = id
        self.destination = destination
        self.message_id = message_id
        self.headers = headers
        self.body = body
        self.priority = priority
        self.expires_at = expires_at
        self.persistent = persistent
        self.delivery_count = delivery_count
        self.enqueued_at = enqueued_at
        self.producer_id = producer_id
        self.producer_seq = producer_seq
        self.size = size if size >= 0 else message_size(headers, body)
        #: The oldest STOMP version that can carry every header (``header_floor``).
        self.floor = header_floor(headers) if floor is None else floor

    @property
    def dedup_key(self) -> str | None:
        if self.producer_id is None or self.producer_seq is None:
            return None
        return f"{self.producer_id}:{self.producer_seq}"

    def expired(self, now: int) -> bool:
        return 0 < self.expires_at <= now


class Source:
    """An ordered backlog with consumers: a queue, a durable subscription, or a
    non-durable topic subscription (memory only, one consumer)."""

    def __init__(self, broker: Broker, name: str, store_id: int | None, stored: bool) -> None:
        self.broker = broker
        self.name = name
        self.store_id = store_id  # destination id (queue) or subscription id (durable)
        self.stored = stored  # pages from the store
        self._heap: list[tuple[int, int, Message]] = []
        self.in_memory_stored = 0  # stored messages in the heap
        self.nonpersistent = 0
        self.bytes = 0  # Message.size of everything in the heap
        #: Size of a stored row, to page in no more than the budget holds: the
        #: largest seen (a recovered queue starts from the largest frame).
        self.row_size = broker.settings.max_frame_size
        self.cursor = 0  # highest stored id paged in or appended
        self.store_has_more = stored
        self.paging = False
        self.consumers: list[Subscription] = []
        self._rr = 0
        self.blocked_producers: set[Client] = set()
        #: Inserts staged for this queue and not yet committed that were not
        #: handed to a consumer up front: while any is pending, a newer
        #: message must not be handed over first (a consumer sees queue order).
        self.pending_inserts = 0

    # Queues store with ref (None, id); durable subscriptions with (sub_id, id).
    def ref(self, message: Message) -> Ref:
        return (None, message.id)

    def push(self, message: Message) -> None:
        heapq.heappush(self._heap, (-message.priority, message.id, message))
        size = message.size
        self.bytes += size
        self.broker.waiting_bytes += size
        if message.persistent:
            self.in_memory_stored += 1
        else:
            self.nonpersistent += 1

    def over_budget(self) -> bool:
        """This destination or the whole broker holds as many bytes as allowed."""
        broker = self.broker
        return (self.bytes >= broker.destination_budget
                or broker.waiting_bytes >= broker.memory_budget)

    def append_committed(self, message: Message) -> None:
        """A freshly committed message: keep it in memory unless the store pages
        (it does once this destination or the broker is out of bytes)."""
        if self.store_has_more or (
            self.in_memory_stored >= MIN_IN_MEMORY
            and (self.in_memory_stored >= MAX_IN_MEMORY or self.over_budget())
        ):
            self.store_has_more = True  # the pager will find it by id
            self.row_size = max(self.row_size, message.size)
            return
        self.cursor = max(self.cursor, message.id)
        self.push(message)

    def add_nonpersistent(self, message: Message, producer: Client | None = None) -> None:
        """Queue a memory-only message; past the limits, hold its producer back."""
        self.push(message)
        if producer is not None and (
            self.nonpersistent >= MAX_NONPERSISTENT_BACKLOG or self.over_budget()
        ):
            self.broker.block_producer(producer, self)

    def pop(self) -> Message | None:
        if not self._heap:
            return None
        message = heapq.heappop(self._heap)[2]
        if message.persistent:
            self._released(message.size, 1, 0)
        else:
            self._released(message.size, 0, 1)
        return message

    def _released(self, size: int, stored: int, nonpersistent: int) -> None:
        """Messages left memory: give their bytes back and let producers that were
        held back for this destination (or the whole broker) read again."""
        broker = self.broker
        self.bytes -= size
        broker.waiting_bytes -= size
        self.in_memory_stored -= stored
        self.nonpersistent -= nonpersistent
        if (self.blocked_producers and self.nonpersistent <= RESUME_NONPERSISTENT_BACKLOG
                and self.bytes <= broker.destination_resume):
            for producer in self.blocked_producers:
                broker._unblocked(producer, self)
                producer.resume_reading(f"flow:{self.name}")
            self.blocked_producers.clear()
        if broker.blocked_producers and broker.waiting_bytes <= broker.memory_resume:
            broker.resume_producers()

    def __len__(self) -> int:
        return len(self._heap)

    def discard(self) -> None:
        """The source is gone (its subscription ended): free what waited in it,
        in the budgets too, and let its paused producers go."""
        self._heap.clear()
        self._released(self.bytes, self.in_memory_stored, self.nonpersistent)

    # -- consumers ----------------------------------------------------------
    def add_consumer(self, sub: Subscription) -> None:
        self.consumers.append(sub)
        self.dispatch()

    def remove_consumer(self, sub: Subscription) -> None:
        if sub in self.consumers:
            self.consumers.remove(sub)

    def _next_consumer(self) -> Subscription | None:
        n = len(self.consumers)
        for i in range(n):
            sub = self.consumers[(self._rr + i) % n]
            if sub.has_credit():
                self._rr = (self._rr + i + 1) % n
                return sub
        return None

    def hand_over_to(self, message: Message) -> Subscription | None:
        """The consumer a new message may go to in the commit that stores it:
        one in a client ack mode whose turn it is, when nothing is ahead of the
        message (in memory, in the store, or committing). Auto-ack consumers
        take theirs after the commit, as before (the turn is kept for them)."""
        if (self.broker.paused or self._heap or self.store_has_more or self.paging
                or self.pending_inserts or message.expired(message.enqueued_at)):
            return None
        turn = self._rr
        sub = self._next_consumer()
        if sub is None or sub.ack_mode == ACK_AUTO:
            self._rr = turn
            return None
        return sub

    def dispatch(self) -> None:
        """Hand waiting messages to consumers with credit, round robin (fair)."""
        if self.broker.paused or not self.consumers:
            return
        now = now_ms()
        while self._heap:
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
        row seen), at most PAGE_SIZE, at least up to the MIN_IN_MEMORY floor."""
        broker = self.broker
        free = min(broker.destination_budget - self.bytes,
                   broker.memory_budget - broker.waiting_bytes)
        limit = min(PAGE_SIZE, LOW_WATER * 2 - self.in_memory_stored,
                    max(free, 0) // max(self.row_size, 1))
        return max(limit, MIN_IN_MEMORY - self.in_memory_stored)

    def page_loaded(self, rows: list[StoredMessage], limit: int) -> None:
        self.paging = False
        largest = 0
        for row in rows:
            if row.id <= self.cursor:
                continue  # already in memory (appended after commit)
            self.cursor = row.id
            message = self.broker.message_from_row(row, self.name)
            largest = max(largest, message.size)
            self.push(message)
        if largest:
            self.row_size = largest
        self.store_has_more = len(rows) >= limit
        self.dispatch()

    # -- management (amqlite.management.actions) -------------------------------------------
    def drop(self, predicate: Callable[[Message], bool]) -> list[Message]:
        """Remove the waiting messages ``predicate`` picks (purge, move, delete by an
        operator), freeing their bytes like ``pop``; what is in flight to consumers is
        not here and is left alone."""
        kept, dropped = [], []
        for entry in self._heap:
            (dropped if predicate(entry[2]) else kept).append(entry)
        if not dropped:
            return []
        heapq.heapify(kept)
        self._heap = kept
        messages = [e[2] for e in dropped]
        stored = sum(1 for m in messages if m.persistent)
        self._released(sum(m.size for m in messages), stored, len(messages) - stored)
        return messages

    def inflight_ids(self) -> set[int]:
        """Ids of this source's messages delivered and not yet acknowledged."""
        return {d.message.id for sub in self.consumers for d in sub.inflight.values()}


class DurableSource(Source):
    """A durable topic subscription's backlog: stored once, owed per subscription."""

    def __init__(self, broker: Broker, name: str, sub_id: int, client_id: str,
                 sub_name: str, topic: str, owner: str | None = None) -> None:
        super().__init__(broker, name, sub_id, stored=True)
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

    def __init__(self, broker: Broker, name: str) -> None:
        super().__init__(broker, name, None, stored=False)
        self.dropped = 0

    def add_nonpersistent(self, message: Message, producer: Client | None = None) -> None:
        """A subscriber that is behind past the count or byte limits misses this one."""
        if self._heap and (self.nonpersistent >= MAX_TOPIC_BACKLOG or self.over_budget()):
            self.dropped += 1
            self.broker.stats["dropped"] += 1
            if self.dropped % DROP_LOG_EVERY == 1:
                log.warning("%s: slow subscriber %d messages (%d bytes) behind; "
                            "%d dropped so far", self.name, self.nonpersistent, self.bytes,
                            self.dropped)
            return
        self.push(message)


@dataclass(slots=True)
class Delivery:
    message: Message
    ref: Ref | None  # None: nothing stored to acknowledge
    #: Handed over with its insert, which has not committed yet (see Broker._send).
    pending: bool = False
    #: Its MESSAGE frame went out: only then may the client acknowledge it (a
    #: cumulative ACK must not cover a delivery still waiting for its commit).
    written: bool = False
    #: Order in which its MESSAGE went out on the subscription. A cumulative
    #: ACK covers what was written up to the acked message, which is not the
    #: order deliveries entered ``inflight``: a persistent delivery waits for
    #: its record to commit while a non-persistent one behind it goes at once.
    written_seq: int = 0
    #: Its subscription closed before that commit: the commit requeues it.
    orphaned: bool = False


class Subscription:
    """One SUBSCRIBE of one connection."""

    def __init__(self, conn: Client, sub_id: str, key: int, destination: str,
                 ack_mode: str, prefetch: int, source: Source) -> None:
        self.conn = conn
        self.id = sub_id
        self.key = key  # small per-connection number, prefix of STOMP 1.2 ack ids
        self.destination = destination
        self.ack_mode = ack_mode
        self.prefetch = prefetch
        self.source = source
        self.inflight: dict[str, Delivery] = {}  # by message-id, in delivery order
        self.inflight_bytes = 0  # Message.size of what is in self.inflight
        #: Message ids in ``inflight`` acked inside a transaction not yet committed: they
        #: do not count against the prefetch (ActiveMQ frees the slot at the ACK).
        self.held: set[str] = set()
        self.written_count = 0  # MESSAGE frames written, numbers Delivery.written_seq
        self.closed = False

    def has_credit(self) -> bool:
        if self.closed or self.conn.closed or not self.conn.can_write():
            return False
        if self.ack_mode == ACK_AUTO:
            return True
        if (len(self.inflight) - len(self.held) < self.prefetch
                and self.inflight_bytes < MAX_INFLIGHT_BYTES):
            return True
        # A consumer whose connection we stopped reading (it also produces) cannot
        # send its ACKs: let it take what waits, up to one destination budget
        # more, so the waiting bytes drop, its reading resumes, its ACKs arrive.
        broker = self.source.broker
        return (self.conn in broker.blocked_producers_all
                and self.inflight_bytes < MAX_INFLIGHT_BYTES + broker.destination_budget)

    def deliver(self, message: Message) -> None:
        broker = self.source.broker
        stored = message.persistent and self.source.stored
        ref = self.source.ref(message) if stored else None
        if self.ack_mode == ACK_AUTO:
            if not self._write(message, message.delivery_count):
                self.source.push(message)  # not sent: another consumer takes it
                return
            message.delivery_count += 1
            broker.dequeued[self.destination] += 1
            if ref is not None:
                broker.writes.stage().acks.append(ref)
            return
        previous = message.delivery_count
        message.delivery_count += 1
        delivery = Delivery(message, ref)
        self.track(delivery)
        if ref is None:
            self.write(delivery, previous)
            return
        # Record the delivery before the client can see it (see module docstring).
        broker.writes.stage_delivery(
            ref, lambda ok: self._delivery_recorded(delivery, previous, ok))

    def track(self, delivery: Delivery) -> None:
        """Awaiting acknowledgement: in ``inflight``, its bytes in ``inflight_bytes``."""
        self.inflight[delivery.message.message_id] = delivery
        self.inflight_bytes += delivery.message.size

    def untrack(self, message_ids: list[str]) -> list[Delivery]:
        """Settled or returned: out of ``inflight``, with their bytes."""
        taken = [self.inflight.pop(mid) for mid in message_ids]
        for d in taken:
            self.inflight_bytes -= d.message.size
        return taken

    def _delivery_recorded(self, delivery: Delivery, previous: int, ok: bool) -> None:
        if ok:
            self.write(delivery, previous)

    def write(self, delivery: Delivery, previous_deliveries: int) -> None:
        """Send a recorded delivery, unless it was settled or its subscription
        closed while the record committed."""
        if self.closed or self.inflight.get(delivery.message.message_id) is not delivery:
            return
        delivery.written = True
        self.written_count += 1
        delivery.written_seq = self.written_count
        self._write(delivery.message, previous_deliveries)

    def covered(self, message_id: str) -> list[str]:
        """The message ids an ACK or NACK of ``message_id`` settles: in ``client``
        mode (cumulative) every delivery written up to it, in the order the client
        saw them; else just it."""
        if self.ack_mode != "client":
            return [message_id]
        last = self.inflight[message_id].written_seq
        return [mid for mid, d in self.inflight.items() if d.written and d.written_seq <= last]

    def _write(self, message: Message, previous_deliveries: int) -> bool:
        """Write one MESSAGE; False if it could not be. Never raises: one message
        this consumer cannot take must not stop dispatch to the others (defence in
        depth; SEND validation keeps such messages out). The consumer is closed
        with an ERROR and what it holds unacknowledged goes back to the source."""
        try:
            headers = {
                "subscription": self.id,
                "message-id": message.message_id,
                "destination": message.destination,
            }
            if message.floor > self.conn.version:  # versions compare as strings
                headers.update(headers_for(self.conn.version, message.headers))
            else:
                headers.update(message.headers)
            if self.ack_mode != ACK_AUTO:
                headers["ack"] = f"{self.key}:{message.message_id}"
            if previous_deliveries:
                headers["redelivered"] = "true"
                headers[DELIVERY_COUNT_HEADER] = str(previous_deliveries + 1)
            self.conn.write_frame(Frame("MESSAGE", headers, message.body))
        except Exception as exc:
            if not self.closed:
                self.closed = True  # no credit: dispatch skips it from now on
                log.exception("subscription %s of %s: cannot deliver %s; closing it",
                              self.id, self.destination, message.message_id)
                self.source.broker.loop.call_soon(
                    self.conn.close_with_error, "cannot deliver a message",
                    f"message {message.message_id} cannot be sent to subscription "
                    f"{self.id}: {exc}")
            return False
        self.source.broker.stats["delivered"] += 1
        return True


#: What one ACK or NACK of a COMMIT settled in memory: (command, subscription,
#: deliveries), kept until the store took the COMMIT (see ``Broker._unsettle``).
Settled = tuple[str, Subscription, list[Delivery]]


def _dispatch_logged(source: Source) -> None:
    """``source.dispatch()`` where a failure must not stop the caller's loop over
    other sources, messages or RECEIPTs: logged, and the message stays queued."""
    try:
        source.dispatch()
    except Exception:
        log.exception("dispatch of %s failed", source.name)


def _ack_miss(session: Session, command: str, what: str, message_id: str,
              named: Subscription | None, sub_name: str | None, version: str) -> str:
    """Why an ACK/NACK matched no delivery, naming a wrong subscription as such (it is
    the usual mistake of a client with several subscriptions)."""
    owner = next((sub for sub in session.subscriptions.values()
                  if sub is not named and _awaits_ack(sub, message_id)), None)
    where = (f"; message {message_id!r} awaits acknowledgement on subscription "
             f"{owner.id!r}" if owner is not None else "")
    if version == STOMP_1_2 and named is None:
        return f"{command} {what} names no subscription of this connection{where}"
    if version == STOMP_1_1 and named is None:
        return (f"{command} names subscription {sub_name!r}, which this connection does "
                f"not have{where}")
    if owner is not None and named is not None:
        return (f"{command} {what}: message {message_id!r} was not delivered to "
                f"subscription {named.id!r}{where}")
    return f"no message awaiting acknowledgement with {what}"


def _awaits_ack(sub: Subscription, message_id: str) -> bool:
    delivery = sub.inflight.get(message_id)
    return delivery is not None and delivery.written


# ---------------------------------------------------------------------------
# transactions and per-connection state


@dataclass
class Transaction:
    #: Its SENDs' messages, checked on arrival (``checked_send``), numbered at COMMIT.
    sends: list[Message] = field(default_factory=list)
    acks: list[tuple[str, Frame]] = field(default_factory=list)  # ("ACK"|"NACK", frame)
    size: int = 0  # bytes of bodies and headers held
    #: Deliveries its ACKs cover, by subscription: their prefetch slots are free (as in
    #: ActiveMQ) though the ACKs apply only at COMMIT; ABORT leaves them with the consumer.
    held: list[tuple[Subscription, list[str]]] = field(default_factory=list)

    def add(self, frame: Frame, name: str) -> None:
        """Count a frame (not yet in ``sends`` or ``acks``) against the transaction's
        limits; BrokerError past them."""
        self.size += len(frame.body) + sum(len(k) + len(v) for k, v in frame.headers.items())
        if len(self.sends) + len(self.acks) >= MAX_TRANSACTION_FRAMES:
            raise BrokerError(f"transaction {name[:60]!r}: more than "
                              f"{MAX_TRANSACTION_FRAMES} frames")
        if self.size > MAX_TRANSACTION_BYTES:
            raise BrokerError(f"transaction {name[:60]!r}: more than "
                              f"{MAX_TRANSACTION_BYTES} bytes")


class Session:
    """Broker-side state of one connected client."""

    def __init__(self, conn: Client) -> None:
        self.conn = conn
        self.subscriptions: dict[str, Subscription] = {}
        self.by_key: dict[int, Subscription] = {}
        self.keys = itertools.count(1)
        self.transactions: dict[str, Transaction] = {}
        self.pending_commits = 0
        self.pending_bytes = 0  # Message.size of persistent sends not yet committed
        self.on_idle: list[Callable[[], None]] = []

    def commit_started(self, size: int = 0) -> None:
        self.pending_commits += 1
        if self.pending_commits == MAX_PENDING_COMMITS:
            self.conn.pause_reading("commits")
        if size:
            self.pending_bytes += size
            if self.pending_bytes >= MAX_PENDING_BYTES:
                self.conn.pause_reading("commit-bytes")

    def commit_finished(self, size: int = 0) -> None:
        self.pending_commits -= 1
        if self.pending_commits == RESUME_PENDING_COMMITS:
            self.conn.resume_reading("commits")
        if size:
            self.pending_bytes -= size
            if self.pending_bytes <= RESUME_PENDING_BYTES:
                self.conn.resume_reading("commit-bytes")  # a no-op unless paused for them
        if self.pending_commits == 0 and self.on_idle:
            waiting, self.on_idle = self.on_idle, []
            for cb in waiting:
                cb()

    def when_idle(self, cb: Callable[[], None]) -> None:
        if self.pending_commits == 0:
            cb()
        else:
            self.on_idle.append(cb)


# ---------------------------------------------------------------------------
# the broker


@dataclass
class ForgottenDestination:
    """A destination ``Broker.forget_destination`` dropped from memory, for the store's
    delete and ``Broker.settle_forgotten``."""

    name: str
    store_id: int | None  # its row; None: it was never stored
    #: The first message id allocated after the cut: lower ids were sent to the old row.
    cut: int
    #: Non-persistent messages dropped from memory (they had no row to delete).
    memory_only: int = 0
    durables: list[DurableSource] = field(default_factory=list)


class Broker:
    """All destinations of one master. Frames arrive via ``handle``."""

    def __init__(
        self,
        settings: Settings,
        committer: GroupCommitter | None,
        recovery: Recovery,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.settings = settings
        self.group = settings.group
        self.committer = committer
        self.loop = loop
        self.epoch = recovery.epoch
        self.writes: WriteBuffer[Client] = WriteBuffer(committer, loop)
        self.writes.on_destinations = self._destinations_committed
        self.paused = False
        self.ids = itertools.count(recovery.next_message_id)
        self.destination_ids = itertools.count(recovery.next_destination_id)
        self.subscription_ids = itertools.count(recovery.next_subscription_id)
        self.destination_rows: dict[str, int] = {}  # name -> store id
        #: Destination rows staged and not yet committed by any batch: every
        #: write that needs one carries it (the store inserts it once), since
        #: the unit that first staged it may be refused by the store.
        self.unconfirmed_destinations: dict[str, DestinationRow] = {}
        self.queues: dict[str, Source] = {}
        self.topics: dict[str, list[TopicSubscriptionSource]] = {}
        self.durables: dict[tuple[str, str], DurableSource] = {}
        self.durables_by_topic: dict[str, list[DurableSource]] = {}
        self.sessions: dict[Client, Session] = {}
        self.clients_by_id: dict[str, Client] = {}
        self.stats = {"sent": 0, "delivered": 0, "acked": 0, "duplicates": 0, "expired": 0,
                      "dead_lettered": 0, "dropped": 0}
        #: Byte budgets (see the module docstring) and their resume levels.
        self.memory_budget = settings.max_memory
        self.memory_resume = int(settings.max_memory * RESUME_FRACTION)
        self.destination_budget = settings.max_destination_memory
        self.destination_resume = int(settings.max_destination_memory * RESUME_FRACTION)
        self.waiting_bytes = 0  # Message.size of every message waiting in a source
        #: Producers paused because the broker-wide budget was reached.
        self.blocked_producers: set[Client] = set()
        #: Producers paused for any memory reason -> the sources that paused them
        #: (None: the broker-wide budget); see Subscription.has_credit.
        self.blocked_producers_all: dict[Client, set[Source | None]] = {}
        #: Per-destination totals since this node became master, for the management
        #: metrics (one dict increment per message; read only when scraped).
        self.enqueued: defaultdict[str, int] = defaultdict(int)
        self.dequeued: defaultdict[str, int] = defaultdict(int)
        self.dead_lettered: defaultdict[str, int] = defaultdict(int)
        #: The users file's [[authorization]] entries; None when there are none (then
        #: every authenticated login may do everything, and frames pay no check).
        self.authz: Policy | None = None
        #: Destinations used since this node became master (topics leave no row unless
        #: durable): using one of these again is not creating it. Kept only with authz.
        self.known_destinations: set[str] = set()
        #: CONNECT is authenticated (a users file): a connection's login is proven, so a
        #: durable subscription belongs to it. Without, a login header proves nothing.
        self.authenticated = bool(settings.users_file)
        for d in recovery.destinations:
            self.destination_rows[d.name] = d.id
            if d.kind == "queue":
                self.queues[d.name] = Source(self, d.name, d.id, stored=True)
        names = {d.id: d.name for d in recovery.destinations}
        for s in recovery.subscriptions:
            topic = names.get(s.destination_id, f"/topic/unknown-{s.destination_id}")
            self._add_durable(DurableSource(self, topic, s.id, s.client_id, s.name, topic,
                                            s.owner))

    # -- connections ------------------------------------------------------------
    def check_client_id(self, client_id: str | None, login: str | None) -> None:
        """Before CONNECTED: a client-id in use may only be taken over by the same login
        (else anyone could disconnect a client and take its durable subscriptions)."""
        if not client_id:
            return
        old = self.clients_by_id.get(client_id)
        if old is not None and not old.closed and old.login != login:
            log.warning("client-id %r: takeover by login %r refused (in use by another login)",
                        client_id, login)
            raise BrokerError(f"client-id {client_id!r} is in use by another login")

    def attach(self, conn: Client) -> None:
        """A client finished its CONNECT. A newer connection with the same
        client-id and login wins (link stealing): after a failover the old one is dead."""
        self.sessions[conn] = Session(conn)
        if conn.client_id:
            old = self.clients_by_id.get(conn.client_id)
            if old is not None and old is not conn:
                old.close_with_error("client-id taken over by a newer connection")
                self.detach(old)
            self.clients_by_id[conn.client_id] = conn

    def detach(self, conn: Client) -> None:
        session = self.sessions.pop(conn, None)
        if session is None:
            return
        if conn.client_id and self.clients_by_id.get(conn.client_id) is conn:
            del self.clients_by_id[conn.client_id]
        self._abort_all(session)
        for sub in list(session.subscriptions.values()):
            self._close_subscription(session, sub)
        for source in self.blocked_producers_all.pop(conn, ()):
            (self if source is None else source).blocked_producers.discard(conn)

    # -- frames -----------------------------------------------------------------
    def handle(self, conn: Client, frame: Frame) -> None:
        """Process one client frame. Raises BrokerError for a client mistake."""
        session = self.sessions[conn]
        command = frame.command
        if command == "SEND":
            if self.authz is not None:
                self.authorize(conn, frame.headers.get("destination", ""), Permission.WRITE)
            tx = frame.headers.get("transaction")
            if tx is not None:
                transaction = self._transaction(session, tx)
                message = checked_send(frame)  # an invalid SEND is refused now
                transaction.add(frame, tx)
                transaction.sends.append(message)
                self._receipt_now(conn, frame)
            else:
                self._send(session, [checked_send(frame)], frame.headers.get("receipt"))
        elif command in ("ACK", "NACK"):
            tx = frame.headers.get("transaction")
            if tx is not None:
                transaction = self._transaction(session, tx)
                # must name a message awaiting ack now
                sub, message_id = self._find_delivery(session, frame)
                transaction.add(frame, tx)
                transaction.acks.append((command, frame))
                if command == "ACK":
                    self._hold(sub, message_id, transaction)
                self._receipt_now(conn, frame)
            else:
                self._ack(session, command, frame, frame.headers.get("receipt"))
        elif command == "SUBSCRIBE":
            if self.authz is not None:
                self.authorize(conn, frame.headers.get("destination", ""), Permission.READ)
            self._subscribe(session, frame)
            # a durable subscription is a write: confirm it once it is durable
            self._finish_write(session, frame.headers.get("receipt"))
        elif command == "UNSUBSCRIBE":
            self._unsubscribe(session, frame)
            self._finish_write(session, frame.headers.get("receipt"))
        elif command == "BEGIN":
            tx = frame.headers["transaction"]
            if tx in session.transactions:
                raise BrokerError(f"transaction {tx} already started")
            if len(session.transactions) >= MAX_OPEN_TRANSACTIONS:
                raise BrokerError(f"too many open transactions: at most "
                                  f"{MAX_OPEN_TRANSACTIONS} per connection")
            session.transactions[tx] = Transaction()
            self._receipt_now(conn, frame)
        elif command == "COMMIT":
            tx = self._transaction(session, frame.headers["transaction"])
            # Everything is checked before anything is applied; on failure the
            # transaction stays open and is aborted when the ERROR closes the connection.
            self._check_commit(session, tx)
            del session.transactions[frame.headers["transaction"]]
            self._commit(session, tx, frame.headers.get("receipt"))
        elif command == "ABORT":
            tx = self._transaction(session, frame.headers["transaction"])
            del session.transactions[frame.headers["transaction"]]
            self._abort(session, tx)
            self._finish_write(session, frame.headers.get("receipt"))
        elif command == "DISCONNECT":
            receipt = frame.headers.get("receipt")
            self._abort_all(session)
            session.when_idle(lambda: self._disconnected(conn, receipt))
        else:
            raise BrokerError(f"unexpected frame {command}")

    def authorize(self, conn: Client, destination: str, permission: Permission) -> None:
        """BrokerError (nothing done) unless the connection's login may use ``destination``
        with ``permission``, and create it when the broker does not know it yet."""
        policy = self.authz
        if policy is None:
            return
        login = conn.login
        if not policy.allowed(login, destination, permission):
            log.info("denied: login %r may not %s %s", login, permission.value, destination)
            raise BrokerError(f"permission denied: login {login!r} has no {permission.value} "
                              f"permission on {destination}")
        if destination in self.known_destinations:
            return
        if (destination not in self.destination_rows and destination not in self.queues
                and destination not in self.topics
                and not policy.may_create(login, destination, permission)):
            log.info("denied: login %r may not create %s", login, destination)
            raise BrokerError(f"permission denied: login {login!r} has no admin permission on "
                              f"{destination}, needed to create it")
        self.known_destinations.add(destination)

    def _abort_all(self, session: Session) -> None:
        """A client that goes away aborts what it had not committed."""
        for tx in session.transactions.values():
            self._abort(session, tx)
        session.transactions.clear()

    def _disconnected(self, conn: Client, receipt: str | None) -> None:
        if receipt is not None and not conn.closed:
            conn.write_receipt(receipt)
        self.detach(conn)
        conn.close()

    @staticmethod
    def _receipt_now(conn: Client, frame: Frame) -> None:
        receipt = frame.headers.get("receipt")
        if receipt is not None:
            conn.write_receipt(receipt)

    @staticmethod
    def _transaction(session: Session, tx: str) -> Transaction:
        try:
            return session.transactions[tx]
        except KeyError:
            raise BrokerError(f"unknown transaction {tx}") from None

    # -- destinations -------------------------------------------------------------
    def _destination_id(self, name: str, batch: Batch) -> int:
        """The store id of a destination, staging its row in ``batch`` until a
        batch that carried it committed (``_destinations_committed``)."""
        did = self.destination_rows.get(name)
        if did is None:
            row = DestinationRow(next(self.destination_ids), name, destination_kind(name))
            did = row.id
            self.destination_rows[name] = did
            self.unconfirmed_destinations[name] = row
            batch.destinations.append(row)
            if name in self.queues:
                self.queues[name].store_id = did
        elif self.unconfirmed_destinations:
            row = self.unconfirmed_destinations.get(name)
            if row is not None:
                # Each unit carries the row (the one that staged it first may be
                # refused); outside a unit, carry it anyway. The store inserts it once.
                unit = self.writes.current
                if unit is None or row not in batch.destinations[unit.start[0]:]:
                    batch.destinations.append(row)
        return did

    def _destinations_committed(self, rows: list[DestinationRow]) -> None:
        for row in rows:
            if self.unconfirmed_destinations.get(row.name) is row:
                del self.unconfirmed_destinations[row.name]

    def _reject(self, unit: WriteUnit[Client]) -> None:
        """The store refused the data of one client frame: nothing of it was
        written. That client gets an ERROR (with its receipt-id) and is closed;
        everyone else goes on, and the node stays master."""
        conn = unit.conn
        log.warning("the store refused a frame's data%s: %s",
                    f" (client {conn.client_id})" if conn and conn.client_id else "",
                    unit.rejected)
        if conn is None or conn.closed:
            return
        conn.close_with_error("the store refused this frame's data",
                              REJECTED_DETAIL, receipt=unit.receipt)

    def queue(self, name: str) -> Source:
        q = self.queues.get(name)
        if q is None:
            q = Source(self, name, self.destination_rows.get(name), stored=True)
            q.store_has_more = False  # new: nothing stored yet
            self.queues[name] = q
        return q

    # -- SEND ---------------------------------------------------------------------
    def _number(self, m: Message) -> Message:
        """Give a checked message (``checked_send``) its store id and message-id."""
        m.id = mid = next(self.ids)
        m.message_id = f"ID:{self.group}:{mid}"
        return m

    def _send(self, session: Session, checked: list[Message], receipt: str | None,
              acks: list[tuple[str, Frame]] | None = None) -> None:
        """Route messages; the persistent ones (all frames of a transaction at
        once) commit in one batch before anyone sees them.

        ``acks`` (a COMMIT's ACK/NACK frames, maybe none) makes this a COMMIT:
        the ack rows join the frame's unit, so the store takes the transaction
        whole or refuses it whole; its non-persistent messages are routed only
        once the unit committed; a refusal undoes the ACKs (``_unsettle``)."""
        conn = session.conn
        messages = [self._number(m) for m in checked]
        self.stats["sent"] += len(messages)
        enqueued = self.enqueued
        to_store: list[tuple[Message, list[DurableSource]]] = []  # no durables: a queue's
        identity_only: list[Message] = []  # nothing to keep but who sent it
        in_memory: list[Message] = []  # nothing to keep (no durable subscriber)
        for m in messages:
            enqueued[m.destination] += 1
            if not m.persistent:
                in_memory.append(m)
            elif destination_kind(m.destination) == "queue":
                to_store.append((m, []))
            else:
                durables = self.durables_by_topic.get(m.destination)
                if durables:
                    to_store.append((m, list(durables)))
                elif m.dedup_key is not None:
                    identity_only.append(m)
                else:
                    in_memory.append(m)
        writes_nothing = not to_store and not identity_only and not acks
        if acks is None or writes_nothing:  # else a COMMIT's: once its unit committed
            for m in in_memory:
                self._route_now(m, conn)
            in_memory = []
            if writes_nothing:
                if receipt is not None:
                    conn.write_receipt(receipt)
                return
        # The frame's own data is a unit: if the store refuses it, only this
        # client is told (see WriteUnit).
        writes = self.writes
        batch = writes.batch
        unit = writes.begin_unit(conn, covers_acks=bool(acks))
        unit.receipt = receipt
        settled: list[Settled] | None = None
        if acks:
            settled = []
            for command, frame in acks:
                self._ack(session, command, frame, None, settled)
        #: (message, its durables, the consumer it was handed over to if any)
        stored: list[tuple[Message, list[DurableSource],
                           tuple[Subscription, Delivery] | None]] = []
        pending_bytes = 0
        for m, durables in to_store:
            row = self._new_row(m, batch, durables)
            batch.inserts.append(row)
            stored.append((m, durables, None if durables else self._hand_over(m, row)))
            pending_bytes += m.size
        for m in identity_only:
            batch.identities.append(self._new_row(m, batch))
        writes.end_unit(unit)
        session.commit_started(pending_bytes)

        def committed(result: BatchResult | None) -> None:
            session.commit_finished(pending_bytes)
            for m, durables, hand in stored:
                if hand is None and not durables:
                    self.queue(m.destination).pending_inserts -= 1
            if result is None:
                if unit.rejected is not None:  # nothing was stored
                    for _, _, hand in stored:
                        if hand is not None:  # nobody gets what was never stored
                            self._handed_over(*hand, duplicate=True)
                    self._reject(unit)  # first: nothing is redelivered to its connection
                    if settled:
                        self._unsettle(settled)
                return  # else the store failed: no receipt; the node is demoting
            duplicate_ids = result.duplicate_ids
            for m, durables, hand in stored:
                duplicate = m.id in duplicate_ids
                if duplicate:
                    self.stats["duplicates"] += 1
                try:
                    if hand is not None:
                        self._handed_over(*hand, duplicate)
                    elif not duplicate:
                        self._route_committed(m, durables)
                except Exception:
                    # Stored: it is delivered from the store after a restart at worst;
                    # the other messages of the batch and the RECEIPT still go out.
                    log.exception("routing committed message %s failed", m.message_id)
            for m in identity_only:
                if m.id in duplicate_ids:
                    self.stats["duplicates"] += 1
                    continue
                try:
                    self._publish_memory(m)
                except Exception:
                    log.exception("publishing message %s failed", m.message_id)
            for m in in_memory:
                try:
                    self._route_now(m, conn)
                except Exception:
                    log.exception("routing message %s failed", m.message_id)
            if receipt is not None and not conn.closed:
                conn.write_receipt(receipt)

        writes.stage_unit(unit, committed)
        if settled:
            # The slots the ACKs freed, once the unit is staged whole (a dispatch
            # may flush the batch: see WriteBuffer.stage_delivery).
            for _, sub, _ in settled:
                _dispatch_logged(sub.source)

    def _hand_over(self, m: Message, row: NewMessage) -> tuple[Subscription, Delivery] | None:
        """Give a queue message to a waiting consumer in the commit that stores
        it, when nothing in the queue is ahead of it; else count it pending."""
        q = self.queue(m.destination)
        sub = q.hand_over_to(m)
        if sub is None:
            q.pending_inserts += 1
            return None
        delivery = Delivery(m, (None, m.id), pending=True)
        sub.track(delivery)
        m.delivery_count = row.delivery_count = 1
        # Nothing is ahead of it (hand_over_to), so the pager's cursor may pass it: a
        # later page must not load it again while it is in flight (a second delivery).
        q.cursor = max(q.cursor, m.id)
        return sub, delivery

    def _handed_over(self, sub: Subscription, delivery: Delivery, duplicate: bool) -> None:
        """The insert of a handed-over message committed (or was a duplicate)."""
        delivery.pending = False
        m = delivery.message
        if delivery.orphaned:
            if not duplicate:  # back to the queue as never handed over
                self.writes.stage().undeliveries.append(m.id)
                m.delivery_count = 0
                q = self.queue(m.destination)
                q.push(m)
                q.dispatch()
            return
        if not duplicate:
            sub.write(delivery, 0)  # never raises: Subscription._write catches
        elif sub.inflight.get(m.message_id) is delivery:
            # already stored: the copy we hold is not, so nobody gets it
            sub.untrack([m.message_id])
            sub.source.dispatch()

    def _new_row(self, m: Message, batch: Batch,
                 durables: list[DurableSource] | None = None) -> NewMessage:
        return NewMessage(
            id=m.id, destination_id=self._destination_id(m.destination, batch),
            message_id=m.message_id, headers=m.headers, body=m.body, priority=m.priority,
            expires_at=m.expires_at, enqueued_at=m.enqueued_at, producer_id=m.producer_id,
            producer_seq=m.producer_seq, dedup_key=m.dedup_key,
            subscriber_ids=tuple(d.store_id for d in durables if d.store_id is not None)
            if durables else (),
        )

    def _abort(self, session: Session, tx: Transaction) -> None:
        """Drop a transaction's sends, keeping the identities of the persistent ones:
        the producer numbered them, and the audit must not see a hole. What its ACKs
        covered is redelivered."""
        if tx.held:
            self._release_held(tx)
        identities = [self._number(m) for m in tx.sends
                      if m.persistent and m.dedup_key is not None]
        if identities:
            batch = self.writes.batch
            unit = self.writes.begin_unit(session.conn)
            unit.claimable = True  # an ABORT's RECEIPT waits for it
            batch.identities.extend(self._new_row(m, batch) for m in identities)
            self.writes.end_unit(unit)

            def stored(result: BatchResult | None) -> None:
                if result is None and unit.rejected is not None:
                    self._reject(unit)

            self.writes.stage_unit(unit, stored)

    def _route_now(self, m: Message, producer: Client | None = None) -> None:
        if destination_kind(m.destination) == "queue":
            q = self.queue(m.destination)
            q.add_nonpersistent(m, producer)
            q.dispatch()
        else:
            self._publish_memory(m, producer)

    def _publish_memory(self, m: Message, producer: Client | None = None) -> None:
        for source in self.topics.get(m.destination, ()):
            source.add_nonpersistent(self._copy(m, persistent=False))
            source.dispatch()
        for durable in self.durables_by_topic.get(m.destination, ()):
            # a non-persistent message reaches only online durable subscribers
            if durable.consumers:
                durable.add_nonpersistent(self._copy(m, persistent=False), producer)
                durable.dispatch()

    @staticmethod
    def _copy(m: Message, persistent: bool | None = None) -> Message:
        """Each subscriber tracks its own delivery count, so each gets its own object."""
        return Message(
            m.id, m.destination, m.message_id, m.headers, m.body, m.priority, m.expires_at,
            m.persistent if persistent is None else persistent, m.delivery_count,
            m.enqueued_at, m.producer_id, m.producer_seq, m.size, m.floor,
        )

    def _route_committed(self, m: Message, durables: list[DurableSource]) -> None:
        """Make a committed message visible; a failure in one source's dispatch does not
        keep it from the other sources (each has its copy already)."""
        if not durables:
            q = self.queue(m.destination)
            q.append_committed(m)
            _dispatch_logged(q)
            return
        for durable in durables:
            durable.append_committed(self._copy(m))
            _dispatch_logged(durable)
        for source in self.topics.get(m.destination, ()):
            source.add_nonpersistent(self._copy(m, persistent=False))
            _dispatch_logged(source)

    # -- SUBSCRIBE / UNSUBSCRIBE ----------------------------------------------------
    def _subscribe(self, session: Session, frame: Frame) -> None:
        h = frame.headers
        destination = h["destination"]
        kind = check_destination(destination)
        prefetch = check_subscribe(h, self.settings.default_prefetch)
        sub_id = h.get("id") or destination  # STOMP 1.0 may omit id
        if sub_id in session.subscriptions:
            raise BrokerError(f"subscription id {sub_id!r} already in use")
        ack_mode = h.get("ack", ACK_AUTO)
        if ack_mode not in ACK_MODES:
            raise BrokerError(f"ack mode {ack_mode!r}: use one of {', '.join(ACK_MODES)}")
        durable_name = h.get("activemq.subscriptionName") or h.get("durable-subscription-name")
        source: Source
        if kind == "queue":
            source = self.queue(destination)
        elif durable_name:
            client_id = session.conn.client_id
            if not client_id:
                raise BrokerError("a durable subscription needs client-id on CONNECT")
            source = self._durable(client_id, durable_name, destination, session.conn.login)
            if source.consumers:
                raise BrokerError(f"durable subscription {durable_name!r} is already active")
        else:
            source = TopicSubscriptionSource(self, destination)
            self.topics.setdefault(destination, []).append(source)
        sub = Subscription(session.conn, sub_id, next(session.keys), destination, ack_mode,
                           prefetch, source)
        session.subscriptions[sub_id] = sub
        session.by_key[sub.key] = sub
        source.add_consumer(sub)

    def _durable(self, client_id: str, name: str, topic: str,
                 login: str | None) -> DurableSource:
        durable = self.durables.get((client_id, name))
        if durable is not None:
            self.check_owner(durable, login)
        if durable is not None and durable.topic != topic:
            # ActiveMQ/JMS: re-subscribing a durable name to another topic replaces it
            self._remove_durable(durable)
            durable = None
        if durable is None:
            # The client's data (its client-id, the name, the topic): a unit.
            batch = self.writes.batch
            unit = self.writes.begin_unit(self.clients_by_id.get(client_id))
            unit.claimable = True  # the SUBSCRIBE's RECEIPT waits for it
            did = self._destination_id(topic, batch)
            sid = next(self.subscription_ids)
            owner = login if self.authenticated else None
            batch.subscriptions.append(SubscriptionRow(sid, client_id, name, did, owner=owner))
            self.writes.end_unit(unit)
            durable = DurableSource(self, topic, sid, client_id, name, topic, owner)
            durable.store_has_more = False
            self._add_durable(durable)
            new = durable

            def created(result: BatchResult | None) -> None:
                if result is None and unit.rejected is not None:
                    # Never stored: forget it, and remove what messages staged
                    # meanwhile stored for it (pending rows of no subscription).
                    if self.durables.get((client_id, name)) is new:
                        self._remove_durable(new)
                    self._reject(unit)

            self.writes.stage_unit(unit, created)
        return durable

    def check_owner(self, durable: DurableSource, login: str | None) -> None:
        """BrokerError (nothing done) unless ``login`` may reattach, replace or remove
        ``durable``: its owner may; without authentication anyone may (as before owners
        were stored). An ownerless one (stored before, or made without authentication)
        becomes the property of the first login that uses it, in the store too."""
        if not self.authenticated or login is None or durable.owner == login:
            return
        if durable.owner is not None:
            log.warning("durable subscription %r of client-id %r: login %r refused "
                        "(it belongs to another login)", durable.sub_name, durable.client_id,
                        login)
            raise BrokerError(f"durable subscription {durable.sub_name!r} of client-id "
                              f"{durable.client_id!r} belongs to another login")
        durable.owner = login
        if durable.store_id is not None:
            self.writes.stage().claimed_subscriptions.append((durable.store_id, login))
        log.warning("durable subscription %r of client-id %r had no owner: login %r owns it "
                    "now", durable.sub_name, durable.client_id, login)

    def _add_durable(self, durable: DurableSource) -> None:
        self.durables[(durable.client_id, durable.sub_name)] = durable
        self.durables_by_topic.setdefault(durable.topic, []).append(durable)

    def _remove_durable(self, durable: DurableSource) -> None:
        self.durables.pop((durable.client_id, durable.sub_name), None)
        peers = self.durables_by_topic.get(durable.topic, [])
        if durable in peers:
            peers.remove(durable)
        if durable.store_id is not None:
            self.writes.stage().removed_subscriptions.append(durable.store_id)
        durable.discard()

    def _unsubscribe(self, session: Session, frame: Frame) -> None:
        h = frame.headers
        sub_id = h.get("id") or h.get("destination")
        sub = session.subscriptions.get(sub_id or "")
        durable_name = h.get("activemq.subscriptionName") or h.get("durable-subscription-name")
        durable = None
        if durable_name and session.conn.client_id:
            durable = self.durables.get((session.conn.client_id, durable_name))
            if durable is not None:
                self.check_owner(durable, session.conn.login)  # before anything changes
        if sub is not None:
            self._close_subscription(session, sub)
        elif not durable_name:
            raise BrokerError(f"no subscription {sub_id!r}")
        if durable is not None:
            self._remove_durable(durable)

    def _close_subscription(self, session: Session, sub: Subscription) -> None:
        """Return what the subscriber had not acknowledged; it will be redelivered."""
        sub.closed = True
        session.subscriptions.pop(sub.id, None)
        session.by_key.pop(sub.key, None)
        source = sub.source
        source.remove_consumer(sub)
        if isinstance(source, TopicSubscriptionSource):
            peers = self.topics.get(sub.destination, [])
            if source in peers:
                peers.remove(source)
            source.discard()
            return
        if sub.inflight:
            returned = []
            for delivery in sub.inflight.values():
                if delivery.pending:
                    delivery.orphaned = True  # its commit requeues it
                else:
                    returned.append(delivery)
            releases = [d.ref for d in returned if d.ref is not None]
            if releases:
                self.writes.stage_releases(releases)
            for delivery in returned:
                source.push(delivery.message)
            sub.inflight.clear()
            sub.held.clear()
            sub.inflight_bytes = 0
            source.dispatch()

    # -- ACK / NACK -----------------------------------------------------------------
    def _find_delivery(self, session: Session, frame: Frame) -> tuple[Subscription, str]:
        h = frame.headers
        version = session.conn.version
        named: Subscription | None = None
        if version == STOMP_1_2:
            ack_id = h.get("id", "")
            key, _, message_id = ack_id.partition(":")
            parsed = parse_ack_key(key)
            named = session.by_key.get(parsed) if parsed is not None else None
            if named is not None and _awaits_ack(named, message_id):
                return named, message_id
            what, sub_name = f"id {ack_id!r}", None if named is None else named.id
        else:
            message_id = h.get("message-id", "")
            what, sub_name = f"message-id {message_id!r}", h.get("subscription")
            if version == STOMP_1_1:
                named = session.subscriptions.get(sub_name or "")
                if named is not None and _awaits_ack(named, message_id):
                    return named, message_id
            else:
                for sub in session.subscriptions.values():
                    if _awaits_ack(sub, message_id):
                        return sub, message_id
                sub_name = None  # 1.0 ACKs name no subscription
        raise BrokerError(_ack_miss(session, frame.command, what, message_id, named, sub_name,
                                    version))

    def _ack(self, session: Session, command: str, frame: Frame, receipt: str | None,
             settled: list[Settled] | None = None) -> None:
        """Apply an ACK/NACK. ``settled``: it is a COMMIT's, whose unit is being
        staged (see ``_send``): what it settled is noted there, for ``_unsettle``
        if the store refuses the unit, and the caller dispatches."""
        sub, message_id = self._find_delivery(session, frame)
        ids = sub.covered(message_id)
        done = sub.untrack(ids)
        if sub.held:
            sub.held.difference_update(ids)
        batch = self.writes.batch
        if command == "ACK":
            self.stats["acked"] += len(done)
            self.dequeued[sub.destination] += len(done)
            batch.acks.extend(d.ref for d in done if d.ref is not None)
        else:  # what went to the dead-letter queue is settled; the rest is released
            done = [d for d in done if self._redeliver_or_dead_letter(sub.source, d, batch)]
        if settled is not None:
            settled.append((command, sub, done))
            return
        self._finish_write(session, receipt)
        sub.source.dispatch()

    def _finish_write(self, session: Session, receipt: str | None) -> None:
        """Stage a commit point; send the RECEIPT (if any) once it is durable."""
        session.commit_started()

        def done(ok: bool) -> None:
            session.commit_finished()
            if ok and receipt is not None and not session.conn.closed:
                session.conn.write_receipt(receipt)

        unit = self.writes.claim(session.conn)
        if unit is None:
            self.writes.stage(done)
        else:  # the frame's own data is in a unit: the RECEIPT waits for it
            unit.receipt = receipt
            self.writes.stage_unit(unit, lambda result: done(result is not None))

    def _redeliver_or_dead_letter(self, source: Source, d: Delivery, batch: Batch,
                                  dead_letter: bool = True) -> bool:
        """Back to ``source``, or past ``max_redeliveries`` (unless not ``dead_letter``)
        to the dead-letter queue. True when it went there (only then is it settled:
        gone from ``source``)."""
        m = d.message
        if not dead_letter or m.delivery_count <= self.settings.max_redeliveries:
            if d.ref is not None:
                self.writes.stage_releases([d.ref])
            source.push(m)
            return False
        self.stats["dead_lettered"] += 1
        self.dead_lettered[m.destination] += 1
        dlq = self.settings.dead_letter_queue
        copy = self._copy(m)
        copy.id = next(self.ids)
        copy.message_id = m.message_id
        copy.destination = dlq
        copy.delivery_count = 0
        copy.producer_id = copy.producer_seq = None  # identity stays with the original
        copy.headers = {**m.headers, "original-destination": m.destination}
        copy.size = message_size(copy.headers, copy.body)
        if not m.persistent:
            self._route_now(copy)
            return True
        did = self._destination_id(dlq, batch)
        batch.inserts.append(NewMessage(
            id=copy.id, destination_id=did, message_id=copy.message_id, headers=copy.headers,
            body=copy.body, priority=copy.priority, expires_at=0,
            enqueued_at=now_ms(),
        ))
        if d.ref is not None:
            batch.acks.append(d.ref)
        dead_letters = self.queue(dlq)
        dead_letters.pending_inserts += 1  # no hand-over may overtake it

        def stored(ok: bool) -> None:
            dead_letters.pending_inserts -= 1
            if ok:
                self._route_committed(copy, [])

        unit = self.writes.current
        if unit is None:
            self.writes.stage(stored)
        else:  # a COMMIT's NACK: the move is its unit's, and fails with it
            self.writes.stage_unit(unit, lambda result: stored(result is not None))
        log.info("message %s moved to %s after %d deliveries", m.message_id, dlq,
                 m.delivery_count)
        return True

    # -- transactions ---------------------------------------------------------------
    @staticmethod
    def _hold(sub: Subscription, message_id: str, tx: Transaction) -> None:
        """An ACK inside a transaction: free the prefetch slots of what it covers now,
        apply it at COMMIT (ActiveMQ: a consumer with prefetch 1 acking in a transaction
        gets its next message before the COMMIT)."""
        ids = sub.covered(message_id)
        sub.held.update(ids)
        tx.held.append((sub, ids))
        sub.source.dispatch()

    @staticmethod
    def _release_held(tx: Transaction) -> None:
        """ABORT (or the connection's end) of a transaction with ACKs: what they covered
        stays with the consumer, awaiting acknowledgement under its ack id, as in
        ActiveMQ (its ``Stomp12Test`` acks the same messages right after ABORT). Only
        the prefetch slots its ACKs freed are taken again; a message the client never
        settles goes back when its subscription ends, like any other."""
        for sub, ids in tx.held:
            sub.held.difference_update(ids)
        tx.held.clear()

    def _check_commit(self, session: Session, tx: Transaction) -> None:
        """Raise BrokerError if any part of ``tx`` would fail; applies nothing.

        Each ACK/NACK must still name a message awaiting acknowledgement once the
        earlier ones of the transaction are applied (a cumulative ACK settles the
        messages before it too). Each SEND was checked when it arrived (``checked_send``
        depends on the frame alone) and is kept as its checked message."""
        settled: set[tuple[int, str]] = set()
        for _command, frame in tx.acks:
            sub, message_id = self._find_delivery(session, frame)
            if (id(sub), message_id) in settled:
                raise BrokerError(f"message {message_id!r} is acknowledged twice in "
                                  "the transaction")
            settled.update((id(sub), mid) for mid in sub.covered(message_id))

    def _commit(self, session: Session, tx: Transaction, receipt: str | None) -> None:
        """Apply a transaction's sends and acks in one unit: all or nothing (see
        ``_send``)."""
        if tx.sends or tx.acks:
            now = now_ms()
            for m in tx.sends:
                m.enqueued_at = now  # enqueued by the COMMIT, not when the SEND came
            self._send(session, tx.sends, receipt, tx.acks)
        else:
            self._finish_write(session, receipt)

    def _unsettle(self, settled: list[Settled]) -> None:
        """The store refused a COMMIT: the messages its ACKs (and NACKs past the
        redelivery limit) settled in memory are not settled in the store. They go
        back to their destination, redelivered: an ACK's (they left the consumer when the
        COMMIT applied them), a NACK's as if the NACK had not come (so not to the
        dead-letter queue). Ack rows cannot be refused on their own (integer ids
        the master allocated): a SEND of the transaction was."""
        for command, sub, done in settled:
            acked = command == "ACK"
            if acked:
                self.stats["acked"] -= len(done)
                self.dequeued[sub.destination] -= len(done)
            else:  # dead-lettered; a memory-only copy was routed at once: it stays so
                done = [d for d in done if d.message.persistent]
                self.stats["dead_lettered"] -= len(done)
                self.dead_lettered[sub.destination] -= len(done)
            if not done or (sub.closed and isinstance(sub.source, TopicSubscriptionSource)):
                continue  # nothing, or memory-only copies for a subscriber that is gone
            for d in done:
                self._redeliver_or_dead_letter(sub.source, d, self.writes.batch, acked)
            _dispatch_logged(sub.source)

    # -- expiry, paging ---------------------------------------------------------------
    def expire(self, source: Source, message: Message) -> None:
        self.stats["expired"] += 1
        if message.persistent and source.stored:
            self.writes.stage().acks.append(source.ref(message))

    def load_page(self, source: Source, limit: int) -> None:
        assert self.committer is not None and source.store_id is not None
        if isinstance(source, DurableSource):
            fn = self.committer.store.load_subscription_page
        else:
            fn = self.committer.store.load_page
        future = asyncio.ensure_future(self.committer.call(fn, source.store_id, source.cursor,
                                                           limit))

        def loaded(f: asyncio.Future) -> None:
            if f.cancelled() or f.exception() is not None:
                source.paging = False
                log.error("paging %s failed: %s", source.name,
                          None if f.cancelled() else f.exception())
                return
            source.page_loaded(f.result(), limit)

        future.add_done_callback(loaded)

    def message_from_row(self, row: StoredMessage, destination: str) -> Message:
        return Message(
            row.id, destination, row.message_id, row.headers, row.body, row.priority,
            row.expires_at, True, row.delivery_count, row.enqueued_at, row.producer_id,
            row.producer_seq,
        )

    # -- memory flow control ----------------------------------------------------------
    def block_producer(self, producer: Client, source: Source) -> None:
        """Stop reading from a producer whose message put ``source`` or the broker
        at its byte budget (ActiveMQ's producer flow control, RabbitMQ's memory
        alarm); ``Source.pop`` resumes it below the resume level."""
        if producer.closed:
            return
        reasons = self.blocked_producers_all.setdefault(producer, set())
        if (source.bytes >= self.destination_budget
                or source.nonpersistent >= MAX_NONPERSISTENT_BACKLOG) \
                and producer not in source.blocked_producers:
            source.blocked_producers.add(producer)
            reasons.add(source)
            producer.pause_reading(f"flow:{source.name}")
        if self.waiting_bytes >= self.memory_budget and producer not in self.blocked_producers:
            self.blocked_producers.add(producer)
            reasons.add(None)
            log.info("memory budget reached (%d bytes waiting): pausing producers",
                     self.waiting_bytes)
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

    # -- management: deleting a destination (amqlite.management.actions) -------------------
    def forget_destination(self, name: str) -> ForgottenDestination:
        """Drop a destination (with no consumers) from memory and hand the store a
        clean cut: everything staged so far is submitted now, so the store's delete
        (queued right after by the caller) comes after every write that names the old
        row, and every write staged from now on names a new row (a SEND creates the
        destination again, as in ActiveMQ). Messages still committing into the old row
        are dropped by ``settle_forgotten`` once they have landed in memory."""
        gone = ForgottenDestination(name, self.destination_rows.pop(name, None),
                                    next(self.ids))
        self.unconfirmed_destinations.pop(name, None)
        for totals in (self.enqueued, self.dequeued, self.dead_lettered):
            totals.pop(name, None)
        self.known_destinations.discard(name)
        q = self.queues.get(name)
        if q is not None:
            q.store_id = None  # a new row is allocated by the next write that needs one
            q.store_has_more = False
            gone.memory_only = sum(1 for m in q.drop(lambda m: True) if not m.persistent)
        if not self.topics.get(name):  # its subscribers left (with some: refused before)
            self.topics.pop(name, None)
        gone.durables = self.durables_by_topic.pop(name, [])
        for durable in gone.durables:
            self.durables.pop((durable.client_id, durable.sub_name), None)
            durable.discard()  # its row goes with the destination's, in the same transaction
        self.writes.flush()
        return gone

    def settle_forgotten(self, gone: ForgottenDestination) -> None:
        """After the store's delete: every commit submitted before it has called back,
        so what those routed into memory (ids below the cut) is dropped, and a queue
        nobody uses again leaves memory, the listing and the metrics."""
        q = self.queues.get(gone.name)
        if q is not None:
            q.drop(lambda m: m.id < gone.cut)
            if (not len(q) and not q.consumers and not q.pending_inserts
                    and gone.name not in self.destination_rows):
                del self.queues[gone.name]
        for durable in gone.durables:
            durable.discard()

    # -- flow of the whole broker --------------------------------------------------------
    def pause(self) -> None:
        """Stop dispatching and committing (the lock is in doubt)."""
        self.paused = True
        self.writes.held = True

    def resume(self) -> None:
        self.paused = False
        self.writes.release()
        self.dispatch_all()

    def dispatch_all(self) -> None:
        for q in self.queues.values():
            q.dispatch()
        for d in self.durables.values():
            d.dispatch()
        for sources in self.topics.values():
            for s in sources:
                s.dispatch()

    def connection_writable(self, conn: Client) -> None:
        session = self.sessions.get(conn)
        if session is None:
            return
        for sub in list(session.subscriptions.values()):
            sub.source.dispatch()
