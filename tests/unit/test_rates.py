"""The console's rate sampler (amqlite.management.rates) as pure logic: rates from the
broker's totals, the ring's bound, resets, the destination cap, and the per-login sums.
The broker is a stand-in holding only the counters the sampler reads."""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace
from typing import Any

import pytest

from amqlite.management import rates
from amqlite.management.rates import Sampler


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def broker() -> Any:
    memory = SimpleNamespace(used=10, held_bytes=0, blocked_producers_all={},
                             memory_budget=1000)
    return SimpleNamespace(enqueued=defaultdict(int), delivered=defaultdict(int),
                           dequeued=defaultdict(int), memory=memory)


def row(name: str, waiting: int = 0, consumers: int = 0) -> dict[str, Any]:
    return {"name": name, "waiting": waiting, "in_flight": 0, "consumers": consumers}


def sampler(b: Any, size: int = 4, max_destinations: int = 10) -> Sampler:
    s = Sampler(SimpleNamespace(broker=b), size=size,  # type: ignore[arg-type]
                max_destinations=max_destinations, clock=Clock())
    s.broker = b
    return s


def test_rates_are_deltas_over_the_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    ticks = iter([100.0, 102.0, 104.0])
    monkeypatch.setattr(rates.time, "monotonic", lambda: next(ticks))
    b = broker()
    s = sampler(b)
    s.record(b, [row("/queue/a")], 1)  # no interval yet: no rate
    b.enqueued["/queue/a"] += 10
    b.delivered["/queue/a"] += 4
    b.dequeued["/queue/a"] += 2
    s.observe_commit(0.002)
    s.observe_commit(0.004)
    s.record(b, [row("/queue/a", waiting=6, consumers=1)], 2)
    b.enqueued.pop("/queue/a")  # the queue went and came back: its total starts again
    b.enqueued["/queue/a"] = 3
    s.record(b, [row("/queue/a", waiting=9)], 2)
    node = s.node_json()
    assert node["node"]["enqueued"] == [None, 5.0, 1.5]
    assert node["node"]["delivered"] == [None, 2.0, 0.0]
    assert node["node"]["acknowledged"] == [None, 1.0, 0.0]
    assert node["node"]["waiting"] == [0, 6, 9]
    assert node["node"]["commit_ms"] == [None, 3.0, None]
    assert node["node"]["commit_max_ms"] == [None, 4.0, None]
    assert node["node"]["connections"] == [1, 2, 2]
    assert node["memory_limit"] == 1000
    assert node["destinations"]["/queue/a"]["waiting"] == 9
    series = s.destination_json("/queue/a")
    assert series is not None and series["series"]["enqueued"] == [None, 5.0, 1.5]
    assert series["series"]["consumers"] == [0, 1, 0]


def test_the_ring_keeps_the_last_samples_only() -> None:
    b = broker()
    s = sampler(b, size=3)
    for i in range(5):
        b.enqueued["/queue/a"] = 0
        s.record(b, [row("/queue/a", waiting=i)], 0)
    data = s.node_json()
    assert data["node"]["waiting"] == [2, 3, 4]
    assert len(data["times"]) == 3 and s.times.itemsize * len(s.times) == 8 * 3


def test_a_destination_past_the_cap_counts_for_the_node_only() -> None:
    b = broker()
    s = sampler(b, max_destinations=1)
    s.record(b, [row("/queue/a", 1), row("/queue/b", 2)], 0)
    assert s.destination_json("/queue/a") is not None
    assert s.destination_json("/queue/b") is None
    assert s.node_json()["node"]["waiting"] == [3]
    s.record(b, [row("/queue/b", 2)], 0)  # /queue/a went: its slot is free
    s.record(b, [row("/queue/b", 2)], 0)
    assert s.destination_json("/queue/a") is None
    assert s.destination_json("/queue/b") is not None


def test_a_login_sees_the_sums_of_what_it_may_read() -> None:
    b = broker()
    s = sampler(b)
    s.record(b, [row("/queue/mine", 2), row("/queue/theirs", 5)], 0)
    data = s.node_json(lambda name: name == "/queue/mine")
    assert data["scope"] == "readable"
    assert list(data["destinations"]) == ["/queue/mine"]
    assert data["node"]["waiting"] == [2]
    assert s.node_json()["node"]["waiting"] == [7]


def test_a_held_up_depth_read_is_never_joined_by_a_second(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A store that holds a read up: each sample waits DEPTH_READ_TIMEOUT for the same
    read and none starts another thread; once the store answers, reads go on."""
    import asyncio
    import threading

    monkeypatch.setattr(rates, "DEPTH_READ_TIMEOUT", 0.05)
    release, calls = threading.Event(), []

    def depths() -> dict[str, Any]:
        calls.append(1)
        release.wait(10)
        return {"/queue/a": "stored"}

    b = broker()
    view = SimpleNamespace(broker=b, serving=True, server=None, depths={},
                           reader=SimpleNamespace(depths=depths),
                           node=SimpleNamespace(master_since=None),
                           destination_rows=lambda depths: [])

    async def run() -> None:
        s = Sampler(view)  # type: ignore[arg-type]
        await s.sample()
        await s.sample()
        assert len(calls) == 1 and view.depths == {} and s.ticks == 2
        release.set()
        await asyncio.wait_for(asyncio.shield(s._reading), 5)  # type: ignore[arg-type]
        await s.sample()  # the late answer is old: a new read, which the store answers
        assert len(calls) == 2 and view.depths == {"/queue/a": "stored"}
        await s.stop()

    asyncio.run(run())
