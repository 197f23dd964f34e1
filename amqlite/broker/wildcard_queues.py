"""Wildcard queue subscriptions: one SUBSCRIBE to ``/queue/orders.*`` consumes from
every queue the pattern matches, those that exist and those created later.

A ``QueuePattern`` holds one child ``Subscription`` per matching queue, all under the
SUBSCRIBE's id (the MESSAGE's ``subscription`` header) with their own ack keys, so an
ACK finds its queue as for any subscription. Each child has the SUBSCRIBE's ack mode,
prefetch (per queue, as ActiveMQ's composite consumers), selector and priority. A
queue joins only if the login may read it (``Broker.may_read``), checked per concrete
queue; a pattern never creates a queue.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from amqlite.broker.subscription import Subscription, close_subscription

if TYPE_CHECKING:
    from amqlite.broker.core import Broker
    from amqlite.broker.selector import Selector
    from amqlite.broker.session import Session
    from amqlite.wildcard import Pattern


@dataclass(eq=False)
class QueuePattern:
    """One wildcard SUBSCRIBE on queues, and its subscription on each matching queue."""

    session: Session
    id: str
    pattern: Pattern
    ack_mode: str
    prefetch: int
    selector: Selector | None
    priority: int
    exclusive: bool
    children: dict[str, Subscription] = field(default_factory=dict)  # by queue name


def subscribe(broker: Broker, qp: QueuePattern) -> None:
    """Register the pattern and join every queue it matches now."""
    qp.session.wildcards[qp.id] = qp
    broker.queue_patterns.add(qp.pattern, qp)
    # Stored queues not in memory yet (``Broker.dormant``) may hold messages: joined
    # (made in memory) too. One that left memory empty joins when it is used again.
    for name in [*broker.queues, *broker.dormant]:
        if qp.pattern.matches(name):
            join(broker, qp, name)


def join(broker: Broker, qp: QueuePattern, name: str) -> None:
    """Consume from queue ``name`` too, if the login may read it."""
    session = qp.session
    if name in qp.children or not broker.may_read(session.conn.login, name):
        return
    source = broker.queue(name)
    child = Subscription(session, qp.id, next(session.keys), name, qp.ack_mode,
                         qp.prefetch, source, qp.selector, qp.priority, qp.exclusive)
    qp.children[name] = child
    session.by_key[child.key] = child
    source.add_consumer(child)


def queue_created(broker: Broker, name: str) -> None:
    """A queue appeared in memory: the patterns that match it consume from it."""
    for qp in broker.queue_patterns.matching(name):
        join(broker, qp, name)


def close(broker: Broker, qp: QueuePattern) -> None:
    """UNSUBSCRIBE or the connection's end: each queue gets back what was unacked."""
    broker.queue_patterns.remove(qp.pattern, qp)
    qp.session.wildcards.pop(qp.id, None)
    for child in list(qp.children.values()):
        close_subscription(broker, qp.session, child)
    qp.children.clear()
