"""The message model: a message in memory, what it costs, and the SEND that makes one.

``Message.size`` is computed once and is what every byte budget adds and subtracts
(``amqlite.broker.memory``). Copies of one message (a topic's subscribers each get one)
share its body and headers: the broker-wide figure counts what they share once, however
many sources hold copies (``Message.origin``, ``hold``, ``unhold``), or however many
subscriptions have copies in flight (``track``, ``untrack``).
"""

from __future__ import annotations

from amqlite.broker.schedule import (
    CRON_HEADER,
    DELAY_HEADER,
    PERIOD_HEADER,
    SCHEDULE_HEADERS,
    Plan,
    ScheduleError,
    parse_schedule,
)
from amqlite.codec import Frame
from amqlite.validation import (
    BrokerError,
    check_destination,
    check_user_headers,
    header_floor,
    parse_send,
)
from amqlite.wildcard import is_wildcard
from amqlite.wire import (
    AMQ_GROUP_FIRST,
    DELIVERY_COUNT_HEADER,
    OMITTED_HEADERS_HEADER,
    ORIGINAL_DESTINATION,
)
from store.api import StoredMessage
from store.statements import now_ms as now_ms  # re-exported: send, scheduler

# now_ms is the store's wall clock: one copy, and (from a module mypyc does not compile)
# a global looked up at each call, so tests can set the clock (test_scheduled).

#: Bytes a Python ``Message`` costs beyond its body and header characters,
#: measured with tracemalloc (Message + Delivery + heap entry + empty headers
#: dict: 497 B; each header: 72 B for 12 characters, so ~60 B beyond them).
MESSAGE_OVERHEAD = 512
HEADER_OVERHEAD = 64
#: Headers the broker owns or that only make sense on the SEND frame: removed from a
#: SEND, so that what a consumer (or an operator's retry) reads of them is the broker's.
NON_USER_HEADERS = frozenset(
    {
        "destination", "receipt", "transaction", "content-length", "message-id",
        "subscription", "ack", "redelivered", DELIVERY_COUNT_HEADER,
        ORIGINAL_DESTINATION, OMITTED_HEADERS_HEADER, AMQ_GROUP_FIRST,
    }
)
DEFAULT_PRIORITY = 4  # JMS default priority


def checked_send(frame: Frame) -> Message:
    """The message a SEND asks for, without its ids (``send.number`` gives them:
    a transaction keeps its messages unnumbered until COMMIT, so ids follow commit
    order); BrokerError when a header does not fit the store."""
    h = frame.headers
    destination = h["destination"]
    check_destination(destination)
    if ("*" in destination or ">" in destination) and is_wildcard(destination):
        raise BrokerError(f"destination {destination[:60]!r} is a wildcard: a SEND needs "
                          "one destination")
    persistent, priority, expires, producer_id, producer_seq = parse_send(h, DEFAULT_PRIORITY)
    headers = {k: v for k, v in h.items() if k not in NON_USER_HEADERS}
    now = now_ms()
    plan, deliver_at = None, 0
    # Three dict lookups on every SEND; parsing only for a scheduled one (the hot path).
    if DELAY_HEADER in headers or PERIOD_HEADER in headers or CRON_HEADER in headers:
        plan, deliver_at = _scheduled(headers, expires, now)
    if plan is not None:
        # Scheduled: stored whatever the persistent header said (ActiveMQ keeps every
        # scheduled message in its scheduler store and delivers the copies persistent).
        persistent = True
        if "persistent" in headers:
            headers["persistent"] = "true"
    chars, floor = check_user_headers(headers)
    m = Message(0, destination, "", headers, frame.body, priority, expires, persistent,
                enqueued_at=now, producer_id=producer_id, producer_seq=producer_seq,
                size=message_size(headers, frame.body, chars), floor=floor)
    if plan is not None:
        m.plan, m.deliver_at = plan, deliver_at
    return m


def _scheduled(headers: dict[str, str], expires: int, now: int) -> tuple[Plan | None, int]:
    """The SEND's scheduling headers (``amqlite.broker.schedule``) as a plan and its first
    due time, removed from ``headers`` (the copies delivered do not carry them, as in
    ActiveMQ); (None, 0) when it is not scheduled. BrokerError names a bad header."""
    try:
        schedule = parse_schedule(headers)
        if schedule is None:
            return None, 0
        due = schedule.first_due(now)
    except ScheduleError as e:
        raise BrokerError(str(e)) from None
    for name in SCHEDULE_HEADERS:
        headers.pop(name, None)
    # An expires already past leaves its copies a millisecond (0 would be "never").
    return Plan(schedule, ttl_ms=max(expires - now, 1) if expires > 0 else 0), due


def message_size(headers: dict[str, str], body: bytes, header_chars: int = -1) -> int:
    """What a message costs in memory, for the byte budgets (integer adds only).
    ``header_chars``: the characters of names and values, when a caller counted them."""
    if header_chars < 0:
        header_chars = sum(map(len, headers)) + sum(map(len, headers.values()))
    return len(body) + header_chars + HEADER_OVERHEAD * len(headers) + MESSAGE_OVERHEAD


class Message:
    """A message in memory; ``id`` is its store row id (or a memory-only id)."""

    __slots__ = (
        "body", "deliver_at", "delivery_count", "destination", "enqueued_at", "expires_at",
        "floor", "headers", "held_size", "holders", "id", "message_id", "origin",
        "persistent", "plan", "priority", "producer_id", "producer_seq", "size",
        "tracked", "tracked_size",
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
        #: A scheduled SEND's plan and first due time (ms); stored, not routed, until
        #: then (``amqlite.broker.scheduler``). None and 0 for every other message.
        self.plan: Plan | None = None
        self.deliver_at = 0
        #: The message this one is a copy of (None: itself): its body and headers are
        #: the origin's, and the origin counts the sources holding any of its copies
        #: (``holders``) and what the first one added to the broker-wide figure
        #: (``held_size``). A field, not a shared object: no allocation per message.
        self.origin: Message | None = None
        self.holders = 0
        self.held_size = 0
        #: The same for the subscriptions holding a copy unacknowledged (``track``).
        self.tracked = 0
        self.tracked_size = 0

    @classmethod
    def from_row(cls, row: StoredMessage, destination: str) -> Message:
        """A stored message paged in (always persistent)."""
        return cls(
            row.id, destination, row.message_id, row.headers, row.body, row.priority,
            row.expires_at, True, row.delivery_count, row.enqueued_at, row.producer_id,
            row.producer_seq,
        )

    def copy(self, persistent: bool | None = None) -> Message:
        """Each subscriber tracks its own delivery count, so each gets its own object;
        the body and headers are shared, and so is the holder count (``hold``)."""
        m = Message(
            self.id, self.destination, self.message_id, self.headers, self.body,
            self.priority, self.expires_at,
            self.persistent if persistent is None else persistent, self.delivery_count,
            self.enqueued_at, self.producer_id, self.producer_seq, self.size, self.floor,
        )
        origin = self.origin
        m.origin = self if origin is None else origin
        return m

    @property
    def dedup_key(self) -> str | None:
        if self.producer_id is None or self.producer_seq is None:
            return None
        return f"{self.producer_id}:{self.producer_seq}"

    def expired(self, now: int) -> bool:
        return 0 < self.expires_at <= now


def _origin(message: Message) -> Message:
    """The message whose counts a copy shares (itself when it is no copy)."""
    origin = message.origin
    return message if origin is None else origin


def hold(message: Message) -> int:
    """A source now holds ``message``: the bytes this adds to the broker-wide figure.
    The first holder of a message or of any of its copies adds its whole ``size``;
    every other one only ``MESSAGE_OVERHEAD`` (its own object and heap entry: the body
    and headers are the first one's). Not less: a stuck holder's copies are real."""
    origin = _origin(message)
    origin.holders += 1
    if origin.holders > 1:
        return MESSAGE_OVERHEAD
    origin.held_size = message.size
    return message.size


def holding(message: Message) -> int:
    """What ``hold`` would add to the broker-wide figure now."""
    return MESSAGE_OVERHEAD if _origin(message).holders else message.size


def releases(message: Message) -> int:
    """What ``unhold`` would take off the broker-wide figure now."""
    origin = _origin(message)
    return origin.held_size if origin.holders == 1 else MESSAGE_OVERHEAD


def unhold(message: Message) -> int:
    """A source let go of ``message``: the bytes this takes off the broker-wide figure
    (what ``hold`` added, summed over the holders: the last one gives back the
    shared part)."""
    origin = _origin(message)
    origin.holders -= 1
    return MESSAGE_OVERHEAD if origin.holders else origin.held_size


def track(message: Message) -> int:
    """A subscription holds ``message`` unacknowledged: the bytes this adds to the
    broker-wide held bytes, as ``hold`` counts waiting ones (a count of its own: a
    copy may wait in one subscription while another has it in flight)."""
    origin = _origin(message)
    origin.tracked += 1
    if origin.tracked > 1:
        return MESSAGE_OVERHEAD
    origin.tracked_size = message.size
    return message.size


def untrack(message: Message) -> int:
    """A subscription's delivery of ``message`` was settled or given back: the bytes
    this takes off the held bytes (what ``track`` added, summed over the holders)."""
    origin = _origin(message)
    origin.tracked -= 1
    return MESSAGE_OVERHEAD if origin.tracked else origin.tracked_size
