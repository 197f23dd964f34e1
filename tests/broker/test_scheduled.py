"""Scheduled delivery (``amqlite.broker.scheduler``) in-process against a real SQLite
store: a scheduled SEND is stored before its RECEIPT and delivered when due, repeats and
cron make their copies, a transaction schedules at COMMIT, bad headers store nothing, a
topic's copy reaches who is subscribed when it is due, and a new master finds what the
last one stored. Cron is driven by a clock of the test's own (a minute is too long)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from amqlite.broker import Broker, BrokerError, ErrorKind, OperationError, Operations
from amqlite.broker import message as message_mod
from amqlite.broker import scheduler as scheduler_mod
from amqlite.broker import send as send_mod
from amqlite.codec import Frame
from amqlite.management.reads import StoreReader
from amqlite.settings import Settings
from store import SqlStore
from tests.broker.test_broker_store import FrameSink, Master, connect, run, until
from tests.helpers.store import assert_counters, one, sql

QUEUE = "/queue/later"


class Clock:
    """The broker's wall clock (``now_ms`` where the SEND, the COMMIT and the scheduler
    read it), moved by the test."""

    def __init__(self, start: datetime) -> None:
        self.ms = int(start.timestamp() * 1000)

    def __call__(self) -> int:
        return self.ms

    def at(self, when: datetime) -> None:
        self.ms = int(when.timestamp() * 1000)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[Clock]:
    c = Clock(datetime(2030, 1, 7, 10, 17, 30, tzinfo=UTC))
    for module in (message_mod, send_mod, scheduler_mod):
        monkeypatch.setattr(module, "now_ms", c)
    yield c


def utc(*args: int) -> int:
    return int(datetime(*args, tzinfo=UTC).timestamp() * 1000)


def send(broker: Broker, client: FrameSink, body: str, dest: str = QUEUE,
         **headers: str) -> None:
    """A SEND with a receipt, and wait for it (the row is stored once it came)."""
    receipt = f"r-{body}"
    broker.handle(client, Frame("SEND", {"destination": dest, "receipt": receipt, **headers},
                                body.encode()))


def receipted(client: FrameSink, body: str) -> bool:
    return any(f.headers.get("receipt-id") == f"r-{body}" for f in client.of("RECEIPT"))


def scheduled_rows(store: SqlStore) -> list[tuple[int, int, dict[str, object]]]:
    return [(i, at, json.loads(plan)) for i, at, plan in sql(
        store, "SELECT id, deliver_at, schedule FROM amq_messages WHERE deliver_at > 0 "
               "ORDER BY deliver_at")]


def subscribe(broker: Broker, dest: str = QUEUE, **headers: str) -> FrameSink:
    consumer = connect(broker)
    broker.handle(consumer, Frame("SUBSCRIBE", {"destination": dest, "id": "s", **headers}))
    return consumer


def bodies(client: FrameSink) -> list[str]:
    return [f.body.decode() for f in client.of("MESSAGE")]


def test_a_delayed_send_is_stored_before_its_receipt_and_delivered_when_due(
        store: SqlStore, settings: Settings) -> None:
    async def scenario() -> None:
        async with Master(store, settings, "a") as broker:
            consumer = subscribe(broker)
            producer = connect(broker)
            sent = time.time()
            send(broker, producer, "soon", AMQ_SCHEDULED_DELAY="300", colour="red",
                 persistent="false")
            await until(lambda: receipted(producer, "soon"))
            [(_, due, plan)] = scheduled_rows(store)
            assert plan == {"delay": 300, "period": 0, "repeat": 0, "cron": None,
                            "fired": 0, "ttl": 0}
            assert abs(due - (sent * 1000 + 300)) < 200
            assert not consumer.of("MESSAGE")
            assert store.load_page(broker.destination_rows[QUEUE], 0, 10) == []
            await until(lambda: len(consumer.of("MESSAGE")) == 1)
            assert time.time() * 1000 >= due
            [m] = consumer.of("MESSAGE")
            # Headers as ActiveMQ delivers a scheduled copy: no AMQ_SCHEDULED_*, the job id.
            assert m.headers["colour"] == "red" and m.headers["persistent"] == "true"
            assert "AMQ_SCHEDULED_DELAY" not in m.headers
            assert m.headers["scheduledJobId"] == m.headers["message-id"]  # one copy: its id
            assert scheduled_rows(store) == []
            await until(lambda: broker.scheduler.fired == 1)
            assert_counters(store)
            assert not store.check_integrity(broker.epoch).mismatch

    run(scenario)


def test_period_and_repeat_make_their_copies_then_the_row_goes(
        store: SqlStore, settings: Settings) -> None:
    """ActiveMQ's documented example scaled down: delay 300 ms, period 200 ms, repeat 2
    is three copies, at 300, 500 and 700 ms."""
    async def scenario() -> None:
        async with Master(store, settings, "a") as broker:
            consumer = subscribe(broker)
            producer = connect(broker)
            start = time.time() * 1000
            send(broker, producer, "tick", AMQ_SCHEDULED_DELAY="300",
                 AMQ_SCHEDULED_PERIOD="200", AMQ_SCHEDULED_REPEAT="2")
            await until(lambda: receipted(producer, "tick"))
            [(job, _, _)] = scheduled_rows(store)
            arrived: list[float] = []
            for n in (1, 2, 3):
                await until(lambda n=n: len(consumer.of("MESSAGE")) == n)
                arrived.append(time.time() * 1000 - start)
            assert arrived[0] >= 300 and arrived[1] >= 500 and arrived[2] >= 700, arrived
            frames = consumer.of("MESSAGE")
            assert bodies(consumer) == ["tick"] * 3
            ids = [f.headers["message-id"] for f in frames]
            assert len(set(ids)) == 3 and f"ID:g1:{job}" not in ids  # repeats: ids of their own
            assert {f.headers["scheduledJobId"] for f in frames} == {f"ID:g1:{job}"}
            await until(lambda: scheduled_rows(store) == [])
            await settled(broker)  # the last copy's ACK may still be in flight
            assert_counters(store)

    run(scenario)


async def settled(broker: Broker) -> None:
    """Until every staged write committed (assert_counters reads the counters and the
    rows apart: a commit in between would look like a mismatch)."""
    writes, committer = broker.writes, broker.committer
    assert committer is not None
    for _ in range(20):
        writes.flush()
        await committer.drain()
        if not (len(writes.batch) or writes.units or writes.callbacks
                or writes.inflight_batches):
            return
    raise AssertionError("the broker keeps staging writes")


def test_cron_fires_at_its_times_and_skips_what_an_outage_missed(
        store: SqlStore, settings: Settings, clock: Clock) -> None:
    async def scenario() -> None:
        async with Master(store, settings, "a") as broker:
            consumer = subscribe(broker)
            producer = connect(broker)
            send(broker, producer, "hourly", AMQ_SCHEDULED_CRON="0 * * * *",
                 expires=str(clock.ms + 60_000))
            await until(lambda: receipted(producer, "hourly"))
            [(_, due, plan)] = scheduled_rows(store)
            assert due == utc(2030, 1, 7, 11, 0) and plan["fired"] == 0
            assert plan["ttl"] == 60_000  # copies live a minute, from their delivery
            await until(lambda: broker.scheduler.armed_for == due)
            clock.at(datetime(2030, 1, 7, 11, 0, 0, 500_000, tzinfo=UTC))
            broker.scheduler.check_now()
            await until(lambda: len(consumer.of("MESSAGE")) == 1)
            first = consumer.of("MESSAGE")[0]
            assert first.headers["expires"] == str(clock.ms + 60_000)
            await until(lambda: scheduled_rows(store)[0][1] == utc(2030, 1, 7, 12, 0))
            assert scheduled_rows(store)[0][2]["fired"] == 1
            # Nobody was master from 11:30 to 15:20: the 12:00 copy comes once, late;
            # 13:00, 14:00 and 15:00 are not made up; the schedule resumes at 16:00.
            clock.at(datetime(2030, 1, 7, 15, 20, tzinfo=UTC))
            broker.scheduler.check_now()
            await until(lambda: len(consumer.of("MESSAGE")) == 2)
            await until(lambda: scheduled_rows(store)[0][1] == utc(2030, 1, 7, 16, 0))
            assert scheduled_rows(store)[0][2]["fired"] == 2
            await until(lambda: broker.scheduler.armed_for == utc(2030, 1, 7, 16, 0))
            assert bodies(consumer) == ["hourly", "hourly"]
            ids = {f.headers["message-id"] for f in consumer.of("MESSAGE")}
            assert len(ids) == 2  # a cron makes many copies: each its own message-id

    run(scenario)


def test_cron_with_repeats_makes_each_firings_sequence(
        store: SqlStore, settings: Settings, clock: Clock) -> None:
    async def scenario() -> None:
        async with Master(store, settings, "a") as broker:
            consumer = subscribe(broker)
            producer = connect(broker)
            send(broker, producer, "burst", AMQ_SCHEDULED_CRON="30 10 * * *",
                 AMQ_SCHEDULED_DELAY="1000", AMQ_SCHEDULED_PERIOD="2000",
                 AMQ_SCHEDULED_REPEAT="1")
            await until(lambda: receipted(producer, "burst"))
            firing = utc(2030, 1, 7, 10, 30)
            assert scheduled_rows(store)[0][1] == firing + 1000
            clock.ms = firing + 1000
            broker.scheduler.check_now()
            await until(lambda: scheduled_rows(store)[0][1] == firing + 3000)
            clock.ms = firing + 3000
            broker.scheduler.check_now()
            await until(lambda: scheduled_rows(store)[0][1] == firing + 86_400_000 + 1000)
            await until(lambda: bodies(consumer) == ["burst", "burst"])

    run(scenario)


def test_a_transaction_schedules_at_commit(store: SqlStore, settings: Settings,
                                           clock: Clock) -> None:
    async def scenario() -> None:
        async with Master(store, settings, "a") as broker:
            producer = connect(broker)
            broker.handle(producer, Frame("BEGIN", {"transaction": "t"}))
            broker.handle(producer, Frame("SEND", {
                "destination": QUEUE, "transaction": "t", "AMQ_SCHEDULED_DELAY": "60000"},
                b"later"))
            sent = clock.ms
            clock.ms += 10_000
            broker.handle(producer, Frame("COMMIT", {"transaction": "t", "receipt": "c"}))
            await until(lambda: any(f.headers.get("receipt-id") == "c"
                                    for f in producer.of("RECEIPT")))
            [(_, due, _)] = scheduled_rows(store)
            assert due == sent + 10_000 + 60_000

    run(scenario)


@pytest.mark.parametrize(("headers", "named"), [
    ({"AMQ_SCHEDULED_DELAY": "-1"}, "AMQ_SCHEDULED_DELAY"),
    ({"AMQ_SCHEDULED_DELAY": "soon"}, "AMQ_SCHEDULED_DELAY"),
    ({"AMQ_SCHEDULED_PERIOD": "0"}, "AMQ_SCHEDULED_PERIOD"),
    ({"AMQ_SCHEDULED_DELAY": "10", "AMQ_SCHEDULED_REPEAT": "-2"}, "AMQ_SCHEDULED_REPEAT"),
    ({"AMQ_SCHEDULED_DELAY": "10", "AMQ_SCHEDULED_REPEAT": "1001"}, "AMQ_SCHEDULED_REPEAT"),
    ({"AMQ_SCHEDULED_CRON": "61 * * * *"}, "AMQ_SCHEDULED_CRON"),
    ({"AMQ_SCHEDULED_CRON": "0 0 30 2 *"}, "AMQ_SCHEDULED_CRON"),
])
def test_bad_scheduling_headers_are_refused_and_nothing_is_stored(
        store: SqlStore, settings: Settings, headers: dict[str, str], named: str) -> None:
    async def scenario() -> None:
        async with Master(store, settings, "a") as broker:
            producer = connect(broker)
            with pytest.raises(BrokerError, match=named):
                send(broker, producer, "bad", **headers)
            broker.handle(producer, Frame("BEGIN", {"transaction": "t"}))
            with pytest.raises(BrokerError, match=named):  # refused at the SEND, not COMMIT
                broker.handle(producer, Frame("SEND", {"destination": QUEUE,
                                                       "transaction": "t", **headers}))
        assert one(store, "SELECT count(*) FROM amq_messages") == 0
        assert QUEUE not in broker.destination_rows

    run(scenario)


def test_a_topic_copy_reaches_durables_and_who_is_subscribed_when_due(
        store: SqlStore, settings: Settings) -> None:
    topic = "/topic/later"

    async def scenario() -> None:
        async with Master(store, settings, "a") as broker:
            durable = connect(broker, client_id="c1")
            broker.handle(durable, Frame("SUBSCRIBE", {
                "destination": topic, "id": "d", "activemq.subscriptionName": "n",
                "receipt": "sub"}))
            await until(lambda: len(durable.of("RECEIPT")) == 1)
            broker.detach(durable)  # offline: the copy is stored for it
            early = subscribe(broker, topic)
            producer = connect(broker)
            send(broker, producer, "news", dest=topic, AMQ_SCHEDULED_DELAY="400")
            await until(lambda: receipted(producer, "news"))
            assert one(store, "SELECT count(*) FROM amq_sub_pending") == 0  # not owed yet
            late = subscribe(broker, topic)  # subscribed before it is due: gets it too
            await until(lambda: len(early.of("MESSAGE")) == 1 and len(late.of("MESSAGE")) == 1)
            await until(lambda: one(store, "SELECT count(*) FROM amq_sub_pending") == 1)
            again = connect(broker, client_id="c1")
            broker.handle(again, Frame("SUBSCRIBE", {
                "destination": topic, "id": "d", "activemq.subscriptionName": "n"}))
            await until(lambda: bodies(again) == ["news"])
            after = subscribe(broker, topic)  # subscribed after it was due: not for it
            send(broker, producer, "now", dest=topic)
            await until(lambda: bodies(after) == ["now"])
            assert bodies(early) == ["news", "now"]

    run(scenario)


def test_a_new_master_delivers_what_the_last_one_stored(store: SqlStore,
                                                         settings: Settings) -> None:
    """The first master stores a message due in a second and stops (before it is due,
    unless the machine is slow); the next one finds it in the store (one index probe)
    and it is delivered once, by one of them. The stopped one's timer stops."""
    async def scenario() -> None:
        async with Master(store, settings, "a") as first:
            producer = connect(first)
            send(first, producer, "handed", AMQ_SCHEDULED_DELAY="1000")
            send(first, producer, "far", AMQ_SCHEDULED_DELAY="3600000")
            await until(lambda: receipted(producer, "far"))
        async with Master(store, settings, "b") as second:
            consumer = subscribe(second)
            await until(lambda: bodies(consumer) == ["handed"])
            [(_, far, _)] = scheduled_rows(store)
            await until(lambda: second.scheduler.armed_for == far)
            if first.scheduler.fired == 0:  # its timer fired on a closed committer
                await until(lambda: first.scheduler.stopped)
        assert first.scheduler.fired + second.scheduler.fired == 1
        assert bodies(consumer) == ["handed"]

    run(scenario)


def test_operators_list_and_cancel_scheduled_messages(store: SqlStore,
                                                      settings: Settings) -> None:
    async def scenario() -> None:
        async with Master(store, settings, "a") as broker:
            reader = StoreReader(settings.store, settings.group)
            ops = Operations(broker, reader)
            sent = await ops.send(QUEUE, b"op", {"AMQ_SCHEDULED_DELAY": "3600000"})
            await ops.send("/queue/other", b"x", {"AMQ_SCHEDULED_PERIOD": "7200000"})
            listing = await ops.scheduled()
            assert listing["total"] == 2
            first = listing["scheduled"][0]
            assert (first["id"], first["destination"], first["body"]) == (sent["id"], QUEUE, "op")
            assert first["schedule"]["delay"] == 3_600_000
            assert (await ops.scheduled(QUEUE))["total"] == 1
            with pytest.raises(OperationError) as e:
                await ops.delete_message(sent["id"])
            assert e.value.kind is ErrorKind.CONFLICT
            assert await ops.cancel_scheduled(sent["id"]) == {
                "cancelled": 1, "id": sent["id"], "message_id": sent["message_id"],
                "destination": QUEUE}
            for missing in (sent["id"], 10**9):
                with pytest.raises(OperationError) as e:
                    await ops.cancel_scheduled(missing)
                assert e.value.kind is ErrorKind.NOT_FOUND
            assert (await ops.scheduled())["total"] == 1
            with pytest.raises(OperationError) as e:
                await ops.scheduled("/queue/never")
            assert e.value.kind is ErrorKind.NOT_FOUND
            assert_counters(store)
            assert not store.check_integrity(broker.epoch).mismatch
            reader.close()

    run(scenario)
