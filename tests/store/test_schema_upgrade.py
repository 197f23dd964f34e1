"""Schema upgrades on a real SQLite file and a real PostgreSQL: v1 -> v2 (durable
subscriptions' owner) and on to v3 (scheduled delivery: ``amq_messages.deliver_at``,
``schedule`` and the due index). An old store is upgraded in place, keeps its
subscriptions and what they are owed, and brokers starting at once on it all succeed."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import create_engine, inspect, text

from store import Batch, SqlStore, StoreError, StoreUnusable, SubscriptionRow
from store import engine as store_sql  # the pool's STORE_STATEMENT_TIMEOUT_MS
from store.schema import SCHEMA_VERSION
from tests.helpers.store import (
    SUB1,
    SUB2,
    TOPIC,
    MakeStore,
    dml_only_role,
    make_v1_store,
    master,
    msg,
    one,
    open_at_once,
    sql,
)


def columns(store: SqlStore) -> set[str]:
    return {c["name"] for c in inspect(store.engine).get_columns("amq_subscriptions")}


def test_v1_store_is_upgraded_and_keeps_its_subscriptions(store_url: str,
                                                          make_store: MakeStore) -> None:
    make_v1_store(store_url, "g1", [SUB1, SUB2], TOPIC,
                  [msg(1, TOPIC.id, subs=(1, 2)), msg(2, TOPIC.id, subs=(1,))])
    s = make_store("g1")
    assert SCHEMA_VERSION == 5
    assert one(s, "SELECT value FROM amq_meta WHERE key = 'schema_version'") \
        == str(SCHEMA_VERSION)
    assert "owner" in columns(s)
    epoch = s.claim_epoch("new-node")
    subs = s.recover(epoch).subscriptions
    assert [(r.id, r.client_id, r.name, r.pending, r.owner) for r in subs] == [
        (1, "c1", "s1", 2, None), (2, "c2", "s2", 1, None)]
    assert [m.id for m in s.load_subscription_page(SUB1.id, 0, 10)] == [1, 2]
    # Opening it again (another node, a restart) changes nothing.
    make_store("g1")
    assert one(s, "SELECT count(*) FROM amq_meta") == 1


def test_an_ownerless_subscription_is_claimed_once(make_store: MakeStore) -> None:
    s, epoch = master(make_store)  # SUB1, SUB2 without owner
    s.commit_batch(epoch, Batch(claimed_subscriptions=[(SUB1.id, "alice")]))
    # A later claim (bob's, or a replay) does not take it over.
    s.commit_batch(epoch, Batch(claimed_subscriptions=[(SUB1.id, "bob")]))
    s.commit_batch(epoch, Batch(subscriptions=[SubscriptionRow(7, "c7", "s7", TOPIC.id,
                                                               owner="carol")]))
    assert sql(s, "SELECT id, owner FROM amq_subscriptions ORDER BY id") == [
        (1, "alice"), (2, None), (7, "carol")]
    assert {r.id: r.owner for r in s.recover(epoch).subscriptions} == {
        1: "alice", 2: None, 7: "carol"}


def test_nodes_starting_at_once_on_a_v1_store_all_succeed(store_url: str) -> None:
    make_v1_store(store_url, "g1", [SUB1], TOPIC, [msg(1, TOPIC.id, subs=(1,))])
    stores, errors = open_at_once(store_url, ["g1"] * 3)
    try:
        assert errors == []
        assert one(stores[0], "SELECT value FROM amq_meta WHERE key = 'schema_version'") \
            == str(SCHEMA_VERSION)
        epoch = stores[0].claim_epoch("node-0")
        assert [m.id for m in stores[0].load_subscription_page(SUB1.id, 0, 10)] == [1]
        assert [r.owner for r in stores[0].recover(epoch).subscriptions] == [None]
    finally:
        for s in stores:
            s.close()


def test_a_pg_upgrade_waiting_for_a_busy_table_gives_up_and_retries(pg_url: str) -> None:
    """An ALTER waiting for its lock blocks the table for everyone: it waits at most
    UPGRADE_LOCK_TIMEOUT_MS, not the 15 s statement timeout, and changes nothing; the
    next open (the node retries) upgrades."""
    make_v1_store(pg_url, "g1", [SUB1], TOPIC, [])
    holder = create_engine(pg_url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with holder.connect() as conn, conn.begin():
            conn.execute(text("LOCK TABLE amq_subscriptions IN ROW EXCLUSIVE MODE"))
            late = SqlStore(pg_url, "g1")
            started = time.monotonic()
            with pytest.raises(StoreError, match="lock timeout"):
                late.open()
            assert time.monotonic() - started < store_sql.STORE_STATEMENT_TIMEOUT_MS / 1000
        with holder.connect() as conn:
            assert conn.scalar(text("SELECT value FROM amq_meta")) == "1"
    finally:
        holder.dispose()
    s = SqlStore(pg_url, "g1")
    s.open()
    try:
        assert one(s, "SELECT value FROM amq_meta WHERE key = 'schema_version'") \
            == str(SCHEMA_VERSION)
    finally:
        s.close()


def test_a_pg_role_that_may_not_upgrade_is_told_once_not_retried(pg_url: str) -> None:
    """A v1 store opened by a role that does not own its tables (an application role
    with only DML grants): ALTER TABLE is refused with insufficient_privilege. That is
    a setting to fix, not a store that is not there yet: StoreUnusable naming the
    privilege (the node exits with one line instead of retrying forever as if the
    store were unreachable), and the store is left as it was. (Since v4 adds a table,
    the first refusal may be CREATE TABLE's: no privilege on the schema.)"""
    make_v1_store(pg_url, "g1", [SUB1], TOPIC, [])
    with dml_only_role(pg_url, "amq_dml_only") as (app_url, admin):
        with pytest.raises(StoreUnusable, match=r"must be owner of table amq_subscriptions|"
                                                r"permission denied for schema public"):
            SqlStore(app_url, "g1").open()
        with admin.connect() as conn:
            assert conn.scalar(text("SELECT value FROM amq_meta")) == "1"
