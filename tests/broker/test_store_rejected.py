"""One client's write the store refuses fails that client only (issue 12).

The real broker in-process over a real SQLite and a real PostgreSQL store, as
in ``test_hand_over``. The bad value is put into the message's (or another) row after the
broker built it, bypassing whatever validation the broker does at the edge:
this is the safety net behind it. Three clients write in the same loop
iteration, so their units go to the store in one merged commit, which the store
refuses and the committer splits: the two good clients get their RECEIPTs, the
bad one an ERROR carrying its receipt-id, and the broker stays master.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable

import pytest

from amqlite.broker import Broker
from amqlite.codec import Frame
from amqlite.settings import Settings
from store import SqlStore
from store.api import Batch, BatchResult, NewMessage, UnitSpan
from tests.broker.test_broker_store import FrameSink, run, until
from tests.broker.test_hand_over import BACKENDS, QUEUE, running, seed_queue
from tests.helpers.committer import SubmitThrough
from tests.helpers.store import assert_counters, sql

TOPIC = "/topic/rejected"
NEW_QUEUE = "/queue/rejected-new"


def poison_message(dialect: str) -> Callable[[NewMessage], None]:
    """What makes a message's row unstorable on ``dialect``."""
    if dialect == "sqlite":  # sqlite3: OverflowError
        def poison(m: NewMessage) -> None:
            m.producer_id, m.producer_seq = "p", 2**63
    else:  # PostgreSQL: varchar(200)
        def poison(m: NewMessage) -> None:
            m.producer_id, m.producer_seq = "p" * 300, 1
    return poison


def poison_name(dialect: str) -> str:
    """A subscription name the store refuses on ``dialect``."""
    return "\ud800" if dialect == "sqlite" else "n\x00ame"


def poison_sends(broker: Broker, poison: Callable[[NewMessage], None]) -> None:
    """The rows of messages whose body is b"poison" get ``poison`` on their way to the
    group committer, after the broker built (and validated) them."""
    committer = broker.writes.committer
    assert committer is not None
    submit = committer.submit

    def poisoned(batch: Batch, units: list[UnitSpan] | None = None
                 ) -> asyncio.Future[BatchResult]:
        for row in batch.inserts:
            if row.body == b"poison":
                poison(row)
        return submit(batch, units)

    broker.writes.committer = SubmitThrough(committer, poisoned)


def queue_bodies(store: SqlStore, queue: str) -> list[bytes]:
    rows = sql(store, "SELECT m.body FROM amq_messages m JOIN amq_destinations d "
                      "ON d.grp = m.grp AND d.id = m.destination_id "
                      "WHERE m.grp = :g AND d.name = :q ORDER BY m.id", g=store.group, q=queue)
    return [bytes(r[0]) for r in rows]


@pytest.mark.parametrize("store_url", BACKENDS, indirect=True)
@pytest.mark.parametrize("queue", [QUEUE, NEW_QUEUE], ids=["known-queue", "new-queue"])
def test_a_refused_send_fails_only_its_client(
    store: SqlStore, settings: Settings, queue: str
) -> None:
    """The bad SEND comes first: on the new queue its unit is the first to
    stage the destination row, which the good units must still create; its
    message is handed to the waiting consumer in the same commit, which must
    be taken back. The known queue takes PostgreSQL's one-round-trip path."""
    seed_queue(store)

    async def scenario() -> None:
        async with running(store, settings) as s:
            poison_sends(s.broker, poison_message(store.dialect))
            consumer = s.client()
            sub = s.subscribe(consumer, destination=queue)
            await until(lambda: not sub.source.paging and not sub.source.store_has_more)
            await s.settle()
            fast = store.fast_commits
            bad, good1, good2 = s.client(), s.client(), s.client()
            s.send(bad, "poison", destination=queue, receipt="b1")
            s.send(good1, "one", destination=queue, receipt="g1")
            s.send(good2, "two", destination=queue, receipt="g2")
            # One loop iteration: three units, one flush, one refused commit.
            await until(lambda: bad.closed and good1.receipts() == ["g1"]
                        and good2.receipts() == ["g2"])
            assert bad.receipts() == []
            assert bad.error_receipts == ["b1"]
            assert "refused" in bad.errors[0]
            assert s.committer.failure is None and s.master.failures == []
            assert s.committer.rejected == 1 and s.committer.splits >= 1
            assert not s.broker.writes.failed
            # The hand-over of the refused message was taken back.
            assert sorted(await s.consume(consumer, 2)) == ["one", "two"]
            assert sub.inflight == {}
            if queue == QUEUE and store.dialect == "postgresql":
                assert store.fast_commits > fast
            # Later writes commit, to the destination the refused unit introduced too.
            s.send(good1, "three", destination=queue, receipt="g3")
            await until(lambda: good1.receipts() == ["g1", "g3"])
            assert await s.consume(consumer, 3, start=2) != []
            await s.settle()
            assert queue not in s.broker.unconfirmed_destinations

    run(scenario)
    assert queue_bodies(store, queue) == []  # all three consumed and acknowledged
    names = [r[0] for r in sql(store, "SELECT name FROM amq_destinations WHERE grp = :g",
                               g=store.group)]
    assert names.count(queue) == 1
    assert_counters(store)


@pytest.mark.parametrize("store_url", BACKENDS, indirect=True)
def test_refused_sends_leave_the_queue_consistent_for_the_next_master(
    store: SqlStore, settings: Settings
) -> None:
    """Nobody consumes: what the good clients sent is stored, in order, and
    what the refused one sent is not; the next activation finds exactly that."""

    async def scenario() -> None:
        async with running(store, settings) as s:
            poison_sends(s.broker, poison_message(store.dialect))
            clients = [s.client() for _ in range(6)]
            for i, c in enumerate(clients):
                body = "poison" if i in (1, 4) else f"m{i}"
                s.send(c, body, destination=NEW_QUEUE, receipt=f"r{i}")
            await until(lambda: all(c.closed or c.receipts() for c in clients))
            assert [bool(c.receipts()) for c in clients] == [True, False, True, True, False,
                                                             True]
            assert s.committer.rejected == 2 and s.master.failures == []

    run(scenario)
    assert queue_bodies(store, NEW_QUEUE) == [b"m0", b"m2", b"m3", b"m5"]
    assert_counters(store)

    async def next_master() -> None:
        async with running(store, settings, name="b") as s:
            consumer = s.client()
            s.subscribe(consumer, destination=NEW_QUEUE)
            assert await s.consume(consumer, 4) == ["m0", "m2", "m3", "m5"]
            await s.settle()

    run(next_master)
    assert queue_bodies(store, NEW_QUEUE) == []


@pytest.mark.parametrize("store_url", BACKENDS, indirect=True)
def test_a_refused_durable_subscribe_fails_only_its_client(
    store: SqlStore, settings: Settings
) -> None:
    """The SUBSCRIBE's row is refused: that client gets an ERROR with its
    receipt-id and no RECEIPT, the broker forgets the subscription, and a
    message published meanwhile (whose insert owed it to that subscription)
    is committed for the producer and cleaned up, not left owed to nobody."""

    async def scenario() -> None:
        async with running(store, settings) as s:
            broker = s.broker
            bad = FrameSink(client_id="c-bad")
            broker.attach(bad)
            broker.handle(bad, Frame("SUBSCRIBE", {
                "destination": TOPIC, "id": "d", "ack": "client-individual",
                "activemq.subscriptionName": "durable", "receipt": "s1"}))
            # Bypass the edge: the staged row gets a name the store refuses.
            rows = broker.writes.batch.subscriptions
            rows[-1] = dataclasses.replace(rows[-1], name=poison_name(store.dialect))
            producer = s.client()
            s.send(producer, "pub", destination=TOPIC, receipt="p1")
            await until(lambda: bad.closed and producer.receipts() == ["p1"])
            assert bad.error_receipts == ["s1"] and bad.of("RECEIPT") == []
            assert ("c-bad", "durable") not in broker.durables
            assert broker.durables_by_topic.get(TOPIC, []) == []
            assert s.committer.failure is None and s.master.failures == []
            await s.settle()
            # A good durable subscription on the same topic works afterwards.
            good = FrameSink(client_id="c-good")
            broker.attach(good)
            broker.handle(good, Frame("SUBSCRIBE", {
                "destination": TOPIC, "id": "d", "ack": "client-individual",
                "activemq.subscriptionName": "durable", "receipt": "s2"}))
            await until(lambda: [f.headers["receipt-id"] for f in good.of("RECEIPT")] == ["s2"])
            s.send(producer, "pub2", destination=TOPIC, receipt="p2")
            await until(lambda: len(good.of("MESSAGE")) == 1)
            assert good.of("MESSAGE")[0].body == b"pub2"
            await s.settle()

    run(scenario)
    subs = sql(store, "SELECT client_id, name FROM amq_subscriptions WHERE grp = :g",
               g=store.group)
    assert subs == [("c-good", "durable")]
    # "pub" was owed only to the refused subscription: gone with its cleanup.
    assert sql(store, "SELECT body FROM amq_messages WHERE grp = :g", g=store.group) \
        in ([(b"pub2",)], [(memoryview(b"pub2"),)])
    assert_counters(store)



@pytest.mark.parametrize("store_url", BACKENDS, indirect=True)
def test_a_durable_moved_to_another_topic_is_not_refused(
    store: SqlStore, settings: Settings
) -> None:
    """Re-subscribing a durable name to another topic removes the old row and
    creates a new one with the same (client-id, name) in one batch; applied in
    the batch's fixed order (create first) the store refuses it, and the split
    (the removal first, then the SUBSCRIBE's unit) must make it go through."""

    async def scenario() -> None:
        async with running(store, settings) as s:
            broker = s.broker
            client = FrameSink(client_id="c1")
            broker.attach(client)

            def subscribe(topic: str, sub_id: str, receipt: str) -> None:
                broker.handle(client, Frame("SUBSCRIBE", {
                    "destination": topic, "id": sub_id, "ack": "client-individual",
                    "activemq.subscriptionName": "d", "receipt": receipt}))

            subscribe(TOPIC, "a", "s1")
            await until(lambda: len(client.of("RECEIPT")) == 1)
            broker.handle(client, Frame("UNSUBSCRIBE", {"id": "a", "receipt": "u1"}))
            await until(lambda: len(client.of("RECEIPT")) == 2)
            subscribe(TOPIC + "-2", "b", "s2")
            await until(lambda: len(client.of("RECEIPT")) == 3 or client.closed)
            assert not client.closed, client.errors
            assert s.master.failures == []
            assert s.committer.splits >= 1 and s.committer.rejected == 0
            await s.settle()

    run(scenario)
    rows = sql(store, "SELECT s.client_id, s.name, d.name FROM amq_subscriptions s "
                      "JOIN amq_destinations d ON d.grp = s.grp AND d.id = s.destination_id "
                      "WHERE s.grp = :g", g=store.group)
    assert rows == [("c1", "d", TOPIC + "-2")]
    assert_counters(store)
