"""Prometheus metrics, read from the broker's memory when scraped.

A custom collector walks the broker's destinations at scrape time, so the hot path pays
one dict increment per message (the per-destination totals in ``Broker``) and nothing
else. The stored depths come from one query for every destination, cached for a second
(``StoreReader.depths``); nothing queries the store per destination.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from amqlite.broker.counters import Kind

if TYPE_CHECKING:
    from amqlite.management.view import NodeView

#: Commit latency buckets (s): a SQLite group commit takes ~1-5 ms, a PostgreSQL one
#: over a LAN 1-20 ms; a second or more means the store is in trouble.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                   2.5, 5.0, 10.0)


class BrokerCollector(Collector):
    """Reads a ``NodeView`` (node, broker, cached depths) at every scrape."""

    def __init__(self, view: NodeView) -> None:
        self.view = view

    def collect(self) -> Iterator[Any]:
        view = self.view
        node = view.node
        master = GaugeMetricFamily("amqlite_node_master",
                                   "1 while this node is the master serving STOMP", labels=[])
        master.add_metric([], 1.0 if view.serving else 0.0)
        yield master
        epoch = GaugeMetricFamily("amqlite_group_epoch",
                                  "The group epoch this node holds as master (0: none)")
        broker = view.broker
        epoch.add_metric([], float(broker.epoch if broker is not None else 0))
        yield epoch
        takeovers = CounterMetricFamily("amqlite_takeovers",
                                        "Times this node became master")
        takeovers.add_metric([], float(node.takeovers))
        yield takeovers
        errors = CounterMetricFamily("amqlite_store_errors",
                                     "Store failures that made this node demote")
        errors.add_metric([], float(node.store_errors))
        yield errors
        server = view.server
        conns = GaugeMetricFamily("amqlite_connections", "Open STOMP connections")
        conns.add_metric([], float(len(server.connections) if server is not None else 0))
        yield conns
        if broker is None:
            return
        yield from self._destinations(broker)

    def _destinations(self, broker: Any) -> Iterator[Any]:
        depths = self.view.depths
        waiting = GaugeMetricFamily("amqlite_destination_messages",
                                    "Messages waiting for a consumer", labels=["destination"])
        inflight = GaugeMetricFamily("amqlite_destination_inflight_messages",
                                     "Messages delivered and not yet acknowledged",
                                     labels=["destination"])
        consumers = GaugeMetricFamily("amqlite_destination_consumers",
                                      "Subscriptions consuming from the destination",
                                      labels=["destination"])
        for row in self.view.destination_rows(depths):
            name = row["name"]
            waiting.add_metric([name], float(row["waiting"]))
            inflight.add_metric([name], float(row["in_flight"]))
            consumers.add_metric([name], float(row["consumers"]))
        yield waiting
        yield inflight
        yield consumers
        scheduled = GaugeMetricFamily("amqlite_scheduled_messages",
                                      "Scheduled messages stored for the destination, due "
                                      "later (AMQ_SCHEDULED_*)", labels=["destination"])
        for name, n in sorted(self.view.scheduled.items()):
            scheduled.add_metric([name], float(n))
        yield scheduled
        totals_of = broker.counters.totals
        for metric, doc, kind in (
            ("amqlite_messages_enqueued", "Messages sent, moved or dead-lettered to the "
             "destination", Kind.ENQUEUED),
            ("amqlite_messages_dequeued", "Messages acknowledged (or auto-acked) from it",
             Kind.DEQUEUED),
            ("amqlite_messages_expired", "Messages of it that expired", Kind.EXPIRED),
            ("amqlite_messages_dead_lettered", "Messages moved to the dead-letter queue",
             Kind.DEAD_LETTERED),
            ("amqlite_messages_moved", "Messages an operator moved out of it", Kind.MOVED),
            ("amqlite_messages_purged", "Messages an operator purged or deleted from it",
             Kind.PURGED),
            ("amqlite_messages_overflow_dropped", "Messages its policy's drop-head dropped",
             Kind.OVERFLOW_DROPPED),
        ):
            family = CounterMetricFamily(metric, doc + " (kept in the store: it survives a "
                                         "takeover)", labels=["destination"])
            for name, n in list(totals_of[kind].items()):
                family.add_metric([name], float(n))
            yield family


class Metrics:
    """The node's metric registry: the collector plus the commit latency histograms."""

    def __init__(self, view: NodeView) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(BrokerCollector(view))
        self.commit_seconds = Histogram(
            "amqlite_commit_duration_seconds", "Group commit duration (one fenced batch)",
            buckets=LATENCY_BUCKETS, registry=self.registry)
        self.receipt_seconds = Histogram(
            "amqlite_receipt_latency_seconds",
            "From a batch's first staged write to its commit: the longest a RECEIPT in it "
            "waited", buckets=LATENCY_BUCKETS, registry=self.registry)

    def observer(self) -> Callable[[float, float], None]:
        commit, receipt = self.commit_seconds.observe, self.receipt_seconds.observe

        def observe(commit_s: float, receipt_s: float) -> None:
            commit(commit_s)
            receipt(receipt_s)

        return observe
