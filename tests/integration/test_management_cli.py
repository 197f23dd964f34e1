"""``amqlite queue|connection|status`` as a user runs them, against a real broker."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from tests.helpers.broker_proc import (
    BrokerFactory,
    BrokerProcess,
    ClientPool,
    unique,
)
from tests.helpers.cluster import amqlite as run_amqlite
from tests.helpers.mgmt import Api, start_with_http, wait_until
from tests.helpers.servers import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def broker(module_factory: BrokerFactory) -> BrokerProcess:
    return start_with_http(module_factory, "mgmtcli", env={"AMQLITE_MAX_REDELIVERIES": "0"})


def amqlite(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """``helpers.cluster.amqlite`` (no stray AMQLITE_* settings), checked."""
    proc = run_amqlite(*args)
    if check:
        assert proc.returncode == 0, f"amqlite {' '.join(args)}: {proc.stderr}"
    assert "Traceback" not in proc.stderr
    return proc


def as_json(broker: BrokerProcess, *args: str) -> Any:
    return json.loads(amqlite(*args, "--url", broker.http, "--json").stdout)  # type: ignore


def _fill(broker: BrokerProcess, clients: ClientPool, dest: str, n: int) -> None:
    producer = clients(broker.port)
    for i in range(n):
        producer.send(dest, f"{dest.rsplit('/', 1)[-1]}-{i}")
    api = Api(broker.http)  # type: ignore[attr-defined]
    wait_until(lambda: (d := api.destination(dest)) and d["waiting"] == n, what=f"{n} in {dest}")


def test_queue_list_and_browse(broker: BrokerProcess, clients: ClientPool) -> None:
    dest = f"/queue/{unique('cli-list')}"
    _fill(broker, clients, dest, 3)
    rows = as_json(broker, "queue", "list")
    [row] = [r for r in rows if r["name"] == dest]
    assert row["waiting"] == 3 and row["enqueued"] == 3
    text = amqlite("queue", "list", "--url", broker.http).stdout  # type: ignore[attr-defined]
    header, *lines = text.splitlines()
    assert header.split() == ["destination", "waiting", "in-flight", "consumers", "enqueued",
                              "dequeued", "expired", "dead-lettered", "moved", "purged",
                              "dropped", "policy"]
    assert any(line.split()[:2] == [dest, "3"] for line in lines)

    page = as_json(broker, "queue", "browse", dest, "--limit", "2")
    assert [m["body"] for m in page["messages"]] == [f"{dest[7:]}-0", f"{dest[7:]}-1"]
    text = amqlite("queue", "browse", dest, "--limit", "2", "--url",
                   broker.http).stdout  # type: ignore[attr-defined]
    assert f"(more: --after {page['next_after']})" in text and f"{dest[7:]}-1" in text


def test_queue_move_delete_purge(broker: BrokerProcess, clients: ClientPool) -> None:
    src, dst = f"/queue/{unique('cli-src')}", f"/queue/{unique('cli-dst')}"
    _fill(broker, clients, src, 4)
    ids = [m["id"] for m in as_json(broker, "queue", "browse", src)["messages"]]
    moved = as_json(broker, "queue", "move", src, dst, "--id", str(ids[0]))
    assert moved["moved"] == 1
    out = amqlite("queue", "delete", src, "--message", str(ids[1]), "--url",
                  broker.http).stdout  # type: ignore[attr-defined]
    assert f"deleted message {ids[1]} from {src}" in out
    out = amqlite("queue", "purge", src, "--url", broker.http).stdout  # type: ignore
    assert f"purged 2 messages from {src}" in out
    out = amqlite("queue", "delete", dst, "--url", broker.http).stdout  # type: ignore
    assert f"deleted {dst}: 1 messages removed" in out
    assert [m["body"] for m in as_json(broker, "queue", "browse", src)["messages"]] == []


def test_queue_retry(broker: BrokerProcess, clients: ClientPool) -> None:
    dest = f"/queue/{unique('cli-retry')}"
    consumer = clients(broker.port)
    consumer.subscribe(dest, ack="client-individual")
    clients(broker.port).send(dest, "dead")
    [msg] = consumer.listener.wait_messages(1)
    consumer.nack(msg)
    consumer.unsubscribe(consumer.subscriptions[0])

    def dead_ids() -> list[int]:
        page = as_json(broker, "queue", "browse", "/queue/DLQ", "--limit", "500")
        return [m["id"] for m in page["messages"]
                if m["headers"].get("original-destination") == dest]

    ids = wait_until(dead_ids, what="the dead letter")
    out = amqlite("queue", "retry", "--id", str(ids[0]), "--url",
                  broker.http).stdout  # type: ignore[attr-defined]
    assert f"retried 1 messages: 1 to {dest}" in out
    again = clients(broker.port)
    again.subscribe(dest)
    assert [m.body for m in again.listener.wait_messages(1)] == ["dead"]


def test_connection_list_and_close(broker: BrokerProcess, clients: ClientPool) -> None:
    cid = unique("cli-conn")
    client = clients(broker.port, headers={"client-id": cid})
    conns = as_json(broker, "connection", "list")
    [mine] = [c for c in conns if c["client_id"] == cid]
    text = amqlite("connection", "list", "--url", broker.http).stdout  # type: ignore
    assert any(line.split()[:3] == [mine["address"], "-", cid] for line in text.splitlines())
    out = amqlite("connection", "close", mine["address"], "--url",
                  broker.http).stdout  # type: ignore[attr-defined]
    assert f"closed the connection from {mine['address']}" in out
    assert client.listener.wait_for(lambda: client.listener.disconnected)


def test_status_of_a_node_and_of_a_group(broker: BrokerProcess) -> None:
    [node] = as_json(broker, "status")
    assert node["role"] == "master" and node["ready"] and node["name"] == "mgmtcli"
    registry = f"sqlite:///{broker.data_dir / 'amqlite.db'}"
    proc = amqlite("status", "--group", broker.group, "--registry", registry, "--json")
    [node] = json.loads(proc.stdout)
    assert node["http"] == broker.http and node["role"] == "master"  # type: ignore


def test_errors_are_one_line_with_exit_1(broker: BrokerProcess) -> None:
    proc = amqlite("queue", "purge", "/queue/no-such-queue", "--url",
                   broker.http, check=False)  # type: ignore[attr-defined]
    assert proc.returncode == 1
    assert proc.stderr.strip() == (f"amqlite: error: {broker.http}: 404 "  # type: ignore
                                   "no destination /queue/no-such-queue")
    proc = amqlite("status", "--url", f"http://127.0.0.1:{free_port()}", check=False)
    assert proc.returncode == 1 and "unreachable" in proc.stdout
