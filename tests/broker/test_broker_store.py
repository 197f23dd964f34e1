"""The broker against a real SQLite store, in-process: paging, recovery, dedup, fencing.

No sockets: ``FrameSink`` is the broker's client seam (what ``ClientConnection``
implements), and every write goes through the real group committer into a
real SQLite file, so what is asserted is what a broker process would do.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from amqlite.broker import Broker
from amqlite.broker import memory as memory_mod
from amqlite.broker import source as source_mod
from amqlite.codec import Frame, FrameParser
from amqlite.settings import Settings
from store import GroupCommitter, Store, StoreError, open_store
from tests.helpers.poll import apoll

DEADLINE = 10.0


class FrameSink:
    """A connected client as the broker sees it: frames written are collected."""

    def __init__(self, version: str = "1.2", client_id: str | None = None) -> None:
        self.version = version
        self.client_id = client_id
        self.login: str | None = None
        self.closed = False
        self.frames: list[Frame] = []
        self.errors: list[str] = []
        self.error_receipts: list[str | None] = []  # the receipt-id of each ERROR
        self.paused: set[str] = set()

    def write_frame(self, frame: Frame) -> None:
        self.frames.append(frame)

    def write_receipt(self, receipt: str) -> None:
        self.write_frame(Frame("RECEIPT", {"receipt-id": receipt}))

    def write_message(self, head: str, body: bytes) -> None:
        """A MESSAGE the broker encoded itself: read back as the client would."""
        parsed = FrameParser(version=self.version).feed(head.encode() + body + b"\x00")
        assert len(parsed) == 1 and isinstance(parsed[0], Frame), parsed
        self.write_frame(parsed[0])

    def can_write(self) -> bool:
        return True

    def close_with_error(self, message: str, detail: str = "",
                         receipt: str | None = None) -> None:
        self.errors.append(message)
        self.error_receipts.append(receipt)
        self.closed = True

    def close(self) -> None:
        self.closed = True

    def pause_reading(self, reason: str) -> None:
        self.paused.add(reason)

    def resume_reading(self, reason: str) -> None:
        self.paused.discard(reason)

    def of(self, command: str) -> list[Frame]:
        return [f for f in self.frames if f.command == command]


async def until(predicate: Callable[[], bool], timeout: float = DEADLINE) -> None:
    await apoll(predicate, timeout=timeout, what="condition", interval=0.005)


class Master:
    """One activation of a master over ``store``: claim, recover, serve."""

    def __init__(self, store: Store, settings: Settings, name: str) -> None:
        self.store = store
        self.settings = settings
        self.name = name
        self.failures: list[BaseException] = []

    async def __aenter__(self) -> Broker:
        loop = asyncio.get_running_loop()
        epoch = await asyncio.to_thread(self.store.claim_epoch, self.name)
        recovery = await asyncio.to_thread(self.store.recover, epoch)
        self.committer = GroupCommitter(self.store, epoch, loop, self.failures.append)
        self.broker = Broker(self.settings, self.committer, recovery, loop)
        return self.broker

    async def __aexit__(self, *exc: object) -> None:
        self.broker.writes.flush()
        await self.committer.drain()
        self.committer.close()
        await self.committer.wait_closed()


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(group="g1", data_dir=str(tmp_path)).resolved()


def run(coro_fn: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(coro_fn())


def connect(broker: Broker, **kw: object) -> FrameSink:
    client = FrameSink(**kw)  # type: ignore[arg-type]
    broker.attach(client)
    return client


def send(broker: Broker, client: FrameSink, dest: str, body: str, **headers: str) -> None:
    broker.handle(client, Frame("SEND", {"destination": dest, **headers}, body.encode()))


def test_deep_queue_is_paged_not_loaded_whole(store: Store, settings: Settings) -> None:
    total = source_mod.MAX_IN_MEMORY * 3

    async def scenario() -> None:
        async with Master(store, settings, "a") as broker:
            producer = connect(broker)
            for i in range(total):
                send(broker, producer, "/queue/deep", f"m{i}")
            broker.handle(producer, Frame("SEND", {"destination": "/queue/deep",
                                                   "receipt": "last"}, b"last"))
            await until(lambda: len(producer.of("RECEIPT")) == 1)
            queue = broker.queues["/queue/deep"]
            assert queue.in_memory_stored <= source_mod.MAX_IN_MEMORY
            assert queue.store_has_more

            consumer = connect(broker)
            broker.handle(consumer, Frame("SUBSCRIBE", {
                "destination": "/queue/deep", "id": "s", "ack": "client-individual",
                "activemq.prefetchSize": "50"}))
            seen: list[bytes] = []
            while len(seen) < total + 1:
                await until(lambda: len(consumer.of("MESSAGE")) > 0)
                batch = consumer.of("MESSAGE")
                consumer.frames.clear()
                for m in batch:
                    seen.append(m.body)
                    assert queue.in_memory_stored <= source_mod.MAX_IN_MEMORY
                    broker.handle(consumer, Frame("ACK", {"id": m.headers["ack"]}))
            assert seen == [f"m{i}".encode() for i in range(total)] + [b"last"]
        assert store.check_integrity(store.claim_epoch("probe")).actual_count == 0

    run(scenario)


def test_new_master_redelivers_unacked_flagged_and_nothing_else(
    store: Store, settings: Settings
) -> None:
    delivered: set[str] = set()

    async def first_master() -> None:
        async with Master(store, settings, "a") as broker:
            producer = connect(broker)
            for i in range(10):
                send(broker, producer, "/queue/q", f"m{i}", receipt=f"r{i}")
            await until(lambda: len(producer.of("RECEIPT")) == 10)
            consumer = connect(broker)
            broker.handle(consumer, Frame("SUBSCRIBE", {
                "destination": "/queue/q", "id": "s", "ack": "client-individual",
                "activemq.prefetchSize": "5"}))
            await until(lambda: len(consumer.of("MESSAGE")) == 5)
            first = consumer.of("MESSAGE")
            for m in first[:2]:  # ack two of the five delivered; three stay in flight
                broker.handle(consumer, Frame("ACK", {"id": m.headers["ack"],
                                                      "receipt": m.headers["ack"]}))
            await until(lambda: len(consumer.of("RECEIPT")) == 2)
            # the two acks freed prefetch credit: two more went out
            await until(lambda: len(consumer.of("MESSAGE")) == 7)
            delivered.update(m.body.decode() for m in consumer.of("MESSAGE"))
            # the "crash": the master vanishes without releasing anything

    async def second_master() -> None:
        async with Master(store, settings, "b") as broker:
            consumer = connect(broker)
            broker.handle(consumer, Frame("SUBSCRIBE", {
                "destination": "/queue/q", "id": "s", "ack": "auto"}))
            await until(lambda: len(consumer.of("MESSAGE")) == 8)
            got = {m.body.decode(): m.headers.get("redelivered") for m in consumer.of("MESSAGE")}
            assert set(got) == {f"m{i}" for i in range(2, 10)}
            # exactly the ones delivered before the crash and never acknowledged
            assert delivered == {f"m{i}" for i in range(7)}
            assert {k for k, v in got.items() if v == "true"} == delivered - {"m0", "m1"}

    run(first_master)
    run(second_master)


def test_resend_with_same_identity_is_receipted_but_stored_once(
    store: Store, settings: Settings
) -> None:
    async def scenario() -> None:
        async with Master(store, settings, "a") as broker:
            producer = connect(broker)
            identity = {"amqlite.producerId": "p1", "amqlite.producerSeq": "7"}
            send(broker, producer, "/queue/d", "once", receipt="a", **identity)
            await until(lambda: len(producer.of("RECEIPT")) == 1)
            consumer = connect(broker)
            broker.handle(consumer, Frame("SUBSCRIBE", {"destination": "/queue/d", "id": "s"}))
            await until(lambda: len(consumer.of("MESSAGE")) == 1)
            # consumed (row deleted); the re-send after a "failover" must still be dropped
            await until(lambda: broker.writes.inflight_batches == 0)
            send(broker, producer, "/queue/d", "once", receipt="b", **identity)
            await until(lambda: len(producer.of("RECEIPT")) == 2)
            assert broker.stats["duplicates"] == 1
            assert len(consumer.of("MESSAGE")) == 1

    run(scenario)


def test_deposed_master_commits_nothing_and_sends_no_receipt(
    store: Store, settings: Settings
) -> None:
    async def scenario() -> None:
        master = Master(store, settings, "a")
        async with master as broker:
            producer = connect(broker)
            send(broker, producer, "/queue/f", "before", receipt="r1")
            await until(lambda: len(producer.of("RECEIPT")) == 1)
            other = open_store(settings.store, settings.group)
            other.open()
            try:
                other.claim_epoch("b")  # another master took over
            finally:
                other.close()
            send(broker, producer, "/queue/f", "after", receipt="r2")
            await until(lambda: bool(master.failures) and broker.writes.failed)
            assert [f.headers["receipt-id"] for f in producer.of("RECEIPT")] == ["r1"]
        assert isinstance(master.failures[0], StoreError)
        epoch = store.claim_epoch("c")
        assert store.check_integrity(epoch).actual_count == 1

    run(scenario)


def _dedup_keys(store: Store) -> dict[str, int | None]:
    from sqlalchemy import select

    from store import schema

    with store.engine.connect() as conn:  # type: ignore[attr-defined]
        rows = conn.execute(select(schema.dedup.c.dedup_key, schema.dedup.c.msg_id)).all()
    return {k: mid for k, mid in rows}


def test_every_numbered_send_leaves_its_identity_even_when_nothing_is_stored(
    store: Store, settings: Settings
) -> None:
    """A persistent publish to a topic with no durable subscriber, and an aborted
    transaction, store no message but keep the producer identity: a replay after
    failover is dropped, and the audit sees no hole in the producer's sequence."""

    async def scenario() -> None:
        async with Master(store, settings, "a") as broker:
            subscriber = connect(broker)
            broker.handle(subscriber, Frame("SUBSCRIBE", {"destination": "/topic/t", "id": "s"}))
            producer = connect(broker)
            ident = {"amqlite.producerId": "p", "amqlite.producerSeq": "1"}
            send(broker, producer, "/topic/t", "pub", receipt="r1", **ident)
            send(broker, producer, "/topic/t", "pub", receipt="r2", **ident)  # a replay
            await until(lambda: len(producer.of("RECEIPT")) == 2)
            assert [m.body for m in subscriber.of("MESSAGE")] == [b"pub"]

            broker.handle(producer, Frame("BEGIN", {"transaction": "tx"}))
            send(broker, producer, "/queue/q", "dropped", transaction="tx",
                 **{"amqlite.producerId": "p", "amqlite.producerSeq": "2"})
            broker.handle(producer, Frame("ABORT", {"transaction": "tx", "receipt": "r3"}))
            await until(lambda: len(producer.of("RECEIPT")) == 3)

    run(scenario)
    assert _dedup_keys(store) == {"p:1": None, "p:2": None}
    assert store.check_integrity(store.claim_epoch("probe")).actual_count == 0


def test_a_queue_full_of_non_persistent_messages_pauses_its_producer_until_drained(
    store: Store, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Memory-only messages are bounded by flow control, not by dropping them."""
    monkeypatch.setattr(memory_mod, "MAX_NONPERSISTENT_BACKLOG", 10)
    monkeypatch.setattr(memory_mod, "RESUME_NONPERSISTENT_BACKLOG", 5)

    async def scenario() -> None:
        async with Master(store, settings, "a") as broker:
            producer = connect(broker)
            for i in range(10):
                send(broker, producer, "/queue/np", f"m{i}", persistent="false")
            assert producer.paused == {"flow:/queue/np"}
            consumer = connect(broker)
            broker.handle(consumer, Frame("SUBSCRIBE", {
                "destination": "/queue/np", "id": "s", "ack": "client-individual",
                "activemq.prefetchSize": "4"}))
            assert producer.paused  # 6 still waiting: above the resume mark
            first = consumer.of("MESSAGE")
            broker.handle(consumer, Frame("ACK", {"id": first[0].headers["ack"]}))
            assert not producer.paused  # 5 waiting: resumed
            assert len(broker.queues["/queue/np"]) == 5  # nothing was dropped

    run(scenario)
