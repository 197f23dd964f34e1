"""``Store.vacuum_messages``: the space of acknowledged messages' rows is reusable
right after it, not after autovacuum's next pass (``amqlite.vacuum``)."""

from __future__ import annotations

from store import Batch, SqlStore
from tests.helpers.store import MakeStore, master, msg, one

MESSAGES = 200


def test_the_deleted_rows_are_vacuumed(make_store: MakeStore, store_url: str) -> None:
    s, e = master(make_store)
    ids = list(range(1, MESSAGES + 1))
    s.commit_batch(e, Batch(inserts=[msg(i) for i in ids]))
    s.commit_batch(e, Batch(acks=[(None, i) for i in ids]))
    s.vacuum_messages()
    assert one(s, "SELECT count(*) FROM amq_messages") == 0
    if store_url.startswith("postgresql"):
        # VACUUM reports to the statistics as it ends (pgstat_report_vacuum).
        with s.engine.connect() as conn:
            vacuumed, dead = conn.exec_driver_sql(
                "SELECT vacuum_count, n_dead_tup FROM pg_stat_user_tables"
                " WHERE relname = 'amq_messages'").one()
        assert (vacuumed, dead) == (1, 0)
    s.commit_batch(e, Batch(inserts=[msg(MESSAGES + 1)]))  # the store goes on as before
    assert one(s, "SELECT count(*) FROM amq_messages") == 1
    s.vacuum_messages()  # nothing acknowledged since: no pass
    if store_url.startswith("postgresql"):
        assert vacuum_count(s) == 1
        s.commit_batch(e, Batch(acks=[(None, MESSAGES + 1)]))
        s.vacuum_messages()
        assert vacuum_count(s) == 2


def vacuum_count(s: SqlStore) -> int:
    with s.engine.connect() as conn:
        return int(conn.exec_driver_sql(
            "SELECT vacuum_count FROM pg_stat_user_tables WHERE relname = 'amq_messages'"
        ).scalar_one())
