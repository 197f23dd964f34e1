"""The console's charts: a sampler in the node that keeps the last minutes of the
broker's figures in fixed-size rings (``GET /api/v1/rates``).

Every ``SAMPLE_SECONDS`` the sampler reads what the broker already counts in memory
(per-destination totals of messages enqueued, delivered and acknowledged; consumers,
in-flight deliveries, the memory budget, connections, producers paused) and the stored
depths from the one query over every destination that ``/metrics`` shares
(``StoreReader.depths``, cached for a second): nothing is queried per destination. Commit
latency comes from the write buffer's observer (one call per committed batch).

Memory is bounded: ``SAMPLES`` values per series in ``array('f')`` rings (4 bytes each),
node-wide series plus ``DESTINATION_SERIES`` for at most ``MAX_CHARTED_DESTINATIONS``
destinations (about 9 MB at the cap, measured with full rings); a destination past the
cap is counted in the node's totals and not charted. History starts when the node
becomes master (the counters are "since this node became master", like ``/metrics``);
a demotion clears it.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import math
import time
from array import array
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from store import StoreError

if TYPE_CHECKING:
    from amqlite.broker import Broker
    from amqlite.management.reads import DestinationDepth
    from amqlite.management.view import NodeView

log = logging.getLogger("amqlite.management")

#: One sample every 2 s: RabbitMQ's management plugin samples every 5 s by default
#: (``collect_statistics_interval``); 2 s makes a burst visible and costs one depth
#: query and one walk of the destinations per sample.
SAMPLE_SECONDS = 2.0
#: Ten minutes of history: what RabbitMQ's management plugin keeps at its finest
#: resolution (``sample_retention_policies``' first tier: 605 s at 5 s).
HISTORY_SECONDS = 600.0
SAMPLES = int(HISTORY_SECONDS / SAMPLE_SECONDS)
#: Destinations charted at most: 6 series x 300 samples x 4 bytes = 7.2 KB of rings each
#: (9 MB measured at the cap with full rings, the last samples' dicts included). Past
#: it a new destination is counted in the node's totals only, until a charted one goes.
MAX_CHARTED_DESTINATIONS = 1000
#: A depth read slower than this (s) is skipped: the sample keeps the last depths
#: rather than falling behind (a store in trouble shows in the commit latency).
DEPTH_READ_TIMEOUT = 1.5


class Series(enum.StrEnum):
    """What is charted per destination (and summed for the node)."""

    ENQUEUED = "enqueued"  # messages sent to it, per second
    DELIVERED = "delivered"  # handed to a consumer (redeliveries too), per second
    ACKNOWLEDGED = "acknowledged"  # acknowledged or auto-acked, per second
    WAITING = "waiting"  # waiting for a consumer (depth)
    IN_FLIGHT = "in_flight"  # delivered, not yet acknowledged
    CONSUMERS = "consumers"


class NodeSeries(enum.StrEnum):
    """What is charted for the node alone."""

    CONNECTIONS = "connections"
    MEMORY_USED = "memory_used"  # bytes against max_memory: waiting messages and held
    MEMORY_HELD = "memory_held"  # of which open transactions and partial frames
    PAUSED_PRODUCERS = "paused_producers"  # producers held back by flow control
    COMMIT_MS = "commit_ms"  # mean group commit duration over the sample
    COMMIT_MAX_MS = "commit_max_ms"  # longest group commit over the sample


DESTINATION_SERIES = tuple(Series)
#: The series that are rates (per second); the others are levels.
RATES = (Series.ENQUEUED, Series.DELIVERED, Series.ACKNOWLEDGED)
NAN = math.nan


def _ring() -> array[float]:
    return array("f", [NAN]) * SAMPLES


class Rings:
    """One ring per series name, written at the sampler's current slot."""

    __slots__ = ("rings",)

    def __init__(self, names: Iterable[str]) -> None:
        self.rings = {str(name): _ring() for name in names}

    def put(self, slot: int, values: dict[str, float]) -> None:
        for name, ring in self.rings.items():
            ring[slot] = values.get(name, NAN)

    def read(self, order: list[int]) -> dict[str, list[float | None]]:
        return {name: [_json(ring[i]) for i in order] for name, ring in self.rings.items()}


def _json(value: float) -> float | None:
    """A ring value for JSON: NaN (no sample) is null; rates keep two decimals."""
    return None if math.isnan(value) else round(value, 2)


class Sampler:
    """Samples the node's broker every ``interval`` seconds into rings of ``size``."""

    def __init__(self, view: NodeView, interval: float = SAMPLE_SECONDS,
                 size: int = SAMPLES, max_destinations: int = MAX_CHARTED_DESTINATIONS,
                 clock: Callable[[], float] = time.time) -> None:
        self.view = view
        self.interval, self.size, self.max_destinations = interval, size, max_destinations
        self.clock = clock
        self._task: asyncio.Task[None] | None = None
        #: The stored depths' read in flight, if any (``sample``).
        self._reading: asyncio.Future[dict[str, DestinationDepth]] | None = None
        self._commits = [0.0, 0, 0.0]  # seconds summed, batches, longest
        self._reset(None)

    def _reset(self, broker: Broker | None) -> None:
        self.broker = broker
        self.ticks = 0  # samples taken since the reset; slot = ticks % size
        self.times = array("d", [NAN]) * self.size  # ms since the Unix epoch
        self.node = Rings([*DESTINATION_SERIES, *NodeSeries])
        self.destinations: dict[str, Rings] = {}
        self.latest: dict[str, dict[str, float]] = {}  # each destination's last sample
        self._previous: dict[str, tuple[int, int, int]] = {}
        self._previous_at: float | None = None

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        task, self._task = self._task, None
        reading, self._reading = self._reading, None
        if reading is not None:  # its thread ends on its own; a failure then is no news
            reading.add_done_callback(lambda f: f.cancelled() or f.exception())
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            next_at += self.interval
            try:
                await self.sample()
            except asyncio.CancelledError:
                raise
            except Exception:  # a chart must never take the node down
                log.exception("management: rate sample failed")
            # A slow sample skips ticks rather than bunching them.
            next_at = max(next_at, loop.time())
            await asyncio.sleep(next_at - loop.time())

    def observe_commit(self, seconds: float) -> None:
        """The write buffer's observer: one committed batch took ``seconds``."""
        c = self._commits
        c[0] += seconds
        c[1] += 1
        if seconds > c[2]:
            c[2] = seconds

    # -- sampling -----------------------------------------------------------------------------
    async def sample(self) -> None:
        """Take one sample (nothing off the serving master: a slave has no figures)."""
        view = self.view
        broker = view.broker
        if broker is not self.broker:
            self._reset(broker)
            if broker is not None:  # its totals count from its takeover: rates from there
                since = view.node.master_since or self.clock()
                self._previous_at = time.monotonic() - max(0.0, self.clock() - since)
        if broker is None or not view.serving:
            return
        # One read at a time: a read the store holds up past the timeout is awaited again
        # by the next sample, never joined by a second one (a hung store would otherwise
        # fill the loop's default executor with our reads, one per sample).
        reading = self._reading
        if reading is None or reading.done():
            if reading is not None and not reading.cancelled():
                reading.exception()  # a late failure, marked seen: the new read will tell
            reading = self._reading = asyncio.ensure_future(
                asyncio.to_thread(view.reader.depths))
        try:
            view.depths = await asyncio.wait_for(asyncio.shield(reading), DEPTH_READ_TIMEOUT)
        except (StoreError, TimeoutError) as e:
            log.debug("management: depths for the rates not read (%s); last ones kept", e)
        if view.broker is not broker:  # demoted while reading
            return
        self.record(broker, view.destination_rows(view.depths),
                    len(view.server.connections) if view.server is not None else 0)

    def record(self, broker: Broker, rows: list[dict[str, Any]], connections: int) -> None:
        """One sample from the broker's counters and the destinations' rows (``NodeView.
        destination_rows``); synchronous, so it sees one moment of the broker."""
        now, mono = self.clock(), time.monotonic()
        dt = None if self._previous_at is None else max(mono - self._previous_at, 1e-3)
        self._previous_at = mono
        slot = self.ticks % self.size
        self.ticks += 1
        self.times[slot] = now * 1000.0
        counters = (broker.enqueued, broker.delivered, broker.dequeued)
        previous = self._previous
        current: dict[str, tuple[int, int, int]] = {}
        totals = [0.0, 0.0, 0.0]
        for name in set().union(*counters):
            counts = current[name] = (counters[0].get(name, 0), counters[1].get(name, 0),
                                      counters[2].get(name, 0))
            before = previous.get(name, (0, 0, 0))
            for i in range(3):
                # A total that went down was reset (the destination left memory or was
                # deleted, and came back); one reset that climbed past its old value
                # within one sample is undercounted in that sample alone.
                totals[i] += counts[i] - before[i] if counts[i] >= before[i] else counts[i]
        self._previous = current
        node: dict[str, float] = {s: (NAN if dt is None else totals[i] / dt)
                                  for i, s in enumerate(RATES)}
        seen: set[str] = set()
        waiting = inflight = consumers = 0
        for row in rows:
            name = row["name"]
            waiting += row["waiting"]
            inflight += row["in_flight"]
            consumers += row["consumers"]
            rings = self.destinations.get(name)
            if rings is None:
                if len(self.destinations) >= self.max_destinations:
                    continue
                rings = self.destinations[name] = Rings(DESTINATION_SERIES)
            seen.add(name)
            counts = current.get(name, (0, 0, 0))
            before = previous.get(name, (0, 0, 0))
            values: dict[str, float] = {s: (NAN if dt is None else
                          (counts[i] - before[i] if counts[i] >= before[i] else counts[i]) / dt)
                      for i, s in enumerate(RATES)}
            values[Series.WAITING] = row["waiting"]
            values[Series.IN_FLIGHT] = row["in_flight"]
            values[Series.CONSUMERS] = row["consumers"]
            rings.put(slot, values)
            self.latest[name] = values
        for gone in [n for n in self.destinations if n not in seen]:
            del self.destinations[gone]
            self.latest.pop(gone, None)
        memory = broker.memory
        commit_sum, commits, longest = self._commits
        self._commits = [0.0, 0, 0.0]
        node.update({
            Series.WAITING: waiting, Series.IN_FLIGHT: inflight, Series.CONSUMERS: consumers,
            NodeSeries.CONNECTIONS: connections,
            NodeSeries.MEMORY_USED: memory.used,
            NodeSeries.MEMORY_HELD: memory.held_bytes,
            NodeSeries.PAUSED_PRODUCERS: len(memory.blocked_producers_all),
            NodeSeries.COMMIT_MS: commit_sum / commits * 1000.0 if commits else NAN,
            NodeSeries.COMMIT_MAX_MS: longest * 1000.0 if commits else NAN,
        })
        self.node.put(slot, node)

    # -- reading ------------------------------------------------------------------------------
    def _order(self) -> list[int]:
        """Slots oldest first."""
        n = min(self.ticks, self.size)
        return [(self.ticks - n + i) % self.size for i in range(n)]

    def _frame(self, order: list[int]) -> dict[str, Any]:
        return {"interval": self.interval, "window": self.interval * self.size,
                "times": [int(self.times[i]) for i in order]}

    def node_json(self, readable: Callable[[str], bool] | None = None) -> dict[str, Any]:
        """The node's history and each destination's last sample. ``readable`` (a login
        that may read only some destinations): its message series are the sums over
        the charted destinations it may read, and it sees only those."""
        order = self._order()
        node = self.node.read(order)
        latest = {name: {s: _json(v) for s, v in values.items()}
                  for name, values in sorted(self.latest.items())
                  if readable is None or readable(name)}
        if readable is not None:
            for s in DESTINATION_SERIES:
                node[s] = self._summed(s, order, latest)
        memory = self.broker.memory if self.broker is not None else None
        return {**self._frame(order), "scope": "node" if readable is None else "readable",
                "memory_limit": memory.memory_budget if memory is not None else None,
                "node": node, "destinations": latest,
                "charted_limit": self.max_destinations}

    def _summed(self, series: str, order: list[int],
                names: Iterable[str]) -> list[float | None]:
        rings = [self.destinations[n].rings[series] for n in names if n in self.destinations]
        out: list[float | None] = []
        for i in order:
            values = [r[i] for r in rings if not math.isnan(r[i])]
            out.append(round(sum(values), 2) if values else None)
        return out

    def destination_json(self, name: str) -> dict[str, Any] | None:
        """One destination's history (None: not charted)."""
        rings = self.destinations.get(name)
        if rings is None:
            return None
        order = self._order()
        return {**self._frame(order), "destination": name, "series": rings.read(order)}
