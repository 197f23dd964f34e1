"""Selectors on a queue: a message goes to a consumer whose selector it matches.

``choice.dispatch`` walks the waiting messages in queue order and gives each to a
consumer that matches it; a message no consumer can take now stays where it is and
never blocks the ones behind it (ActiveMQ's behaviour). A selective consumer that
still has credit after the walk found nothing
in memory; while the store holds more than memory, it scans the store past the
pager's cursor with its selector (``scan``): the simple terms (equality, ``IN``,
ranges, ``IS NULL`` on a header; ranges on priority and times) are checked by the
database (``store.api.PageFilter``), the rest here, so a consumer whose one match
sits behind 100,000 others gets it without paging them in.

Topic subscriptions filter when a message is routed to them (``routing``), not here.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from amqlite.broker.message import Message
from amqlite.broker.selector import SelectorError, parse_selector
from amqlite.validation import BrokerError

if TYPE_CHECKING:
    from amqlite.broker.selector import Selector
    from amqlite.broker.source import Source
    from amqlite.broker.subscription import Subscription
    from store.api import PageFilter, StoredMessage

log = logging.getLogger("amqlite.broker")

#: Rows one scan reads: enough to fill a consumer's usual prefetch in a few scans,
#: few enough that a scan of a deep queue is one short query.
SCAN_PAGE = 200
#: The SUBSCRIBE header (ActiveMQ's and RabbitMQ's name).
SELECTOR_HEADER = "selector"


def selector_of(headers: dict[str, str]) -> Selector | None:
    """A SUBSCRIBE's selector, or None (no header, or a blank one: ActiveMQ's "no
    selector"); BrokerError naming the position when it does not parse."""
    text = headers.get(SELECTOR_HEADER)
    if text is None or not text.strip():
        return None
    try:
        return parse_selector(text)
    except SelectorError as e:
        raise BrokerError(f"selector {text[:60]!r}: {e}") from None


def stored_selector(text: str | None, name: str) -> Selector | None:
    """A durable subscription's selector as the store kept it. One this version cannot
    parse (written by another) is logged and left out rather than stop activation."""
    if text is None:
        return None
    try:
        return parse_selector(text)
    except SelectorError as e:
        log.error("durable subscription %r: stored selector %r does not parse (%s): it "
                  "receives every message until re-subscribed", name, text[:60], e)
        return None


def matches(sub: Subscription, message: Message) -> bool:
    selector = sub.selector
    return selector is None or selector.matches(message.headers, message)


def page_filter(selector: Selector) -> PageFilter:
    """The terms of ``selector`` the store can check (none: every row is a candidate)."""
    found = selector.sql_filter()
    if found is None:
        return ()
    return tuple((t.source, t.field, t.op, t.value) for t in found.terms)


def scan_if_starving(source: Source) -> None:
    """After a dispatch walk: a selective consumer that still has credit found nothing
    in memory; while the store holds more, it scans the store with its selector."""
    if source.store_has_more and source.store_id is not None:
        for sub in source.consumers:
            if (sub.selector is not None and not sub.scan_done and not sub.scanning
                    and sub.has_credit()):
                scan(source, sub)


def store_grew(source: Source) -> None:
    """A committed message stayed in the store only: every selective consumer may
    find a match there again."""
    for sub in source.consumers:
        sub.scan_done = False


def scan(source: Source, sub: Subscription) -> None:
    """Read up to SCAN_PAGE rows past ``sub``'s last scan that its selector may match,
    and keep the ones it does (``source.ahead``)."""
    broker = source.broker
    assert broker.committer is not None and source.store_id is not None
    assert sub.selector is not None
    after = max(source.cursor, sub.scan_after)
    sub.scanning = True
    future = asyncio.ensure_future(broker.committer.call(
        broker.committer.store.load_page_matching, source.store_id, after, SCAN_PAGE,
        page_filter(sub.selector)))

    def loaded(f: asyncio.Future[list[StoredMessage]]) -> None:
        sub.scanning = False
        if f.cancelled() or f.exception() is not None:
            log.error("selective scan of %s failed: %s", source.name,
                      None if f.cancelled() else f.exception())
            return
        rows = f.result()
        if len(rows) < SCAN_PAGE:
            sub.scan_done = True
        for row in rows:
            sub.scan_after = max(sub.scan_after, row.id)
            if row.id <= source.cursor or row.id in source.ahead:
                continue  # in memory, in flight, or the pager has it
            message = Message.from_row(row, source.name)
            if matches(sub, message):
                source.ahead.add(row.id)
                source.push(message)
        if not sub.closed:
            source.dispatch()

    future.add_done_callback(loaded)
