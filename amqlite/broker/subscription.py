"""Subscriptions and the deliveries they hold until acknowledged.

A message delivered in a client ack mode is recorded as delivered
(``delivery_count + 1``) before its MESSAGE frame is written, so a message seen
again after a crash is always flagged ``redelivered``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from amqlite.broker.counters import Kind
from amqlite.broker.message import Message, track, untrack
from amqlite.broker.selector import Selector
from amqlite.broker.session import Session
from amqlite.broker.source import Source, TopicSubscriptionSource
from amqlite.codec import Frame, join_head
from amqlite.validation import headers_for
from amqlite.wire import ACK_AUTO, AMQ_GROUP_FIRST, DELIVERY_COUNT_HEADER, STOMP_1_0
from store.api import Ref

if TYPE_CHECKING:
    from amqlite.broker.core import Broker

log = logging.getLogger("amqlite.broker")

#: Message bytes one subscription may hold unacknowledged, whatever its
#: ``activemq.prefetchSize``: a huge prefetch must not page the backlog into
#: RAM. 8 MiB is ActiveMQ's default prefetch (1000) of 8 KB messages. Past this, the
#: broker-wide budget and the connection's share bound them too (``memory``).
MAX_INFLIGHT_BYTES = 8 * 1024 * 1024
#: Headers a MESSAGE frame sets itself: a message carrying one of them (none from a
#: SEND: ``NON_USER_HEADERS``) takes ``_write_frame``, where the frame's value wins.
_FRAME_SET = frozenset({"subscription", "message-id", "destination", "ack", "redelivered",
                        DELIVERY_COUNT_HEADER, AMQ_GROUP_FIRST, "content-length"})


@dataclass(slots=True, init=False)
class Delivery:
    """A message handed to a subscription. One per delivery, so the constructor is
    written out: the one ``dataclass`` generates runs as interpreted Python even in the
    compiled build (``codec.Frame``)."""

    message: Message
    ref: Ref | None  # None: nothing stored to acknowledge
    #: Handed over with its insert, which has not committed yet (see Broker._send).
    pending: bool
    #: Its MESSAGE frame went out: only then may the client acknowledge it (a
    #: cumulative ACK must not cover a delivery still waiting for its commit).
    written: bool
    #: Order in which its MESSAGE went out on the subscription. A cumulative
    #: ACK covers what was written up to the acked message, which is not the
    #: order deliveries entered ``inflight``: a persistent delivery waits for
    #: its record to commit while a non-persistent one behind it goes at once.
    written_seq: int
    #: Its subscription closed before that commit: the commit requeues it.
    orphaned: bool
    #: The first message of its group this consumer gets (``choice``).
    group_first: bool

    def __init__(self, message: Message, ref: Ref | None, pending: bool = False,
                 group_first: bool = False) -> None:
        self.message, self.ref = message, ref
        self.pending, self.group_first = pending, group_first
        self.written, self.written_seq, self.orphaned = False, 0, False


class Subscription:
    """One SUBSCRIBE of one connection."""

    def __init__(self, session: Session, sub_id: str, key: int, destination: str,
                 ack_mode: str, prefetch: int, source: Source,
                 selector: Selector | None = None, priority: int = 0,
                 exclusive: bool = False) -> None:
        self.session = session  # counts the connection's unacknowledged bytes
        self.conn = session.conn
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
        #: Its JMS selector (``amqlite.broker.selective``), and its scan of a queue's
        #: store: the last id read, whether it reached the end, whether one is running.
        self.selector = selector
        #: ActiveMQ's consumer priority and exclusivity (``choice``).
        self.priority = priority
        self.exclusive = exclusive
        self.scan_after = 0
        self.scan_done = False
        self.scanning = False

    def has_credit(self) -> bool:
        if self.closed or self.conn.closed or not self.conn.can_write():
            return False
        if self.ack_mode == ACK_AUTO:
            return True
        memory = self.source.memory
        if (len(self.inflight) - len(self.held) < self.prefetch
                and self.inflight_bytes < MAX_INFLIGHT_BYTES):
            # Unacknowledged deliveries are held bytes: past the connection's share, or
            # the part of the budget deliveries may fill (the rest only for connections
            # holding next to nothing), the message stays waiting (or in the store).
            mine = self.session.inflight_bytes
            if mine < memory.delivery_share and (
                    memory.held_bytes < memory.delivery_budget
                    or (mine < memory.delivery_floor
                        and memory.held_bytes < memory.memory_budget)):
                return True
            memory.starved.add(self.source)  # dispatched again once bytes are released
            if mine >= memory.delivery_share:
                return memory.may_overdraw(self.conn, mine, memory.delivery_share)
            return False
        return memory.may_overdraw(self.conn, self.inflight_bytes, MAX_INFLIGHT_BYTES)

    def deliver(self, message: Message, group_first: bool = False) -> None:
        broker = self.source.broker
        stored = message.persistent and self.source.stored
        ref = self.source.ref(message) if stored else None
        if self.ack_mode == ACK_AUTO:
            if not self._write(message, message.delivery_count, group_first):
                self.source.push(message)  # not sent: another consumer takes it
                return
            message.delivery_count += 1
            broker.counters.add(self.destination, Kind.DEQUEUED)
            if ref is not None:
                broker.writes.stage().acks.append(ref)
            return
        previous = message.delivery_count
        message.delivery_count += 1
        delivery = Delivery(message, ref, group_first=group_first)
        self.track(delivery)
        if ref is None:
            self.write(delivery, previous)
            return
        # Record the delivery before the client can see it (see module docstring).
        broker.writes.stage_delivery(
            ref, lambda ok: self._delivery_recorded(delivery, previous, ok))

    def track(self, delivery: Delivery) -> None:
        """Awaiting acknowledgement: in ``inflight``, its bytes in ``inflight_bytes``, the
        connection's (whole: its shares) and the broker's held bytes (the message left
        its source's waiting bytes as it was taken; a topic message other subscriptions
        hold unacknowledged too is one body: ``message.track``)."""
        message = delivery.message
        self.inflight[message.message_id] = delivery
        size = message.size
        self.inflight_bytes += size
        self.session.inflight_bytes += size
        self.source.memory.held_bytes += track(message)

    def untrack(self, message_ids: list[str]) -> list[Delivery]:
        """Settled or returned: out of ``inflight``, with their bytes."""
        taken = [self.inflight.pop(mid) for mid in message_ids]
        size = freed = 0
        for d in taken:
            size += d.message.size
            freed += untrack(d.message)
        self.inflight_bytes -= size
        self.session.inflight_bytes -= size
        self.source.memory.release_held(freed)
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
        self._write(delivery.message, previous_deliveries, delivery.group_first)

    def covered(self, message_id: str) -> list[str]:
        """The message ids an ACK or NACK of ``message_id`` settles: in ``client``
        mode (cumulative) every delivery written up to it, in the order the client
        saw them; else just it."""
        if self.ack_mode != "client":
            return [message_id]
        last = self.inflight[message_id].written_seq
        return [mid for mid, d in self.inflight.items() if d.written and d.written_seq <= last]

    def _write(self, message: Message, previous_deliveries: int,
               group_first: bool = False) -> bool:
        """Write one MESSAGE; False if it could not be. Never raises: one message
        this consumer cannot take must not stop dispatch to the others (defence in
        depth; SEND validation keeps such messages out). The consumer is closed
        with an ERROR and what it holds unacknowledged goes back to the source."""
        try:
            if not self._write_fast(message, previous_deliveries, group_first):
                self._write_frame(message, previous_deliveries, group_first)
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
        broker = self.source.broker
        broker.stats["delivered"] += 1
        broker.delivered[self.destination] += 1
        return True

    def _write_fast(self, message: Message, previous_deliveries: int,
                    group_first: bool) -> bool:
        """Write the MESSAGE without a headers dict or a Frame: its head joined in a few
        C-level passes (``codec.join_head``), handed to the connection as it is
        (``Client.write_message``). False, nothing written, unless the consumer speaks
        1.1 or 1.2 and can carry every header (``Message.floor``), no header of the
        message is one this frame sets itself, and nothing needs more than its colons
        escaped: ``_write_frame`` then takes the general path, to the same bytes."""
        version = self.conn.version
        headers = message.headers
        if (version == STOMP_1_0 or message.floor > version
                or not _FRAME_SET.isdisjoint(headers) or "" in headers):
            return False
        message_id = message.message_id
        parts = ["MESSAGE", "subscription\x00" + self.id, "message-id\x00" + message_id,
                 "destination\x00" + message.destination]
        for name, value in headers.items():
            parts.append(name + "\x00" + value)
        if self.ack_mode != ACK_AUTO:
            parts.append(f"ack\x00{self.key}:{message_id}")
        if previous_deliveries:
            parts.append("redelivered\x00true")
            parts.append(f"{DELIVERY_COUNT_HEADER}\x00{previous_deliveries + 1}")
        if group_first:
            parts.append(AMQ_GROUP_FIRST + "\x00true")
        body = message.body
        if body:
            parts.append("content-length\x00" + str(len(body)))
        head = join_head(parts, escape=True)
        if head is None:
            return False
        self.conn.write_message(head, body)
        return True

    def _write_frame(self, message: Message, previous_deliveries: int,
                     group_first: bool) -> None:
        """The MESSAGE as a Frame, for any consumer and any header (``headers_for``)."""
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
        if group_first:
            headers[AMQ_GROUP_FIRST] = "true"
        self.conn.write_frame(Frame("MESSAGE", headers, message.body))


#: What one ACK or NACK of a COMMIT settled in memory: (command, subscription,
#: deliveries), kept until the store took the COMMIT (see ``Broker._unsettle``).
Settled = tuple[str, Subscription, list[Delivery]]


def close_subscription(broker: Broker, session: Session, sub: Subscription) -> None:
    """Return what the subscriber had not acknowledged; it will be redelivered."""
    sub.closed = True
    session.subscriptions.pop(sub.id, None)
    session.by_key.pop(sub.key, None)
    source = sub.source
    source.remove_consumer(sub)
    # Out of the held bytes whatever happens to them next (a topic's are dropped).
    deliveries = sub.untrack(list(sub.inflight)) if sub.inflight else []
    sub.held.clear()
    if isinstance(source, TopicSubscriptionSource):
        peers = broker.topics.get(sub.destination, [])
        if source in peers:
            peers.remove(source)
            if not peers:
                broker.topic_left(sub.destination)
        if source.pattern is not None:
            broker.topic_patterns.remove(source.pattern, source)
        source.discard()
        return
    if deliveries:
        returned = []
        for delivery in deliveries:
            if delivery.pending:
                delivery.orphaned = True  # its commit requeues it
            else:
                returned.append(delivery)
        releases = [d.ref for d in returned if d.ref is not None]
        if releases:
            broker.writes.stage_releases(releases)
        for delivery in returned:
            source.push(delivery.message)
        source.dispatch()
    if type(source) is Source and not source.consumers:
        broker.queue_left(source)  # nothing left in it: out of memory (issue 23)
