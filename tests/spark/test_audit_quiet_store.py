"""Issue 26: a store audited after its broker stopped has nothing wrong with it.

A real broker writes and consumes through its own commit path and prunes its dedup
window (recording the prune in the store), then stops. Audited two hours later, the
dedup entries it wrote are past the window, but no broker has run since to prune
them: that is housekeeping pending, reported, not a ``dedup_expired`` finding, and
exit 0. An entry that the recorded prune should have removed is a finding.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from sqlalchemy import create_engine, text

from amqlite.client import AsyncClient
from spark.audit_job import EXIT_CLEAN, EXIT_FINDINGS, FINDINGS
from tests.helpers.broker_proc import BrokerFactory
from tests.helpers.poll import poll
from tests.spark.conftest import run_audit
from tests.spark.seed import HOUR_MS, engine_url

pytestmark = [pytest.mark.spark, pytest.mark.integration]

GROUP = "quiet"
SENDS = 30
CONSUMED = 10
#: Housekeeping rounds of the broker under test (s): soon after it starts.
HOUSEKEEPING_S = "0.2"
#: The prunes the store recorded (store/housekeeping.py dedup_pruned_key).
PRUNES_SQL = "SELECT value FROM amq_meta WHERE key LIKE 'dedup_pruned:%'"


def _store_rows(url: str, sql: str) -> list[tuple[object, ...]]:
    engine = create_engine(engine_url(url))
    try:
        with engine.begin() as conn:
            return [tuple(r) for r in conn.execute(text(sql))]
    finally:
        engine.dispose()


def _run_broker_then_stop(tmp_path: Path, store_args: list[str]) -> str:
    """Send, consume part, wait for a recorded prune, stop the broker; return the
    store's URL as the audit takes it."""
    factory = BrokerFactory(tmp_path / "brokers")
    try:
        broker = factory.start(
            group=GROUP,
            env={"AMQLITE_HOUSEKEEPING_INTERVAL": HOUSEKEEPING_S},
            extra_args=store_args,
        )
        url = f"tcp://127.0.0.1:{broker.port}"

        async def traffic() -> None:
            producer = AsyncClient(url, producer_id="p-quiet")
            await producer.connect()
            for n in range(SENDS):
                await producer.send("/queue/quiet", f"m-{n}")
            await producer.send("/topic/nobody", "t")  # an identity, no message
            consumer = AsyncClient(url)
            await consumer.connect()
            sub = await consumer.subscribe("/queue/quiet", ack="client-individual")
            for _ in range(CONSUMED):
                message = await sub.receive(10)
                assert message is not None
                assert await consumer.ack(message)
            await consumer.disconnect()
            await producer.disconnect()

        asyncio.run(asyncio.wait_for(traffic(), 60))
        store = store_args[1] if store_args else f"sqlite:///{broker.data_dir}/amqlite.db"
        poll(
            lambda: _store_rows(store, PRUNES_SQL),
            timeout=30,
            what="a recorded dedup prune",
        )
        broker.terminate()
        return store
    finally:
        factory.close()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_stopped_broker_store_is_clean_with_housekeeping_pending(
    spark: SparkSession, tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    store_args: list[str] = []
    if backend == "postgresql":
        store_args = ["--store", request.getfixturevalue("pg_url")]
    store = _run_broker_then_stop(tmp_path, store_args)
    entries = SENDS + 1
    assert _store_rows(store, "SELECT COUNT(*) FROM amq_dedup") == [(entries,)]
    later = int(time.time() * 1000) + 2 * HOUR_MS

    run = run_audit(["--store", store, "--now", str(later)], str(tmp_path / "audit"))
    assert run.code == EXIT_CLEAN, run.stdout + run.stderr
    assert run.summary["counts"] == {f: 0 for f in FINDINGS}
    pending = run.summary["housekeeping_pending"][GROUP]
    assert pending["dedup_entries_past_window"] == entries
    assert pending["last_prune_at"] is not None
    assert (
        f"housekeeping pending (not a finding): group {GROUP}: {entries} dedup entries"
        in run.stdout
    )
    assert run.stdout.endswith(
        "clean: no duplicates, orphans, stale state or sequence gaps found\n"
    )

    # One entry older than what the recorded prune removed: the pruner missed it.
    (before,) = (
        json.loads(str(v))["before"]
        for (v,) in _store_rows(store, PRUNES_SQL)
    )
    engine = create_engine(engine_url(store))
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE amq_dedup SET created_at = :at WHERE grp = :g AND producer_seq = 1"
            ),
            {"at": before - 1, "g": GROUP},
        )
    engine.dispose()
    run = run_audit(["--store", store, "--now", str(later), "--json"])
    assert run.code == EXIT_FINDINGS, run.stdout + run.stderr
    summary = json.loads(run.stdout)
    assert summary["counts"] == {f: (1 if f == "dedup_expired" else 0) for f in FINDINGS}
    assert summary["housekeeping_pending"][GROUP]["dedup_entries_past_window"] == entries - 1
