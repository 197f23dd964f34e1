"""``Store.vacuum_messages``: the space of acknowledged messages' rows is reusable
right after it, not after autovacuum's next pass (``amqlite.vacuum``)."""

from __future__ import annotations

import logging

import pytest

from store import Batch, SqlStore
from tests.helpers.store import MakeStore, dml_only_role, master, msg, one, store_opener

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


def test_a_role_that_may_not_vacuum_is_told_once(pg_url: str,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    """A deployment whose store role only has DML grants on tables another role owns:
    PostgreSQL's VACUUM would skip the table with a warning only its server log shows.
    The store asks once, says so in the broker's log, and does not try again."""
    with store_opener(pg_url) as make:
        owner, e = master(make)
        churn(owner, e, 1)
        owner.vacuum_messages()  # the schema's owner may
        assert owner.may_vacuum is True and vacuum_count(owner) == 1
    role = "amq_vacuum_dml_only"
    with dml_only_role(pg_url, role) as (app_url, _), store_opener(app_url) as make:
        s, e = master(make, group="g2")
        with caplog.at_level(logging.WARNING, logger="store.sql"):
            churn(s, e, 1)
            s.vacuum_messages()
            churn(s, e, MESSAGES + 1)
            s.vacuum_messages()
        assert s.may_vacuum is False
        told = [r.getMessage() for r in caplog.records if "may not VACUUM" in r.getMessage()]
        assert len(told) == 1, told
        assert f"role {role} may not VACUUM amq_messages" in told[0]
        assert vacuum_count(s) == 1  # the owner's pass only


def churn(s: SqlStore, epoch: int, first: int) -> None:
    """MESSAGES messages stored and acknowledged: dead rows a vacuum would reclaim."""
    ids = list(range(first, first + MESSAGES))
    s.commit_batch(epoch, Batch(inserts=[msg(i) for i in ids]))
    s.commit_batch(epoch, Batch(acks=[(None, i) for i in ids]))
