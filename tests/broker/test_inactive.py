"""The inactive-queue GC in-process (issue 21, ``gc_inactive_destinations``): which queues
are due and when, and that one whose messages wait in the store is kept while an empty
one goes from memory and the store.

The same through a broker process is in tests/integration/test_inactive.py.
"""

from __future__ import annotations

import pytest

from amqlite.broker import Operations, inactive
from amqlite.codec import Frame
from amqlite.settings import Settings, SettingsError, load_settings
from store import Batch, DestinationRow, NewMessage, SqlStore
from tests.broker.test_broker_store import Master, connect, run, send, until
from tests.broker.test_temporary import reply_to_of, stored_names, subscribe


def test_idle_queues_are_due_after_the_timeout_and_only_then(
        store: SqlStore, settings: Settings) -> None:
    async def scenario() -> None:
        async with Master(store, settings, "a") as broker:
            client = connect(broker)
            for name in ("idle", "waiting", "consumed"):
                broker.queue(f"/queue/{name}")
            send(broker, client, "/queue/waiting", "x", persistent="false")
            subscribe(broker, client, "/queue/consumed")
            reply_to_of(broker, client, "/temp-queue/r")  # /queue/requests: one waits
            seen: dict[str, inactive._Idle] = {}
            assert inactive.due(broker, seen, 10, 0.0) == []
            assert set(seen) == {"/queue/idle"}
            assert inactive.due(broker, seen, 10, 9.0) == []
            send(broker, client, "/queue/idle", "used", persistent="false")
            broker.queues["/queue/idle"].drop(lambda m: True)  # gone as if consumed
            assert inactive.due(broker, seen, 10, 10.0) == []  # a SEND: its time restarts
            assert inactive.due(broker, seen, 10, 19.0) == []
            assert inactive.due(broker, seen, 10, 20.0) == ["/queue/idle"]

    run(scenario)


def test_an_idle_queue_with_stored_messages_is_kept(
        store: SqlStore, settings: Settings) -> None:
    async def scenario() -> None:
        async with Master(store, settings, "a") as broker:
            client = connect(broker)
            send(broker, client, "/queue/kept", "stored", receipt="r")
            await until(lambda: bool(client.of("RECEIPT")))
            q = broker.queues["/queue/kept"]
            q.drop(lambda m: True)  # as if only the store held it (not paged in)
            ops = Operations(broker, inactive._NoReads())
            seen = {"/queue/kept": inactive._Idle(0.0, inactive._mark(broker, "/queue/kept"))}
            await inactive._delete(broker, ops, "/queue/kept", seen)
            assert "/queue/kept" in broker.queues and q.store_has_more
            assert "/queue/kept" in stored_names(store)
            broker.queue("/queue/gone")
            send(broker, client, "/queue/gone", "x", receipt="r2")
            await until(lambda: len(client.of("RECEIPT")) == 2)
            subscribe(broker, client, "/queue/gone", "g")
            await until(lambda: bool(client.of("MESSAGE")))
            broker.handle(client, Frame("UNSUBSCRIBE", {"id": "g"}))
            broker.writes.flush()
            await broker.committer.drain()  # its ACK is in the store
            seen = {"/queue/gone": inactive._Idle(0.0, inactive._mark(broker, "/queue/gone"))}
            await inactive._delete(broker, ops, "/queue/gone", seen)
            assert "/queue/gone" not in broker.queues
            assert "/queue/gone" not in stored_names(store)

    run(scenario)


def test_the_setting_is_off_unless_given() -> None:
    assert Settings().gc_inactive_destinations == 0
    with pytest.raises(SettingsError, match="gc_inactive_destinations"):
        load_settings({"gc_inactive_destinations": "-1"}, environ={})


def test_the_store_says_whether_a_destination_holds_any_message(store: SqlStore) -> None:
    epoch = store.claim_epoch("a")
    empty, plain, scheduled = (DestinationRow(i, f"/queue/{n}", "queue")
                               for i, n in ((1, "empty"), (2, "plain"), (3, "later")))

    def row(mid: int, dest: int, deliver_at: int = 0) -> NewMessage:
        return NewMessage(id=mid, destination_id=dest, message_id=f"ID:{mid}", headers={},
                          body=b"x", deliver_at=deliver_at)

    store.commit_batch(epoch, Batch(destinations=[empty, plain, scheduled],
                                    inserts=[row(1, 2), row(2, 3, deliver_at=2**40)]))
    assert not store.holds_messages(empty.id)
    assert store.holds_messages(plain.id)
    assert store.holds_messages(scheduled.id)  # paging does not see it; the GC must
    assert store.load_page(scheduled.id, 0, 10) == []
