"""A COMMIT the store refuses applies nothing, ACKs included (issue 12, class 2).

The real broker in-process over a real SQLite and a real PostgreSQL store, as in
``test_store_rejected``: a SEND of the transaction gets a value the store refuses
after the broker validated it (the safety net behind the edge validation). The
COMMIT's ack rows are in its unit with its inserts, so the store refuses them
together; what its ACKs settled in memory is redelivered; another client's write
in the same merged commit still commits.

Ack rows alone cannot be refused: they are integer ids the master allocated
(``DELETE ... WHERE id IN``), so "a COMMIT with only ACKs that the store refuses"
has no case; ``test_an_ack_only_commit_beside_a_refused_send_commits`` shows such
a COMMIT's unit committing on its own when a neighbour's unit is refused.
"""

from __future__ import annotations

import dataclasses

import pytest

from amqlite.codec import Frame
from amqlite.settings import Settings
from store import SqlStore
from tests.broker.test_broker_store import run, until
from tests.broker.test_hand_over import BACKENDS, QUEUE, ProbeSink, Scene, running, seed_queue
from tests.broker.test_store_rejected import poison_message, poison_sends, queue_bodies
from tests.helpers.store import assert_counters

OTHER_QUEUE = "/queue/commit-atomic"
TX = {"transaction": "t"}


async def delivered(s: Scene, body: str) -> tuple[ProbeSink, Frame]:
    """A stored message ``body`` on QUEUE, delivered to a new client-ack consumer;
    from now on a SEND whose body is "poison" carries a value the store refuses."""
    poison_sends(s.broker, poison_message(s.store.dialect))
    producer = s.client()
    s.send(producer, body, receipt="p")
    await until(lambda: producer.receipts() == ["p"])
    consumer = s.client()
    sub = s.subscribe(consumer)
    await until(lambda: not sub.source.paging and not sub.source.store_has_more)
    [message] = await s.receive(consumer, 1)
    await s.settle()
    return consumer, message


@pytest.mark.parametrize("store_url", BACKENDS, indirect=True)
def test_a_refused_commit_applies_none_of_its_acks_and_sends(
    store: SqlStore, settings: Settings
) -> None:
    """BEGIN; SEND kept; SEND memory (non-persistent); ACK m; SEND poison; COMMIT,
    with another client's SEND in the same loop iteration (one merged commit).
    The COMMIT gets an ERROR with its receipt-id; m is neither acknowledged in the
    store nor lost (another consumer gets it, redelivered); neither SEND of the
    transaction reaches the store or a consumer; the other client's message commits."""
    seed_queue(store)

    async def scenario() -> None:
        async with running(store, settings) as s:
            consumer, m = await delivered(s, "m")
            watcher = s.client()  # would see what the transaction sent to OTHER_QUEUE
            s.subscribe(watcher, destination=OTHER_QUEUE)
            other = s.client()

            s.broker.handle(consumer, Frame("BEGIN", TX))
            s.send(consumer, "kept", destination=OTHER_QUEUE, **TX)
            s.send(consumer, "memory", destination=OTHER_QUEUE, persistent="false", **TX)
            s.ack(consumer, m, **TX)
            s.send(consumer, "poison", **TX)
            s.broker.handle(consumer, Frame("COMMIT", {**TX, "receipt": "c1"}))
            s.send(other, "good", destination=OTHER_QUEUE, receipt="g1")
            assert s.broker.writes.batch.acks  # staged, in the COMMIT's unit

            await until(lambda: consumer.closed and other.receipts() == ["g1"])
            assert consumer.error_receipts == ["c1"] and "refused" in consumer.errors[0]
            assert "c1" not in consumer.receipts()
            assert s.committer.rejected == 1 and s.committer.failure is None
            assert s.master.failures == [] and not s.broker.writes.failed
            assert s.broker.stats["acked"] == 0
            await s.settle()
            assert queue_bodies(store, QUEUE) == [b"m"]  # its ack was not applied
            assert queue_bodies(store, OTHER_QUEUE) == [b"good"]  # nor "kept" stored
            assert [f.body for f in (await s.receive(watcher, 1))] == [b"good"]

            s.broker.detach(consumer)  # what the server does once the ERROR closed it
            again = s.client()
            s.subscribe(again)
            [redelivered] = await s.receive(again, 1)
            assert redelivered.body == b"m" and redelivered.headers["redelivered"] == "true"
            s.ack(again, redelivered)
            s.ack(watcher, watcher.of("MESSAGE")[0])
            await s.settle()
            # "memory" never went out, though it needed no store.
            assert watcher.bodies() == ["good"]

    run(scenario)
    assert queue_bodies(store, QUEUE) == [] and queue_bodies(store, OTHER_QUEUE) == []
    assert_counters(store)


@pytest.mark.parametrize("store_url", BACKENDS, indirect=True)
def test_a_refused_commit_does_not_dead_letter_what_it_nacked(
    store: SqlStore, settings: Settings
) -> None:
    """A NACK past the redelivery limit moves the message to the dead-letter queue
    in the COMMIT's unit: refused, the DLQ gets nothing (no copy in memory either)
    and the message is redelivered from its queue, as if the NACK never came."""
    settings = dataclasses.replace(settings, max_redeliveries=0)
    seed_queue(store)

    async def scenario() -> None:
        async with running(store, settings) as s:
            consumer, m = await delivered(s, "m")
            dlq = s.client()
            s.subscribe(dlq, destination=settings.dead_letter_queue)

            s.broker.handle(consumer, Frame("BEGIN", TX))
            s.broker.handle(consumer, Frame("NACK", {"id": m.headers["ack"], **TX}))
            s.send(consumer, "poison", **TX)
            s.broker.handle(consumer, Frame("COMMIT", {**TX, "receipt": "c1"}))
            await until(lambda: consumer.closed)
            assert consumer.error_receipts == ["c1"]
            assert s.broker.stats["dead_lettered"] == 0
            await s.settle()
            assert queue_bodies(store, settings.dead_letter_queue) == []
            assert dlq.of("MESSAGE") == []
            assert queue_bodies(store, QUEUE) == [b"m"]

            s.broker.detach(consumer)
            again = s.client()
            s.subscribe(again)
            [redelivered] = await s.receive(again, 1)
            assert redelivered.body == b"m" and redelivered.headers["redelivered"] == "true"
            s.ack(again, redelivered)
            await s.settle()
            assert dlq.of("MESSAGE") == []

    run(scenario)
    assert queue_bodies(store, QUEUE) == []
    assert_counters(store)


@pytest.mark.parametrize("store_url", BACKENDS, indirect=True)
def test_an_ack_only_commit_beside_a_refused_send_commits(
    store: SqlStore, settings: Settings
) -> None:
    """The merged commit is refused for another client's SEND: it is split along
    the units, the COMMIT's unit (its ack rows only) commits on its own and gets
    its RECEIPT, the message it acknowledged is gone from the store."""
    seed_queue(store)

    async def scenario() -> None:
        async with running(store, settings) as s:
            consumer, m = await delivered(s, "m")
            bad = s.client()

            s.broker.handle(consumer, Frame("BEGIN", TX))
            s.ack(consumer, m, **TX)
            s.broker.handle(consumer, Frame("COMMIT", {**TX, "receipt": "c1"}))
            s.send(bad, "poison", destination=OTHER_QUEUE, receipt="b1")
            await until(lambda: bad.closed and consumer.receipts() == ["c1"])
            assert bad.error_receipts == ["b1"] and not consumer.closed
            assert s.committer.rejected == 1 and s.committer.splits >= 1
            assert s.broker.stats["acked"] == 1
            await s.settle()
            assert queue_bodies(store, QUEUE) == []

    run(scenario)
    assert_counters(store)
