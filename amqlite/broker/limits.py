"""Bounded queues (``max_length``, ``max_bytes`` of a policy, ``amqlite.policy``) and what
a SEND's policy changes (its expiry).

A bounded queue keeps a *ledger*: every message that is in it, by id, with its body's
bytes, in the order they came. What counts against the limits is what is **waiting**
(ready, not in flight to a consumer), as RabbitMQ counts: the ledger minus the
persistent messages its consumers hold. Unbounded queues keep no ledger (the hot path
pays one ``is None`` test per message).

The ledger is kept where messages come and go, so a number cannot drift by being
counted twice (ids, not counters):

- in: a persistent SEND when staged (refused or duplicate: out again); whatever is
  pushed into the queue's memory or committed to it (pages, redeliveries, DLQ and
  operator copies); non-persistent messages when pushed;
- out: every queue ack the write buffer sends to the store (``forget_acked``: consumed,
  expired, dead-lettered, purged, moved, dropped), what housekeeping reaps, a
  non-persistent message when it leaves memory, a message whose redelivery is delayed
  (back when due).

At activation a bounded queue's ledger is read from the store (``load``): one query per
bounded queue, as long as the queue, which its policy bounds.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from amqlite.broker.counters import Kind
from amqlite.broker.message import Message, message_size, now_ms
from amqlite.policy import DestinationPolicy, Overflow
from amqlite.validation import BrokerError
from store.api import Batch, Ref

if TYPE_CHECKING:
    from amqlite.broker.core import Broker
    from amqlite.broker.source import Source

log = logging.getLogger("amqlite.broker")


class Ledger:
    """A bounded queue's messages: id -> body bytes, in arrival order."""

    __slots__ = ("bytes", "dropped", "members", "policy")

    def __init__(self, policy: DestinationPolicy) -> None:
        self.policy = policy
        self.members: dict[int, int] = {}
        self.bytes = 0
        #: Dropped (drop-head) while their insert was still committing: when it commits,
        #: the message is not made visible (its ack, staged after, deletes the row).
        self.dropped: set[int] = set()

    def admit(self, message_id: int, size: int) -> bool:
        if message_id in self.members:
            return False
        self.members[message_id] = size
        self.bytes += size
        return True

    def forget(self, message_id: int) -> bool:
        size = self.members.pop(message_id, None)
        if size is None:
            return False
        self.bytes -= size
        return True


def admit(broker: Broker, q: Source, m: Message) -> None:
    """``m`` is in bounded queue ``q`` (idempotent)."""
    ledger = q.ledger
    if ledger is not None and ledger.admit(m.id, len(m.body)):
        broker.bounded[m.id] = q


def dropped_meanwhile(q: Source, m: Message) -> bool:
    """A committed message of bounded queue ``q`` that drop-head dropped while it was
    committing: it must not be made visible. Else it is admitted (idempotent)."""
    ledger = q.ledger
    assert ledger is not None
    if ledger.dropped and m.id in ledger.dropped:
        ledger.dropped.discard(m.id)
        return True
    if ledger.admit(m.id, len(m.body)):
        q.broker.bounded[m.id] = q
    return False


def forget(broker: Broker, q: Source, message_id: int) -> None:
    ledger = q.ledger
    if ledger is not None and ledger.forget(message_id):
        broker.bounded.pop(message_id, None)


def forget_refs(broker: Broker, refs: Iterable[Ref]) -> None:
    """Queue messages that left the store (acked, reaped): out of their ledgers."""
    bounded = broker.bounded
    for sid, mid in refs:
        if sid is None:
            q = bounded.pop(mid, None)
            if q is not None and q.ledger is not None:
                q.ledger.forget(mid)


def forget_acked(broker: Broker, batch: Batch) -> None:
    """The write buffer's ``on_flush``: what a batch's acks settle leaves the ledgers."""
    if broker.bounded and batch.acks:
        forget_refs(broker, batch.acks)


def waiting(q: Source) -> tuple[int, int]:
    """(messages, body bytes) waiting in bounded queue ``q``: the ledger less the
    persistent messages its consumers hold (non-persistent ones left it when popped)."""
    ledger = q.ledger
    assert ledger is not None
    held = held_bytes = 0
    for sub in q.consumers:
        for d in sub.inflight.values():
            if d.ref is not None and d.message.id in ledger.members:
                held += 1
                held_bytes += len(d.message.body)
    return len(ledger.members) - held, ledger.bytes - held_bytes


def _over(policy: DestinationPolicy, q: Source, extra: int, extra_bytes: int) -> bool:
    """Would ``extra`` more messages (``extra_bytes``) put ``q`` past its limits? The
    consumers' in-flight messages are only counted out when the ledger alone is over."""
    ledger = q.ledger
    assert ledger is not None
    over_length = policy.max_length and len(ledger.members) + extra > policy.max_length
    over_bytes = policy.max_bytes and ledger.bytes + extra_bytes > policy.max_bytes
    if not over_length and not over_bytes:
        return False
    count, size = waiting(q)
    return bool((policy.max_length and count + extra > policy.max_length)
                or (policy.max_bytes and size + extra_bytes > policy.max_bytes))


def check_send(broker: Broker, messages: list[Message]) -> None:
    """Before a SEND (or a COMMIT's SENDs) is applied: each message's policy stamps its
    expiry, and a bounded queue with ``reject-publish`` that has no room refuses the
    frame whole (BrokerError: an ERROR, no RECEIPT, nothing stored), as RabbitMQ's
    ``reject-publish`` nacks the publish. A message bigger than ``max_bytes`` is
    refused whatever the overflow (no drop makes room for it)."""
    policies = broker.policies
    counted: dict[str, tuple[int, int]] = {}  # this frame's messages per bounded queue
    now = 0
    for m in messages:
        policy = policies.resolve(m.destination)
        if policy.stamps_expiry and m.plan is None:
            now = now or now_ms()
            _stamp_expiry(m, policy, now)
        if not policy.limited or not m.destination.startswith("/queue/"):
            continue
        body = len(m.body)
        if policy.max_bytes and body > policy.max_bytes:
            raise BrokerError(f"message refused: its body ({body} bytes) is larger than "
                              f"max_bytes {policy.max_bytes} of {m.destination}")
        if policy.overflow is not Overflow.REJECT_PUBLISH:
            continue
        q = broker.queues.get(m.destination)  # a refused SEND makes no queue
        if q is not None and q.ledger is None:
            continue
        n, size = counted.get(m.destination, (0, 0))
        n, size = n + 1, size + body
        if q is None:  # not in memory: empty, but for this frame's own messages
            full = bool((policy.max_length and n > policy.max_length)
                        or (policy.max_bytes and size > policy.max_bytes))
        else:
            full = _over(policy, q, n, size)
        if full:
            limit = (f"max_length {policy.max_length}" if policy.max_length
                     else f"max_bytes {policy.max_bytes}")
            log.info("%s is full (%s): a SEND refused (overflow reject-publish)",
                     m.destination, limit)
            raise BrokerError(f"queue {m.destination} is full ({limit}): message refused "
                              "(overflow reject-publish)")
        counted[m.destination] = (n, size)


def _stamp_expiry(m: Message, policy: DestinationPolicy, now: int) -> None:
    """The policy's default TTL or cap, also in the ``expires`` header consumers read."""
    expires = policy.expires_at(m.expires_at, now)
    if expires != m.expires_at:
        m.expires_at = expires
        m.headers["expires"] = str(expires)
        m.size = message_size(m.headers, m.body)


def make_room(broker: Broker, q: Source, m: Message) -> None:
    """A persistent ``m`` is being staged into bounded queue ``q``: admitted, and with
    ``drop-head`` the head of the queue (the message a consumer would get next) is
    dropped while the waiting messages are past a limit."""
    ledger = q.ledger
    assert ledger is not None
    policy = ledger.policy
    if policy.overflow is Overflow.DROP_HEAD:
        while _over(policy, q, 1, len(m.body)):
            if not drop_head(broker, q):
                break
    admit(broker, q, m)


def drop_head(broker: Broker, q: Source) -> bool:
    """Drop the message at the head of ``q`` (RabbitMQ's ``drop-head``): the first one
    waiting in memory, else the oldest waiting one in the store. False: none waits."""
    ledger = q.ledger
    assert ledger is not None
    victim = q.pop() if q.heap else None
    if victim is not None:
        message_id, persistent = victim.id, victim.persistent
    else:
        held = q.inflight_ids()
        found = next((i for i in ledger.members if i not in held), None)
        if found is None:
            return False
        message_id, persistent = found, True
        ledger.dropped.add(message_id)  # its insert may still be committing
        if message_id > q.cursor:
            q.ahead.add(message_id)  # the pager must not bring it back
    forget(broker, q, message_id)
    if persistent and q.stored:
        broker.writes.stage().acks.append((None, message_id))
    broker.stats["overflow_dropped"] += 1
    broker.counters.add(q.name, Kind.OVERFLOW_DROPPED)  # with the ack just staged
    log.debug("%s: message %d dropped (overflow drop-head)", q.name, message_id)
    return True


async def load(broker: Broker) -> None:
    """At activation: the ledgers of the bounded queues from the store."""
    committer = broker.committer
    if committer is None or not broker.policies.limits_queues:
        return
    for q in list(broker.queues.values()):
        if q.ledger is None or q.store_id is None:
            continue
        rows = await committer.call(committer.store.queue_members, q.store_id)
        for message_id, size in rows:
            if q.ledger.admit(message_id, size):
                broker.bounded[message_id] = q
