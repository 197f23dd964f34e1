"""Destinations nobody uses leave memory (issue 23, item 8), in-process: a queue with no
store row, no message and no consumer and a topic with no subscriber are dropped when the
last consumer leaves, and come back on their next use; a queue the store holds messages
for stays and pages them to the next consumer.

The RSS of 100,000 SUBSCRIBE/UNSUBSCRIBE pairs through a broker process is in
tests/integration/test_destination_memory.py.
"""

from __future__ import annotations

from amqlite.broker import Broker
from amqlite.codec import Frame
from amqlite.settings import Settings
from store import SqlStore
from tests.broker.test_broker_store import FrameSink, Master, connect, run, send, until
from tests.broker.test_temporary import subscribe


def unsubscribe(broker: Broker, client: FrameSink, sub_id: str) -> None:
    broker.handle(client, Frame("UNSUBSCRIBE", {"id": sub_id}))


def test_an_unused_queue_and_topic_leave_memory_and_come_back(
        store: SqlStore, settings: Settings) -> None:
    async def scenario() -> None:
        async with Master(store, settings, "a") as broker:
            client = connect(broker)
            subscribe(broker, client, "/queue/q1", "a")
            subscribe(broker, client, "/topic/t1", "b")
            assert "/queue/q1" in broker.queues and "/topic/t1" in broker.topics
            unsubscribe(broker, client, "a")
            unsubscribe(broker, client, "b")
            assert "/queue/q1" not in broker.queues
            assert "/topic/t1" not in broker.topics
            # Used again: made again. A persistent message for nobody waits in it.
            send(broker, client, "/queue/q1", "later", receipt="r")
            await until(lambda: bool(client.of("RECEIPT")))
            subscribe(broker, client, "/queue/q1", "c")
            await until(lambda: len(client.of("MESSAGE")) == 1)
            assert client.of("MESSAGE")[0].body == b"later"
            subscribe(broker, client, "/topic/t1", "d")
            send(broker, client, "/topic/t1", "news", persistent="false")
            await until(lambda: len(client.of("MESSAGE")) == 2)
            # Non-persistent, never stored: it keeps the queue until someone takes it.
            send(broker, client, "/queue/np", "kept", persistent="false")
            subscribe(broker, client, "/queue/np", "e", ack="client")
            await until(lambda: len(client.of("MESSAGE")) == 3)
            unsubscribe(broker, client, "e")  # unacked: back in the queue
            assert len(broker.queues["/queue/np"]) == 1
            subscribe(broker, client, "/queue/np", "f")
            await until(lambda: len(client.of("MESSAGE")) == 4)
            unsubscribe(broker, client, "f")
            assert "/queue/np" not in broker.queues
            assert "/queue/np" not in broker.enqueued and "/queue/np" not in broker.dequeued

    run(scenario)


def test_a_queue_with_stored_messages_stays_pages_them_back_and_leaves_drained(
        store: SqlStore, settings: Settings) -> None:
    async def scenario() -> None:
        async with Master(store, settings, "a") as broker:
            client = connect(broker)
            for i in range(5):
                send(broker, client, "/queue/kept", f"m{i}", receipt=f"r{i}")
            await until(lambda: len(client.of("RECEIPT")) == 5)
            subscribe(broker, client, "/queue/kept", "a", ack="client-individual")
            await until(lambda: len(client.of("MESSAGE")) == 5)
            unsubscribe(broker, client, "a")  # nothing acked: all back
            q = broker.queues["/queue/kept"]
            q.drop(lambda m: True)  # as if only the store held them (not paged in)
            q.store_has_more, q.cursor = True, 0
            broker.writes.flush()
            assert broker.committer is not None
            await broker.committer.drain()  # the releases are in the store
            subscribe(broker, client, "/queue/kept", "b")
            unsubscribe(broker, client, "b")  # left before the page came: it stays
            assert broker.queues.get("/queue/kept") is q
            subscribe(broker, client, "/queue/kept", "c")
            await until(lambda: len(client.of("MESSAGE")) >= 10)
            bodies = sorted(m.body.decode() for m in client.of("MESSAGE")[5:])
            assert bodies == [f"m{i}" for i in range(5)]
            unsubscribe(broker, client, "c")
            # Drained: out of memory now; its row stays (the inactive-queue GC's to
            # delete), and its next use is the same stored queue.
            assert "/queue/kept" not in broker.queues
            row = broker.destination_rows["/queue/kept"]
            send(broker, client, "/queue/kept", "again", receipt="r-again")
            await until(lambda: len(client.of("RECEIPT")) == 6)
            assert broker.queues["/queue/kept"].store_id == row
            subscribe(broker, client, "/queue/kept", "d")
            await until(lambda: len(client.of("MESSAGE")) == 11)
            assert client.of("MESSAGE")[10].body == b"again"
            unsubscribe(broker, client, "d")
            assert "/queue/kept" not in broker.queues
            assert broker.destination_rows["/queue/kept"] == row
            # Its totals stay with its row (the store keeps them too).
            assert broker.enqueued["/queue/kept"] == 6

    run(scenario)
