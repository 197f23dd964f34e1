"""A message with an empty body through every management read that returns a body
(browse, one message, the scheduled list) and the actions that copy bodies (move, retry),
on SQLite and on PostgreSQL: SQLite's substr() of an empty BLOB is NULL, and a store may
hand back an empty value as NULL, so each read must answer 200 with ``body == ""``."""

from __future__ import annotations

import pytest

from tests.helpers.broker_proc import BrokerFactory, ClientPool, unique
from tests.helpers.mgmt import Api, start_with_http, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

#: Far enough ahead that the scheduled copy stays scheduled for the test (ms).
LATER_MS = 3_600_000


def _empty(row: dict) -> None:
    assert row["body"] == "" and row["body_base64"] is None, row
    assert row["size"] == 0 and row["truncated"] is False, row


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_an_empty_body_is_browsed_read_listed_moved_and_retried(
        backend: str, broker_factory: BrokerFactory, clients: ClientPool,
        request: pytest.FixtureRequest) -> None:
    args: list[str] = []
    if backend == "postgresql":
        url = request.getfixturevalue("pg_url")
        args = ["--store", url, "--locker", url]
    broker = start_with_http(broker_factory, f"empty-{backend}", extra_args=args,
                             env={"AMQLITE_MAX_REDELIVERIES": "0"})
    api = Api(broker.http)  # type: ignore[attr-defined]
    q, moved_to = unique("empty"), unique("empty-moved")
    producer = clients(broker.port)
    producer.send(f"/queue/{q}", "")
    producer.send(f"/queue/{q}", "", headers={"AMQ_SCHEDULED_DELAY": str(LATER_MS)})
    api.ok("POST", f"/api/v1/send/queue/{q}", {"body": ""})  # the API's own SEND path
    wait_until(lambda: (d := api.destination(f"/queue/{q}")) and d["waiting"] == 2,
               what=f"/queue/{q} waiting 2")

    page = api.ok("GET", f"/api/v1/messages/queue/{q}")["messages"]
    assert len(page) == 2
    for row in page:
        _empty(row)
        _empty(api.ok("GET", f"/api/v1/message/{row['id']}"))
    [scheduled] = api.ok("GET", f"/api/v1/scheduled?destination=/queue/{q}")["scheduled"]
    _empty(scheduled)
    _empty(api.ok("GET", f"/api/v1/message/{scheduled['id']}"))

    assert api.ok("POST", f"/api/v1/move/queue/{q}",
                  {"to": f"/queue/{moved_to}", "ids": [page[0]["id"]]})["moved"] == 1
    [moved] = wait_until(lambda: api.ok("GET", f"/api/v1/messages/queue/{moved_to}")
                         ["messages"], what="the moved message")
    _empty(moved)

    consumer = clients(broker.port)  # NACK: max_redeliveries 0 dead-letters it
    consumer.subscribe(f"/queue/{q}", ack="client-individual")
    [msg] = consumer.listener.wait_messages(1)
    assert msg.body == ""
    consumer.nack(msg)

    def dead() -> list[dict]:
        rows = api.ok("GET", "/api/v1/messages/queue/DLQ?limit=500")["messages"]
        return [m for m in rows if m["headers"].get("original-destination") == f"/queue/{q}"]

    [letter] = wait_until(dead, what="the dead letter")
    _empty(letter)
    result = api.ok("POST", "/api/v1/retry/queue/DLQ", {"ids": [letter["id"]]})
    assert result["moved"] == 1
    [back] = consumer.listener.wait_messages(2)[1:]
    assert back.body == ""
