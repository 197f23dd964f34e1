"""Byte budgets in-process (issue 12, class 6): the accounting returns to zero,
flow control pauses and resumes by bytes, persistent messages past the budget
stay in the store, a producer that also consumes is not deadlocked.

The RSS side of the same cases runs against a real broker process in
tests/integration/test_memory_budget.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from amqlite.broker import Broker, message_size
from amqlite.broker import message as message_mod
from amqlite.broker import source as source_mod
from amqlite.codec import Frame
from amqlite.settings import Settings
from store import Store
from tests.broker.test_broker_store import FrameSink, Master, connect, run, send, until

KIB = 1024
BODY = "x" * (16 * KIB)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """Tiny budgets: 64 KiB per destination, 128 KiB for the broker."""
    return Settings(group="g1", data_dir=str(tmp_path), max_memory=128 * KIB,
                    max_destination_memory=64 * KIB).resolved()


def subscribe(broker: Broker, client: FrameSink, dest: str, **headers: str) -> None:
    broker.handle(client, Frame("SUBSCRIBE", {"destination": dest, "id": dest,
                                              "ack": "client-individual", **headers}))


def slow_topic_subscriber(broker: Broker, topic: str) -> FrameSink:
    """A subscriber of ``topic`` whose connection never drains: what is published
    waits in its source."""
    slow = connect(broker)
    slow.can_write = lambda: False  # type: ignore[method-assign]
    broker.handle(slow, Frame("SUBSCRIBE", {"destination": topic, "id": "s"}))
    return slow


def ack_all(broker: Broker, client: FrameSink, done: set[str]) -> int:
    """ACK every MESSAGE not acknowledged yet; returns how many were."""
    n = 0
    for frame in client.of("MESSAGE"):
        if frame.headers["ack"] not in done:
            done.add(frame.headers["ack"])
            broker.handle(client, Frame("ACK", {"id": frame.headers["ack"]}))
            n += 1
    return n


def test_message_size_counts_body_headers_and_overhead() -> None:
    headers = {"a": "bc", "content-type": "text/plain"}
    assert message_size(headers, b"12345") == (
        5 + 3 + 22 + 2 * message_mod.HEADER_OVERHEAD + message_mod.MESSAGE_OVERHEAD)


def test_accounting_returns_to_zero_when_everything_is_acknowledged(
        store: Store, settings: Settings) -> None:
    async def scenario() -> None:
        async with Master(store, settings, "a") as broker:
            producer, consumer = connect(broker), connect(broker)
            subscribe(broker, consumer, "/queue/z")
            for i in range(20):
                send(broker, producer, "/queue/z", f"{i}:{BODY}",
                     persistent="true" if i % 2 else "false")
            done: set[str] = set()

            def drained() -> bool:
                ack_all(broker, consumer, done)
                return len(done) == 20

            await until(drained)
            sub = broker.sessions[consumer].subscriptions["/queue/z"]
            assert broker.waiting_bytes == 0
            assert broker.queues["/queue/z"].bytes == 0
            assert sub.inflight_bytes == 0
            assert not producer.paused

    run(scenario)


def test_nonpersistent_producer_is_paused_by_bytes_and_resumed_below_the_mark(
        store: Store, settings: Settings) -> None:
    async def scenario() -> None:
        async with Master(store, settings, "a") as broker:
            producer = connect(broker)
            for _ in range(4):  # 4 x 16 KiB = the 64 KiB destination budget
                send(broker, producer, "/queue/np", BODY, persistent="false")
            assert producer.paused == {"flow:/queue/np"}
            consumer = connect(broker)
            subscribe(broker, consumer, "/queue/np", **{"activemq.prefetchSize": "1"})
            assert producer.paused  # 3 waiting: above 3/4 of the budget
            ack_all(broker, consumer, set())
            assert not producer.paused  # 2 waiting: resumed
            assert len(broker.queues["/queue/np"]) == 2  # nothing was dropped

    run(scenario)


def test_many_queues_pause_the_producer_at_the_broker_budget(
        store: Store, settings: Settings) -> None:
    async def scenario() -> None:
        async with Master(store, settings, "a") as broker:
            producer = connect(broker)
            for i in range(8):  # 8 x 16 KiB = 128 KiB over 4 queues, each at half its budget
                send(broker, producer, f"/queue/m{i % 4}", BODY, persistent="false")
            assert producer.paused == {"memory"}
            consumer = connect(broker)
            subscribe(broker, consumer, "/queue/m0")
            subscribe(broker, consumer, "/queue/m1")
            done: set[str] = set()  # a message at a time: the connection's share is 4 KiB
            await until(lambda: ack_all(broker, consumer, done) == 0 and len(done) == 4)
            assert not producer.paused
            assert broker.waiting_bytes == 4 * broker.queues["/queue/m2"].bytes // 2

    run(scenario)


def test_producer_that_also_consumes_takes_what_waits(store: Store,
                                                      settings: Settings) -> None:
    """Its reading is paused, so its ACKs cannot arrive: it may hold more in
    flight than its prefetch, which drains the queue and resumes its reading."""
    async def scenario() -> None:
        async with Master(store, settings, "a") as broker:
            me = connect(broker)
            subscribe(broker, me, "/queue/self", **{"activemq.prefetchSize": "1"})
            for _ in range(5):
                send(broker, me, "/queue/self", BODY, persistent="false")
            # the 5th reached the budget and paused it; its subscription then took
            # messages past its prefetch until the queue was below the resume mark
            assert not me.paused
            assert len(me.of("MESSAGE")) == 3
            assert broker.queues["/queue/self"].bytes <= broker.destination_resume
            done: set[str] = set()
            while ack_all(broker, me, done):
                pass
            assert len(done) == 5  # and nothing was lost

    run(scenario)


def test_persistent_messages_past_the_budget_stay_in_the_store(
        store: Store, settings: Settings) -> None:
    total = 3 * source_mod.MIN_IN_MEMORY

    async def scenario() -> None:
        async with Master(store, settings, "a") as broker:
            producer = connect(broker)
            for i in range(total):
                send(broker, producer, "/queue/p", f"{i:04d}{BODY}", receipt=f"r{i}")
            await until(lambda: len(producer.of("RECEIPT")) == total)
            queue = broker.queues["/queue/p"]
            assert queue.in_memory_stored == source_mod.MIN_IN_MEMORY  # the floor
            assert queue.store_has_more
            assert not producer.paused  # persistent: the store holds them
            consumer = connect(broker)
            subscribe(broker, consumer, "/queue/p")
            done: set[str] = set()

            sub = broker.sessions[consumer].subscriptions["/queue/p"]

            def drained() -> bool:
                ack_all(broker, consumer, done)
                # Waiting: the destination budget or the MIN_IN_MEMORY floor; held
                # unacknowledged: the broker-wide budget (a row past either).
                row = queue.row_size
                assert queue.bytes <= max(broker.destination_budget,
                                          source_mod.MIN_IN_MEMORY * row) + row
                assert sub.inflight_bytes <= broker.memory.memory_budget + row
                return len(done) == total

            await until(drained)
            got = [f.body[:4].decode() for f in consumer.of("MESSAGE")]
            assert got == [f"{i:04d}" for i in range(total)]

    run(scenario)


def test_slow_topic_subscriber_drops_past_its_byte_budget(store: Store,
                                                         settings: Settings) -> None:
    async def scenario() -> None:
        async with Master(store, settings, "a") as broker:
            slow_topic_subscriber(broker, "/topic/t")
            producer = connect(broker)
            for _ in range(10):
                send(broker, producer, "/topic/t", BODY, persistent="false")
            [source] = broker.topics["/topic/t"]
            assert len(source) == 4  # 64 KiB of 16 KiB messages
            assert source.dropped == broker.stats["dropped"] == 6
            assert not producer.paused  # a topic publisher is never held back

    run(scenario)


def test_a_closed_topic_subscription_gives_its_bytes_back(store: Store,
                                                          settings: Settings) -> None:
    async def scenario() -> None:
        async with Master(store, settings, "a") as broker:
            slow = slow_topic_subscriber(broker, "/topic/gone")
            producer = connect(broker)
            for _ in range(3):
                send(broker, producer, "/topic/gone", BODY, persistent="false")
            assert broker.waiting_bytes > 3 * len(BODY)
            broker.handle(slow, Frame("UNSUBSCRIBE", {"id": "s"}))
            assert broker.waiting_bytes == 0

    run(scenario)
