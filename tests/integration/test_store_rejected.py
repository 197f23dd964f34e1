"""A value the store cannot hold costs its client an ERROR, not the group a master
(issue 12, "a rejected write never demotes"), against a real broker process on
SQLite and on PostgreSQL.

One raw client SENDs a header value its store cannot hold while a stomp.py
producer pipelines SENDs to the same queue: the bad frame gets an ERROR with its
receipt-id and its connection is closed; every other SEND gets its RECEIPT and
arrives once; the broker stays master and keeps serving. (Validation at the edge
may answer the bad frame before the store sees it; the outcome asked for here is
the same either way.)
"""

from __future__ import annotations

import pytest

from tests.helpers.broker_fixtures import store_args
from tests.helpers.broker_proc import (
    WAIT,
    BrokerFactory,
    ClientPool,
    RawStomp,
    assert_broker_serves,
    format_frames,
    unique,
    wait_receipts,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

#: How long the broker may take to answer the bad frame with ERROR and close.
CLOSE_DEADLINE = 10.0
#: SENDs the good producer pipelines around the bad one.
GOOD_SENDS = 200

#: Per store: headers that today reach it with a value it refuses.
BAD_HEADERS = {
    # sqlite3 raises OverflowError for an int past 2**63.
    "sqlite": {"expires": str(2**63)},
    # amq_messages.producer_id is varchar(200).
    "postgresql": {"amqlite.producerId": "p" * 300, "amqlite.producerSeq": "1"},
}


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_value_the_store_refuses_does_not_demote(
    backend: str, broker_factory: BrokerFactory, clients: ClientPool,
    request: pytest.FixtureRequest,
) -> None:
    broker = broker_factory.start(name=f"rejected-{backend}",
                                  extra_args=store_args(backend, request))
    queue = f"/queue/{unique('rejected')}"
    consumer = clients(broker.port)
    consumer.subscribe(queue)
    producer = clients(broker.port)

    with RawStomp(broker.port) as raw:
        raw.connect()
        receipts = []
        for i in range(GOOD_SENDS):
            receipt = unique("r-good")
            producer.conn.send(queue, f"m{i}", headers={"receipt": receipt})
            receipts.append(receipt)
            if i == GOOD_SENDS // 2:  # in the middle of the good producer's stream
                raw.send_frame("SEND", {"destination": queue, "receipt": "bad-1",
                                        **BAD_HEADERS[backend]}, b"poison")
        closed, frames = raw.wait_closed(CLOSE_DEADLINE)
    assert closed, f"the bad client's connection is still open: {format_frames(frames)}"
    errors = [f for f in frames if f.command == "ERROR"]
    assert [f.headers.get("receipt-id") for f in errors] == ["bad-1"], format_frames(frames)
    assert not [f for f in frames if f.command == "RECEIPT"], format_frames(frames)

    wait_receipts(producer.listener, receipts, WAIT, "good SENDs")
    bodies = sorted(f.body for f in consumer.listener.wait_messages(GOOD_SENDS))
    assert bodies == sorted(f"m{i}" for i in range(GOOD_SENDS))

    assert broker.alive and broker.is_serving(), broker.log_tail()
    assert_broker_serves(broker.port)
    assert "store write failed" not in broker.log_text()
    assert "DEMOTED" not in broker.log_text()
