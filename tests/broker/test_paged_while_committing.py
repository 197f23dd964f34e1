"""A committed insert that a page read brings in before the insert is routed (the
scheduler routes its copies a loop turn after their commit; a consumer's page may load
in between) is in the queue once, not twice: seen as a scheduled copy delivered twice by
a new master in tests/integration/test_scheduled.py. In process, against SQLite."""

from __future__ import annotations

from amqlite.broker.message import Message
from amqlite.settings import Settings
from store import Store
from store.api import StoredMessage
from tests.broker.test_broker_store import Master, run


def _row(mid: int, did: int) -> StoredMessage:
    return StoredMessage(mid, did, f"ID:g1:{mid}", {}, b"x", 4, 0, 0, 0)


def test_an_insert_paged_in_before_it_is_routed_is_in_the_queue_once(
        store: Store, settings: Settings) -> None:
    async def scenario() -> None:
        async with Master(store, settings, "a") as broker:
            q = broker.queue("/queue/race")
            q.store_id, q.store_has_more = 7, True
            q.pending_inserts += 1  # the copy is staged (Scheduler._stage)
            q.page_loaded([_row(5, 7), _row(6, 7)], 10)  # read after its commit
            q.pending_inserts -= 1  # its commit's turn: routed now
            q.append_committed(Message.from_row(_row(6, 7), "/queue/race"))
            assert sorted(m.id for _, _, m in q.heap) == [5, 6]
            # With nothing pending, a page forgets the ids; a new insert is appended.
            q.page_loaded([], 10)
            assert not q.paged_committing
            q.append_committed(Message.from_row(_row(9, 7), "/queue/race"))
            assert sorted(m.id for _, _, m in q.heap) == [5, 6, 9]
            q.heap.clear()  # nothing to deliver or store at the end

    run(scenario)
