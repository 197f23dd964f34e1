"""Stored queues a new master has not used yet are not in memory (``Broker.dormant``),
in-process against a real SQLite store: SEND, SUBSCRIBE and a wildcard SUBSCRIBE make
them, and each then pages what the store holds, once."""

from __future__ import annotations

from amqlite.broker.operations import Operations
from amqlite.codec import Frame
from amqlite.management.reads import StoreReader
from amqlite.settings import Settings
from store import Store
from tests.broker.test_broker_store import Master, connect, run, send, until

NAMES = [f"/queue/dormant.{i}" for i in range(3)]


def fill(store: Store, settings: Settings) -> None:
    """A first master stores one message in each queue."""
    async def first() -> None:
        async with Master(store, settings, "a") as broker:
            producer = connect(broker)
            for i, name in enumerate(NAMES):
                send(broker, producer, name, name, receipt=f"r{i}")
            await until(lambda: len(producer.of("RECEIPT")) == len(NAMES))

    run(first)


def test_a_new_master_makes_stored_queues_on_first_use(store: Store,
                                                       settings: Settings) -> None:
    fill(store, settings)

    async def second() -> None:
        async with Master(store, settings, "b") as broker:
            assert broker.dormant == set(NAMES) and not set(NAMES) & set(broker.queues)
            assert set(NAMES) <= set(broker.destination_rows)
            producer = connect(broker)
            send(broker, producer, NAMES[0], "after", receipt="r")  # made by a SEND
            await until(lambda: len(producer.of("RECEIPT")) == 1)
            assert NAMES[0] in broker.queues and NAMES[0] not in broker.dormant
            consumer = connect(broker)
            broker.handle(consumer, Frame("SUBSCRIBE", {
                "destination": "/queue/dormant.>", "id": "w", "ack": "auto"}))
            await until(lambda: len(consumer.of("MESSAGE")) == len(NAMES) + 1)
            got = sorted(m.body.decode() for m in consumer.of("MESSAGE"))
            assert got == sorted([*NAMES, "after"])
            assert not broker.dormant

    run(second)


def test_rows_by_id_follow_the_rows_by_name(store: Store, settings: Settings) -> None:
    """``destination_names`` (the reaper's id -> name) is kept with ``destination_rows``:
    at activation, when a write stages a new row, and when a destination is deleted."""
    fill(store, settings)

    async def second() -> None:
        async with Master(store, settings, "b") as broker:
            def by_id() -> dict[int, str]:
                return {did: name for name, did in broker.destination_rows.items()}

            assert broker.destination_names == by_id()
            producer = connect(broker)
            send(broker, producer, "/queue/dormant.new", "x", receipt="r")
            await until(lambda: len(producer.of("RECEIPT")) == 1)
            assert "/queue/dormant.new" in broker.destination_names.values()
            assert broker.destination_names == by_id()
            reader = StoreReader(settings.store, settings.group)
            try:
                await Operations(broker, reader).delete_destination(NAMES[1])
            finally:
                reader.close()
            assert NAMES[1] not in broker.destination_names.values()
            assert broker.destination_names == by_id()

    run(second)
