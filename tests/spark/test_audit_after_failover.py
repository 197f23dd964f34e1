"""The audit over a store written by real brokers through failovers must come back clean.

Three brokers share a PostgreSQL store and advisory lock; a failover client sends
persistent messages to a queue, to a topic with a durable subscriber and to a topic
with none, some in aborted transactions and some non-persistent, while the master
is SIGKILLed twice; a consumer takes part of the queue. Every producer sequence must
be accounted for, nothing stored twice, nothing orphaned: exit 0.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from amqlite.client import AsyncClient
from tests.helpers.broker_proc import BrokerFactory, wait_one_serving
from tests.spark.conftest import run_audit

pytestmark = [pytest.mark.integration, pytest.mark.spark]

MESSAGES = 120
KILL_AT = (40, 80)


@pytest.mark.timeout(240)
def test_audit_is_clean_after_failovers(
    spark: SparkSession, pg_url: str, tmp_path: Path
) -> None:
    factory = BrokerFactory(tmp_path / "brokers")
    try:
        brokers = [
            factory.new(name=f"n{i}", group="audited",
                        env={"AMQLITE_LOCK_KEEPALIVE": "0.5"},
                        extra_args=["--store", pg_url, "--locker", pg_url, "--rejoin"]).start()
            for i in range(3)
        ]
        wait_one_serving(brokers)
        url = ("failover:(" + ",".join(f"tcp://127.0.0.1:{b.port}" for b in brokers)
               + ")?randomize=false&initialReconnectDelay=20&maxReconnectDelay=500")

        async def traffic() -> None:
            durable = AsyncClient(url, client_id="auditor")
            await durable.connect()
            sub = await durable.subscribe("/topic/audited", durable_name="d",
                                          ack="client-individual")
            producer = AsyncClient(url, producer_id="p-audit")
            await producer.connect()
            for n in range(MESSAGES):
                if n in KILL_AT:
                    master, _ = wait_one_serving(brokers)
                    await asyncio.to_thread(master.kill)
                    await asyncio.to_thread(master.start)  # back as a slave
                if n % 10 == 3:
                    tx = await producer.begin()
                    await producer.send("/queue/audited", f"tx-{n}", transaction=tx)
                    await producer.abort(tx)
                elif n % 10 == 5:
                    await producer.send("/topic/nobody-listens", f"t-{n}")
                elif n % 10 == 7:
                    await producer.send("/queue/audited", f"np-{n}", persistent=False)
                elif n % 2:
                    await producer.send("/topic/audited", f"d-{n}")
                else:
                    await producer.send("/queue/audited", f"q-{n}")
            consumer = AsyncClient(url)
            await consumer.connect()
            queue = await consumer.subscribe("/queue/audited", ack="client-individual")
            for _ in range(10):  # consume part of the queue
                message = await queue.receive(10)
                assert message is not None
                assert await consumer.ack(message)
            for _ in range(5):  # and part of the durable subscription
                message = await sub.receive(10)
                assert message is not None
                assert await durable.ack(message)
            for client in (consumer, producer, durable):
                await client.disconnect()

        asyncio.run(asyncio.wait_for(traffic(), 180))
    finally:
        factory.close()

    run = run_audit(["--store", pg_url, "--group", "audited"], str(tmp_path / "audit"))
    assert run.code == 0, f"audit found problems:\n{run.stdout}\n{run.stderr}"
    assert run.summary["findings"] == [] or all(
        row["count"] == 0 for row in run.summary["findings"]
    ), run.summary["findings"]
