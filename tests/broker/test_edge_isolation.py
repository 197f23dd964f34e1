"""Issue 12 classes 2 and 3, in-process against a real SQLite store: a COMMIT that fails
applies nothing, and a consumer that cannot take a message holds back nobody else.

The real-process regressions are in tests/integration/test_edge_validation.py; here the
broker's seams are reachable, so dispatch can be made to fail for one consumer (SEND
validation keeps such messages out of a real broker).
"""

from __future__ import annotations

import pytest

from amqlite.broker import Broker, BrokerError
from amqlite.broker import session as broker_mod
from amqlite.codec import Frame, ProtocolError
from amqlite.settings import Settings
from store import Store
from tests.broker import test_broker_store as base
from tests.broker.test_broker_store import FrameSink, Master, connect, run, send, until

# The broker-store tests' settings (a real SQLite store in tmp_path); store is the conftest's.
settings = base.settings

QUEUE = "/queue/edge"


class BrokenSink(FrameSink):
    """A consumer whose connection cannot encode a MESSAGE (as a 1.0 consumer could not
    encode a header name with ':' before SEND validated it); closes like the server."""

    def __init__(self, broker: Broker) -> None:
        super().__init__()
        self.broker = broker

    def write_frame(self, frame: Frame) -> None:
        if frame.command == "MESSAGE":
            raise ProtocolError("unencodable header", "test", fault="local")
        super().write_frame(frame)

    def close_with_error(self, message: str, detail: str = "") -> None:
        super().close_with_error(message, detail)
        self.broker.detach(self)


@pytest.mark.parametrize("ack", ["auto", "client-individual"])
def test_consumer_that_cannot_take_a_message_holds_back_nobody(
        store: Store, settings: Settings, ack: str) -> None:
    """The producer gets its RECEIPT, the healthy consumer gets every message (also the
    one the broken consumer failed on), and only the broken consumer is closed."""
    async def scenario() -> None:
        async with Master(store, settings, "a") as broker:
            broken = BrokenSink(broker)
            broker.attach(broken)
            broker.handle(broken, Frame("SUBSCRIBE", {"destination": QUEUE, "id": "b",
                                                      "ack": ack}))
            healthy = connect(broker)
            broker.handle(healthy, Frame("SUBSCRIBE", {"destination": QUEUE, "id": "h",
                                                       "ack": "auto"}))
            producer = connect(broker)
            for i in range(6):
                send(broker, producer, QUEUE, f"m{i}", receipt=f"r{i}")
            await until(lambda: len(producer.of("RECEIPT")) == 6)
            await until(lambda: len(healthy.of("MESSAGE")) == 6)
            assert sorted(m.body for m in healthy.of("MESSAGE")) == [
                f"m{i}".encode() for i in range(6)]
            await until(lambda: broken.closed)
            assert broken.errors == ["cannot deliver a message"]
            assert not healthy.closed and not producer.closed

    run(scenario)


def test_failed_commit_applies_no_ack(store: Store, settings: Settings) -> None:
    """BEGIN; ACK m; ACK m again; COMMIT: the COMMIT is refused before anything is
    applied, and m is redelivered once the connection goes."""
    async def scenario() -> None:
        async with Master(store, settings, "a") as broker:
            producer = connect(broker)
            send(broker, producer, QUEUE, "m", receipt="r")
            await until(lambda: len(producer.of("RECEIPT")) == 1)
            consumer = connect(broker)
            broker.handle(consumer, Frame("SUBSCRIBE", {"destination": QUEUE, "id": "s",
                                                        "ack": "client-individual"}))
            await until(lambda: len(consumer.of("MESSAGE")) == 1)
            ack = consumer.of("MESSAGE")[0].headers["ack"]
            broker.handle(consumer, Frame("BEGIN", {"transaction": "t"}))
            broker.handle(consumer, Frame("ACK", {"id": ack, "transaction": "t"}))
            broker.handle(consumer, Frame("ACK", {"id": ack, "transaction": "t"}))
            with pytest.raises(BrokerError, match="twice"):
                broker.handle(consumer, Frame("COMMIT", {"transaction": "t"}))
            assert broker.stats["acked"] == 0
            broker.detach(consumer)  # what the ERROR's close does

            again = connect(broker)
            broker.handle(again, Frame("SUBSCRIBE", {"destination": QUEUE, "id": "s",
                                                     "ack": "auto"}))
            await until(lambda: len(again.of("MESSAGE")) == 1)
            [m] = again.of("MESSAGE")
            assert m.body == b"m" and m.headers.get("redelivered") == "true"

    run(scenario)


def test_invalid_send_in_transaction_refused_when_it_arrives(store: Store,
                                                             settings: Settings) -> None:
    async def scenario() -> None:
        async with Master(store, settings, "a") as broker:
            client = connect(broker)
            broker.handle(client, Frame("BEGIN", {"transaction": "t"}))
            with pytest.raises(BrokerError, match="priority"):
                send(broker, client, QUEUE, "x", transaction="t", priority="abc")
            assert broker.sessions[client].transactions["t"].sends == []

    run(scenario)


def test_transaction_limits(store: Store, settings: Settings,
                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(broker_mod, "MAX_TRANSACTION_FRAMES", 3)
    monkeypatch.setattr(broker_mod, "MAX_TRANSACTION_BYTES", 1000)

    async def scenario() -> None:
        async with Master(store, settings, "a") as broker:
            client = connect(broker)
            for i in range(broker_mod.MAX_OPEN_TRANSACTIONS):
                broker.handle(client, Frame("BEGIN", {"transaction": f"t{i}"}))
            with pytest.raises(BrokerError, match="open transactions"):
                broker.handle(client, Frame("BEGIN", {"transaction": "one-more"}))
            for _ in range(3):
                send(broker, client, QUEUE, "x", transaction="t0")
            with pytest.raises(BrokerError, match="more than 3 frames"):
                send(broker, client, QUEUE, "x", transaction="t0")
            with pytest.raises(BrokerError, match="more than 1000 bytes"):
                send(broker, client, QUEUE, "y" * 1001, transaction="t1")

    run(scenario)


def test_cumulative_ack_follows_the_order_messages_were_written(store: Store,
                                                                settings: Settings) -> None:
    """Found by the fuzzer: a persistent message waits for its delivery to commit while a
    non-persistent one sent after it goes out at once. An ``ack:client`` ACK of the first
    MESSAGE the client saw settles only that one, not the persistent message written after
    it, whose own ACK then succeeds."""
    async def scenario() -> None:
        async with Master(store, settings, "a") as broker:
            consumer = connect(broker)
            broker.handle(consumer, Frame("SUBSCRIBE", {"destination": QUEUE, "id": "s",
                                                        "ack": "client"}))
            producer = connect(broker)
            send(broker, producer, QUEUE, "persistent", receipt="r")
            send(broker, producer, QUEUE, "memory", persistent="false")
            await until(lambda: len(consumer.of("MESSAGE")) == 2)
            first, second = consumer.of("MESSAGE")
            assert (first.body, second.body) == (b"memory", b"persistent")
            broker.handle(consumer, Frame("ACK", {"id": first.headers["ack"]}))
            assert broker.stats["acked"] == 1
            broker.handle(consumer, Frame("ACK", {"id": second.headers["ack"]}))
            assert broker.stats["acked"] == 2
            assert not consumer.closed

    run(scenario)
