"""The hand-over: a persistent SEND to a queue with a consumer waiting is
delivered in the commit that stores it (see ``Broker._send``/``_hand_over``).

The real broker runs in-process against a real store and group committer, as
in ``test_broker_store``. Clients are ``ProbeSink``s: for every frame the broker
writes they note how many commits the committer had made and what the store
held for that message at that moment, so "written only after the commit that
stored it as delivered" is something we can assert rather than infer.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable
from typing import NamedTuple

import pytest

from amqlite.broker import Broker, Subscription, now_ms
from amqlite.codec import Frame
from amqlite.settings import Settings
from store import Batch, DestinationRow, GroupCommitter, NewMessage, SqlStore
from tests.broker.test_broker_store import FrameSink, Master, connect, run, send, until
from tests.helpers.store import sql

QUEUE = "/queue/hand"
BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.integration)]


# The fixtures store_url, settings and store are tests/broker/conftest.py's.


# -- observing the broker and the store ----------------------------------------------------


class Row(NamedTuple):
    delivery_count: int
    inflight_epoch: int | None


class Snapshot(NamedTuple):
    """What was true when the broker wrote a frame."""

    commits: int  # transactions the group committer had committed
    row: Row | None  # the stored message (MESSAGE frames only)


class ProbeSink(FrameSink):
    """A client that snapshots the committer and the store at each frame written."""

    def __init__(self, probe: Callable[[Frame], Snapshot]) -> None:
        super().__init__()
        self.probe = probe
        self.snapshots: dict[str, Snapshot] = {}  # by message-id or receipt-id

    def write_frame(self, frame: Frame) -> None:
        key = frame.headers.get("message-id") or frame.headers.get("receipt-id", "")
        self.snapshots[key] = self.probe(frame)
        super().write_frame(frame)

    def bodies(self) -> list[str]:
        return [f.body.decode() for f in self.of("MESSAGE")]

    def receipts(self) -> list[str]:
        return [f.headers["receipt-id"] for f in self.of("RECEIPT")]


def stored_row(store: SqlStore, message_id: str) -> Row | None:
    rows = sql(store, "SELECT delivery_count, inflight_epoch FROM amq_messages "
                      "WHERE grp = :g AND message_id = :m", g=store.group, m=message_id)
    return Row(*rows[0]) if rows else None


def queue_rows(store: SqlStore) -> int:
    return len(sql(store, "SELECT m.id FROM amq_messages m JOIN amq_destinations d "
                          "ON d.grp = m.grp AND d.id = m.destination_id "
                          "WHERE m.grp = :g AND d.name = :q", g=store.group, q=QUEUE))


def seed_queue(store: SqlStore) -> None:
    """Create QUEUE before the master starts: its later batches then create no
    destination, which is what lets PostgreSQL take the pipelined path."""
    epoch = store.claim_epoch("seed")
    store.commit_batch(epoch, Batch(destinations=[DestinationRow(1, QUEUE, "queue")]))


class Scene:
    """A running master and the few things these tests do with it."""

    def __init__(self, master: Master, store: SqlStore) -> None:
        self.master = master
        self.store = store

    @property
    def broker(self) -> Broker:
        return self.master.broker

    @property
    def committer(self) -> GroupCommitter:
        return self.master.committer

    @property
    def epoch(self) -> int:
        return self.broker.epoch

    def snapshot(self, frame: Frame) -> Snapshot:
        row = stored_row(self.store, frame.headers["message-id"]) \
            if frame.command == "MESSAGE" else None
        return Snapshot(self.committer.commits, row)

    def client(self) -> ProbeSink:
        client = ProbeSink(self.snapshot)
        self.broker.attach(client)
        return client

    def subscribe(self, client: ProbeSink, ack: str = "client-individual",
                  prefetch: int = 10, destination: str = QUEUE) -> Subscription:
        self.broker.handle(client, Frame("SUBSCRIBE", {
            "destination": destination, "id": "s", "ack": ack,
            "activemq.prefetchSize": str(prefetch)}))
        return self.broker.sessions[client].subscriptions["s"]

    def send(self, client: ProbeSink, body: str, destination: str = QUEUE,
             **headers: str) -> None:
        self.broker.handle(client, Frame("SEND", {"destination": destination, **headers},
                                         body.encode()))

    def ack(self, client: ProbeSink, message: Frame, **headers: str) -> None:
        self.broker.handle(client, Frame("ACK", {"id": message.headers["ack"], **headers}))

    def staged(self) -> NewMessage:
        """The last insert staged and not yet committed."""
        return self.broker.writes.batch.inserts[-1]

    async def settle(self) -> None:
        """Until every staged write committed, including writes its callbacks staged."""
        writes = self.broker.writes
        for _ in range(20):
            writes.flush()
            await self.committer.drain()
            if not (len(writes.batch) or writes.units or writes.callbacks
                    or writes.inflight_batches):
                return
        raise AssertionError("the broker keeps staging writes")

    async def receive(self, client: ProbeSink, count: int) -> list[Frame]:
        await until(lambda: len(client.of("MESSAGE")) >= count)
        return client.of("MESSAGE")

    async def consume(self, client: ProbeSink, count: int, start: int = 0) -> list[str]:
        """Receive and ACK one at a time until ``count`` messages arrived (the
        first ``start`` were acknowledged already)."""
        for i in range(start, count):
            message = (await self.receive(client, i + 1))[i]
            self.ack(client, message)
        return client.bodies()


@contextlib.asynccontextmanager
async def running(store: SqlStore, settings: Settings, name: str = "a") -> AsyncIterator[Scene]:
    master = Master(store, settings, name)
    async with master:
        yield Scene(master, store)


def message_id(frame: Frame) -> str:
    return frame.headers["message-id"]


def assert_first_delivery(*frames: Frame) -> None:
    for f in frames:
        assert "redelivered" not in f.headers, f.headers
        assert "amqlite.deliveryCount" not in f.headers, f.headers


# -- 1. the hand-over itself ---------------------------------------------------------------


@pytest.mark.parametrize("store_url", BACKENDS, indirect=True)
def test_waiting_consumer_gets_the_message_in_the_commit_that_stores_it(
    store: SqlStore, settings: Settings
) -> None:
    """One commit stores the message as delivered; the MESSAGE and the RECEIPT
    leave only after it, and no second write records the delivery."""
    seed_queue(store)  # recovered, so the queue must page (empty) before handing over

    async def scenario() -> None:
        async with running(store, settings) as s:
            consumer, producer = s.client(), s.client()
            s.subscribe(consumer)
            queue = s.broker.queues[QUEUE]
            await until(lambda: not queue.store_has_more and not queue.paging)
            await s.settle()
            commits, fast = s.committer.commits, store.fast_commits

            s.send(producer, "hello", receipt="r1")
            assert s.staged().delivery_count == 1  # handed over in the insert itself
            assert not s.broker.writes.batch.deliveries
            assert consumer.frames == []  # nothing written before the commit
            await until(lambda: producer.receipts() == ["r1"])
            await s.settle()

            [message] = consumer.of("MESSAGE")
            assert message.body == b"hello"
            assert_first_delivery(message)
            handed = Row(delivery_count=1, inflight_epoch=s.epoch)
            # written after the one commit that stored it as delivered, with the RECEIPT
            assert consumer.snapshots[message_id(message)] == Snapshot(commits + 1, handed)
            assert producer.snapshots["r1"].commits == commits + 1
            assert s.committer.commits == commits + 1  # no separate delivery write
            if store.dialect == "postgresql":
                assert store.fast_commits == fast + 1
            assert stored_row(store, message_id(message)) == handed

            s.ack(consumer, message, receipt="a1")
            await until(lambda: consumer.receipts() == ["a1"])
            assert stored_row(store, message_id(message)) is None
            assert queue_rows(store) == 0

    run(scenario)


# -- 2. queue order ------------------------------------------------------------------------


def test_a_consumer_without_credit_gets_the_backlog_in_send_order(
    store: SqlStore, settings: Settings
) -> None:
    """m1 waits for its commit when the consumer gets credit back (the ACK of m0,
    same loop turn): m2, sent after that ACK, must not be handed over ahead of m1."""

    async def scenario() -> None:
        async with running(store, settings) as s:
            consumer, producer = s.client(), s.client()
            s.subscribe(consumer, prefetch=1)
            s.send(producer, "m0")
            [m0] = await s.receive(consumer, 1)

            s.send(producer, "m1")  # no credit: queued after its commit
            s.ack(consumer, m0)  # credit again, nothing in memory to give yet
            s.send(producer, "m2")
            assert s.staged().delivery_count == 0  # not handed over ahead of m1
            s.send(producer, "m3", receipt="r3")

            assert await s.consume(consumer, 4, start=1) == ["m0", "m1", "m2", "m3"]
            assert_first_delivery(*consumer.of("MESSAGE"))
            await until(lambda: producer.receipts() == ["r3"])
            await s.settle()
            assert queue_rows(store) == 0

    run(scenario)


def test_a_backlog_still_in_the_store_goes_before_a_new_message(
    store: SqlStore, settings: Settings
) -> None:
    """After a restart the backlog is in the store only: a SEND in the turn of
    the first SUBSCRIBE finds the queue paging and must queue behind it."""

    async def fill() -> None:
        async with running(store, settings) as s:
            producer = s.client()
            for i in range(3):
                s.send(producer, f"m{i}", receipt=f"r{i}")
            await until(lambda: len(producer.receipts()) == 3)

    async def restart() -> None:
        async with running(store, settings, "b") as s:
            consumer, producer = s.client(), s.client()
            s.subscribe(consumer)
            s.send(producer, "m3")
            assert s.staged().delivery_count == 0
            assert await s.consume(consumer, 4) == ["m0", "m1", "m2", "m3"]
            assert_first_delivery(*consumer.of("MESSAGE"))

    run(fill)
    run(restart)


# -- 3. the subscription closes before the commit ------------------------------------------


def close_by_unsubscribe(s: Scene, client: ProbeSink) -> None:
    s.broker.handle(client, Frame("UNSUBSCRIBE", {"id": "s"}))


def close_by_detach(s: Scene, client: ProbeSink) -> None:
    client.closed = True
    s.broker.detach(client)


@pytest.mark.parametrize("subscribe_later", [False, True], ids=["same-turn", "after-release"])
@pytest.mark.parametrize("close", [close_by_unsubscribe, close_by_detach])
def test_a_message_handed_to_a_subscription_closed_before_the_commit_is_not_lost(
    store: SqlStore, settings: Settings, close: Callable[[Scene, ProbeSink], None],
    subscribe_later: bool,
) -> None:
    """Staging and the close happen in one loop turn, before the flush
    (``call_soon``) submits the batch: the close falls between staging and
    commit. The commit releases the message and requeues it as never seen; the
    next consumer subscribes in that same turn, or once the release committed."""

    async def scenario() -> None:
        async with running(store, settings) as s:
            gone, other, producer = s.client(), s.client(), s.client()
            s.subscribe(gone)
            s.send(producer, "m", receipt="r")
            handed = s.staged()
            assert handed.delivery_count == 1  # handed to `gone`, not committed
            close(s, gone)
            if subscribe_later:
                await until(lambda: producer.receipts() == ["r"])
                await s.settle()
                row = stored_row(store, handed.message_id)
                assert row is not None and row.inflight_epoch is None  # released
            s.subscribe(other)

            [message] = await s.receive(other, 1)
            assert message.body == b"m"
            assert_first_delivery(message)
            assert gone.of("MESSAGE") == []
            await until(lambda: producer.receipts() == ["r"])
            # recorded as delivered to `other` before it was written
            written = other.snapshots[message_id(message)]
            assert written.row is not None and written.row.inflight_epoch == s.epoch

            s.ack(other, message, receipt="a")
            await until(lambda: other.receipts() == ["a"])
            await s.settle()
            assert len(other.of("MESSAGE")) == 1  # exactly once
            assert queue_rows(store) == 0

    run(scenario)


# -- 4. duplicates -------------------------------------------------------------------------


@pytest.mark.parametrize("same_commit", [False, True], ids=["stored-earlier", "same-commit"])
def test_a_duplicate_handed_over_reaches_nobody_and_costs_no_credit(
    store: SqlStore, settings: Settings, same_commit: bool
) -> None:
    """The replay is handed over before the store says it is a duplicate; then
    it is dropped, and its prefetch slot is free again."""
    first = {"amqlite.producerId": "p", "amqlite.producerSeq": "1"}
    second = {"amqlite.producerId": "p", "amqlite.producerSeq": "2"}

    async def scenario() -> None:
        async with running(store, settings) as s:
            consumer, producer = s.client(), s.client()
            sub = s.subscribe(consumer, prefetch=2)
            s.send(producer, "original", receipt="r1", **first)
            if not same_commit:
                await s.receive(consumer, 1)  # stored and in flight, not acked
            s.send(producer, "replay", receipt="r2", **first)
            assert s.staged().delivery_count == 1  # handed over: the consumer had credit
            await until(lambda: producer.receipts() == ["r1", "r2"])
            assert s.broker.stats["duplicates"] == 1

            s.send(producer, "next", receipt="r3", **second)  # needs the freed slot
            await s.receive(consumer, 2)
            await s.settle()
            assert consumer.bodies() == ["original", "next"]
            assert len(sub.inflight) == 2
            assert queue_rows(store) == 2

    run(scenario)


# -- 5. auto-ack consumers -----------------------------------------------------------------


@pytest.mark.parametrize("other_ack", ["auto", "client-individual"])
def test_auto_ack_consumers_are_not_handed_over_and_keep_their_turn(
    store: SqlStore, settings: Settings, other_ack: str
) -> None:
    """An auto-ack consumer gets its message from the dispatch after the commit,
    stored as not delivered, and the skipped hand-over does not cost it its
    round-robin turn (one message per commit, so the turns are observable)."""

    async def scenario() -> None:
        async with running(store, settings) as s:
            auto, other, producer = s.client(), s.client(), s.client()
            s.subscribe(auto, ack="auto")
            s.subscribe(other, ack=other_ack)
            for i in range(4):
                s.send(producer, f"m{i}", receipt=f"r{i}")
                handed = other_ack != "auto" and i % 2 == 1  # `other`'s turn
                assert s.staged().delivery_count == int(handed)
                await until(lambda n=i: len(producer.receipts()) == n + 1)

            assert auto.bodies() == ["m0", "m2"]
            assert other.bodies() == ["m1", "m3"]
            not_delivered, handed_over = Row(0, None), Row(1, s.epoch)
            expected = {auto: not_delivered,
                        other: not_delivered if other_ack == "auto" else handed_over}
            for client, row in expected.items():  # as stored when the MESSAGE was written
                assert [client.snapshots[message_id(f)].row for f in client.of("MESSAGE")] \
                    == [row, row]
            await s.settle()
            assert queue_rows(store) == (0 if other_ack == "auto" else 2)

    run(scenario)


# -- 6. a paused broker --------------------------------------------------------------------


def test_a_paused_broker_does_not_hand_over_and_delivers_after_resume(
    store: SqlStore, settings: Settings
) -> None:
    """Paused, nothing is dispatched nor committed; on resume the message is
    stored, then delivered by its own delivery write (two commits)."""

    async def scenario() -> None:
        async with running(store, settings) as s:
            consumer, producer = s.client(), s.client()
            sub = s.subscribe(consumer)
            await s.settle()
            commits = s.committer.commits

            s.broker.pause()
            s.send(producer, "m", receipt="r")
            assert s.staged().delivery_count == 0
            assert not sub.inflight
            await s.committer.drain()  # the held flush has run: still nothing committed
            assert s.committer.commits == commits
            assert consumer.frames == [] and producer.frames == []

            s.broker.resume()
            [message] = await s.receive(consumer, 1)
            await until(lambda: producer.receipts() == ["r"])
            assert_first_delivery(message)
            assert consumer.snapshots[message_id(message)] == \
                Snapshot(commits + 2, Row(1, s.epoch))
            assert producer.snapshots["r"].commits == commits + 1

    run(scenario)


# -- known problems ------------------------------------------------------------------------
# Regressions: each of these failed before its fix (found while testing the hand-over).


def test_a_requeued_orphan_counts_only_the_deliveries_made_after_a_failover(
    store: SqlStore, settings: Settings
) -> None:
    """The message reached one consumer, once: a new master must call its next
    delivery the second (deliveryCount 2), not the third; max_redeliveries
    would otherwise dead-letter it one delivery early."""
    rows: list[tuple[Row | None, Row]] = []  # (stored at its first delivery, expected)

    async def first() -> None:
        async with running(store, settings) as s:
            gone, other, producer = s.client(), s.client(), s.client()
            s.subscribe(gone)
            s.send(producer, "m", receipt="r")
            close_by_unsubscribe(s, gone)
            s.subscribe(other)
            [message] = await s.receive(other, 1)
            assert_first_delivery(message)
            rows.append((other.snapshots[message_id(message)].row, Row(1, s.epoch)))
            # the "crash": `other` never acknowledges

    async def failover() -> None:
        async with running(store, settings, "b") as s:
            consumer = s.client()
            s.subscribe(consumer, ack="auto")
            [message] = await s.receive(consumer, 1)
            [(stored, expected)] = rows
            header = message.headers.get("amqlite.deliveryCount")
            assert (stored, header) == (expected, "2")

    run(first)
    run(failover)


def test_a_cumulative_ack_does_not_cover_a_handed_message_not_yet_written(
    store: SqlStore, settings: Settings
) -> None:
    """A non-persistent message overtakes the pending hand-over; acknowledging it
    (ack=client) must not acknowledge the one the client has not received."""

    async def scenario() -> None:
        async with running(store, settings) as s:
            consumer, producer = s.client(), s.client()
            s.subscribe(consumer, ack="client")
            s.send(producer, "stored", receipt="r")  # handed over, pending
            s.send(producer, "fast", persistent="false")  # written at once
            [fast] = consumer.of("MESSAGE")
            s.ack(consumer, fast, receipt="a1")
            stored = (await s.receive(consumer, 2))[1]
            assert stored.body == b"stored"
            s.ack(consumer, stored, receipt="a2")  # BrokerError today: already acked
            await until(lambda: consumer.receipts() == ["a1", "a2"])

    run(scenario)


def test_a_cumulative_ack_does_not_cover_a_delivery_not_yet_written(
    store: SqlStore, settings: Settings
) -> None:
    """The same race on the ordinary path loses a RECEIPTed message: it is
    acknowledged (deleted) and never written to anyone."""

    async def scenario() -> None:
        async with running(store, settings) as s:
            consumer, producer = s.client(), s.client()
            s.send(producer, "stored", receipt="r")
            await until(lambda: producer.receipts() == ["r"])
            s.subscribe(consumer, ack="client")  # delivery of "stored" staged
            s.send(producer, "fast", persistent="false")  # written at once
            [fast] = consumer.of("MESSAGE")
            s.ack(consumer, fast, receipt="a1")
            await until(lambda: consumer.receipts() == ["a1"])
            await s.settle()
            assert (consumer.bodies(), queue_rows(store)) == (["fast", "stored"], 1)

    run(scenario)


@pytest.mark.parametrize("ack", ["auto", "client-individual"])
def test_a_message_expired_on_arrival_is_not_delivered(
    store: SqlStore, settings: Settings, ack: str
) -> None:
    """JMS expiry is absolute: with a producer's clock ahead, a message can
    arrive expired. Dispatch drops it; a hand-over must too."""

    async def scenario() -> None:
        async with running(store, settings) as s:
            consumer, producer = s.client(), s.client()
            s.subscribe(consumer, ack=ack)
            s.send(producer, "late", receipt="r", expires=str(now_ms() - 1000))
            await until(lambda: producer.receipts() == ["r"])
            await s.settle()  # a delivery would have been written by now
            assert (consumer.bodies(), s.broker.stats["expired"]) == ([], 1)

    run(scenario)


def test_a_dead_lettered_message_is_not_overtaken_by_a_hand_over(
    store: SqlStore, settings: Settings
) -> None:
    """A NACK past max_redeliveries stores a copy in the DLQ; a SEND to the DLQ
    in the same turn comes after it in queue order."""
    settings = dataclasses.replace(settings, max_redeliveries=0)
    dlq = settings.dead_letter_queue

    async def scenario() -> None:
        async with running(store, settings) as s:
            source, dead, producer = s.client(), s.client(), s.client()
            s.subscribe(source)
            s.subscribe(dead, destination=dlq)
            s.send(producer, "dead")
            [message] = await s.receive(source, 1)
            s.broker.handle(source, Frame("NACK", {"id": message.headers["ack"]}))
            s.send(producer, "direct", destination=dlq)
            await s.receive(dead, 2)
            assert dead.bodies() == ["dead", "direct"]

    run(scenario)


def test_a_handed_over_message_is_behind_the_pager_cursor(store: SqlStore, settings: Settings
                                                         ) -> None:
    """Pages load ids past the queue's cursor; a message handed over in the commit that
    stores it is in flight, so the cursor must be past it or a later page (once the queue
    pages again) would deliver it a second time."""
    async def scenario() -> None:
        async with Master(store, settings, "a") as broker:
            consumer = connect(broker)
            broker.handle(consumer, Frame("SUBSCRIBE", {"destination": QUEUE, "id": "s",
                                                        "ack": "client-individual"}))
            producer = connect(broker)
            send(broker, producer, QUEUE, "handed", receipt="r")
            await until(lambda: len(consumer.of("MESSAGE")) == 1)
            q = broker.queues[QUEUE]
            [delivery] = q.consumers[0].inflight.values()
            assert q.cursor >= delivery.message.id
            assert store.load_page(q.store_id, q.cursor, 10) == []

    run(scenario)
