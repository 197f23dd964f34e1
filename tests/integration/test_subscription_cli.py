"""``amqlite subscription list|remove`` and ``amqlite queue browse`` of a topic, as an
operator runs them against real brokers: the group's master found through the registry
(``--group --registry``), followed after a SIGKILL takeover."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from tests.helpers.broker_proc import BrokerFactory, ClientPool, unique
from tests.helpers.cluster import amqlite as run_amqlite
from tests.helpers.mgmt import Api, pair_with_http, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def amqlite(*args: str, code: int = 0) -> subprocess.CompletedProcess[str]:
    proc = run_amqlite(*args)
    assert proc.returncode == code, f"amqlite {' '.join(args)}: {proc.stderr}"
    assert "Traceback" not in proc.stderr
    return proc


def test_durable_subscriptions_from_the_cli_follow_the_master(
        broker_factory: BrokerFactory, clients: ClientPool) -> None:
    master, slave = pair_with_http(broker_factory, ("sub-a", "sub-b"),
                                   {"AMQLITE_LOCK_POLL_INTERVAL": "0.1"}, [])
    where = ["--group", master.group, "--registry",
             f"sqlite:///{master.data_dir / 'amqlite.db'}"]
    topic, cid, name = f"/topic/{unique('prices')}", unique("cid"), unique("dur")
    sub = clients(master.port, headers={"client-id": cid})
    sub.subscribe(topic, headers={"activemq.subscriptionName": name})
    sub.close()
    producer = clients(master.port)
    for i in range(3):
        producer.send(topic, f"p{i}", {"persistent": "true"})
    api = Api(master.http)  # type: ignore[attr-defined]
    wait_until(lambda: (d := api.destination(topic)) and d["waiting"] == 3, what="3 owed")

    master.kill()
    slave.wait_serving()
    # Through the registry: the new master answers (the killed one's entry is stale).

    def listed() -> list[dict[str, Any]] | None:
        proc = run_amqlite("subscription", "list", "--topic", topic, *where, "--json")
        return json.loads(proc.stdout) if proc.returncode == 0 else None

    rows = wait_until(listed, what="the subscription listed by the new master")
    assert rows == [{"client_id": cid, "name": name, "topic": topic, "pending": 3,
                     "owner": None, "online": False}]
    text = amqlite("subscription", "list", *where).stdout
    header, *lines = text.splitlines()
    assert header.split() == ["client-id", "name", "topic", "pending", "owner", "online"]
    assert [line.split() for line in lines] == [[cid, name, topic, "3", "no"]]

    # `queue list` counts 3 waiting on the topic; browsing it says where they are.
    listing = {r["name"]: r for r in json.loads(amqlite("queue", "list", *where,
                                                        "--json").stdout)}
    assert listing[topic]["waiting"] == 3
    out = amqlite("queue", "browse", topic, *where).stdout
    assert out.startswith(f"{topic} is a topic: it keeps no messages of its own. Its 3 "
                          "waiting are owed to its 1 durable subscriptions")
    assert cid in out and name in out
    page = json.loads(amqlite("queue", "browse", topic, *where, "--json").stdout)
    assert page["messages"] == [] and page["subscriptions"] == rows

    out = amqlite("subscription", "remove", cid, name, *where).stdout
    assert out.strip() == f"removed durable subscription {name} of {cid}"
    assert json.loads(amqlite("subscription", "list", *where, "--json").stdout) == []
    # Removing it again: one line, exit 1.
    proc = amqlite("subscription", "remove", cid, name, *where, code=1)
    [line] = proc.stderr.splitlines()
    assert line.startswith("amqlite: error: ") and "404" in line
