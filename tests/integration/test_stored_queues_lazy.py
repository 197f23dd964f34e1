"""Issue 23: stored queues are made in memory on first use, not at activation
(``Broker.dormant``), against real broker processes.

20,000 queue rows are written to a store before any broker runs. A broker activating
on it holds a bounded amount more than one on an empty store (before: every queue was a
``Source`` in memory, about 1.2 KB each) and activates about as fast; the listing,
``/metrics`` and the console's API still show every stored queue, and what the store
holds for queues not in memory is found: a stored message is delivered exactly once,
an expired one is reaped and counted, a scheduled one comes when due, one in flight
under the old master is redelivered and dead-lettered into a dead-letter queue that
already held one.
"""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from store import Batch, DestinationRow, NewMessage, open_store
from tests.helpers.broker_proc import HOST, BrokerFactory, BrokerProcess, ClientPool
from tests.helpers.poll import poll
from tests.helpers.servers import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

QUEUES = 20_000
#: RSS the 20,000 rows may add to a broker's (measured: about 10 MB: the names, their
#: ids, and what reading the rows left in the allocator; before, 24 MB more in Sources).
RSS_GROWTH = 18 * 1024 * 1024
#: Activation of 20,000 rows (read from the store, nothing made per queue): measured
#: about 0.2 s, before 0.4 s; the bound leaves a loaded 2-core machine room.
ACTIVATION_MS = 3_000
ROWS_PER_BATCH = 2_000
#: The queues the messages are in, and the shared dead-letter queue (a row too).
PLAIN, EXPIRED, SCHEDULED, IN_FLIGHT = (f"/queue/many.{i}" for i in (10_000, 10_001,
                                                                        10_002, 10_003))
DLQ = "/queue/DLQ"
#: The default policy's max_redeliveries: one delivery more dead-letters it.
MAX_REDELIVERIES = 6
SCHEDULED_DELAY_MS = 4_000


def seed(data_dir: Path) -> None:
    """20,000 queue rows (and the DLQ's) in the store of ``data_dir``, as a master that
    is gone left them, with a message in four of them and in the DLQ."""
    store = open_store(f"sqlite:///{data_dir / 'amqlite.db'}", "default")
    store.open()
    try:
        epoch = store.claim_epoch("gone")
        rows = [DestinationRow(i, f"/queue/many.{i}", "queue") for i in range(1, QUEUES)]
        rows.append(DestinationRow(QUEUES, DLQ, "queue"))
        ids = {r.name: r.id for r in rows}
        for at in range(0, len(rows), ROWS_PER_BATCH):
            store.commit_batch(epoch, Batch(destinations=rows[at:at + ROWS_PER_BATCH]))

        def message(mid: int, name: str, **extra: Any) -> NewMessage:
            return NewMessage(id=mid, destination_id=ids[name], message_id=f"ID:seed:{mid}",
                              headers={}, body=f"{name} {mid}".encode(), enqueued_at=1, **extra)

        store.commit_batch(epoch, Batch(inserts=[
            message(1, PLAIN), message(2, EXPIRED, expires_at=1),
            message(3, IN_FLIGHT, delivery_count=MAX_REDELIVERIES), message(4, DLQ)]))
    finally:
        store.close()


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS in /proc/{pid}/status")


def activation_ms(broker: BrokerProcess) -> int:
    found = re.search(r"activated in (\d+) ms", broker.log_text())
    assert found, broker.log_tail()
    return int(found.group(1))


def api(port: int, path: str) -> Any:
    with urllib.request.urlopen(f"http://{HOST}:{port}{path}", timeout=30) as r:
        body = r.read().decode()
    return json.loads(body) if path.startswith("/api/") else body


def test_stored_queues_are_made_on_first_use_and_nothing_stored_is_lost(
        broker_factory: BrokerFactory, clients: ClientPool) -> None:
    data = broker_factory.data_dir("seeded")
    seed(data)
    # Memory and activation: a broker on the 20,000 rows against one on an empty store.
    quiet = ["--http", "off"]
    empty = broker_factory.new(name="empty", extra_args=quiet).start()
    first = broker_factory.new(name="first", data_dir=data, extra_args=quiet).start()
    empty.wait_serving()
    first.wait_serving()
    growth = rss(first.pid) - rss(empty.pid)
    assert growth < RSS_GROWTH, f"20,000 stored queues took {growth / 1e6:.1f} MB"
    assert activation_ms(first) < ACTIVATION_MS, first.log_tail()
    assert f"{QUEUES} destinations" in first.log_text()
    # A scheduled message for a stored queue, due once the next master serves.
    clients(first.port).send(SCHEDULED, "later",
                             {"AMQ_SCHEDULED_DELAY": str(SCHEDULED_DELAY_MS)})
    first.kill()
    empty.terminate()

    # The takeover: the next master, with the API, reaping every half second.
    http = free_port()
    broker = broker_factory.new(name="next", data_dir=data, extra_args=[
        "--http", f"{HOST}:{http}"], env={"AMQLITE_HOUSEKEEPING_INTERVAL": "0.5"}).start()
    broker.wait_serving()
    listed = {d["name"]: d for d in api(http, "/api/v1/destinations")["destinations"]}
    assert len(listed) == QUEUES and "/queue/many.19999" in listed
    assert listed[PLAIN]["waiting"] == 1 and listed[DLQ]["waiting"] == 1
    assert 'destination="/queue/many.19999"' in api(http, "/metrics")
    browsed = api(http, f"/api/v1/messages{PLAIN}")  # the API's browse of one not in memory
    assert [m["body"] for m in browsed["messages"]] == [f"{PLAIN} 1"], browsed
    # The store's reaper deletes and counts the expired one, its queue not in memory.
    poll(lambda: api(http, f"/api/v1/destinations{EXPIRED}"),
         lambda d: d["expired"] == 1 and d["waiting"] == 0, timeout=30,
         what="the expired message reaped and counted")
    # The scheduler brings the scheduled one when due into its queue, made for it.
    poll(lambda: api(http, f"/api/v1/destinations{SCHEDULED}")["waiting"], lambda n: n == 1,
         timeout=SCHEDULED_DELAY_MS / 1000 + 30, what="the scheduled message due")

    consumer = clients(broker.port)
    consumer.subscribe(PLAIN)
    consumer.subscribe(SCHEDULED)
    consumer.send(PLAIN, "marker")  # after the stored one: the last to come
    got = consumer.listener.wait_messages(3)
    consumer.listener.wait_for(
        lambda: any(m.body == "marker" for m in consumer.listener.messages))
    bodies = sorted(m.body for m in consumer.listener.messages)
    assert bodies == sorted([f"{PLAIN} 1", "marker", "later"]), bodies
    assert len(got) >= 3

    # In flight under the gone master: redelivered, NACKed once more, dead-lettered
    # into the stored DLQ (not in memory either) next to what it held.
    nacker = clients(broker.port)
    nacker.subscribe(IN_FLIGHT, ack="client-individual")
    frame = nacker.listener.wait_messages(1)[0]
    assert frame.body == f"{IN_FLIGHT} 3" and frame.headers.get("redelivered") == "true"
    nacker.nack(frame)
    reader = clients(broker.port)
    reader.subscribe(DLQ)
    letters = reader.listener.wait_messages(2)
    assert sorted(m.body for m in letters) == sorted([f"{DLQ} 4", f"{IN_FLIGHT} 3"])
    assert broker.alive
