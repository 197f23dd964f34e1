"""Temporary destinations in-process (issue 21): ownership, the reply-to rewrite, memory
only, deletion with the connection, the byte budgets; what operators may not do.

The same flows through real stomp.py clients and a broker process are in
tests/integration/test_temporary.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from amqlite.broker import Broker, Operations
from amqlite.broker import memory as memory_mod
from amqlite.broker import temporary as temporary_mod
from amqlite.broker.operations import OperationError
from amqlite.codec import Frame
from amqlite.settings import Settings, SettingsError, load_settings
from amqlite.validation import BrokerError
from store import SqlStore
from tests.broker.test_broker_store import FrameSink, Master, connect, run, send, until
from tests.helpers.store import sql


class NoReads:
    """The store reads ``Operations`` takes; refusing a temporary name needs none."""

    def message(self, message_id: int) -> dict[str, Any] | None:
        raise AssertionError("no read expected")

    def message_ids(self, destination_id: int, after_id: int, limit: int) -> list[int]:
        raise AssertionError("no read expected")

    def full_rows(self, ids: list[int]) -> list[dict[str, Any]]:
        raise AssertionError("no read expected")


def subscribe(broker: Broker, client: FrameSink, dest: str, sub_id: str = "s",
              **headers: str) -> None:
    broker.handle(client, Frame("SUBSCRIBE", {"destination": dest, "id": sub_id,
                                              **headers}))


def reply_to_of(broker: Broker, client: FrameSink, own_name: str) -> str:
    """The broker-wide name a SEND's reply-to naming ``own_name`` is rewritten to."""
    send(broker, client, "/queue/requests", "ask", persistent="false",
         **{"reply-to": own_name})
    return broker.queues["/queue/requests"].heap[-1][2].headers["reply-to"]


def stored_names(store: SqlStore) -> list[str]:
    return [r[0] for r in sql(store, "SELECT name FROM amq_destinations")]


def test_reply_to_is_rewritten_and_answered_by_another_connection(
        store: SqlStore, settings: Settings) -> None:
    async def scenario() -> None:
        async with Master(store, settings, "a") as broker:
            requester = connect(broker)
            subscribe(broker, requester, "/temp-queue/replies")
            service = connect(broker)
            subscribe(broker, service, "/queue/service", "svc")
            send(broker, requester, "/queue/service", "question",
                 **{"reply-to": "/temp-queue/replies", "receipt": "r1"})
            await until(lambda: bool(service.of("MESSAGE")))
            request = service.of("MESSAGE")[0]
            reply_to = request.headers["reply-to"]
            assert reply_to.startswith("/remote-temp-queue/ID:")
            assert reply_to.endswith(":replies")
            send(broker, service, reply_to, "answer", receipt="r2")
            assert [f.body for f in requester.of("MESSAGE")] == [b"answer"]
            assert requester.of("MESSAGE")[0].headers["destination"] == reply_to
            assert service.of("RECEIPT") and not service.errors

    run(scenario)


def test_each_connection_has_its_own_names(store: SqlStore, settings: Settings) -> None:
    async def scenario() -> None:
        async with Master(store, settings, "a") as broker:
            one, two = connect(broker), connect(broker)
            names = {reply_to_of(broker, c, "/temp-queue/r") for c in (one, two)}
            assert len(names) == 2
            token = reply_to_of(broker, one, "/temp-topic/t").split(":")[1]
            assert len(token) == 2 * temporary_mod.TOKEN_BYTES
            assert reply_to_of(broker, one, "/temp-queue/r") in names  # same one again

    run(scenario)


def test_only_the_owner_subscribes(store: SqlStore, settings: Settings) -> None:
    async def scenario() -> None:
        async with Master(store, settings, "a") as broker:
            owner = connect(broker)
            name = reply_to_of(broker, owner, "/temp-queue/mine")
            other = connect(broker)
            with pytest.raises(BrokerError, match="belongs to another connection"):
                subscribe(broker, other, name)
            with pytest.raises(BrokerError, match="durable"):
                subscribe(broker, owner, "/temp-topic/t", "d",
                          **{"activemq.subscriptionName": "d"})
            subscribe(broker, owner, name)  # the owner may use the broker-wide name too
            assert not owner.errors

    run(scenario)


def test_persistent_sends_stay_in_memory(store: SqlStore, settings: Settings) -> None:
    async def scenario() -> None:
        async with Master(store, settings, "a") as broker:
            owner = connect(broker)
            send(broker, owner, "/temp-queue/q", "one", persistent="true", receipt="r")
            assert owner.of("RECEIPT")
            name = reply_to_of(broker, owner, "/temp-queue/q")
            q = broker.queues[name]
            assert len(q) == 1 and q.nonpersistent == 1 and not q.stored
            broker.writes.flush()
            await broker.committer.drain()
            assert not [n for n in stored_names(store) if "temp" in n]
            assert sql(store, "SELECT count(*) FROM amq_messages WHERE body = :b",
                       b=b"one") == [(0,)]
            with pytest.raises(BrokerError, match="scheduled delivery"):
                send(broker, owner, "/temp-queue/q", "later", AMQ_SCHEDULED_DELAY="1000")

    run(scenario)


def test_the_end_of_the_connection_deletes_them_and_frees_their_bytes(
        store: SqlStore, settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory_mod, "MAX_NONPERSISTENT_BACKLOG", 3)

    async def scenario() -> None:
        async with Master(store, settings, "a") as broker:
            owner = connect(broker)
            queue = reply_to_of(broker, owner, "/temp-queue/q")
            topic = reply_to_of(broker, owner, "/temp-topic/t")
            subscribe(broker, owner, "/temp-topic/t")
            producer = connect(broker)
            for i in range(3):
                send(broker, producer, queue, f"m{i}")
            assert producer.paused == {f"flow:{queue}"}  # a budget as any other
            assert broker.waiting_bytes > 0
            broker.detach(owner)
            assert queue not in broker.queues and topic not in broker.topics
            assert not producer.paused  # held back for a queue that is gone: free
            assert broker.waiting_bytes == sum(  # what waits elsewhere, no more
                m.size for *_, m in broker.queues["/queue/requests"].heap)
            assert not broker.temporary.by_name and not broker.temporary.owners
            with pytest.raises(BrokerError, match="does not exist"):
                send(broker, producer, queue, "late")

    run(scenario)


def test_a_commit_to_a_gone_one_is_refused_and_a_late_route_dropped(
        store: SqlStore, settings: Settings) -> None:
    async def scenario() -> None:
        async with Master(store, settings, "a") as broker:
            owner = connect(broker)
            name = reply_to_of(broker, owner, "/temp-queue/q")
            producer = connect(broker)
            broker.handle(producer, Frame("BEGIN", {"transaction": "t"}))
            send(broker, producer, name, "in tx", transaction="t")
            broker.detach(owner)
            with pytest.raises(BrokerError, match="does not exist"):
                broker.handle(producer, Frame("COMMIT", {"transaction": "t"}))
            late = broker.queue(name)  # what a COMMIT committing meanwhile routes to
            late.add_nonpersistent(broker.queues["/queue/requests"].heap[0][2].copy())
            assert name not in broker.queues and not len(late)

    run(scenario)


def test_operators_and_settings_cannot_name_one(store: SqlStore, settings: Settings) -> None:
    async def scenario() -> None:
        async with Master(store, settings, "a") as broker:
            ops = Operations(broker, NoReads())
            send(broker, connect(broker), "/queue/a", "x", persistent="false")
            with pytest.raises(OperationError, match="temporary"):
                await ops.send("/temp-queue/x", b"x")
            with pytest.raises(OperationError, match="temporary"):
                await ops.move("/queue/a", "/remote-temp-queue/ID:x:y")
            with pytest.raises(OperationError, match="temporary"):
                await ops.purge("/remote-temp-queue/ID:x:y")

    run(scenario)
    for bad in ("/temp-queue/DLQ", "/remote-temp-queue/ID:x:DLQ"):
        with pytest.raises(SettingsError, match="dead_letter_queue"):
            load_settings({"dead_letter_queue": bad, "data_dir": settings.data_dir},
                          environ={})


def test_a_stomp_1_0_unsubscribe_by_destination_finds_its_subscription(
        store: SqlStore, settings: Settings) -> None:
    async def scenario() -> None:
        async with Master(store, settings, "a") as broker:
            owner = connect(broker, version="1.0")
            broker.handle(owner, Frame("SUBSCRIBE", {"destination": "/temp-queue/r"}))
            [sub] = broker.sessions[owner].subscriptions.values()
            broker.handle(owner, Frame("UNSUBSCRIBE", {"destination": "/temp-queue/r",
                                                       "receipt": "u"}))
            assert not broker.sessions[owner].subscriptions and sub.closed
            await until(lambda: bool(owner.of("RECEIPT")))
            assert not owner.errors

    run(scenario)
