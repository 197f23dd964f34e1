"""Per-destination totals that survive a takeover (issue 27): two real brokers of one
group, each with its management API; traffic through stomp.py, a NACK to the
dead-letter queue, a move and a purge by ``amqlite queue``, a message reaped as
expired; then the master is SIGKILLed and the new master shows the same totals in
``/api/v1/destinations``, ``/metrics`` and ``amqlite queue list``. On the embedded
store and on PostgreSQL."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.broker_fixtures import store_args
from tests.helpers.broker_proc import BrokerFactory, ClientPool, unique
from tests.helpers.cluster import amqlite
from tests.helpers.mgmt import Api, pair_with_http, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

KINDS = ("enqueued", "dequeued", "expired", "dead_lettered", "moved", "purged",
         "overflow_dropped")
#: The first NACK dead-letters; expired rows are reaped every 0.2 s.
ENV = {"AMQLITE_MAX_REDELIVERIES": "0", "AMQLITE_HOUSEKEEPING_INTERVAL": "0.2",
       "AMQLITE_LOCK_POLL_INTERVAL": "0.1"}
#: A bounded queue that drops its oldest (amqlite.policy): what it drops is counted.
POLICY = """
[[policy]]
destination = "/queue/cnt-drop.>"
max_length = 1
overflow = "drop-head"
"""


def totals(row: dict[str, Any] | None) -> dict[str, int]:
    assert row is not None
    return {k: row[k] for k in KINDS}


def metric(text: str, kind: str, dest: str) -> float | None:
    m = re.search(rf'^amqlite_messages_{kind}_total\{{destination="{re.escape(dest)}"\}} (\S+)$',
                  text, re.M)
    return float(m.group(1)) if m else None


def cli_list(http: str) -> dict[str, dict[str, Any]]:
    proc = amqlite("queue", "list", "--url", http, "--json")
    assert proc.returncode == 0, proc.stderr
    return {r["name"]: r for r in json.loads(proc.stdout)}


@pytest.mark.parametrize("store", ["sqlite", "postgresql"])
def test_counts_survive_a_sigkill_takeover(store: str, broker_factory: BrokerFactory,
                                           clients: ClientPool, tmp_path: Path,
                                           request: pytest.FixtureRequest) -> None:
    config = tmp_path / "policy.toml"
    config.write_text(POLICY)
    master, slave = pair_with_http(broker_factory, ("cnt-a", "cnt-b"), ENV,
                                   store_args(store, request), ["--config", str(config)])
    api = Api(master.http)  # type: ignore[attr-defined]
    q, other, dlq = f"/queue/{unique('cnt')}", f"/queue/{unique('cnt-to')}", "/queue/DLQ"
    producer = clients(master.port)
    for i in range(10):
        producer.send(q, f"m{i}", {"persistent": "true"})
    # Consume four (ACK), NACK one past the limit (to the dead-letter queue).
    consumer = clients(master.port)
    consumer.subscribe(q, ack="client-individual", headers={"activemq.prefetchSize": "5"})
    frames = consumer.listener.wait_messages(5)
    for f in frames[:4]:
        consumer.ack(f)
    consumer.nack(frames[4])
    consumer.close()
    wait_until(lambda: (d := api.destination(q)) and d["waiting"] == 5 and d["in_flight"] == 0,
               what="5 waiting, none in flight")
    # Move two (by id), purge the other three: by the CLI, as an operator does.
    ids = [m["id"] for m in api.ok("GET", f"/api/v1/messages{q}?limit=2")["messages"]]
    moved = amqlite("queue", "move", q, other, *[f"--id={i}" for i in ids],
                    "--url", api.base)
    assert moved.returncode == 0, moved.stderr
    purged = amqlite("queue", "purge", q, "--url", api.base)
    assert purged.returncode == 0 and "purged 3 messages" in purged.stdout, purged.stderr
    # One that expires while nobody consumes: the store's reaper counts it.
    producer.send(q, "short", {"persistent": "true",
                               "expires": str(int(time.time() * 1000) + 300)})
    wait_until(lambda: (d := api.destination(q)) and d["expired"] == 1, what="1 expired")

    # Three into a queue that keeps one: two dropped by its policy.
    bounded = f"/queue/cnt-drop.{unique('q')}"
    for i in range(3):
        producer.send(bounded, f"b{i}", {"persistent": "true"})

    expected = {"enqueued": 11, "dequeued": 4, "expired": 1, "dead_lettered": 1, "moved": 2,
                "purged": 3, "overflow_dropped": 0}
    assert totals(api.destination(q)) == expected
    assert api.destination(dlq)["enqueued"] == 1  # type: ignore[index]
    assert api.destination(other)["enqueued"] == 2  # type: ignore[index]
    assert api.destination(bounded)["overflow_dropped"] == 2  # type: ignore[index]
    before = {d: totals(api.destination(d)) for d in (q, other, dlq, bounded)}

    master.kill()  # SIGKILL: nothing flushed on the way out
    slave.wait_serving()
    new_api = Api(slave.http)  # type: ignore[attr-defined]
    wait_until(lambda: new_api.destination(q) is not None, what="the new master's API")
    after = {d: totals(new_api.destination(d)) for d in (q, other, dlq, bounded)}
    assert after == before
    # The same numbers in /metrics and in `amqlite queue list`.
    status, page = new_api.get("/metrics")
    assert status == 200
    for kind, n in expected.items():  # a total still 0 has no sample yet
        assert (metric(page, kind, q) or 0) == n, kind
    assert metric(page, "enqueued", dlq) == 1
    assert metric(page, "overflow_dropped", bounded) == 2
    listed = cli_list(slave.http)  # type: ignore[attr-defined]
    assert totals(listed[q]) == expected and listed[dlq]["enqueued"] == 1
    # And counting goes on from there on the new master.
    clients(slave.port).send(q, "after", {"persistent": "true"})
    wait_until(lambda: new_api.destination(q)["enqueued"] == 12,  # type: ignore[index]
               what="12 enqueued")


def test_an_in_flight_message_reaped_as_expired_counts_once(
        broker_factory: BrokerFactory, clients: ClientPool) -> None:
    """The store's reaper deletes an expired row even while a consumer holds it (and
    counts it expired); the consumer's later ACK must not count it dequeued too."""
    master, _ = pair_with_http(broker_factory, ("once-a", "once-b"), ENV, [])
    api = Api(master.http)  # type: ignore[attr-defined]
    q = f"/queue/{unique('once')}"
    consumer = clients(master.port)
    consumer.subscribe(q, ack="client-individual")
    clients(master.port).send(q, "short", {"persistent": "true",
                                           "expires": str(int(time.time() * 1000) + 300)})
    [frame] = consumer.listener.wait_messages(1)
    wait_until(lambda: (d := api.destination(q)) and d["expired"] == 1,
               what="the in-flight message reaped")
    consumer.ack(frame)
    clients(master.port).send(q, "marker", {"persistent": "true"})
    [_, marker] = consumer.listener.wait_messages(2)
    consumer.ack(marker)
    row = wait_until(lambda: (d := api.destination(q)) and d["dequeued"] == 1 and d,
                     what="the marker's ACK counted")
    assert totals(row)["expired"] == 1 and row["dequeued"] == 1 and row["enqueued"] == 2
