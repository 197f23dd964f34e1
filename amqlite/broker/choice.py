"""Which consumer of a queue gets a message, when it is not plain round robin.

ActiveMQ's consumer choice, which STOMP clients reach through headers:

* a **selector** (``selective``): only consumers whose selector matches;
* **message groups** (``JMSXGroupID``): a group is pinned to one consumer until that
  consumer leaves, then it moves; the first message a consumer gets of a group says
  so (``JMSXGroupFirstForConsumer: true``); ``JMSXGroupSeq: -1`` closes the group;
* **exclusive** consumers (``activemq.exclusive: true``): while one is subscribed, it
  alone receives (the highest priority, then the earliest);
* **consumer priority** (``activemq.priority``, 0-127): a consumer gets messages only
  while no consumer of a higher priority has credit for them.

``dispatch`` walks the waiting messages in queue order (priority, then id) and gives
each to the consumer ``pick`` names; a message nobody may take now waits where it is
and never blocks the ones behind it. Group ownership lives in memory: after a
takeover every delivery of the old master was returned, so groups are pinned afresh
as messages flow, and a group is never with two consumers at once.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

from amqlite.broker import selective
from amqlite.broker.message import Message, now_ms
from amqlite.wire import AMQ_GROUP_ID, AMQ_GROUP_SEQ

if TYPE_CHECKING:
    from amqlite.broker.source import Source
    from amqlite.broker.subscription import Subscription

#: ``JMSXGroupSeq`` value that closes a group (ActiveMQ): the next message of the
#: group may go to any consumer.
GROUP_CLOSE_SEQ = "-1"


def dispatch(source: Source) -> None:
    """``Source.dispatch`` for a picky queue."""
    now = now_ms()
    heap = source.heap
    consumers = source.consumers
    skipped: list[tuple[int, int, Message]] = []
    while heap and any(sub.has_credit() for sub in consumers):
        entry = heapq.heappop(heap)
        message = entry[2]
        if message.expired(now):
            source.take(entry)
            source.broker.expire(source, message)
            continue
        sub, first = pick(source, message)
        if sub is None:
            skipped.append(entry)  # nobody who may take it has room: it waits
            continue
        source.take(entry)
        sub.deliver(message, group_first=first)
    for entry in skipped:
        heapq.heappush(heap, entry)
    source.maybe_page()
    if source.selective:
        selective.scan_if_starving(source)


def pick(source: Source, message: Message) -> tuple[Subscription | None, bool]:
    """The consumer ``message`` goes to now (None: it waits), and whether it is the
    first of its group for that consumer."""
    group = message.headers.get(AMQ_GROUP_ID) if source.groups_seen else None
    if group is not None:
        owner = source.groups.get(group)
        if owner is not None:
            if not (owner.has_credit() and selective.matches(owner, message)):
                return None, False  # the group waits for its consumer
            if message.headers.get(AMQ_GROUP_SEQ) == GROUP_CLOSE_SEQ:
                del source.groups[group]
            return owner, False
    sub = next_in_turn(source, message)
    if sub is None or group is None:
        return sub, False
    if message.headers.get(AMQ_GROUP_SEQ) != GROUP_CLOSE_SEQ:
        source.groups[group] = sub
    return sub, True


def next_in_turn(source: Source, message: Message) -> Subscription | None:
    """Round robin among the consumers that may take ``message``: the exclusive one
    alone if there is one, else the highest priority with credit that matches."""
    consumers = source.consumers  # kept in priority order (Source.add_consumer)
    if source.exclusive:
        sub = next(s for s in consumers if s.exclusive)
        ok = sub.has_credit() and selective.matches(sub, message)
        return sub if ok else None
    n = len(consumers)
    start = source.turn
    best: Subscription | None = None
    best_at = 0
    for i in range(n):
        at = (start + i) % n
        sub = consumers[at]
        if best is not None and sub.priority <= best.priority:
            continue
        if sub.has_credit() and selective.matches(sub, message):
            best, best_at = sub, at
    if best is not None:
        source.turn = (best_at + 1) % n
    return best


def consumer_left(source: Source, sub: Subscription) -> None:
    """Its groups move: each is pinned again by its next message."""
    if source.groups:
        for group in [g for g, owner in source.groups.items() if owner is sub]:
            del source.groups[group]
