"""Deleting a destination in-process while SENDs to it are committing: every message
sent before the cut is removed (from the store and from memory, counted once), every
one sent after lives in the destination created again, and the memory accounting, the
metrics' totals and the store's counters agree with what is left."""

from __future__ import annotations

import asyncio

import pytest

from amqlite.broker import Broker, ForgottenDestination, Operations, destinations
from amqlite.codec import Frame
from amqlite.management.reads import StoreReader
from amqlite.settings import Settings
from store import SqlStore
from tests.broker.test_broker_store import Master, connect, run, until

QUEUE = "/queue/del"
#: Sent with receipts before the delete, racing it, and after it.
BEFORE, DURING, AFTER = 5, 4, 2


@pytest.mark.parametrize("store_url", ["sqlite", "postgresql"], indirect=True)
def test_sends_racing_a_delete_are_removed_or_kept_whole(store: SqlStore,
                                                         settings: Settings,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    async def scenario() -> None:
        async with Master(store, settings, "a") as broker:
            reader = StoreReader(settings.store, settings.group)
            producer = connect(broker)
            n = 0

            def send(tag: str) -> None:
                nonlocal n
                n += 1
                broker.handle(producer, Frame("SEND", {"destination": QUEUE,
                                                       "receipt": str(n)}, f"{tag}{n}".encode()))

            for _ in range(BEFORE):
                send("before")
            await until(lambda: len(producer.of("RECEIPT")) == BEFORE)
            old_id = broker.destination_rows[QUEUE]
            for _ in range(2):
                send("before")  # staged, not committed when the delete starts
            forget = destinations.forget_destination

            def forget_while_sending(b: Broker, name: str) -> ForgottenDestination:
                """SENDs staged right before and right after the cut, in its loop step."""
                send("before")
                gone = forget(b, name)
                send("cut-after")
                return gone

            monkeypatch.setattr(destinations, "forget_destination", forget_while_sending)
            task = asyncio.create_task(Operations(broker, reader).delete_destination(QUEUE))
            for _ in range(DURING):
                await asyncio.sleep(0)  # one loop step: let the delete make progress
                send("during")
            result = await task
            for _ in range(AFTER):
                send("after")
            await until(lambda: len(producer.of("RECEIPT")) == n)
            assert not producer.errors

            survivors = [m.body.decode() for m in
                         store.load_page(broker.destination_rows[QUEUE], 0, 100)]
            assert broker.destination_rows[QUEUE] != old_id
            assert result["messages"] + len(survivors) == n  # each one once
            assert all(not b.startswith("before") for b in survivors)
            assert any(b.startswith("cut-after") for b in survivors)
            assert [b for b in survivors if b.startswith("after")] == [f"after{n - 1}",
                                                                        f"after{n}"]
            assert len(broker.queues[QUEUE]) == len(survivors)  # memory holds just those
            assert broker.waiting_bytes == sum(s.bytes for s in broker.queues.values())
            assert broker.enqueued[QUEUE] <= DURING + AFTER  # counted from the cut
            integrity = await asyncio.to_thread(store.check_integrity, broker.epoch)
            assert not integrity.mismatch
            reader.close()

    run(scenario)
