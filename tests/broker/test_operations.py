"""The operator API (``amqlite.broker.operations``) driven directly, against a real
SQLite store: what each verb leaves in the store, and the kind of error it raises."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

import pytest

from amqlite.broker import Broker, ErrorKind, OperationError, Operations
from amqlite.codec import Frame
from amqlite.management.reads import StoreReader
from amqlite.settings import Settings
from store import SqlStore
from tests.broker.test_broker_store import Master, connect, run, until

QUEUE = "/queue/ops"


def stored(store: SqlStore, broker: Broker, name: str) -> list[bytes]:
    """The bodies of queue ``name``'s rows in the store, by id."""
    did = broker.destination_rows.get(name)
    return [] if did is None else [m.body for m in store.load_page(did, 0, 1000)]


async def integrity_ok(store: SqlStore, broker: Broker) -> bool:
    return not (await asyncio.to_thread(store.check_integrity, broker.epoch)).mismatch


def test_send_stores_then_purge_removes(store: SqlStore, settings: Settings) -> None:
    async def scenario() -> None:
        async with Master(store, settings, "a") as broker:
            reader = StoreReader(settings.store, settings.group)
            ops = Operations(broker, reader)
            sent = [await ops.send(QUEUE, f"m{i}".encode(), {"colour": "red"})
                    for i in range(3)]
            # Durable when send returns: in the store, numbered by the broker.
            assert stored(store, broker, QUEUE) == [b"m0", b"m1", b"m2"]
            assert [s["message_id"] for s in sent] == [f"ID:g1:{s['id']}" for s in sent]
            assert all(s["persistent"] and s["destination"] == QUEUE for s in sent)
            row = store.load_page(broker.destination_rows[QUEUE], 0, 1)[0]
            assert row.headers == {"colour": "red"}
            assert broker.enqueued[QUEUE] == 3  # counted as a client's SEND is

            memory_only = await ops.send(QUEUE, b"fleeting", persistent=False)
            assert not memory_only["persistent"]
            assert stored(store, broker, QUEUE) == [b"m0", b"m1", b"m2"]

            result = await ops.purge(QUEUE)
            assert result == {"destination": QUEUE, "purged": 4, "in_flight_kept": 0}
            assert stored(store, broker, QUEUE) == []
            assert len(broker.queues[QUEUE]) == 0
            assert broker.waiting_bytes == 0
            assert await integrity_ok(store, broker)
            reader.close()

    run(scenario)


def test_send_reaches_a_waiting_consumer_and_move_keeps_its_message(
        store: SqlStore, settings: Settings) -> None:
    async def scenario() -> None:
        async with Master(store, settings, "a") as broker:
            reader = StoreReader(settings.store, settings.group)
            ops = Operations(broker, reader)
            consumer = connect(broker)
            broker.handle(consumer, Frame("SUBSCRIBE", {
                "destination": QUEUE, "id": "s", "ack": "client-individual",
                "activemq.prefetchSize": "1"}))
            first = await ops.send(QUEUE, b"first")
            await until(lambda: len(consumer.of("MESSAGE")) == 1)
            assert consumer.of("MESSAGE")[0].body == b"first"
            second = await ops.send(QUEUE, b"second")  # waits: the prefetch of 1 is taken

            result = await ops.move(QUEUE, "/queue/elsewhere", [first["id"], second["id"]])
            assert result == {"source": QUEUE, "moved": 1, "in_flight_kept": 1,
                              "not_found": 0, "target": "/queue/elsewhere"}
            assert stored(store, broker, QUEUE) == [b"first"]  # in flight: kept
            assert stored(store, broker, "/queue/elsewhere") == [b"second"]
            with pytest.raises(OperationError) as conflict:
                await ops.delete_destination(QUEUE)
            assert conflict.value.kind is ErrorKind.CONFLICT
            assert not consumer.errors
            assert await integrity_ok(store, broker)
            reader.close()

    run(scenario)


def test_errors_have_a_kind_and_change_nothing(store: SqlStore, settings: Settings) -> None:
    async def scenario() -> None:
        async with Master(store, settings, "a") as broker:
            reader = StoreReader(settings.store, settings.group)
            ops = Operations(broker, reader)

            async def kind_of(call: Awaitable[object]) -> ErrorKind:
                with pytest.raises(OperationError) as e:
                    await call
                return e.value.kind

            assert await kind_of(ops.send("/nowhere/x", b"")) is ErrorKind.BAD_REQUEST
            assert await kind_of(ops.send(QUEUE, b"", {"priority": "high"})) \
                is ErrorKind.BAD_REQUEST
            too_big = b"x" * (settings.max_frame_size + 1)
            assert await kind_of(ops.send(QUEUE, too_big)) is ErrorKind.BAD_REQUEST
            assert await kind_of(ops.purge(QUEUE)) is ErrorKind.NOT_FOUND
            assert await kind_of(ops.purge("/topic/t")) is ErrorKind.BAD_REQUEST
            assert await kind_of(ops.delete_message(10**9)) is ErrorKind.NOT_FOUND
            assert await kind_of(ops.remove_durable("c", "n")) is ErrorKind.NOT_FOUND
            with pytest.raises(OperationError) as e:
                ops.close_connection("10.0.0.1:1", "alice")
            assert e.value.kind is ErrorKind.NOT_FOUND
            assert QUEUE not in broker.destination_rows  # no SEND got through

            broker.pause()
            assert await kind_of(ops.send(QUEUE, b"m")) is ErrorKind.UNAVAILABLE
            broker.resume()
            broker.writes.failed = True  # as after a store failure: the node demotes
            assert await kind_of(ops.send(QUEUE, b"m")) is ErrorKind.UNAVAILABLE
            broker.writes.failed = False
            assert stored(store, broker, QUEUE) == []
            reader.close()

    run(scenario)
