"""Acknowledgement: ACK and NACK, redelivery, dead letters, and ACKs in transactions.

An ACK inside a transaction frees its prefetch slot at once (ActiveMQ) and applies
at COMMIT; after ABORT the messages stay with the consumer, acknowledgeable under
their ack ids. A message NACKed more than its policy's ``max_redeliveries`` times moves to its
dead-letter queue in the same commit that settles it; one NACKed fewer times comes back
after the policy's redelivery delay, if any (``amqlite.broker.redelivery``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from amqlite.broker import destinations, receipts, redelivery, routing
from amqlite.broker.counters import Kind
from amqlite.broker.message import message_size, now_ms
from amqlite.broker.source import Source, TopicSubscriptionSource
from amqlite.codec import Frame
from amqlite.validation import BrokerError, parse_ack_key
from amqlite.wire import ORIGINAL_DESTINATION, STOMP_1_1, STOMP_1_2
from store.api import Batch, NewMessage

if TYPE_CHECKING:
    from amqlite.broker.core import Broker
    from amqlite.broker.session import Session, Transaction
    from amqlite.broker.subscription import Delivery, Settled, Subscription

log = logging.getLogger("amqlite.broker")


def ack_miss(session: Session, command: str, what: str, message_id: str,
              named: Subscription | None, sub_name: str | None, version: str) -> str:
    """Why an ACK/NACK matched no delivery, naming a wrong subscription as such (it is
    the usual mistake of a client with several subscriptions)."""
    owner = next((sub for sub in session.all_subscriptions()
                  if sub is not named and awaits_ack(sub, message_id)), None)
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


def awaits_ack(sub: Subscription, message_id: str) -> bool:
    delivery = sub.inflight.get(message_id)
    return delivery is not None and delivery.written


def find_delivery(session: Session, frame: Frame) -> tuple[Subscription, str]:
    h = frame.headers
    version = session.conn.version
    named: Subscription | None = None
    if version == STOMP_1_2:
        ack_id = h.get("id", "")
        key, _, message_id = ack_id.partition(":")
        parsed = parse_ack_key(key)
        named = session.by_key.get(parsed) if parsed is not None else None
        if named is not None and awaits_ack(named, message_id):
            return named, message_id
        what, sub_name = f"id {ack_id!r}", None if named is None else named.id
    else:
        message_id = h.get("message-id", "")
        what, sub_name = f"message-id {message_id!r}", h.get("subscription")
        if version == STOMP_1_1:
            named = session.subscriptions.get(sub_name or "")
            if named is not None and awaits_ack(named, message_id):
                return named, message_id
            qp = session.wildcards.get(sub_name or "")
            for child in qp.children.values() if qp is not None else ():
                if awaits_ack(child, message_id):
                    return child, message_id
        else:
            for sub in session.all_subscriptions():
                if awaits_ack(sub, message_id):
                    return sub, message_id
            sub_name = None  # 1.0 ACKs name no subscription
    raise BrokerError(ack_miss(session, frame.command, what, message_id, named, sub_name,
                               version))


def ack(broker: Broker, session: Session, command: str, frame: Frame, receipt: str | None,
        settled: list[Settled] | None = None) -> None:
    """Apply an ACK/NACK. ``settled``: it is a COMMIT's, whose unit is being
    staged (see ``send.send``): what it settled is noted there, for ``unsettle``
    if the store refuses the unit, and the caller dispatches."""
    sub, message_id = find_delivery(session, frame)
    ids = sub.covered(message_id)
    done = sub.untrack(ids)
    if sub.held:
        sub.held.difference_update(ids)
    batch = broker.writes.batch
    if command == "ACK":
        broker.stats["acked"] += len(done)
        counters = broker.counters
        gone = counters.settle_gone(d.ref for d in done) if counters.gone else 0
        counters.add(sub.destination, Kind.DEQUEUED, len(done) - gone)  # gone: expired
        batch.acks.extend(d.ref for d in done if d.ref is not None)
    else:  # what went to the dead-letter queue is settled; the rest is released
        done = [d for d in done if redeliver_or_dead_letter(broker, sub.source, d, batch)]
    if settled is not None:
        settled.append((command, sub, done))
        return
    receipts.answer(broker, session, receipt)
    sub.source.dispatch()


def redeliver_or_dead_letter(broker: Broker, source: Source, d: Delivery, batch: Batch,
                             dead_letter: bool = True, delayed: bool = True) -> bool:
    """Back to ``source`` (after the policy's redelivery delay unless not ``delayed``),
    or past the policy's ``max_redeliveries`` (unless not ``dead_letter``) to its
    dead-letter queue. True when it went there (only then is it settled: gone from
    ``source``)."""
    m = d.message
    policy = broker.policies.resolve(m.destination)
    if not dead_letter or m.delivery_count <= policy.max_redeliveries:
        wait = policy.redelivery_delay_ms(m.delivery_count) if delayed else 0
        if wait > 0:
            redelivery.delay(broker, source, d, wait)
            return False
        if d.ref is not None:
            broker.writes.stage_releases([d.ref])
        source.push(m)
        return False
    broker.stats["dead_lettered"] += 1
    dlq = dead_letter_queue(broker, m.destination)
    broker.counters.add(m.destination, Kind.DEAD_LETTERED)
    broker.counters.add(dlq, Kind.ENQUEUED)  # what enters the dead-letter queue
    copy = m.copy()
    copy.id = next(broker.ids)
    copy.message_id = m.message_id
    copy.destination = dlq
    copy.delivery_count = 0
    copy.producer_id = copy.producer_seq = None  # identity stays with the original
    copy.headers = {**m.headers, ORIGINAL_DESTINATION: m.destination}
    copy.size = message_size(copy.headers, copy.body)
    if not m.persistent:
        routing.route_now(broker, copy)
        return True
    did = destinations.destination_id(broker, dlq, batch)
    batch.inserts.append(NewMessage(
        id=copy.id, destination_id=did, message_id=copy.message_id, headers=copy.headers,
        body=copy.body, priority=copy.priority, expires_at=0,
        enqueued_at=now_ms(),
    ))
    if d.ref is not None:
        batch.acks.append(d.ref)
    dead_letters = broker.queue(dlq)
    dead_letters.pending_inserts += 1  # no hand-over may overtake it

    def stored(ok: bool) -> None:
        dead_letters.pending_inserts -= 1
        if ok:
            routing.route_committed(broker, copy, [])

    unit = broker.writes.current
    if unit is None:
        broker.writes.stage(stored)
    else:  # a COMMIT's NACK: the move is its unit's, and fails with it
        broker.writes.stage_unit(unit, lambda result: stored(result is not None))
    log.info("message %s moved to %s after %d deliveries", m.message_id, dlq,
             m.delivery_count)
    return True


def dead_letter_queue(broker: Broker, destination: str) -> str:
    """Where ``destination``'s dead letters go (its policy); the broker-wide
    ``dead_letter_queue`` when an individual one's name would be too long (decided
    once per name: ``Policies.dead_letter_queue``)."""
    return broker.policies.dead_letter_queue(destination, broker.settings.dead_letter_queue)


def hold(sub: Subscription, message_id: str, tx: Transaction) -> None:
    """An ACK inside a transaction: free the prefetch slots of what it covers now,
    apply it at COMMIT (ActiveMQ: a consumer with prefetch 1 acking in a transaction
    gets its next message before the COMMIT)."""
    ids = sub.covered(message_id)
    sub.held.update(ids)
    tx.held.append((sub, ids))
    sub.source.dispatch()


def release_held(tx: Transaction) -> None:
    """ABORT (or the connection's end) of a transaction with ACKs: what they covered
    stays with the consumer, awaiting acknowledgement under its ack id, as in
    ActiveMQ (its ``Stomp12Test`` acks the same messages right after ABORT). Only
    the prefetch slots its ACKs freed are taken again; a message the client never
    settles goes back when its subscription ends, like any other."""
    for sub, ids in tx.held:
        sub.held.difference_update(ids)
    tx.held.clear()


def check_commit(session: Session, tx: Transaction) -> None:
    """Raise BrokerError if any part of ``tx`` would fail; applies nothing.

    Each ACK/NACK must still name a message awaiting acknowledgement once the
    earlier ones of the transaction are applied (a cumulative ACK settles the
    messages before it too). Each SEND was checked when it arrived (``checked_send``
    depends on the frame alone) and is kept as its checked message."""
    settled: set[tuple[int, str]] = set()
    for _command, frame in tx.acks:
        sub, message_id = find_delivery(session, frame)
        if (id(sub), message_id) in settled:
            raise BrokerError(f"message {message_id!r} is acknowledged twice in "
                              "the transaction")
        settled.update((id(sub), mid) for mid in sub.covered(message_id))


def unsettle(broker: Broker, settled: list[Settled]) -> None:
    """The store refused a COMMIT: the messages its ACKs (and NACKs past the
    redelivery limit) settled in memory are not settled in the store. They go
    back to their destination, redelivered: an ACK's (they left the consumer when the
    COMMIT applied them), a NACK's as if the NACK had not come (so not to the
    dead-letter queue). Ack rows cannot be refused on their own (integer ids
    the master allocated): a SEND of the transaction was."""
    for command, sub, done in settled:
        acked = command == "ACK"
        if acked:
            broker.stats["acked"] -= len(done)
            broker.counters.add(sub.destination, Kind.DEQUEUED, -len(done))
        else:  # dead-lettered; a memory-only copy was routed at once: it stays so
            done = [d for d in done if d.message.persistent]
            broker.stats["dead_lettered"] -= len(done)
            broker.counters.add(sub.destination, Kind.DEAD_LETTERED, -len(done))
            broker.counters.add(dead_letter_queue(broker, sub.destination), Kind.ENQUEUED,
                                -len(done))
        if not done or (sub.closed and isinstance(sub.source, TopicSubscriptionSource)):
            continue  # nothing, or memory-only copies for a subscriber that is gone
        for d in done:
            redeliver_or_dead_letter(broker, sub.source, d, broker.writes.batch, acked,
                                     delayed=False)
        routing.dispatch_logged(sub.source)
