"""SEND and COMMIT: messages numbered, staged in one unit, routed once committed.

The persistent messages of one frame (every frame of a transaction at once) commit
in one unit before anyone sees them; the RECEIPT follows (``receipts.answer``).
When a consumer is waiting for a queue that has nothing else to give, the new
message is handed to it in the commit that stores it (stored as delivered): one
write instead of two, and the MESSAGE leaves with the RECEIPT.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from amqlite.broker import acks, destinations, limits, receipts, routing
from amqlite.broker.counters import Kind
from amqlite.broker.message import Message, now_ms
from amqlite.broker.schedule import ScheduleError
from amqlite.broker.subscription import Delivery, Settled, Subscription
from amqlite.codec import Frame
from amqlite.validation import destination_kind
from store.api import Batch, BatchResult, NewMessage

if TYPE_CHECKING:
    from amqlite.broker.core import Broker
    from amqlite.broker.session import Client, Session, Transaction
    from amqlite.broker.source import DurableSource

log = logging.getLogger("amqlite.broker")

#: (message, its durables, the consumer it was handed over to if any)
Stored = tuple[Message, list["DurableSource"], tuple[Subscription, Delivery] | None]


def send(broker: Broker, session: Session, checked: list[Message], receipt: str | None,
         ack_frames: list[tuple[str, Frame]] | None = None) -> None:
    """Route messages; the persistent ones (all frames of a transaction at
    once) commit in one batch before anyone sees them.

    ``ack_frames`` (a COMMIT's ACK/NACK frames, maybe none) makes this a COMMIT:
    the ack rows join the frame's unit, so the store takes the transaction
    whole or refuses it whole; its non-persistent messages are routed only
    once the unit committed; a refusal undoes the ACKs (``acks.unsettle``)."""
    conn = session.conn
    if ack_frames is None and broker.policies.any:  # a COMMIT's: checked in on_commit
        limits.check_send(broker, checked)  # BrokerError: refused whole, nothing done
    messages = [broker.number(m) for m in checked]
    bounded = broker.policies.limits_queues
    broker.stats["sent"] += len(messages)
    count = broker.counters.add
    to_store: list[tuple[Message, list[DurableSource]]] = []  # no durables: a queue's
    identity_only: list[Message] = []  # nothing to keep but who sent it
    in_memory: list[Message] = []  # nothing to keep (no durable subscriber)
    scheduled: list[Message] = []  # stored now, routed when due (amqlite.broker.scheduler)
    for m in messages:
        if m.plan is not None:
            scheduled.append(m)  # enqueued when a copy is due, not now
            continue
        count(m.destination, Kind.ENQUEUED)
        if bounded and destination_kind(m.destination) == "queue":
            q = broker.queue(m.destination)
            if q.ledger is not None:
                limits.make_room(broker, q, m)
        if not m.persistent:
            in_memory.append(m)
        elif destination_kind(m.destination) == "queue":
            to_store.append((m, []))
        else:
            durables = routing.durables_for(broker, m.destination)
            if durables:
                durables = [d for d in durables if routing.wants(d, m, conn)]
            if durables:
                to_store.append((m, list(durables)))
            elif m.dedup_key is not None:
                identity_only.append(m)
            else:
                in_memory.append(m)
    writes_nothing = not to_store and not identity_only and not scheduled and not ack_frames
    if ack_frames is None or writes_nothing:  # else a COMMIT's: once its unit committed
        for m in in_memory:
            routing.route_now(broker, m, conn)
        in_memory = []
        if writes_nothing:
            receipts.answer_now(conn, receipt)
            return
    # The frame's own data is a unit: if the store refuses it, only this
    # client is told (see WriteUnit).
    writes = broker.writes
    batch = writes.batch
    unit = writes.begin_unit(conn, covers_acks=bool(ack_frames))
    settled: list[Settled] | None = None
    if ack_frames:
        settled = []
        for command, frame in ack_frames:
            acks.ack(broker, session, command, frame, None, settled)
    stored: list[Stored] = []
    pending_bytes = 0
    for m, durables in to_store:
        row = new_row(broker, m, batch, durables)
        batch.inserts.append(row)
        hand = None if durables else hand_over(broker, m, row)
        stored.append((m, durables, hand))
        if hand is None:  # else held as its consumer's delivery already (the same bytes)
            pending_bytes += m.size
    for m in identity_only:
        batch.identities.append(new_row(broker, m, batch))
    for m in scheduled:
        batch.inserts.append(scheduled_row(broker, m, batch))
        pending_bytes += m.size
    writes.end_unit(unit)

    def committed(result: BatchResult | None) -> None:
        for m, durables, hand in stored:
            if hand is None and not durables:
                broker.queue(m.destination).pending_inserts -= 1
        if bounded:  # what was not stored (or routed) leaves the ledgers it entered
            limits.forget_refs(broker, [
                (None, m.id) for m, durables, _ in stored
                if not durables and (result is None or m.id in result.duplicate_ids)])
            if result is None:
                limits.forget_refs(broker, [(None, m.id) for m in in_memory])
        if result is None:
            if unit.rejected is not None:  # nothing was stored
                for _, _, hand in stored:
                    if hand is not None:  # nobody gets what was never stored
                        handed_over(broker, *hand, duplicate=True)
                if settled:
                    acks.unsettle(broker, settled)
            return  # else the store failed: no receipt; the node is demoting
        _route_stored(broker, stored, identity_only, result, conn)
        for m in scheduled:
            if m.id in result.duplicate_ids:
                broker.stats["duplicates"] += 1
            else:
                broker.scheduler.stored(m.deliver_at)
        for m in in_memory:
            try:
                routing.route_now(broker, m, conn)
            except Exception:
                log.exception("routing message %s failed", m.message_id)

    receipts.answer(broker, session, receipt, unit, committed, pending_bytes)
    if settled:
        # The slots the ACKs freed, once the unit is staged whole (a dispatch
        # may flush the batch: see WriteBuffer.stage_delivery).
        for _, sub, _ in settled:
            routing.dispatch_logged(sub.source)


def _route_stored(broker: Broker, stored: list[Stored], identity_only: list[Message],
                  result: BatchResult, producer: Client) -> None:
    """A unit committed: make its messages visible, except duplicates the store found."""
    duplicate_ids = result.duplicate_ids
    for m, durables, hand in stored:
        duplicate = m.id in duplicate_ids
        if duplicate:
            broker.stats["duplicates"] += 1
        try:
            if hand is not None:
                handed_over(broker, *hand, duplicate)
            elif not duplicate:
                routing.route_committed(broker, m, durables, producer)
        except Exception:
            # Stored: it is delivered from the store after a restart at worst;
            # the other messages of the batch and the RECEIPT still go out.
            log.exception("routing committed message %s failed", m.message_id)
    for m in identity_only:
        if m.id in duplicate_ids:
            broker.stats["duplicates"] += 1
            continue
        try:
            routing.publish_memory(broker, m, producer)
        except Exception:
            log.exception("publishing message %s failed", m.message_id)


def hand_over(broker: Broker, m: Message,
              row: NewMessage) -> tuple[Subscription, Delivery] | None:
    """Give a queue message to a waiting consumer in the commit that stores
    it, when nothing in the queue is ahead of it; else count it pending."""
    q = broker.queue(m.destination)
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
    q.taken_max = max(q.taken_max, m.id)
    return sub, delivery


def handed_over(broker: Broker, sub: Subscription, delivery: Delivery,
                duplicate: bool) -> None:
    """The insert of a handed-over message committed (or was a duplicate)."""
    delivery.pending = False
    m = delivery.message
    if delivery.orphaned:
        if not duplicate:  # back to the queue as never handed over
            broker.writes.stage().undeliveries.append(m.id)
            m.delivery_count = 0
            q = broker.queue(m.destination)
            q.push(m)
            q.dispatch()
        return
    if not duplicate:
        sub.write(delivery, 0)  # never raises: Subscription._write catches
    elif sub.inflight.get(m.message_id) is delivery:
        # already stored: the copy we hold is not, so nobody gets it
        sub.untrack([m.message_id])
        sub.source.dispatch()


def new_row(broker: Broker, m: Message, batch: Batch,
            durables: list[DurableSource] | None = None) -> NewMessage:
    return NewMessage(
        id=m.id, destination_id=destinations.destination_id(broker, m.destination, batch),
        message_id=m.message_id, headers=m.headers, body=m.body, priority=m.priority,
        expires_at=m.expires_at, enqueued_at=m.enqueued_at, producer_id=m.producer_id,
        producer_seq=m.producer_seq, dedup_key=m.dedup_key,
        subscriber_ids=tuple(d.store_id for d in durables if d.store_id is not None)
        if durables else (),
    )


def scheduled_row(broker: Broker, m: Message, batch: Batch) -> NewMessage:
    """A scheduled SEND's row: stored with its due time and plan, deliverable at neither
    its queue nor a durable subscription until then (``amqlite.broker.scheduler``)."""
    assert m.plan is not None
    row = new_row(broker, m, batch)
    row.deliver_at, row.schedule = m.deliver_at, m.plan.to_json()
    row.expires_at = 0  # its copies expire (Plan.ttl_ms); the row waits for its time
    return row


def commit(broker: Broker, session: Session, tx: Transaction, receipt: str | None) -> None:
    """Apply a transaction's sends and acks in one unit: all or nothing (see ``send``)."""
    if tx.sends or tx.acks:
        now = now_ms()
        for m in tx.sends:
            m.enqueued_at = now  # enqueued by the COMMIT, not when the SEND came
            if m.plan is not None:  # scheduled from the COMMIT too
                m.deliver_at = _first_due(m, now)
        send(broker, session, tx.sends, receipt, tx.acks)
    else:
        receipts.answer(broker, session, receipt)


def _first_due(m: Message, now: int) -> int:
    """A scheduled message's first due time counted from ``now`` (its COMMIT); the one its
    SEND computed if the cron has no firing left (checked then: it had one)."""
    assert m.plan is not None
    try:
        return m.plan.schedule.first_due(now)
    except ScheduleError:
        return m.deliver_at


def abort(broker: Broker, session: Session, tx: Transaction, receipt: str | None,
          answered: bool = True) -> None:
    """Drop a transaction's sends, keeping the identities of the persistent ones:
    the producer numbered them, and the audit must not see a hole; the RECEIPT
    waits for them. What its ACKs covered stays with the consumer
    (``acks.release_held``). ``answered``: an ABORT frame (not the connection's end,
    which has nothing to answer unless identities are written)."""
    broker.memory.release_transaction(session, tx.size)
    if tx.held:
        acks.release_held(tx)
    identities = [broker.number(m) for m in tx.sends
                  if m.persistent and m.dedup_key is not None]
    if not identities:
        if answered:
            receipts.answer(broker, session, receipt)
        return
    writes = broker.writes
    batch = writes.batch
    unit = writes.begin_unit(session.conn)
    batch.identities.extend(new_row(broker, m, batch) for m in identities)
    writes.end_unit(unit)
    receipts.answer(broker, session, receipt, unit)
