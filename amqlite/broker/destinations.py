"""Destinations: their store rows, durable subscriptions, and deleting one.

A destination's row is staged with the first write that needs it and carried by
every write until a batch that held it committed (the unit that staged it first
may be refused by the store). Topics leave no row unless a durable subscription
or a persistent message needs one.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from amqlite.broker import receipts
from amqlite.broker.source import DurableSource
from amqlite.validation import BrokerError, destination_kind
from amqlite.wildcard import is_wildcard
from store.api import Batch, BatchResult, DestinationRow, SubscriptionRow
from store.write_buffer import WriteUnit

if TYPE_CHECKING:
    from amqlite.broker.core import Broker
    from amqlite.broker.selector import Selector
    from amqlite.broker.session import Client

log = logging.getLogger("amqlite.broker")


def destination_id(broker: Broker, name: str, batch: Batch) -> int:
    """The store id of a destination, staging its row in ``batch`` until a
    batch that carried it committed (``destinations_committed``)."""
    did = broker.destination_rows.get(name)
    row: DestinationRow | None
    if did is None:
        row = DestinationRow(next(broker.destination_ids), name, destination_kind(name))
        did = row.id
        broker.destination_rows[name] = did
        broker.destination_names[did] = name
        broker.unconfirmed_destinations[name] = row
        batch.destinations.append(row)
        if name in broker.queues:
            broker.queues[name].store_id = did
    elif broker.unconfirmed_destinations:
        row = broker.unconfirmed_destinations.get(name)
        # Each unit carries the row (the one that staged it first may be
        # refused); outside a unit, carry it anyway. The store inserts it once.
        if row is not None and not broker.writes.in_current_unit(row):
            batch.destinations.append(row)
    return did


def destinations_committed(broker: Broker, rows: list[DestinationRow]) -> None:
    for row in rows:
        if broker.unconfirmed_destinations.get(row.name) is row:
            del broker.unconfirmed_destinations[row.name]


# -- durable subscriptions -------------------------------------------------------------
def durable(
    broker: Broker, client_id: str, name: str, topic: str, login: str | None,
    selector: Selector | None = None,
) -> tuple[DurableSource, WriteUnit[Client] | None, receipts.OnResult | None]:
    """The durable subscription ``(client_id, name)`` on ``topic``, made if new: then
    also its unit (the SUBSCRIBE's RECEIPT waits for it) and what to do with the
    store's answer."""
    found = broker.durables.get((client_id, name))
    if found is not None:
        check_owner(broker, found, login)
    if found is not None and (found.topic != topic
                              or _text(found.selector) != _text(selector)):
        # ActiveMQ/JMS: re-subscribing a durable name to another topic or with another
        # selector replaces it
        remove_durable(broker, found)
        found = None
    if found is not None:
        return found, None, None
    # The client's data (its client-id, the name, the topic): a unit.
    writes = broker.writes
    batch = writes.batch
    unit = writes.begin_unit(broker.clients_by_id.get(client_id))
    did = destination_id(broker, topic, batch)
    sid = next(broker.subscription_ids)
    owner = login if broker.authenticated else None
    batch.subscriptions.append(SubscriptionRow(sid, client_id, name, did, _text(selector),
                                               owner=owner))
    writes.end_unit(unit)
    new = DurableSource(broker, topic, sid, client_id, name, topic, owner, selector)
    new.store_has_more = False
    add_durable(broker, new)

    def created(result: BatchResult | None) -> None:
        # Never stored: forget it, and remove what messages staged
        # meanwhile stored for it (pending rows of no subscription).
        if (result is None and unit.rejected is not None
                and broker.durables.get((client_id, name)) is new):
            remove_durable(broker, new)

    return new, unit, created


def _text(selector: Selector | None) -> str | None:
    return None if selector is None else selector.text


def check_owner(broker: Broker, durable: DurableSource, login: str | None) -> None:
    """BrokerError (nothing done) unless ``login`` may reattach, replace or remove
    ``durable``: its owner may; without authentication anyone may (as before owners
    were stored). An ownerless one (stored before, or made without authentication)
    becomes the property of the first login that uses it, in the store too."""
    if not broker.authenticated or login is None or durable.owner == login:
        return
    if durable.owner is not None:
        log.warning("durable subscription %r of client-id %r: login %r refused "
                    "(it belongs to another login)", durable.sub_name, durable.client_id,
                    login)
        raise BrokerError(f"durable subscription {durable.sub_name!r} of client-id "
                          f"{durable.client_id!r} belongs to another login")
    durable.owner = login
    if durable.store_id is not None:
        broker.writes.stage().claimed_subscriptions.append((durable.store_id, login))
    log.warning("durable subscription %r of client-id %r had no owner: login %r owns it "
                "now", durable.sub_name, durable.client_id, login)


def add_durable(broker: Broker, durable: DurableSource) -> None:
    broker.durables[(durable.client_id, durable.sub_name)] = durable
    broker.durables_by_topic.setdefault(durable.topic, []).append(durable)
    if is_wildcard(durable.topic):
        durable.pattern = broker.durable_patterns.add(durable.topic, durable)


def remove_durable(broker: Broker, durable: DurableSource) -> None:
    broker.durables.pop((durable.client_id, durable.sub_name), None)
    peers = broker.durables_by_topic.get(durable.topic, [])
    if durable in peers:
        peers.remove(durable)
        if not peers:
            del broker.durables_by_topic[durable.topic]
    if durable.pattern is not None:
        broker.durable_patterns.remove(durable.pattern, durable)
    if durable.store_id is not None:
        broker.writes.stage().removed_subscriptions.append(durable.store_id)
    durable.discard()


# -- deleting a destination (the operator API) -----------------------------------------
@dataclass
class ForgottenDestination:
    """A destination ``forget_destination`` dropped from memory, for the store's
    delete and ``settle_forgotten``."""

    name: str
    store_id: int | None  # its row; None: it was never stored
    #: The first message id allocated after the cut: lower ids were sent to the old row.
    cut: int
    #: Non-persistent messages dropped from memory (they had no row to delete).
    memory_only: int = 0
    durables: list[DurableSource] = field(default_factory=list)


def forget_destination(broker: Broker, name: str) -> ForgottenDestination:
    """Drop a destination (with no consumers) from memory and hand the store a
    clean cut: everything staged so far is submitted now, so the store's delete
    (queued right after by the caller) comes after every write that names the old
    row, and every write staged from now on names a new row (a SEND creates the
    destination again, as in ActiveMQ). Messages still committing into the old row
    are dropped by ``settle_forgotten`` once they have landed in memory."""
    gone = ForgottenDestination(name, broker.destination_rows.pop(name, None),
                                next(broker.ids))
    if gone.store_id is not None:
        broker.destination_names.pop(gone.store_id, None)
    broker.unconfirmed_destinations.pop(name, None)
    broker.forget_totals(name)
    broker.known_destinations.discard(name)
    broker.dormant.discard(name)  # its rows go with the store's delete
    q = broker.queues.get(name)
    if q is not None:
        q.store_id = None  # a new row is allocated by the next write that needs one
        q.store_has_more = False
        gone.memory_only = sum(1 for m in q.drop(lambda m: True) if not m.persistent)
    if not broker.topics.get(name):  # its subscribers left (with some: refused before)
        broker.topics.pop(name, None)
    gone.durables = broker.durables_by_topic.pop(name, [])
    for d in gone.durables:
        broker.durables.pop((d.client_id, d.sub_name), None)
        d.discard()  # its row goes with the destination's, in the same transaction
    broker.writes.flush()
    return gone


def settle_forgotten(broker: Broker, gone: ForgottenDestination) -> None:
    """After the store's delete: every commit submitted before it has called back,
    so what those routed into memory (ids below the cut) is dropped, and a queue
    nobody uses again leaves memory, the listing and the metrics."""
    q = broker.queues.get(gone.name)
    if q is not None:
        q.drop(lambda m: m.id < gone.cut)
        if (not len(q) and not q.consumers and not q.pending_inserts
                and gone.name not in broker.destination_rows):
            del broker.queues[gone.name]
    for d in gone.durables:
        d.discard()
