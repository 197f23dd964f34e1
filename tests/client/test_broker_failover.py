"""The client against real ``amqlite start`` processes: a master/slave pair on one data
directory. The promise: every message whose RECEIPT the producer got is stored exactly once,
whether the master is SIGKILLed or stopped while sends are in flight."""

from __future__ import annotations

import asyncio

import pytest

from amqlite.client import AsyncClient
from tests.helpers.broker_proc import BrokerFactory, BrokerProcess, start_pair, unique
from tests.helpers.client import RecordingListener, async_test

pytestmark = pytest.mark.integration

MESSAGES = 150
#: Sends in flight at once, so the master dies with some of them unconfirmed.
IN_FLIGHT = 20
#: The master is killed after this many RECEIPTs.
KILL_AFTER = 50
#: How long the consumer waits for a missing message before declaring it lost.
QUIET = 5.0


def pair_url(a: BrokerProcess, b: BrokerProcess) -> str:
    return (f"failover:(tcp://127.0.0.1:{a.port},tcp://127.0.0.1:{b.port})"
            "?randomize=false&initialReconnectDelay=50&maxReconnectDelay=500")


@pytest.mark.parametrize("how", ["kill", "term"])
def test_failover_loses_no_receipted_message_and_stores_none_twice(
    broker_factory: BrokerFactory, how: str
) -> None:
    master, slave = start_pair(broker_factory)
    url = pair_url(master, slave)
    queue = f"/queue/{unique('failover')}"

    @async_test
    async def scenario() -> None:
        listener = RecordingListener()
        producer = AsyncClient(url, listener=listener)
        await producer.connect()
        gate = asyncio.Semaphore(IN_FLIGHT)
        receipted: list[tuple[str, int]] = []
        killed = asyncio.Event()

        async def send(number: int) -> None:
            async with gate:
                result = await producer.send(queue, f"m{number}")
            receipted.append(result.identity)
            if len(receipted) == KILL_AFTER and not killed.is_set():
                killed.set()
                if how == "kill":
                    await asyncio.to_thread(master.kill)
                else:
                    await asyncio.to_thread(master.terminate)

        await asyncio.wait_for(
            asyncio.gather(*(send(n) for n in range(MESSAGES))), timeout=120)
        assert killed.is_set()
        assert listener.count("interrupted") >= 1, "the producer never failed over"
        assert producer.connected_uri is not None
        assert producer.connected_uri.port == slave.port
        print(f"\n{how}: re-sent {producer.resent} send(s) after failover; "
              f"gaps {[i.duration for i in producer.interruptions]}")
        await producer.disconnect()

        consumer = AsyncClient(url)
        await consumer.connect()
        sub = await consumer.subscribe(queue, ack="client-individual", prefetch=50)
        seen: list[tuple[str, int]] = []
        while len(set(seen)) < MESSAGES:
            message = await sub.receive(QUIET)
            if message is None:
                break
            assert message.identity is not None
            seen.append(message.identity)
            assert await consumer.ack(message)
        # nothing stored twice arrives later either
        assert await sub.receive(0.5) is None
        await consumer.disconnect()
        missing = set(receipted) - set(seen)
        assert not missing, f"{len(missing)} receipted messages lost: {sorted(missing)[:10]}"
        duplicates = len(seen) - len(set(seen))
        assert duplicates == 0, f"{duplicates} messages stored twice"
        assert len(seen) == MESSAGES

    scenario()


def test_durable_subscriber_is_resubscribed_by_name_on_the_new_master(
    broker_factory: BrokerFactory,
) -> None:
    master, slave = start_pair(broker_factory)
    url = pair_url(master, slave)
    topic = f"/topic/{unique('durable')}"

    @async_test
    async def scenario() -> None:
        listener = RecordingListener()
        consumer = AsyncClient(url, client_id=unique("cid"), listener=listener)
        await consumer.connect()
        sub = await consumer.subscribe(topic, durable_name="audit", ack="client-individual")
        producer = AsyncClient(url)
        await producer.connect()
        await producer.send(topic, "before")
        first = await sub.receive(10)
        assert first is not None and first.text == "before"
        assert await consumer.ack(first)

        await asyncio.to_thread(master.kill)
        # Sent while the consumer may still be reconnecting: the durable subscription
        # lives in the store, so the new master keeps it for the consumer.
        await producer.send(topic, "after")
        await listener.wait_count("resumed", 2, timeout=30)
        assert consumer.connected_uri is not None and consumer.connected_uri.port == slave.port
        second = await sub.receive(10)
        assert second is not None and second.text == "after"
        assert await consumer.ack(second)
        assert await sub.receive(0.5) is None
        await producer.disconnect()
        await consumer.disconnect()

    scenario()
