"""Deleting idle queues (issue 21), ActiveMQ's ``gcInactiveDestinations``.

Some clients make a queue per session and never delete it, Spring's STOMP broker relay
among them. With ``gc_inactive_destinations`` set to a number of seconds (0, the
default, is off, as it is in ActiveMQ), a queue that has had no consumers, no messages
(in memory or in the store) and no SEND for that long is deleted the way an operator
deletes one (``Operations.delete_idle``: ``destinations.forget_destination``, then the
store's ``delete_destination``). It disappears from memory, the store, the listing and
the metrics. A later SEND or SUBSCRIBE creates it again; with ``[[authorization]]``
entries, doing so needs the right to create it.

The queues are looked at every quarter of the timeout (ActiveMQ looks every
``schedulePeriodForDestinationPurge``), so a queue goes between 1 and 1.25 timeouts
after it was last used. A consumer that comes and goes between two looks, with no message,
goes unseen: deleting an empty, unused queue loses nothing. Temporary destinations go
with their connection, and topics are not deleted here. A queue leaves memory with its
last consumer when nothing is in it (``Broker.queue_left``, issue 23), without this
setting; one with a store row keeps the row (and its id in ``destination_rows``) until
it is deleted here, so the stored queues out of memory are looked at too.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from amqlite.broker.operations import OperationError, Operations
from amqlite.validation import destination_kind, is_temporary
from store.api import StoreError

if TYPE_CHECKING:
    from amqlite.broker.core import Broker
    from amqlite.broker.source import Source

log = logging.getLogger("amqlite.broker")

#: Looks per timeout, so that a queue is deleted at most a quarter of the timeout late.
#: ActiveMQ's documented example ("Delete Inactive Destinations") looks every 10 s
#: (schedulePeriodForDestinationPurge) for a 30 s inactiveTimoutBeforeGC: three.
LOOKS_PER_TIMEOUT = 4
#: The shortest time between two looks. Each look walks every queue (about a
#: microsecond each), so even a tiny timeout leaves the loop ten looks a second.
MIN_LOOK_SECONDS = 0.1


@dataclass(slots=True)
class _Idle:
    """A queue seen idle: since when, and its totals then (a change means it was used)."""

    since: float  # time.monotonic()
    mark: tuple[int, int]  # (enqueued, dequeued)


def idle(q: Source) -> bool:
    """Nothing is in the queue, on its way into it (committing, paging) or taking from
    it, and no producer waits for room in it. What the store holds is asked apart."""
    return not (q.consumers or len(q) or q.pending_inserts or q.paging
                or q.blocked_producers)


def _mark(broker: Broker, name: str) -> tuple[int, int]:
    return broker.enqueued.get(name, 0), broker.dequeued.get(name, 0)


def due(broker: Broker, seen: dict[str, _Idle], timeout: float, now: float) -> list[str]:
    """One look: update ``seen`` (queues idle, since when) and return the queues idle
    for ``timeout`` seconds."""
    ready: list[str] = []
    for name, q in broker.queues.items():
        if is_temporary(name) or not idle(q):
            seen.pop(name, None)
            continue
        _look(broker, seen, name, timeout, now, ready)
    # Stored queues out of memory (Broker.queue_left) are idle: nothing is in them.
    for name in broker.destination_rows:
        if name not in broker.queues and destination_kind(name) == "queue":
            _look(broker, seen, name, timeout, now, ready)
    for name in [n for n in seen
                 if n not in broker.queues and n not in broker.destination_rows]:
        del seen[name]
    return ready


def _look(broker: Broker, seen: dict[str, _Idle], name: str, timeout: float, now: float,
          ready: list[str]) -> None:
    """``name`` is idle now: since when (a SEND or a delivery since restarts it)."""
    mark = _mark(broker, name)
    was = seen.get(name)
    if was is None or was.mark != mark:
        seen[name] = _Idle(now, mark)
    elif now - was.since >= timeout:
        ready.append(name)


async def collect(broker: Broker, timeout: float) -> None:
    """Delete the queues idle for ``timeout`` seconds, until cancelled (a task of the
    node while it is master)."""
    seen: dict[str, _Idle] = {}
    operations = Operations(broker, _NoReads())
    period = max(timeout / LOOKS_PER_TIMEOUT, MIN_LOOK_SECONDS)
    while True:
        await asyncio.sleep(period)
        if broker.paused:
            continue
        for name in due(broker, seen, timeout, time.monotonic()):
            await _delete(broker, operations, name, seen)


async def _delete(broker: Broker, operations: Operations, name: str,
                  seen: dict[str, _Idle]) -> None:
    """Delete ``name`` if the store holds nothing of it and nothing used it meanwhile."""
    q, was = broker.queues.get(name), seen.get(name)
    did = broker.destination_rows.get(name)
    if was is None or (q is None and did is None):
        return
    if did is not None and broker.committer is not None:
        # From here on what commits into the queue lands in memory, where the check
        # after the read sees it; the pager is told again if the store has some. (A
        # queue out of memory, ``Broker.dormant`` or left empty, is asked the same way:
        # what comes is made through Broker.queue, and the check after the read sees
        # it.)
        had_more = q is not None and q.store_has_more
        if q is not None:
            q.store_has_more = False
        committer = broker.committer
        try:  # scheduled messages count: paging does not see them, a delete would
            holds = await committer.call(committer.store.holds_messages, did)
        except StoreError as e:
            if q is not None:
                q.store_has_more = had_more
            log.warning("inactive queue %s: reading the store failed: %s", name, e)
            return
        if holds:  # messages nobody consumes (yet): look again a timeout later
            seen[name] = _Idle(time.monotonic(), was.mark)
            if q is not None:
                q.store_has_more = True
                q.dispatch()  # a consumer that came meanwhile pages them in
            return
    if (broker.paused or broker.queues.get(name) is not q
            or (q is not None and not idle(q)) or _mark(broker, name) != was.mark):
        return  # used meanwhile: the next look starts its time again
    try:
        await operations.delete_idle(name)
    except OperationError as e:
        log.warning("inactive queue %s: not deleted: %s", name, e)
        return
    seen.pop(name, None)
    log.info("deleted queue %s: no consumer, message or SEND for %.1f s "
             "(gc_inactive_destinations)", name, time.monotonic() - was.since)


class _NoReads:
    """The store reads ``Operations`` takes; ``delete_idle`` makes none."""

    def message(self, message_id: int) -> dict[str, Any] | None:
        raise NotImplementedError("the inactive-queue GC reads no message")

    def message_ids(self, destination_id: int, after_id: int, limit: int) -> list[int]:
        raise NotImplementedError("the inactive-queue GC reads no message")

    def full_rows(self, ids: list[int]) -> list[dict[str, Any]]:
        raise NotImplementedError("the inactive-queue GC reads no message")

    def scheduled(self, destination_id: int | None,
                  limit: int) -> tuple[list[dict[str, Any]], int]:
        raise NotImplementedError("the inactive-queue GC reads no message")
