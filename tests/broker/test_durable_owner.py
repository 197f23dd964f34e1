"""Durable subscription ownership in-process, against a real SQLite store: the owner is
stored from a proven login only; without a users file a login header proves nothing and
anyone with the client-id may remove a subscription, as before owners existed."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from amqlite.broker import Broker, BrokerError
from amqlite.codec import Frame
from amqlite.settings import Settings
from store import SqlStore
from tests.broker.test_broker_store import FrameSink, Master, run, until
from tests.helpers.store import sql

TOPIC = "/topic/news"
NAME = {"activemq.subscriptionName": "mine"}


def client(broker: Broker, login: str, client_id: str = "cid") -> FrameSink:
    conn = FrameSink(client_id=client_id)
    conn.login = login
    broker.attach(conn)
    return conn


async def frame(broker: Broker, conn: FrameSink, command: str, **headers: str) -> None:
    """Handle one frame with a receipt; wait for the RECEIPT (the write is committed)."""
    receipt = f"r{len(conn.frames)}-{command}"
    broker.handle(conn, Frame(command, {**headers, **NAME, "receipt": receipt}))
    await until(lambda: any(f.headers.get("receipt-id") == receipt
                            for f in conn.of("RECEIPT")))


async def subscribed_and_gone(broker: Broker, login: str) -> None:
    """``login`` creates the durable subscription (committed) and disconnects."""
    conn = client(broker, login)
    await frame(broker, conn, "SUBSCRIBE", destination=TOPIC, id="s")
    broker.detach(conn)


def owners(store: SqlStore) -> list[tuple[str, str | None]]:
    return [tuple(r) for r in sql(store, "SELECT name, owner FROM amq_subscriptions")]


def test_without_a_users_file_a_login_header_owns_nothing(store: SqlStore,
                                                          settings: Settings) -> None:
    async def scenario() -> None:
        async with Master(store, settings, "a") as broker:
            await subscribed_and_gone(broker, "alice")
            assert owners(store) == [("mine", None)]
            bob = client(broker, "bob")
            await frame(broker, bob, "UNSUBSCRIBE", id="other")
            assert bob.errors == []
            assert owners(store) == []

    run(scenario)


@pytest.fixture
def authenticated(settings: Settings, tmp_path: Path) -> Settings:
    return dataclasses.replace(settings, users_file=str(tmp_path / "users.toml"))


def test_with_a_users_file_only_the_owner_removes_it(store: SqlStore,
                                                     authenticated: Settings) -> None:
    async def scenario() -> None:
        async with Master(store, authenticated, "a") as broker:
            await subscribed_and_gone(broker, "alice")
            assert owners(store) == [("mine", "alice")]
            bob = client(broker, "bob")
            with pytest.raises(BrokerError, match="'mine' of client-id 'cid' belongs to "
                                                  "another login"):
                broker.handle(bob, Frame("UNSUBSCRIBE", {"id": "other", **NAME}))
            broker.detach(bob)
            assert ("cid", "mine") in broker.durables
            alice = client(broker, "alice")
            await frame(broker, alice, "UNSUBSCRIBE", id="other")
            assert owners(store) == []

    run(scenario)
