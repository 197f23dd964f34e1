"""Issue 15, "STOMP compatibility" (found by running other projects' suites against
amqlite), against a real broker process:

* STOMP 1.0 header values are trimmed (the 1.0 specification's examples put a space after
  the colon; ActiveMQ trims), and only on 1.0 connections;
* an ACK inside a transaction frees its prefetch slot at once, as in ActiveMQ, while the
  ACK itself applies only at COMMIT; after ABORT the messages stay with the consumer,
  acknowledgeable under their ack ids (issue 21, ActiveMQ's ``Stomp12Test``);
* a header value with an escaped newline (stomp.py's ``test_specialchars``) reaches 1.1
  and 1.2 consumers byte for byte; a 1.0 consumer gets the message without it, named
  in ``amqlite.omittedHeaders`` (issue 21);
* an ACK naming the wrong subscription says so in its ERROR.
"""

from __future__ import annotations

import pytest
from stomp.utils import Frame

from tests.helpers.broker_proc import (
    WAIT,
    BrokerFactory,
    BrokerProcess,
    Client,
    ClientPool,
    RawStomp,
    ack_id,
    unique,
    wait_receipt,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

#: How long "nothing more arrives" is watched (s): longer than a dispatch takes on a busy
#: machine, short enough to keep the module quick.
QUIET = 0.6


@pytest.fixture(scope="module")
def broker(module_factory: BrokerFactory) -> BrokerProcess:
    return module_factory.start(name="compat")


def test_stomp10_header_values_are_trimmed(broker: BrokerProcess) -> None:
    queue = f"/queue/{unique('trim10')}"
    with RawStomp(broker.port) as raw:
        # The 1.0 specification's own CONNECT example: "login: <username>" (no
        # accept-version: a 1.0 client).
        raw.send_raw(b"CONNECT\nhost: localhost\n\n\x00")
        connected = raw.expect("CONNECTED", "1.0 CONNECT")
        assert connected.headers.get("version", "1.0") == "1.0"
        raw.send_raw(f"SUBSCRIBE\ndestination: {queue}\nack: client\nreceipt: r-sub \n\n\x00"
                     .encode())
        assert raw.expect("RECEIPT", "SUBSCRIBE").headers["receipt-id"] == "r-sub"
        raw.send_raw(f"SEND\ndestination:  {queue}\t\nreceipt: r-send\n\nhello\x00".encode())
        # The RECEIPT (after the commit) and the MESSAGE may come in either order.
        answers = {f.command: f for f in (raw.read_frame(WAIT), raw.read_frame(WAIT))
                   if f is not None}
        assert set(answers) == {"RECEIPT", "MESSAGE"}, answers
        assert answers["RECEIPT"].headers["receipt-id"] == "r-send"
        message = answers["MESSAGE"]
        assert message.headers["destination"] == queue
        assert message.body == b"hello"
        raw.send_raw(f"ACK\nmessage-id: {message.headers['message-id']}\nreceipt: r-ack\n\n\x00"
                     .encode())
        assert raw.expect("RECEIPT", "ACK").headers["receipt-id"] == "r-ack"


def test_stomp12_header_values_keep_their_spaces(broker: BrokerProcess) -> None:
    """The trimming is 1.0's: on 1.2 a space is part of the value (a receipt id here)."""
    with RawStomp(broker.port) as raw:
        raw.connect()
        raw.send_raw(b"BEGIN\ntransaction:t1\nreceipt: r \n\n\x00")
        assert raw.expect("RECEIPT", "BEGIN").headers["receipt-id"] == " r "


def _a_and_b_with_prefetch_one(broker: BrokerProcess, clients: ClientPool,
                               queue: str) -> tuple[Client, Client]:
    """A producer sends "a" and "b" to ``queue``; a consumer subscribes with
    client-individual acks and a prefetch of 1. Returns (producer, consumer)."""
    producer = clients(broker.port)
    for body in ("a", "b"):
        producer.send(queue, body)
    consumer = clients(broker.port)
    consumer.subscribe(queue, ack="client-individual",
                       headers={"activemq.prefetchSize": "1"})
    return producer, consumer


def test_ack_in_transaction_frees_the_prefetch_slot_and_applies_at_commit(
    broker: BrokerProcess, clients: ClientPool
) -> None:
    queue = f"/queue/{unique('txprefetch')}"
    producer, consumer = _a_and_b_with_prefetch_one(broker, clients, queue)
    listener = consumer.listener
    [first] = listener.wait_messages(1)
    assert listener.holds_for(lambda: listener.count() == 1, QUIET), listener.bodies()
    tx = unique("tx")
    consumer.tx("begin", tx)
    consumer.ack(first, transaction=tx)
    # Before the COMMIT: the slot is free, the next message comes.
    second = listener.wait_messages(2, timeout=WAIT)[1]
    assert second.body == "b"
    consumer.tx("commit", tx)
    consumer.ack(second)
    consumer.close()

    after = clients(broker.port)
    after.subscribe(queue)
    producer.send(queue, "marker")
    after.listener.wait_messages(1)
    assert after.listener.wait_quiet(QUIET, timeout=WAIT)
    assert after.listener.bodies() == ["marker"]  # "a" was settled by the COMMIT


def test_abort_leaves_what_a_transaction_acked_with_the_consumer(
        broker: BrokerProcess, clients: ClientPool) -> None:
    """After ABORT "a" is still the consumer's: nothing is redelivered while it holds
    it, and its ACK outside the transaction settles it."""
    queue = f"/queue/{unique('txprefetchabort')}"
    producer, consumer = _a_and_b_with_prefetch_one(broker, clients, queue)
    listener = consumer.listener
    [first] = listener.wait_messages(1)
    tx = unique("tx")
    consumer.tx("begin", tx)
    consumer.ack(first, transaction=tx)
    second = listener.wait_messages(2, timeout=WAIT)[1]
    consumer.tx("abort", tx)
    consumer.ack(second)
    assert listener.holds_for(lambda: listener.count() == 2, QUIET), listener.bodies()
    consumer.ack(first)  # its ack id still names it
    producer.send(queue, "marker")
    marker = listener.wait_messages(3, timeout=WAIT)[2]
    assert marker.body == "marker"
    consumer.ack(marker)
    consumer.close()
    after = clients(broker.port)
    after.subscribe(queue)
    assert after.listener.wait_quiet(QUIET, timeout=WAIT)
    assert after.listener.bodies() == [], "a settled message came back"


@pytest.mark.parametrize("command", ["ACK", "NACK"])
def test_messages_acked_in_an_aborted_transaction_are_settled_after_it(
        broker: BrokerProcess, command: str) -> None:
    """ActiveMQ's ``Stomp12Test`` (retirement after transaction abort): ten messages, a
    prefetch of 1, each ACKed inside a transaction that is then aborted; each is then
    ACKed (or NACKed) at once outside it and gets its RECEIPT, the connection stays."""
    queue = f"/queue/{unique('abortretire')}"
    with RawStomp(broker.port) as raw:
        raw.connect()
        for n in range(10):
            raw.send_frame("SEND", {"destination": queue, "receipt": f"s{n}"}, str(n).encode())
            raw.expect("RECEIPT", f"SEND {n}")
        raw.send_frame("SUBSCRIBE", {"id": "1", "destination": queue,
                                     "ack": "client-individual",
                                     "activemq.prefetchSize": "1"})
        raw.send_frame("BEGIN", {"transaction": "tx1"})
        ack_ids = []
        for n in range(10):
            message = raw.expect("MESSAGE", f"message {n}")
            assert message.body == str(n).encode()
            ack_ids.append(message.headers["ack"])  # as on the wire: sent back as it is
            raw.send_frame("ACK", {"transaction": "tx1", "id": message.headers["ack"]})
        raw.send_frame("ABORT", {"transaction": "tx1"})
        for n, ack in enumerate(ack_ids):
            raw.send_frame(command, {"id": ack, "receipt": f"r{n}"})
            receipt = raw.expect("RECEIPT", f"{command} {n} after ABORT")
            assert receipt.headers["receipt-id"] == f"r{n}"


@pytest.mark.parametrize("version", ["1.1", "1.2"])
def test_escaped_newline_in_a_header_value_reaches_consumers_byte_for_byte(
        broker: BrokerProcess, clients: ClientPool, version: str) -> None:
    """stomp.py's own ``test_specialchars``: its escapes go out and come back intact."""
    queue = f"/queue/{unique('special')}"
    consumer = clients(broker.port, version=version)
    consumer.subscribe(queue)
    producer = clients(broker.port, version=version)
    special = {"special-1": "test with colon : test", "special-2": "test with backslash \\ test",
               "special-3": "test with newline \n"}
    producer.send(queue, "special", headers=special)
    [message] = consumer.listener.wait_messages(1)
    for name, value in special.items():
        assert message.headers[name] == value, (name, message.headers)
    assert not consumer.listener.errors and not producer.listener.errors


def test_ack_naming_the_wrong_subscription_says_so(broker: BrokerProcess,
                                                   clients: ClientPool) -> None:
    q1, q2 = f"/queue/{unique('wrongsub1')}", f"/queue/{unique('wrongsub2')}"
    producer = clients(broker.port)
    producer.send(q1, "one")
    producer.send(q2, "two")
    consumer = clients(broker.port)
    s1 = consumer.subscribe(q1, ack="client-individual", sub_id="s1")
    s2 = consumer.subscribe(q2, ack="client-individual", sub_id="s2")
    frames = consumer.listener.wait_messages(2)
    by_sub = {f.headers["subscription"]: f for f in frames}
    key_of_s2 = ack_id(by_sub[s2]).partition(":")[0]
    message_id = by_sub[s1].headers["message-id"]
    consumer.conn.ack(f"{key_of_s2}:{message_id}", receipt="r-wrong")
    listener = consumer.listener
    assert listener.wait_for(lambda: bool(listener.errors), WAIT)
    text = listener.error_texts()[0]
    assert "not delivered to subscription 's2'" in text, text
    assert "awaits acknowledgement on subscription 's1'" in text, text
    assert listener.errors[0].headers.get("receipt-id") == "r-wrong"

    other = clients(broker.port)
    other.subscribe(q2, ack="client-individual", sub_id="only")
    [mine] = other.listener.wait_messages(1)
    other.conn.ack(f"999:{mine.headers['message-id']}", receipt="r-nosub")
    assert other.listener.wait_for(lambda: bool(other.listener.errors), WAIT)
    text = other.listener.error_texts()[0]
    assert "names no subscription of this connection" in text, text
    assert "awaits acknowledgement on subscription 'only'" in text, text


def _settle(client: Client, version: str, command: str, frame: Frame,
            transaction: str | None = None) -> None:
    """ACK or NACK ``frame`` the way stomp.py speaks ``version``, and wait for the RECEIPT."""
    receipt = unique(f"r-{command.lower()}")
    method = getattr(client.conn, command.lower())
    if version == "1.0":
        method(frame.headers["message-id"], transaction=transaction, receipt=receipt)
    elif version == "1.1":
        method(frame.headers["message-id"], frame.headers["subscription"],
               transaction=transaction, receipt=receipt)
    else:
        method(ack_id(frame), transaction=transaction, receipt=receipt)
    wait_receipt(client.listener, receipt, WAIT, f"{command} {frame.body!r} ({version})")


@pytest.mark.parametrize("version", ["1.0", "1.1", "1.2"])
def test_acks_around_begin_commit_abort_with_stomp_py_on_every_version(
        broker: BrokerProcess, clients: ClientPool, version: str) -> None:
    """stomp.py on 1.0, 1.1 and 1.2: ACK (and NACK where the version has it) inside a
    transaction that is aborted, then the same messages settled outside it; an ACK inside
    a transaction that commits; nothing settled comes back, nothing is refused."""
    queue = f"/queue/{unique('txacks' + version.replace('.', ''))}"
    producer = clients(broker.port, version=version)
    for body in ("a", "b", "c"):
        producer.send(queue, body)
    consumer = clients(broker.port, version=version)
    consumer.subscribe(queue, ack="client-individual" if version != "1.0" else "client")
    first, second, third = consumer.listener.wait_messages(3)
    aborted = unique("tx")
    consumer.tx("begin", aborted)
    _settle(consumer, version, "ACK", first, aborted)
    if version != "1.0":  # 1.0 has no NACK
        _settle(consumer, version, "NACK", second, aborted)
    consumer.tx("abort", aborted)
    _settle(consumer, version, "ACK", first)  # still the consumer's after ABORT
    _settle(consumer, version, "ACK", second)
    committed = unique("tx")
    consumer.tx("begin", committed)
    _settle(consumer, version, "ACK", third, committed)
    consumer.tx("commit", committed)
    assert not consumer.listener.errors, consumer.listener.error_texts()
    consumer.close()
    after = clients(broker.port, version=version)
    after.subscribe(queue)
    assert after.listener.wait_quiet(QUIET, timeout=WAIT)
    assert after.listener.bodies() == [], "a settled message came back"
