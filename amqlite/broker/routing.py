"""Routing: where a message goes once it may be seen (queues, topic subscribers).

A persistent message becomes visible to consumers only after its insert committed
(``route_committed``); a non-persistent one at once (``route_now``). A failure in
one source's dispatch never keeps a message from the other sources.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from amqlite.validation import destination_kind

if TYPE_CHECKING:
    from amqlite.broker.core import Broker
    from amqlite.broker.message import Message
    from amqlite.broker.session import Client
    from amqlite.broker.source import DurableSource, Source, TopicSubscriptionSource

log = logging.getLogger("amqlite.broker")


def dispatch_logged(source: Source) -> None:
    """``source.dispatch()`` where a failure must not stop the caller's loop over
    other sources, messages or RECEIPTs: logged, and the message stays queued."""
    try:
        source.dispatch()
    except Exception:
        log.exception("dispatch of %s failed", source.name)


def wants(source: Source, m: Message, producer: Client | None = None) -> bool:
    """Does a topic subscription take ``m``: its selector (if any) matches, and it is
    not ``activemq.noLocal`` with ``m`` from its own connection?"""
    if source.no_local and producer is not None and any(
            sub.conn is producer for sub in source.consumers):
        return False
    selector = source.selector
    return selector is None or selector.matches(m.headers, m)


def topic_subscribers(broker: Broker, topic: str) -> list[TopicSubscriptionSource]:
    """The non-durable subscribers of ``topic``: its own, and those of wildcard patterns
    that match it and whose login may read it (checked per concrete destination, so a
    pattern never delivers from a topic its login may not read, even one created after
    the SUBSCRIBE)."""
    own = broker.topics.get(topic)
    if not broker.topic_patterns:
        return own or []
    matched = [s for s in broker.topic_patterns.matching(topic)
               if broker.may_read(s.login, topic)]
    return [*own, *matched] if own else matched


def durables_for(broker: Broker, topic: str) -> list[DurableSource] | None:
    """The durable subscriptions a message to ``topic`` is stored for (see
    ``topic_subscribers``; a durable pattern is checked against its owner's login)."""
    own = broker.durables_by_topic.get(topic)
    if not broker.durable_patterns:
        return own
    matched = [d for d in broker.durable_patterns.matching(topic)
               if broker.may_read(d.owner, topic)]
    return [*own, *matched] if own else matched


def route_now(broker: Broker, m: Message, producer: Client | None = None) -> None:
    """A message with nothing to store: to its queue, or to the topic's subscribers."""
    if destination_kind(m.destination) == "queue":
        q = broker.queue(m.destination)
        q.add_nonpersistent(m, producer)
        q.dispatch()
    else:
        publish_memory(broker, m, producer)


def publish_memory(broker: Broker, m: Message, producer: Client | None = None) -> None:
    for source in topic_subscribers(broker, m.destination):
        if wants(source, m, producer):
            source.add_nonpersistent(m.copy(persistent=False))
            source.dispatch()
    for durable in durables_for(broker, m.destination) or ():
        # a non-persistent message reaches only online durable subscribers
        if durable.consumers and wants(durable, m, producer):
            durable.add_nonpersistent(m.copy(persistent=False), producer)
            durable.dispatch()


def route_committed(broker: Broker, m: Message, durables: list[DurableSource],
                    producer: Client | None = None) -> None:
    """Make a committed message visible; a failure in one source's dispatch does not
    keep it from the other sources (each has its copy already)."""
    if not durables:
        q = broker.queue(m.destination)
        q.append_committed(m)
        dispatch_logged(q)
        return
    for durable in durables:
        durable.append_committed(m.copy())
        dispatch_logged(durable)
    for source in topic_subscribers(broker, m.destination):
        if wants(source, m, producer):
            source.add_nonpersistent(m.copy(persistent=False))
            dispatch_logged(source)
