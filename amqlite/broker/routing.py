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
    from amqlite.broker.source import DurableSource, Source

log = logging.getLogger("amqlite.broker")


def dispatch_logged(source: Source) -> None:
    """``source.dispatch()`` where a failure must not stop the caller's loop over
    other sources, messages or RECEIPTs: logged, and the message stays queued."""
    try:
        source.dispatch()
    except Exception:
        log.exception("dispatch of %s failed", source.name)


def route_now(broker: Broker, m: Message, producer: Client | None = None) -> None:
    """A message with nothing to store: to its queue, or to the topic's subscribers."""
    if destination_kind(m.destination) == "queue":
        q = broker.queue(m.destination)
        q.add_nonpersistent(m, producer)
        q.dispatch()
    else:
        publish_memory(broker, m, producer)


def publish_memory(broker: Broker, m: Message, producer: Client | None = None) -> None:
    for source in broker.topics.get(m.destination, ()):
        source.add_nonpersistent(m.copy(persistent=False))
        source.dispatch()
    for durable in broker.durables_by_topic.get(m.destination, ()):
        # a non-persistent message reaches only online durable subscribers
        if durable.consumers:
            durable.add_nonpersistent(m.copy(persistent=False), producer)
            durable.dispatch()


def route_committed(broker: Broker, m: Message, durables: list[DurableSource]) -> None:
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
    for source in broker.topics.get(m.destination, ()):
        source.add_nonpersistent(m.copy(persistent=False))
        dispatch_logged(source)
