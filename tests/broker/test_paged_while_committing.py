"""A committed row that a consumer's page can read before the broker routed it to memory
is in memory once, not twice. The scheduler's round commits a batch of copies (to a
queue, to a topic's durable subscriptions) and of due delayed redeliveries; a consumer
that SUBSCRIBEs meanwhile (a new master's first minutes: every source pages from the
store) pages in what committed. Seen as a scheduled copy delivered twice by a new master
in tests/integration/test_scheduled.py (queues: 78b7ac9), and as the same for a durable
subscription's copy and a delayed redelivery.

The interleaving is made exact, not hoped for: the page is requested right after the
round's batch went to the group committer, and the loop waits (a barrier on the store
thread, with a deadline) until the store thread has committed the batch and read the
page, so both outcomes are queued on the loop before either is handled. In process,
against SQLite."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from amqlite.broker import Broker
from amqlite.broker import message as message_mod
from amqlite.broker import redelivery as redelivery_mod
from amqlite.broker import scheduler as scheduler_mod
from amqlite.broker import send as send_mod
from amqlite.codec import Frame
from amqlite.policy import parse_policies
from amqlite.settings import Settings
from store import SqlStore
from store.api import Batch
from tests.broker.test_broker_store import DEADLINE, FrameSink, Master, connect, run, until
from tests.helpers.committer import SubmitThrough

TOPIC = "/topic/race"
QUEUE = "/queue/race"
#: The scheduled message's delay and the redelivery delay (ms): the second master's clock
#: starts past both, so its first round makes them deliverable.
DELAY_MS = 60_000


class Clock:
    """The broker's wall clock where the SEND, the NACK and the scheduler read it."""

    def __init__(self) -> None:
        self.ms = 1_900_000_000_000

    def __call__(self) -> int:
        return self.ms


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[Clock]:
    c = Clock()
    for module in (message_mod, send_mod, scheduler_mod, redelivery_mod):
        monkeypatch.setattr(module, "now_ms", c)
    yield c


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """A queue NACK waits DELAY_MS in the store (a delayed redelivery)."""
    policies = parse_policies([{"destination": "/queue/>",
                                "redelivery_delay": DELAY_MS / 1000}], "test")
    return Settings(group=settings.group, data_dir=settings.data_dir, store=settings.store,
                    policies=policies).resolved()


def subscribe(broker: Broker, dest: str, **headers: str) -> FrameSink:
    client = connect(broker, client_id=headers.pop("client_id", None))
    broker.handle(client, Frame("SUBSCRIBE", {"destination": dest, "id": "s", **headers}))
    return client


def durable(broker: Broker) -> FrameSink:
    return subscribe(broker, TOPIC, client_id="c1", **{"activemq.subscriptionName": "n"})


def consumer_during_round(broker: Broker, make: Callable[[], FrameSink]) -> list[FrameSink]:
    """When the scheduler's round submits its batch, ``make`` a consumer (its SUBSCRIBE
    pages the store), and hold the loop until the store thread committed the batch and
    read the page."""
    committer = broker.committer
    assert committer is not None
    submit = committer.submit
    made: list[FrameSink] = []

    def racing_submit(batch: Batch, units: Any = None) -> Any:
        future = submit(batch, units)
        if not made and (batch.schedule_steps or batch.redeliveries):
            made.append(make())
            passed = threading.Event()
            committer.call(passed.set)  # runs after the commit and the page read
            assert passed.wait(DEADLINE)
        return future

    broker.writes.committer = SubmitThrough(committer, racing_submit)
    return made


def messages(client: FrameSink) -> list[str]:
    return [f.headers["message-id"] for f in client.of("MESSAGE")]


def test_a_scheduled_copy_paged_in_by_a_durable_subscriber_is_delivered_once(
        store: SqlStore, settings: Settings, clock: Clock) -> None:
    async def first() -> None:
        async with Master(store, settings, "a") as broker:
            sub = durable(broker)
            producer = connect(broker)
            broker.handle(producer, Frame("SEND", {
                "destination": TOPIC, "receipt": "r", "AMQ_SCHEDULED_DELAY": str(DELAY_MS)},
                b"later"))
            await until(lambda: len(producer.of("RECEIPT")) == 1)
            broker.detach(sub)  # offline: the copy is stored for it

    async def second() -> None:
        clock.ms += DELAY_MS + 1
        async with Master(store, settings, "b") as broker:
            made = consumer_during_round(broker, lambda: durable(broker))
            await until(lambda: broker.scheduler.fired == 1)
            [sub] = made
            await until(lambda: len(sub.of("MESSAGE")) >= 1)
            assert len(messages(sub)) == 1, messages(sub)
            [d] = broker.durables.values()
            assert len(d) == 0 and sub.of("MESSAGE")[0].body == b"later"

    run(first)
    run(second)


@pytest.mark.parametrize("selector", [None, "colour = 'red'"])
def test_a_scheduled_copy_paged_in_by_a_queue_consumer_is_delivered_once(
        store: SqlStore, settings: Settings, clock: Clock, selector: str | None) -> None:
    """A selective consumer also scans the store with its selector (``selective.scan``)."""
    options = {} if selector is None else {"selector": selector}

    async def first() -> None:
        async with Master(store, settings, "a") as broker:
            producer = connect(broker)
            broker.handle(producer, Frame("SEND", {
                "destination": QUEUE, "receipt": "r", "AMQ_SCHEDULED_DELAY": str(DELAY_MS),
                "colour": "red"}, b"later"))
            await until(lambda: len(producer.of("RECEIPT")) == 1)

    async def second() -> None:
        clock.ms += DELAY_MS + 1
        async with Master(store, settings, "b") as broker:
            made = consumer_during_round(broker, lambda: subscribe(broker, QUEUE, **options))
            await until(lambda: broker.scheduler.fired == 1)
            [sub] = made
            await until(lambda: len(sub.of("MESSAGE")) >= 1)
            assert len(messages(sub)) == 1, messages(sub)
            assert len(broker.queues[QUEUE]) == 0

    run(first)
    run(second)


def test_a_delayed_redelivery_paged_in_by_a_new_consumer_is_delivered_once(
        store: SqlStore, settings: Settings, clock: Clock) -> None:
    """A NACKed queue message waits its redelivery delay in the store; the next master's
    first round makes it deliverable while a consumer of its (dormant) queue subscribes."""
    async def first() -> None:
        async with Master(store, settings, "a") as broker:
            producer = connect(broker)
            broker.handle(producer, Frame("SEND", {"destination": QUEUE, "receipt": "r"},
                                          b"again"))
            await until(lambda: len(producer.of("RECEIPT")) == 1)
            sub = subscribe(broker, QUEUE, ack="client-individual")
            await until(lambda: len(sub.of("MESSAGE")) == 1)
            ack = sub.of("MESSAGE")[0].headers["ack"]
            broker.handle(sub, Frame("NACK", {"id": ack, "receipt": "n"}))
            await until(lambda: len(sub.of("RECEIPT")) == 1)

    async def second() -> None:
        clock.ms += DELAY_MS + 1
        async with Master(store, settings, "b") as broker:
            made = consumer_during_round(broker, lambda: subscribe(broker, QUEUE))
            await until(lambda: bool(made) and len(made[0].of("MESSAGE")) >= 1)
            [sub] = made
            await until(lambda: broker.scheduler.armed_for is None
                        and broker.scheduler._round is None)
            assert len(messages(sub)) == 1, messages(sub)
            assert sub.of("MESSAGE")[0].headers.get("redelivered") == "true"
            assert len(broker.queues[QUEUE]) == 0

    run(first)
    run(second)
