"""Delayed redelivery: a NACKed message waits ``redelivery_delay`` (with back-off) before
it is delivered again (``amqlite.policy``; ActiveMQ's broker-side ``RedeliveryPlugin``,
which also hands the message to its scheduler).

A queue's persistent message waits in the store, not in a timer: the NACK's batch takes
it out of flight and gives its row a due time (``Batch.delays``: ``deliver_at`` and a
plan that says "redelivery"), so it is a scheduled message like an
``AMQ_SCHEDULED_DELAY`` one, invisible to the pager. The scheduler's one timer
(``amqlite.broker.scheduler``) brings it back when due (``Batch.redeliveries``: the same
row, its delivery count kept), on this master or, after a takeover, on the next: a
delay survives a SIGKILL. Everything else (non-persistent messages, a durable topic
subscription's, whose row other subscriptions share) waits in this node's memory; a
takeover redelivers those at once.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from amqlite.broker import limits, routing
from amqlite.broker.message import Message, now_ms
from amqlite.broker.source import Source

if TYPE_CHECKING:
    from amqlite.broker.core import Broker
    from amqlite.broker.subscription import Delivery
    from store.api import ScheduledRow

#: The plan key that marks a scheduled row as a delayed redelivery (its value: the
#: deliveries so far), not an ``AMQ_SCHEDULED_*`` message.
REDELIVERY_KEY = "redelivery"


def plan_json(deliveries: int, delay_ms: int) -> str:
    return json.dumps({REDELIVERY_KEY: deliveries, "delay": delay_ms})


def is_redelivery(schedule: str | None) -> bool:
    """Is a scheduled row's plan a delayed redelivery's?"""
    return schedule is not None and f'"{REDELIVERY_KEY}"' in schedule


def delay(broker: Broker, source: Source, d: Delivery, delay_ms: int) -> None:
    """Take a NACKed delivery out of flight and give it back to ``source`` in
    ``delay_ms`` (module docstring for where it waits)."""
    m = d.message
    due = now_ms() + delay_ms
    if d.ref is not None and d.ref[0] is None and m.persistent:  # a queue's stored row
        limits.forget(broker, source, m.id)  # not waiting until it is due again
        scheduler = broker.scheduler

        def stored(ok: bool) -> None:
            if ok:
                scheduler.stored(due)

        broker.writes.stage(stored).delays.append(
            (m.id, due, plan_json(m.delivery_count, delay_ms)))
        return
    if d.ref is not None:
        broker.writes.stage_releases([d.ref])
    broker.loop.call_later(delay_ms / 1000, _back, broker, source, m)


def _back(broker: Broker, source: Source, m: Message) -> None:
    if type(source) is Source:  # a queue: the one by that name now (it may have left
        source = broker.queue(source.name)  # memory while empty: ``Broker.queue_left``)
    source.push(m)
    routing.dispatch_logged(source)


def due(broker: Broker, row: ScheduledRow) -> None:
    """A delayed redelivery's row is deliverable again: into its queue's memory, where
    the pager will not bring it a second time (``ahead``). Called in the callback of the
    commit that made it deliverable (``Scheduler._route``), before any page read after
    that commit is handled (a later call could find it paged in already: delivered
    twice)."""
    if row.destination is None or row.kind != "queue":
        return
    m = Message(row.id, row.destination, row.message_id, row.headers, row.body, row.priority,
                row.expires_at, True, row.delivery_count, row.enqueued_at, row.producer_id,
                row.producer_seq)
    q = broker.queue(row.destination)
    if not q.stored:
        return  # a temporary queue that is gone
    if m.id > q.cursor:
        q.ahead.add(m.id)  # the pager steps over it (it is in memory now)
    q.push(m)
    routing.dispatch_logged(q)
