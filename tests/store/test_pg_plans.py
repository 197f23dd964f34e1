"""The group commit's statements keep probing amq_messages by key whatever PostgreSQL's
statistics said when it planned them (``pg_batch.PLANNER_SETTINGS``).

The pipeline prepares its statements once per connection, and after five runs
PostgreSQL keeps a generic plan until the table's statistics change. A churning
queue's table looks empty after autovacuum truncates it; a plan made then (a hash
join over a sequential scan of the table) stayed while dead rows grew the table to a
gigabyte, and W1 fell to a fifth. Here: the table is made to look empty, the
statements are run into their cached plans, the table grows, and the plan each
would run now is read in the pipeline's own session (``EXPLAIN EXECUTE`` of its
prepared statements, run with ``EXPLAIN ANALYZE``)."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from store import Batch, SqlStore, pg_batch
from store.pg_pipeline import Statement
from store.schema import COUNTER_KINDS
from tests.helpers.store import MakeStore, master, msg

pytestmark = pytest.mark.integration

#: Runs after which PostgreSQL's plan cache may settle on a generic plan (plancache.c:
#: five custom plans first).
CUSTOM_PLANS_FIRST = 5
#: Rows the group grows by once the plans are cached (far more than a key probe reads),
#: and the first of their ids: beyond those the statements are asked about.
GROWTH_ROWS = 5000
GROWTH_FIRST_ID = 100_000
#: The pipeline's statements that find amq_messages' rows by id.
PROBING = (pg_batch.S_UNDELIVER, pg_batch.S_DELIVER, pg_batch.S_RELEASE, pg_batch.S_ACK_COUNT,
           pg_batch.S_INSERT_ACK_COUNT)
#: A value for each of their parameters, as an SQL literal: the group, one message id
#: (``aid``: the one INSERT_ACK_COUNT acks), nothing to insert.
ARGUMENTS = {"g": "'g1'", "e": "1", "now": "0", "id": "'{1}'", "n": "'{1}'", "d": "'{1}'",
             "lo": "1", "hi": "1", "aid": "'{1}'", "alo": "1", "ahi": "1",
             **dict.fromkeys(("dk", "dp", "ds", "di", "dst", "mid", "pid", "pseq", "k", "prio",
                              "exp", "enq", "dc", "h", "b"), "'{}'"),
             **dict.fromkeys(COUNTER_KINDS, "'{0}'")}
#: INSERT_ACK_COUNT's ``id`` is the inserts': none.
NOTHING_INSERTED = {pg_batch.S_INSERT_ACK_COUNT.name: {"id": "'{}'"}}


@pytest.fixture
def store_url(pg_url: str) -> str:
    """PostgreSQL only: the pipeline and its plans do not exist on SQLite."""
    return pg_url


def looks_empty(pg_url: str) -> None:
    """What autovacuum leaves behind a queue its consumers keep empty: the table
    truncated, its statistics saying no pages and no rows."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE amq_messages")
        relpages, reltuples = conn.execute(
            "SELECT relpages, reltuples FROM pg_class WHERE relname = 'amq_messages'"
        ).fetchone() or (None, None)
    assert (relpages, reltuples) == (0, 0)


def grow(pg_url: str) -> None:
    """Rows of the group, written behind the store's back: the cached plans see no new
    statistics, as while dead rows pile up between two autovacuums."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO amq_messages (grp, id, destination_id, message_id, priority,"
            " expires_at, enqueued_at, delivery_count, headers, body)"
            " SELECT 'g1', n, 1, 'm' || n, 4, 0, 0, 0, '{}', '\\x00'::bytea"
            " FROM generate_series(%s::int8, %s::int8) AS n",
            (GROWTH_FIRST_ID, GROWTH_FIRST_ID + GROWTH_ROWS - 1))


def scans_of_messages(store: SqlStore, st: Statement) -> list[dict[str, Any]]:
    """Run ``st`` for message 1 (gone: nothing changes) with ``EXPLAIN ANALYZE`` in the
    pipeline's session, so with the plan it would use now; the plan's scans of
    amq_messages."""
    pipeline = store._pipeline
    assert pipeline is not None
    name = st.name.decode()
    arguments = {**ARGUMENTS, **NOTHING_INSERTED.get(st.name, {})}
    args = ", ".join(arguments[p] for p in st.params)
    explain = Statement(f"explain_{name}",
                        f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE {name}({args})", {})
    (result,) = pipeline.transaction([(explain, {})])
    scans = []
    todo = [json.loads(pipeline.texts(result)[0])[0]["Plan"]]
    while todo:
        node = todo.pop()
        todo += node.get("Plans", [])
        if node.get("Relation Name") == "amq_messages" and "Scan" in node["Node Type"]:
            scans.append(node)
    return scans


def test_a_plan_made_on_an_empty_looking_table_reads_only_its_ids(
        make_store: MakeStore, pg_url: str) -> None:
    s, e = master(make_store)
    looks_empty(pg_url)
    next_id = 1
    for _ in range(CUSTOM_PLANS_FIRST + 2):
        a, b = next_id, next_id + 1
        next_id += 2
        s.commit_batch(e, Batch(inserts=[msg(a), msg(b)]))
        s.commit_batch(e, Batch(deliveries=[(None, a), (None, b)]))
        s.commit_batch(e, Batch(releases=[(None, a)], undeliveries=[b]))
        s.commit_batch(e, Batch(acks=[(None, a), (None, b)],
                                counters={1: [0, 2, 0, 0, 0, 0, 0]}))
        # Inserts, acks and totals in one commit: INSERT_ACK_COUNT (ids of their own).
        s.commit_batch(e, Batch(inserts=[msg(a + 50_000)], acks=[(None, b + 50_000)],
                                counters={1: [1, 1, 0, 0, 0, 0, 0]}))
    grow(pg_url)
    for st in PROBING:
        scans = scans_of_messages(s, st)
        assert scans, st.name
        for scan in scans:
            # Reading the group's 5000 other rows is what took W1 down; message 1's
            # probe (or its span, 1 to 1) reads none.
            assert scan["Node Type"] != "Seq Scan", scan
            assert scan["Actual Rows"] * scan["Actual Loops"] == 0, scan
            assert scan.get("Rows Removed by Filter", 0) == 0, scan
            assert scan.get("Rows Removed by Join Filter", 0) == 0, scan


def test_the_pipelines_session_has_the_planner_settings(make_store: MakeStore) -> None:
    s, e = master(make_store)
    s.commit_batch(e, Batch(inserts=[msg(1)]))
    assert s._pipeline is not None
    probe = Statement("settings", "SELECT current_setting('enable_seqscan') || ','"
                      " || current_setting('enable_hashjoin') || ','"
                      " || current_setting('enable_mergejoin')", {})
    (result,) = s._pipeline.transaction([(probe, {})])
    assert s._pipeline.texts(result) == ["off,off,off"]
