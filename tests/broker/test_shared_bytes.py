"""A message held by several sources is counted once broker-wide (issue 23, item 1).

Each of a topic's subscribers gets its own copy of a message, sharing one body: the
broker-wide ``waiting_bytes`` adds its ``size`` once and ``MESSAGE_OVERHEAD`` for each
further copy (``message.hold``); each source's own ``bytes`` keeps the whole size, for
its own limits. Every path a message leaves a source by gives back what it added, so the
figure is back to 0 when the last holder lets go: pop (a delivery), take (a selective
dispatch), drop (an operator's purge), evict (given back to the store), discard (an
UNSUBSCRIBE, or a connection's close). Copies in flight unacknowledged count the same
way in the held bytes (``message.track``), each connection the whole size (its share).

The RSS side (a dozen stuck topic subscribers, one that reads and misses nothing) runs
against a real broker in tests/integration/test_held_broker_wide.py.
"""

from __future__ import annotations

import heapq
from pathlib import Path

import pytest

from amqlite.broker.message import MESSAGE_OVERHEAD, Message
from amqlite.broker.source import MIN_IN_MEMORY, Source
from amqlite.codec import Frame
from amqlite.settings import Settings
from store import Store
from tests.broker.test_broker_store import Master, connect, run, send, until
from tests.broker.test_memory_accounting import slow_topic_subscriber

KIB = 1024
BODY = "x" * (16 * KIB)
#: Slow subscribers of one topic, and the messages each holds.
HOLDERS = 3
MESSAGES = 3


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """Budgets that hold every copy as one body, not as HOLDERS bodies: 128 KiB per
    destination, 160 KiB for the broker (3 x 3 x 16 KiB would be 144 KiB)."""
    return Settings(group="g1", data_dir=str(tmp_path), max_memory=160 * KIB,
                    max_destination_memory=128 * KIB).resolved()


def test_a_topic_message_waiting_for_many_subscribers_is_counted_once(
        store: Store, settings: Settings) -> None:
    async def scenario() -> None:
        async with Master(store, settings, "a") as broker:
            slow = [slow_topic_subscriber(broker, "/topic/shared") for _ in range(HOLDERS)]
            producer = connect(broker)
            for _ in range(MESSAGES):
                send(broker, producer, "/topic/shared", BODY, persistent="false")
            sources = list(broker.topics["/topic/shared"])
            size = sources[0].heap[0][2].size
            assert [len(s) for s in sources] == [MESSAGES] * HOLDERS  # none dropped
            assert [s.bytes for s in sources] == [MESSAGES * size] * HOLDERS

            def shared(holders: int) -> int:
                return MESSAGES * (size + (holders - 1) * MESSAGE_OVERHEAD) if holders else 0

            assert broker.waiting_bytes == shared(HOLDERS)
            # pop: one subscriber reads again and takes its copies
            slow[0].can_write = lambda: True  # type: ignore[method-assign]
            broker.connection_writable(slow[0])
            assert len(slow[0].of("MESSAGE")) == MESSAGES
            assert broker.waiting_bytes == shared(HOLDERS - 1)
            # discard, by UNSUBSCRIBE: one of the two holders left
            broker.handle(slow[1], Frame("UNSUBSCRIBE", {"id": "s"}))
            assert broker.waiting_bytes == shared(HOLDERS - 2)
            # discard, by the connection's close: the last holder
            broker.detach(slow[2])
            assert broker.waiting_bytes == 0
            assert broker.memory.used == 0

    run(scenario)


@pytest.fixture
def roomy_settings(tmp_path: Path) -> Settings:
    """A connection's share of deliveries (1/32 of max_memory) takes MESSAGES."""
    return Settings(group="g1", data_dir=str(tmp_path), max_memory=4 * KIB * KIB,
                    max_destination_memory=KIB * KIB).resolved()


def test_a_topic_message_unacknowledged_by_many_subscribers_is_held_once(
        store: Store, roomy_settings: Settings) -> None:
    """Client-ack subscribers of one topic each have a copy in flight: the held bytes
    count the body once and each further copy's overhead; each subscription and its
    connection count the whole message (their own shares). ACKs and a close give back
    their part, the last one the body."""
    async def scenario() -> None:
        async with Master(store, roomy_settings, "a") as broker:
            subs = [connect(broker) for _ in range(HOLDERS)]
            for c in subs:
                broker.handle(c, Frame("SUBSCRIBE", {
                    "destination": "/topic/acked", "id": "s", "ack": "client",
                    "activemq.prefetchSize": str(MESSAGES)}))
            producer = connect(broker)
            for _ in range(MESSAGES):
                send(broker, producer, "/topic/acked", BODY, persistent="false")
            sessions = [broker.sessions[c] for c in subs]
            size = next(iter(sessions[0].subscriptions["s"].inflight.values())).message.size
            assert [s.inflight_bytes for s in sessions] == [MESSAGES * size] * HOLDERS
            assert broker.waiting_bytes == 0

            def held(holders: int) -> int:
                return MESSAGES * (size + (holders - 1) * MESSAGE_OVERHEAD) if holders else 0

            assert broker.memory.held_bytes == held(HOLDERS)
            broker.handle(subs[0], Frame("ACK", {"id": subs[0].of("MESSAGE")[-1]
                                                 .headers["ack"]}))  # cumulative: all
            assert sessions[0].inflight_bytes == 0
            assert broker.memory.held_bytes == held(HOLDERS - 1)
            broker.detach(subs[1])  # a close gives its deliveries back (dropped: a topic)
            assert broker.memory.held_bytes == held(HOLDERS - 2)
            broker.handle(subs[2], Frame("ACK", {"id": subs[2].of("MESSAGE")[-1]
                                                 .headers["ack"]}))
            assert broker.memory.held_bytes == 0
            assert broker.memory.used == 0

    run(scenario)


def _stored(n: int) -> Message:
    return Message(n, "/topic/d", f"m-{n}", {}, b"y" * KIB, 4, 0, True)


def test_every_way_out_of_a_source_gives_back_what_its_copy_added(
        store: Store, settings: Settings) -> None:
    """Two stored sources (durable subscriptions of one topic) holding copies of the same
    messages: take, drop and evict give back a copy's overhead while the other holds
    it, the whole size once it is the last; the figure ends at 0."""
    async def scenario() -> None:
        async with Master(store, settings, "a") as broker:
            a = Source(broker, "/topic/d", 1, stored=True)
            b = Source(broker, "/topic/d", 2, stored=True)
            count = MIN_IN_MEMORY + 4
            originals = [_stored(n) for n in range(1, count + 1)]
            for m in originals:
                a.push(m.copy())
                b.push(m.copy())
            size = originals[0].size
            memory = broker.memory
            assert a.bytes == b.bytes == count * size
            assert memory.waiting_bytes == count * (size + MESSAGE_OVERHEAD)

            # take (a selective dispatch's path): a's first; b still holds it
            taken = a.take(heapq.heappop(a.heap))
            assert taken.id == 1 and a.bytes == (count - 1) * size
            assert memory.waiting_bytes == count * (size + MESSAGE_OVERHEAD) - MESSAGE_OVERHEAD
            # drop (an operator's purge): b's first, the last holder of message 1
            assert [m.id for m in b.drop(lambda m: m.id == 1)] == [1]
            assert memory.waiting_bytes == (count - 1) * (size + MESSAGE_OVERHEAD)

            # evict: a gives back its newest copies, b still holds them: only overheads
            freed = a.evict(2 * size)
            evicted = {m.id for m in originals} - {e[2].id for e in a.heap} - {1}
            assert freed == len(evicted) * MESSAGE_OVERHEAD and evicted
            waiting = (count - 1) * (size + MESSAGE_OVERHEAD) - freed
            assert memory.waiting_bytes == waiting
            # ... and then b, the last holder of the same ones: the whole size each
            freed = b.evict(len(evicted) * size)
            assert freed == len(evicted) * size
            assert memory.waiting_bytes == waiting - freed

            # pop, then discard of what is left in both
            popped = a.pop()
            assert popped is not None
            assert memory.waiting_bytes == waiting - freed - MESSAGE_OVERHEAD
            a.discard()
            b.discard()
            assert a.bytes == b.bytes == 0
            assert memory.waiting_bytes == 0
            assert all(m.holders == 0 for m in originals)

    run(scenario)


@pytest.fixture
def small_settings(tmp_path: Path) -> Settings:
    return Settings(group="g1", data_dir=str(tmp_path), max_memory=48 * KIB,
                    max_destination_memory=48 * KIB).resolved()


def test_a_topic_subscriber_behind_takes_the_room_of_stored_messages(
        store: Store, small_settings: Settings) -> None:
    """A queue's stored messages fill the broker's budget: a topic subscriber that is a
    message behind does not miss the next one; stored messages go back to the store
    (they are paged in again), as for a transaction."""
    async def scenario() -> None:
        async with Master(store, small_settings, "a") as broker:
            producer = connect(broker)
            for n in range(3 * MIN_IN_MEMORY):  # one at a time: none is pending with another
                send(broker, producer, "/queue/stored", f"{n}:" + "q" * KIB,
                     persistent="true", receipt=f"r{n}")
                await until(lambda: len(producer.of("RECEIPT")) == n + 1)  # noqa: B023
            queue = broker.queues["/queue/stored"]
            assert queue.store_has_more
            assert queue.in_memory_stored > MIN_IN_MEMORY
            assert broker.memory.used >= broker.memory.memory_budget
            in_memory = queue.in_memory_stored
            slow_topic_subscriber(broker, "/topic/behind")
            for n in range(2):
                send(broker, producer, "/topic/behind", f"{n}:" + "t" * KIB,
                     persistent="false")
            [source] = broker.topics["/topic/behind"]
            assert len(source) == 2 and source.dropped == 0
            assert queue.in_memory_stored < in_memory  # given back to the store

    run(scenario)
