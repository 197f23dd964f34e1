"""Stored messages given back to the store for held bytes (``Source.evict``, issue 23):
a queue whose newest stored messages left memory pages them in again, and nothing is
delivered twice or lost, whatever was in flight or acknowledged when they left. In
process, against SQLite; the RSS of the whole case is tests/integration/test_held_memory.py.
"""

from __future__ import annotations

from amqlite.broker import source as source_mod
from amqlite.codec import Frame
from amqlite.settings import Settings
from store import Store
from tests.broker.test_broker_store import Master, connect, run, send, until

COUNT = 100
IN_FLIGHT = 10


def test_evicted_messages_come_back_once_after_in_flight_and_acked_ones(
        store: Store, settings: Settings) -> None:
    async def scenario() -> None:
        async with Master(store, settings, "a") as broker:
            producer = connect(broker)
            for i in range(COUNT):
                send(broker, producer, "/queue/ev", f"m{i:03d}", receipt=f"r{i}")
            await until(lambda: len(producer.of("RECEIPT")) == COUNT)
            q = broker.queues["/queue/ev"]
            assert len(q) == COUNT
            consumer = connect(broker)
            broker.handle(consumer, Frame("SUBSCRIBE", {
                "destination": "/queue/ev", "id": "s", "ack": "client-individual",
                "activemq.prefetchSize": str(IN_FLIGHT)}))
            await until(lambda: len(consumer.of("MESSAGE")) == IN_FLIGHT)
            first = consumer.of("MESSAGE")
            broker.handle(consumer, Frame("ACK", {"id": first[0].headers["ack"]}))
            # The held bytes want everything: all but MIN_IN_MEMORY leave, newest first.
            freed = broker.reclaim(1 << 40)
            assert freed > 0
            assert q.in_memory_stored == source_mod.MIN_IN_MEMORY and q.store_has_more
            kept = sorted(m.id for _, _, m in q.heap)
            assert kept[-1] < q.cursor + 1  # what is left is below the pager's cursor
            # A second reclaim finds nothing more to give (the floor).
            assert broker.reclaim(1 << 40) == 0
            for m in first[1:]:  # settle the rest; new ones arrive, paged in again
                broker.handle(consumer, Frame("ACK", {"id": m.headers["ack"]}))
            got = list(first)

            async def drain() -> None:
                while len(got) < COUNT:
                    await until(lambda: len(consumer.of("MESSAGE")) > len(got))
                    for m in consumer.of("MESSAGE")[len(got):]:
                        got.append(m)
                        broker.handle(consumer, Frame("ACK", {"id": m.headers["ack"]}))

            await drain()
            bodies = [m.body.decode() for m in got]
            assert sorted(bodies) == [f"m{i:03d}" for i in range(COUNT)], bodies
            assert len(set(bodies)) == COUNT  # none twice
        assert store.check_integrity(store.claim_epoch("probe")).actual_count == 0

    run(scenario)


def test_nothing_older_than_a_message_in_flight_is_given_back(
        store: Store, settings: Settings) -> None:
    """The newest messages (high priority) are in flight: a page from below any of the
    waiting ones would load those again, so none of the waiting ones is given back."""
    async def scenario() -> None:
        async with Master(store, settings, "a") as broker:
            producer = connect(broker)
            for i in range(COUNT):
                send(broker, producer, "/queue/pri", f"m{i:03d}", receipt=f"r{i}",
                     priority="9" if i >= COUNT - IN_FLIGHT else "4")
            await until(lambda: len(producer.of("RECEIPT")) == COUNT)
            consumer = connect(broker)
            broker.handle(consumer, Frame("SUBSCRIBE", {
                "destination": "/queue/pri", "id": "s", "ack": "client-individual",
                "activemq.prefetchSize": str(IN_FLIGHT)}))
            await until(lambda: len(consumer.of("MESSAGE")) == IN_FLIGHT)
            assert {m.headers["priority"] for m in consumer.of("MESSAGE")} == {"9"}
            assert broker.reclaim(1 << 40) == 0
            assert len(broker.queues["/queue/pri"]) == COUNT - IN_FLIGHT

    run(scenario)
