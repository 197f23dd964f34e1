"""What the management API reads from the node (``NodeView``): its broker and server as
they are now, stored depths, and the group from the registry."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from amqlite.management.reads import DestinationDepth, StoreReader
from amqlite.registry import (
    Member,
    RegistryError,
    current_master,
    read_members,
    registry_url,
)
from amqlite.validation import destination_kind
from store import StoreError

if TYPE_CHECKING:
    from amqlite.broker import Broker
    from amqlite.node import Node

log = logging.getLogger("amqlite.management")

#: How long the registry's view of the group is reused (s); it changes within ~1 s.
GROUP_CACHE_SECONDS = 1.0


class NodeView:
    """What the API reads from the node, in one place (the node changes its broker and
    server when it becomes master or demotes)."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.settings = node.settings
        self.reader = StoreReader(node.settings.store, node.settings.group)
        self.depths: dict[str, DestinationDepth] = {}
        #: Scheduled messages per destination (``StoreReader.scheduled_counts``).
        self.scheduled: dict[str, int] = {}
        self._group: list[Member] = []
        self._group_at = 0.0

    @property
    def broker(self) -> Broker | None:
        return self.node.broker

    @property
    def server(self) -> Any:
        return self.node.server

    @property
    def serving(self) -> bool:
        node, broker = self.node, self.node.broker
        return (node.role == "master" and broker is not None and not broker.paused
                and not node.lost.is_set())

    async def refresh_depths(self, name: str | None = None) -> None:
        """Stored depths and scheduled counts (cached a second). Read again now if the
        broker has a committed store row that the cache does not show yet (a destination
        created within the last second: ``name``'s, or with no ``name`` any), so that a
        route finds every destination the store holds, in memory or not, and a new one's
        depth is not shown as 0 from a read made before it existed."""
        broker = self.broker
        if broker is None:
            self.depths = {}
            return
        try:
            self.depths = await asyncio.to_thread(self.reader.depths)
            self.scheduled = await asyncio.to_thread(self.reader.scheduled_counts)
            names = broker.destination_rows if name is None else (name,)
            if any(n not in self.depths and n in broker.destination_rows
                   and n not in broker.unconfirmed_destinations for n in names):
                self.depths = await asyncio.to_thread(self.reader.depths, 0.0)
                self.scheduled = await asyncio.to_thread(self.reader.scheduled_counts, 0.0)
        except StoreError as e:
            log.warning("management: reading depths failed: %s", e)

    async def group(self) -> list[Member]:
        if time.monotonic() - self._group_at >= GROUP_CACHE_SECONDS:
            s = self.settings
            try:
                self._group = await asyncio.to_thread(read_members, registry_url(s), s.group)
            except RegistryError as e:
                log.debug("management: registry unreadable: %s", e)
            self._group_at = time.monotonic()
        return self._group

    async def master(self) -> dict[str, Any] | None:
        """The group's master as the registry sees it (``registry.current_master``) other
        than this node, or None."""
        m = current_master(m for m in await self.group() if m.name != self.settings.name)
        if m is None:
            return None
        return {"name": m.name, "http": m.http, "services": list(m.services), "epoch": m.epoch,
                "websocket": list(m.websocket)}

    def destination_rows(self, depths: dict[str, DestinationDepth]) -> list[dict[str, Any]]:
        """One row per destination: stored depth (cached) with live memory state."""
        broker = self.broker
        if broker is None:
            return []
        # destination_rows: a store row the cached depths (a second old) miss yet.
        names = set(depths) | set(broker.destination_rows) | set(broker.queues) \
            | set(broker.topics) | set(broker.durables_by_topic)
        return [self._row(broker, name, depths.get(name), self.scheduled.get(name, 0),
                          self.reader.delayed.get(name, 0)) for name in sorted(names)]

    def destination_row(self, name: str,
                        depths: dict[str, DestinationDepth]) -> dict[str, Any] | None:
        """``destination_rows``' row of ``name`` alone (None when unknown), without
        building every other destination's."""
        broker = self.broker
        if broker is None or not (name in depths or name in broker.destination_rows
                                  or name in broker.queues or name in broker.topics
                                  or name in broker.durables_by_topic):
            return None
        return self._row(broker, name, depths.get(name), self.scheduled.get(name, 0),
                         self.reader.delayed.get(name, 0))

    @staticmethod
    def _row(broker: Broker, name: str, d: DestinationDepth | None,
             scheduled: int = 0, delayed: int = 0) -> dict[str, Any]:
        kind = d.kind if d is not None else destination_kind(name)
        if kind == "queue":
            q = broker.queues.get(name)
            inflight = sum(len(s.inflight) for s in q.consumers) if q is not None else 0
            stored = d.depth if d is not None else 0  # delayed redeliveries included
            waiting = (max(0, stored - inflight - delayed)
                       + (q.nonpersistent if q is not None else 0))
            consumers = len(q.consumers) if q is not None else 0
        else:
            durables = broker.durables_by_topic.get(name, [])
            inflight = sum(len(s.inflight) for dur in durables for s in dur.consumers)
            # What the store owes its durable subscriptions (not only what is paged in:
            # after a takeover nothing is until a consumer comes), and memory-only ones.
            owed = d.pending if d is not None else 0
            waiting = max(0, owed - inflight) + sum(dur.nonpersistent for dur in durables)
            consumers = len(broker.topics.get(name, [])) + sum(
                len(dur.consumers) for dur in durables)
        return {
            "name": name, "kind": kind, "waiting": waiting, "in_flight": inflight,
            "consumers": consumers, "delivered": broker.delivered.get(name, 0),
            # enqueued, dequeued, expired, dead_lettered, moved, purged, overflow_dropped
            # (amqlite.broker.counters: kept in the store)
            **broker.counters.of(name),
            "scheduled": scheduled,  # stored, due later (amqlite.broker.scheduler)
            "redelivery_delayed": delayed,  # of them, NACKed under a redelivery delay
            "policy": policy_json(broker, name),  # amqlite.policy
        }


def policy_json(broker: Broker, name: str) -> dict[str, Any]:
    """The policy that applies to ``name``, with a one-line summary for tables."""
    policy = broker.policies.resolve(name)
    return {**policy.to_json(), "dead_letter_queue": policy.dead_letter_for(name),
            "summary": policy.summary(name)}
