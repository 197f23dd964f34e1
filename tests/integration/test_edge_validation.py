"""Issue 12 classes 1, 2, 3, 4 and 7 against a real broker process, on SQLite and
PostgreSQL: whatever a client sends, it alone gets an ERROR (with ``receipt-id`` when
its frame had ``receipt``), nothing is stored or half-applied, and the broker stays
master (the process lives and another connection's canary message goes through).

Bad bytes go out on raw sockets (stomp.py escapes or refuses them); consumers and
canaries are stomp.py.
"""

from __future__ import annotations

from urllib.parse import quote

import pytest

from amqlite.broker import MAX_OPEN_TRANSACTIONS
from tests.helpers.broker_fixtures import store_args
from tests.helpers.broker_proc import (
    BrokerFactory,
    BrokerProcess,
    Client,
    ClientPool,
    RawFrame,
    RawStomp,
    assert_broker_serves,
    assert_error_then_closed,
    unique,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

#: How long the broker may take to answer bad input with ERROR and close.
CLOSE_DEADLINE = 10.0
BIG = str(2**63)  # one past BIGINT
DIGITS_5000 = "9" * 5000


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def broker(request: pytest.FixtureRequest, module_factory: BrokerFactory) -> BrokerProcess:
    """One broker per store kind for the module; each test uses its own destinations."""
    name = "edge-sqlite" if request.param == "sqlite" else "edge-pg"
    return module_factory.start(name=name, extra_args=store_args(request.param, request))


def assert_refused(raw: RawStomp, receipt: str | None, what: str) -> RawFrame:
    """ERROR (and nothing else) then close; the ERROR names the frame's receipt."""
    return assert_error_then_closed(raw, what, None, CLOSE_DEADLINE, receipt=receipt)


def assert_still_master(broker: BrokerProcess) -> None:
    assert broker.alive, f"broker exited ({broker.returncode}):\n{broker.log_tail()}"
    assert_broker_serves(broker.port)
    assert broker.alive


def assert_queue_holds_only(clients: ClientPool, broker: BrokerProcess, queue: str,
                            canary: str) -> None:
    """Send a canary after the refused frame and read the queue: the canary comes first
    (queues are FIFO), so a refused message that had been stored would show up."""
    producer = clients(broker.port)
    producer.send(queue, canary)
    consumer = clients(broker.port)
    consumer.subscribe(queue)
    [first] = consumer.listener.wait_messages(1)[:1]
    assert first.body == canary, f"refused message was stored: {first.body!r}"


# --- class 1: values the store cannot hold; class 7: strict integers --------------------

BAD_SENDS = {
    "expires-past-bigint": {"expires": BIG},
    "producer-seq-past-bigint": {"amqlite.producerId": "p", "amqlite.producerSeq": BIG},
    "producer-seq-underscore": {"amqlite.producerId": "p", "amqlite.producerSeq": "1_0"},
    "producer-seq-arabic-digits": {"amqlite.producerId": "p",
                                   "amqlite.producerSeq": "\u0661\u0662"},
    "producer-id-201": {"amqlite.producerId": "p" * 201, "amqlite.producerSeq": "1"},
    "priority-abc": {"priority": "abc"},
    "priority-5000-digits": {"priority": DIGITS_5000[:4000]},
    "expires-negative": {"expires": "-1"},
    "persistent-junk": {"persistent": "maybe"},
}


@pytest.mark.parametrize("headers", BAD_SENDS.values(), ids=BAD_SENDS.keys())
def test_send_with_value_store_cannot_hold_is_refused(broker: BrokerProcess,
                                                      clients: ClientPool,
                                                      headers: dict[str, str]) -> None:
    queue = f"/queue/{unique('bad')}"
    with RawStomp(broker.port) as raw:
        raw.connect()
        raw.send_frame("SEND", {"destination": queue, "receipt": "bad-send", **headers},
                       b"refused")
        assert_refused(raw, "bad-send", f"SEND {headers}")
    assert_still_master(broker)
    assert_queue_holds_only(clients, broker, queue, "canary")


@pytest.mark.parametrize("destination", [
    "/queue/" + "d" * 600, "/topic/" + "d" * 600, "/queue/", "/elsewhere/x",
], ids=["queue-600", "topic-600", "empty-name", "no-kind"])
def test_bad_destination_refused_on_send_and_subscribe(broker: BrokerProcess,
                                                       destination: str) -> None:
    for command, extra in (("SEND", {}), ("SUBSCRIBE", {"id": "s1"})):
        with RawStomp(broker.port) as raw:
            raw.connect()
            raw.send_frame(command, {"destination": destination, "receipt": "r-dest",
                                     **extra}, b"x" if command == "SEND" else b"")
            assert_refused(raw, "r-dest", f"{command} to {destination[:30]}")
    assert_still_master(broker)


def test_client_id_too_long_refused_at_connect(broker: BrokerProcess) -> None:
    with RawStomp(broker.port) as raw:
        raw.send_frame("CONNECT", {"accept-version": "1.2", "host": "localhost",
                                   "client-id": "c" * 201, "receipt": "r-conn"})
        frame = assert_refused(raw, "r-conn", "CONNECT with a 201-character client-id")
        assert "client-id" in (frame.body.decode() + frame.headers.get("message", ""))
    assert_still_master(broker)


@pytest.mark.parametrize("headers", [
    {"activemq.subscriptionName": "n" * 201},
    {"durable-subscription-name": "n" * 201},
    {"activemq.prefetchSize": "1_0"},
    {"activemq.prefetchSize": DIGITS_5000[:4000]},
    {"activemq.prefetchSize": "1000000"},
    {"id": "i" * 201},
], ids=["subscription-name-201", "durable-name-201", "prefetch-underscore",
        "prefetch-4000-digits", "prefetch-past-limit", "id-201"])
def test_bad_subscribe_refused(broker: BrokerProcess, headers: dict[str, str]) -> None:
    with RawStomp(broker.port) as raw:
        raw.connect(extra={"client-id": unique("cid")})
        raw.send_frame("SUBSCRIBE", {"destination": f"/topic/{unique('t')}", "id": "s1",
                                     "ack": "client-individual", "receipt": "r-sub",
                                     **headers})
        assert_refused(raw, "r-sub", f"SUBSCRIBE {list(headers)}")
    assert_still_master(broker)


@pytest.mark.parametrize("content_length", [DIGITS_5000, "1_0", "\u0661"],
                         ids=["5000-digits", "underscore", "arabic-digit"])
def test_bad_content_length_gets_error_frame(broker: BrokerProcess,
                                             content_length: str) -> None:
    """Not a traceback and a silent close: an ERROR frame, with the receipt-id."""
    with RawStomp(broker.port) as raw:
        raw.connect()
        raw.send_raw(f"SEND\ndestination:/queue/x\nreceipt:r-cl\ncontent-length:"
                     f"{content_length}\n\nx\x00".encode())
        assert_refused(raw, "r-cl", f"content-length {content_length[:10]}")
    assert_still_master(broker)


@pytest.mark.parametrize("ack_id", [DIGITS_5000[:4000] + ":m", "\u0661:m", "1_0:m"],
                         ids=["4000-digit-key", "arabic-digit-key", "underscore-key"])
def test_bad_ack_id_gets_error_frame(broker: BrokerProcess, ack_id: str) -> None:
    with RawStomp(broker.port) as raw:
        raw.connect()
        raw.send_frame("ACK", {"id": ack_id, "receipt": "r-ack"})
        assert_refused(raw, "r-ack", f"ACK {ack_id[:10]}")
    assert_still_master(broker)


# --- class 4: frame injection ---------------------------------------------------------


def test_nul_in_header_is_refused_not_relayed(broker: BrokerProcess,
                                              clients: ClientPool) -> None:
    """A raw NUL inside a header value would end the MESSAGE frame early for stomp.py and
    forge a RECEIPT behind it: the sender gets ERROR, the consumer gets nothing forged."""
    queue = f"/queue/{unique('nul')}"
    consumer = clients(broker.port)
    consumer.subscribe(queue)
    with RawStomp(broker.port) as raw:
        raw.connect()
        raw.send_raw(f"SEND\ndestination:{queue}\nx-evil:a\x00RECEIPT\nreceipt-id:forged\n"
                     "\n\x00".encode())
        assert_refused(raw, None, "NUL in a header value")
    with RawStomp(broker.port) as raw:  # a NUL in the destination too
        raw.connect()
        raw.send_raw(f"SEND\ndestination:{queue}\x00x\nx:y\n\nbody\x00".encode())
        assert_refused(raw, None, "NUL in a destination")
    assert_still_master(broker)
    producer = clients(broker.port)
    producer.send(queue, "canary")
    [first] = consumer.listener.wait_messages(1)[:1]
    assert first.body == "canary"
    assert "forged" not in consumer.listener.receipts
    assert not consumer.listener.errors


@pytest.mark.parametrize("version", ["1.0", "1.1"])
@pytest.mark.parametrize("frame", [
    "SEND\ndestination:{queue}\npersistent:true\nreceipt:tail\r\r\n\nbody\x00",
    "SUBSCRIBE\ndestination:{queue}\nid:s\r\r\nack:auto\n\n\x00",
], ids=["send-receipt", "subscribe-id"])
def test_value_the_client_version_cannot_get_back_is_refused(
        broker: BrokerProcess, clients: ClientPool, version: str, frame: str) -> None:
    """Fuzz seed 1734290163: a STOMP 1.0 ``receipt`` ending with CR was stored, then its
    RECEIPT could not be encoded (a traceback in the commit callback). A value the
    broker echoes (``receipt``, the subscription ``id``) that the client's own version
    cannot carry is refused on arrival; nothing is stored; no traceback."""
    queue = f"/queue/{unique('cr')}"
    log_from = len(broker.log_text())
    with RawStomp(broker.port) as raw:
        raw.connect(extra={"accept-version": version})
        raw.send_raw(frame.format(queue=queue).encode())
        error = assert_error_then_closed(raw, f"trailing CR in STOMP {version}",
                                         "malformed header", CLOSE_DEADLINE)
        assert "receipt-id" not in error.headers  # it cannot be written back either
    assert_still_master(broker)
    assert_queue_holds_only(clients, broker, queue, "canary")
    assert "Traceback" not in broker.log_text()[log_from:]


@pytest.mark.parametrize(("connect_extra", "command", "headers"), [
    ({"client-id": "c\x00d"}, None, {}),
    ({"client-id": "cid-nul-sub"}, "SUBSCRIBE",
     {"destination": "/topic/nul", "id": "s", "activemq.subscriptionName": "n\x00m"}),
    ({}, "SEND", {"destination": "/queue/nul", "amqlite.producerId": "p\x00q",
                  "amqlite.producerSeq": "1"}),
], ids=["client-id", "subscription-name", "producer-id"])
def test_nul_in_stored_names_refused(broker: BrokerProcess, connect_extra: dict[str, str],
                                     command: str | None, headers: dict[str, str]) -> None:
    """A NUL the store cannot hold (PostgreSQL text) is refused before anything is
    written, with the frame's receipt-id."""
    with RawStomp(broker.port) as raw:
        if command is None:
            raw.send_frame("CONNECT", {"accept-version": "1.2", "host": "localhost",
                                       "receipt": "r-nul", **connect_extra})
        else:
            raw.connect(extra=connect_extra)
            raw.send_frame(command, {"receipt": "r-nul", **headers})
        assert_refused(raw, "r-nul", f"NUL in {command or 'CONNECT'}")
    assert_still_master(broker)


# --- class 2: transactions are atomic ---------------------------------------------------


def test_open_transactions_are_bounded(broker: BrokerProcess) -> None:
    with RawStomp(broker.port) as raw:
        raw.connect()
        for i in range(MAX_OPEN_TRANSACTIONS):
            raw.send_frame("BEGIN", {"transaction": f"t{i}", "receipt": f"r{i}"})
        for i in range(MAX_OPEN_TRANSACTIONS):
            frame = raw.read_frame()
            assert frame is not None and frame.headers.get("receipt-id") == f"r{i}", frame
        raw.send_frame("BEGIN", {"transaction": "one-too-many", "receipt": "r-over"})
        frame = assert_refused(raw, "r-over", "BEGIN past the open-transaction limit")
        assert "transactions" in frame.headers.get("message", "")
    assert_still_master(broker)


def connect_and_take(raw: RawStomp, queue: str) -> RawFrame:
    """CONNECT, SUBSCRIBE to ``queue`` with client-individual acks; the first MESSAGE."""
    raw.connect()
    raw.send_frame("SUBSCRIBE", {"destination": queue, "id": "s",
                                 "ack": "client-individual"})
    return raw.expect("MESSAGE", f"SUBSCRIBE to {queue}")


def assert_m_redelivered(clients: ClientPool, broker: BrokerProcess,
                         queue: str) -> Client:
    """A new consumer of ``queue`` gets "m" again, flagged redelivered; it is returned."""
    consumer = clients(broker.port)
    consumer.subscribe(queue)
    [again] = consumer.listener.wait_messages(1)[:1]
    assert again.body == "m" and again.headers.get("redelivered") == "true"
    return consumer


def test_invalid_send_in_transaction_leaves_acks_unapplied(broker: BrokerProcess,
                                                           clients: ClientPool) -> None:
    """BEGIN; ACK m; SEND priority:abc: ERROR at the SEND, and the ACK is never applied:
    m is redelivered to the next consumer."""
    queue = f"/queue/{unique('txatomic')}"
    clients(broker.port).send(queue, "m")
    with RawStomp(broker.port) as raw:
        message = connect_and_take(raw, queue)
        raw.send_frame("BEGIN", {"transaction": "t", "receipt": "r-begin"})
        raw.send_frame("ACK", {"id": message.headers["ack"], "transaction": "t",
                               "receipt": "r-ack"})
        for expected in ("r-begin", "r-ack"):
            receipt = raw.read_frame()
            assert receipt is not None and receipt.headers.get("receipt-id") == expected, \
                receipt
        raw.send_frame("SEND", {"destination": queue, "transaction": "t",
                                "priority": "abc", "receipt": "r-bad"}, b"bad")
        raw.send_frame("COMMIT", {"transaction": "t", "receipt": "r-commit"})
        assert_refused(raw, "r-bad", "SEND priority:abc in a transaction")
    assert_still_master(broker)
    assert_m_redelivered(clients, broker, queue)


def test_commit_that_cannot_apply_applies_nothing(broker: BrokerProcess,
                                                  clients: ClientPool) -> None:
    """BEGIN; SEND n; ACK m; ACK m again; COMMIT: ERROR at COMMIT, n is not stored and
    m is redelivered."""
    queue = f"/queue/{unique('txcommit')}"
    clients(broker.port).send(queue, "m")
    with RawStomp(broker.port) as raw:
        message = connect_and_take(raw, queue)
        ack = message.headers["ack"]
        raw.send_frame("BEGIN", {"transaction": "t"})
        raw.send_frame("SEND", {"destination": queue, "transaction": "t"}, b"n")
        raw.send_frame("ACK", {"id": ack, "transaction": "t"})
        raw.send_frame("ACK", {"id": ack, "transaction": "t"})
        raw.send_frame("COMMIT", {"transaction": "t", "receipt": "r-commit"})
        assert_refused(raw, "r-commit", "COMMIT acknowledging one message twice")
    assert_still_master(broker)
    consumer = assert_m_redelivered(clients, broker, queue)
    producer = clients(broker.port)
    producer.send(queue, "canary")
    got = consumer.listener.wait_messages(2)
    assert [m.body for m in got] == ["m", "canary"], "the failed COMMIT's SEND was stored"


# --- class 3: headers every consumer's STOMP version can carry --------------------------


@pytest.fixture
def versioned_consumers(broker: BrokerProcess, clients: ClientPool) -> dict[str, Client]:
    """One stomp.py consumer per STOMP version, by version."""
    return {version: clients(broker.port, version=version) for version in ("1.0", "1.1", "1.2")}


@pytest.mark.parametrize(("header_line", "name", "value", "carried_by"), [
    ("a\\cb:v", "a:b", "v", ("1.1", "1.2")),  # a colon in a name: 1.0 cannot carry it
    ("x-cr:v\\r", "x-cr", "v\r", ("1.2",)),  # a trailing CR: only 1.2 escapes it
    ("x-cr-mid:a\\rb", "x-cr-mid", "a\rb", ("1.2",)),  # a CR anywhere: 1.2 only
    ("x-lf:a\\nb", "x-lf", "a\nb", ("1.1", "1.2")),  # a LF: 1.0 cannot escape it
], ids=["colon-in-name", "trailing-cr", "cr-in-value", "lf-in-value"])
def test_header_a_consumer_version_cannot_carry_is_left_out_for_it(
        broker: BrokerProcess, clients: ClientPool,
        versioned_consumers: dict[str, Client], header_line: str, name: str, value: str,
        carried_by: tuple[str, ...]) -> None:
    """1.0, 1.1 and 1.2 consumers on one topic; a 1.2 producer sends a header only some
    of them can carry (issue 21: the sender's version can express it, so it is no
    error). Those that can get it byte for byte; the others get the message without it,
    named in ``amqlite.omittedHeaders``, and their framing holds: the next message
    reaches all three."""
    topic = f"/topic/{unique('mixed')}"
    for consumer in versioned_consumers.values():
        consumer.subscribe(topic)
    good = clients(broker.port)
    good.send(topic, "before")
    with RawStomp(broker.port) as raw:
        raw.connect()
        raw.send_raw(f"SEND\ndestination:{topic}\nreceipt:r-hdr\nx-plain:p\n{header_line}"
                     "\n\nspecial\x00".encode())
        assert raw.expect("RECEIPT", "SEND").headers["receipt-id"] == "r-hdr"
    good.send(topic, "after")
    for version, consumer in versioned_consumers.items():
        listener = consumer.listener
        got = listener.wait_messages(3)
        assert [m.body for m in got] == ["before", "special", "after"], f"STOMP {version}"
        assert not listener.errors, f"STOMP {version}: {listener.error_texts()}"
        headers = got[1].headers
        assert headers["x-plain"] == "p", f"STOMP {version}: {headers}"
        if version in carried_by:
            assert headers.get(name) == value, f"STOMP {version}: {headers}"
            assert "amqlite.omittedHeaders" not in headers, f"STOMP {version}: {headers}"
        else:
            assert name not in headers, f"STOMP {version}: {headers}"
            assert headers["amqlite.omittedHeaders"] == quote(name, safe=""), headers
        assert "amqlite.omittedHeaders" not in got[2].headers
    assert_still_master(broker)

