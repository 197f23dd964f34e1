"""SUBSCRIBE and UNSUBSCRIBE: which source a subscription takes from, and its end."""

from __future__ import annotations

from typing import TYPE_CHECKING

from amqlite.broker import destinations, receipts, selective, wildcard_queues
from amqlite.broker.source import Source, TopicSubscriptionSource
from amqlite.broker.subscription import Subscription, close_subscription
from amqlite.codec import Frame, parse_uint
from amqlite.validation import BrokerError, check_destination, check_subscribe
from amqlite.wildcard import WildcardError, compile_pattern, is_wildcard
from amqlite.wire import (
    ACK_AUTO,
    ACK_MODES,
    AMQ_CONSUMER_PRIORITY,
    AMQ_EXCLUSIVE,
    AMQ_NO_LOCAL,
)
from store.write_buffer import WriteUnit

if TYPE_CHECKING:
    from amqlite.broker.core import Broker
    from amqlite.broker.session import Client, Session

#: The SUBSCRIBE/UNSUBSCRIBE headers naming a durable topic subscription: ActiveMQ's,
#: and the one RabbitMQ and the STOMP world also use.
DURABLE_NAME_HEADERS = ("activemq.subscriptionName", "durable-subscription-name")


#: ``activemq.priority`` is a Java byte in ActiveMQ; consumers use 0 (the default) to
#: 127 in practice, and a negative priority means nothing there.
MAX_CONSUMER_PRIORITY = 127


def consumer_options(headers: dict[str, str]) -> tuple[int, bool, bool]:
    """``(priority, exclusive, no_local)`` of a SUBSCRIBE. The flags are true only for
    ``true`` in any case, as ActiveMQ's Boolean.parseBoolean reads them; a priority
    that is not an integer in 0..127 is an ERROR."""
    text = headers.get(AMQ_CONSUMER_PRIORITY)
    priority = 0
    if text is not None:
        value = parse_uint(text, MAX_CONSUMER_PRIORITY)
        if value is None:
            raise BrokerError(f"{AMQ_CONSUMER_PRIORITY} {text[:20]!r}: must be an "
                              f"integer in 0..{MAX_CONSUMER_PRIORITY}")
        priority = value
    exclusive = headers.get(AMQ_EXCLUSIVE, "").lower() == "true"
    no_local = headers.get(AMQ_NO_LOCAL, "").lower() == "true"
    return priority, exclusive, no_local


def durable_name(headers: dict[str, str]) -> str | None:
    return headers.get(DURABLE_NAME_HEADERS[0]) or headers.get(DURABLE_NAME_HEADERS[1])


def subscribe(broker: Broker, session: Session, frame: Frame) -> None:
    """Attach a new subscription to its source; the RECEIPT waits for a new durable
    subscription's row (``receipts.answer``)."""
    h = frame.headers
    destination = h["destination"]
    kind = check_destination(destination)
    pattern = None
    if ("*" in destination or ">" in destination) and is_wildcard(destination):
        try:
            pattern = compile_pattern(destination)
        except WildcardError as e:
            raise BrokerError(str(e)) from None
    prefetch = check_subscribe(h, broker.settings.default_prefetch)
    sub_id = h.get("id") or destination  # STOMP 1.0 may omit id
    if sub_id in session.subscriptions or sub_id in session.wildcards:
        raise BrokerError(f"subscription id {sub_id!r} already in use")
    ack_mode = h.get("ack", ACK_AUTO)
    if ack_mode not in ACK_MODES:
        raise BrokerError(f"ack mode {ack_mode!r}: use one of {', '.join(ACK_MODES)}")
    name = durable_name(h)
    selector = selective.selector_of(h)
    priority, exclusive, no_local = consumer_options(h)
    if pattern is not None and kind == "queue":
        wildcard_queues.subscribe(broker, wildcard_queues.QueuePattern(
            session, sub_id, pattern, ack_mode, prefetch, selector, priority, exclusive))
        receipts.answer(broker, session, h.get("receipt"))
        return
    source: Source
    unit: WriteUnit[Client] | None = None
    on_result: receipts.OnResult | None = None
    if kind == "queue":
        source = broker.queue(destination)
    elif name:
        client_id = session.conn.client_id
        if not client_id:
            raise BrokerError("a durable subscription needs client-id on CONNECT")
        source, unit, on_result = destinations.durable(broker, client_id, name, destination,
                                                       session.conn.login, selector)
        if source.consumers:
            raise BrokerError(f"durable subscription {name!r} is already active")
    else:
        topic = TopicSubscriptionSource(broker, destination, session.conn.login)
        topic.selector = selector
        if pattern is None:
            broker.topics.setdefault(destination, []).append(topic)
        else:
            topic.pattern = broker.topic_patterns.add(pattern, topic)
        source = topic
    if kind == "topic":
        source.no_local = no_local
    sub = Subscription(session, sub_id, next(session.keys), destination, ack_mode,
                       prefetch, source, selector, priority, exclusive)
    session.subscriptions[sub_id] = sub
    session.by_key[sub.key] = sub
    source.add_consumer(sub)
    receipts.answer(broker, session, h.get("receipt"), unit, on_result)


def unsubscribe(broker: Broker, session: Session, frame: Frame) -> None:
    h = frame.headers
    sub_id = h.get("id") or h.get("destination")
    sub = session.subscriptions.get(sub_id or "")
    name = durable_name(h)
    durable = None
    if name and session.conn.client_id:
        durable = broker.durables.get((session.conn.client_id, name))
        if durable is not None:
            destinations.check_owner(broker, durable, session.conn.login)  # before changes
    qp = session.wildcards.get(sub_id or "") if sub is None else None
    if sub is not None:
        close_subscription(broker, session, sub)
    elif qp is not None:
        wildcard_queues.close(broker, qp)
    elif not name:
        raise BrokerError(f"no subscription {sub_id!r}")
    if durable is not None:
        destinations.remove_durable(broker, durable)
    receipts.answer(broker, session, h.get("receipt"))
