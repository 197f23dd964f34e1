"""Unit tests of edge validation (issue 12 classes 1, 3, 4, 7): strict integers, NUL in
headers, store-sized values and headers every STOMP version can carry."""

from __future__ import annotations

from urllib.parse import quote

import pytest

from amqlite.codec import Frame, FrameParser, ProtocolError, encode_frame, parse_uint
from amqlite.protocol import StompProtocol
from amqlite.validation import (
    MAX_PREFETCH,
    BrokerError,
    check_connect,
    check_destination,
    check_subscribe,
    check_user_headers,
    headers_for,
    parse_ack_key,
    parse_send,
)
from amqlite.wire import OMITTED_HEADERS_HEADER
from store import schema

PID, SEQ = "amqlite.producerId", "amqlite.producerSeq"


def send_fields(headers: dict[str, str]) -> tuple[bool, int, int, str | None, int | None]:
    return parse_send(headers, 4, PID, SEQ)


# --- the one strict integer parser (class 7) --------------------------------------------


@pytest.mark.parametrize("text", ["1_0", "+1", "-1", " 1", "1 ", "", "\u0661\u0662", "²", "0x10",
                                  "1.0", "9" * 5000])
def test_parse_uint_refuses_what_int_would_take_or_choke_on(text: str) -> None:
    """int() takes underscores, signs, spaces and non-ASCII digits and raises on 5,000
    digits; the strict parser refuses all of them without raising."""
    assert parse_uint(text, 2**63 - 1) is None


def test_parse_uint_bounds() -> None:
    assert parse_uint("0", 9) == 0
    assert parse_uint("9", 9) == 9
    assert parse_uint("10", 9) is None
    assert parse_uint("9223372036854775807", 2**63 - 1) == 2**63 - 1
    assert parse_uint("9223372036854775808", 2**63 - 1) is None
    assert parse_uint("007", 9) == 7


@pytest.mark.parametrize("length", ["1_0", "\u0661", "+5", "9" * 5000, "5 "])
def test_content_length_parsed_strictly(length: str) -> None:
    """A bad content-length is a remote ProtocolError (an ERROR frame), never a
    ValueError traceback."""
    data = f"SEND\ndestination:/queue/a\ncontent-length:{length}\nreceipt:r9\n\nx\x00"
    with pytest.raises(ProtocolError) as info:
        FrameParser(version="1.2").feed(data.encode())  # (1.0 trims "5 " to "5")
    assert info.value.fault == "remote"
    assert info.value.message == "invalid content-length"
    assert info.value.receipt_id == "r9"


def test_huge_content_length_gets_protocol_error_from_protocol() -> None:
    proto = StompProtocol("server")
    proto.receive_data(b"CONNECT\naccept-version:1.2\nhost:x\n\n\x00")
    with pytest.raises(ProtocolError) as info:
        proto.receive_data(b"SEND\ndestination:/queue/a\ncontent-length:" + b"9" * 5000
                           + b"\n\nx\x00")
    assert info.value.fault == "remote"
    assert b"ERROR" in proto.error(info.value)


# --- NUL in headers: frame injection (class 4) ------------------------------------------


@pytest.mark.parametrize("head", [
    b"SEND\ndestination:/queue/a\nx-h:v\x00RECEIPT\n\n",
    b"SEND\ndestination:/queue/a\nx\x00h:v\n\n",
    b"SEND\ndestination:/queue/a\x00\n\n",
])
def test_nul_in_header_is_a_remote_protocol_error(head: bytes) -> None:
    with pytest.raises(ProtocolError) as info:
        FrameParser(version="1.2").feed(head + b"body\x00")
    assert info.value.fault == "remote"
    assert "NUL" in str(info.value)


def test_nul_error_names_a_clean_receipt() -> None:
    with pytest.raises(ProtocolError) as info:
        FrameParser(version="1.2").feed(b"SEND\nreceipt:r\\c1\nx:a\x00b\n\n\x00")
    assert info.value.receipt_id == "r:1"
    with pytest.raises(ProtocolError) as info:
        FrameParser(version="1.2").feed(b"SEND\nreceipt:r\x00\n\n\x00")
    assert info.value.receipt_id is None


def test_nul_in_body_is_still_fine_with_content_length() -> None:
    [frame] = FrameParser().feed(b"SEND\ndestination:/queue/a\ncontent-length:3\n\na\x00b\x00")
    assert frame.body == b"a\x00b"


# --- store limits (class 1) ----------------------------------------------------------------


def test_schema_columns_use_the_exported_sizes() -> None:
    """The validation's limits are the columns' sizes: one constant each."""
    assert schema.destinations.c.name.type.length == schema.DESTINATION_NAME_LENGTH
    assert schema.messages.c.producer_id.type.length == schema.PRODUCER_ID_LENGTH
    assert schema.messages.c.message_id.type.length == schema.MESSAGE_ID_LENGTH
    assert schema.messages.c.dedup_key.type.length == schema.DEDUP_KEY_LENGTH
    assert schema.subscriptions.c.client_id.type.length == schema.CLIENT_ID_LENGTH
    assert schema.subscriptions.c.name.type.length == schema.SUBSCRIPTION_NAME_LENGTH
    # the longest producer_id:producer_seq fits the dedup key column
    assert (schema.PRODUCER_ID_LENGTH + 1 + len(str(schema.BIGINT_MAX))
            <= schema.DEDUP_KEY_LENGTH)


def test_destination_checks() -> None:
    assert check_destination("/queue/a") == "queue"
    assert check_destination("/topic/" + "x" * (schema.DESTINATION_NAME_LENGTH - 7)) == "topic"
    for bad in ("/queue/" + "x" * schema.DESTINATION_NAME_LENGTH, "/queue/", "queue/a",
                "/queue/a\rb", "/queue/a\nb", "/queue/a\x00b", "/other/a"):
        with pytest.raises(BrokerError):
            check_destination(bad)


def test_send_fields_valid_and_defaults() -> None:
    assert send_fields({}) == (True, 4, 0, None, None)
    assert send_fields({"persistent": "FALSE", "priority": "7", "expires": "123",
                        PID: "p", SEQ: str(2**63 - 1)}) == (False, 7, 123, "p", 2**63 - 1)
    assert send_fields({"expires": ""})[2] == 0
    # ActiveMQ's clamp for integers out of 0..9
    assert send_fields({"priority": "10"})[1] == 9
    assert send_fields({"priority": "2147483647"})[1] == 9


@pytest.mark.parametrize("headers", [
    {"priority": "abc"}, {"priority": "-1"}, {"priority": "1_0"}, {"priority": "9" * 5000},
    {"expires": str(2**63)}, {"expires": "-5"}, {"expires": "1.5"},
    {SEQ: str(2**63)}, {SEQ: "-1"}, {SEQ: "\u0661"},
    {PID: "p" * (schema.PRODUCER_ID_LENGTH + 1)}, {PID: "a\x00b"},
    {"persistent": "yes"},
], ids=lambda h: f"{next(iter(h))}={next(iter(h.values()))[:12]!r}")
def test_send_fields_refused(headers: dict[str, str]) -> None:
    with pytest.raises(BrokerError) as info:
        send_fields(headers)
    assert next(iter(headers)) in str(info.value)


def test_subscribe_checks() -> None:
    assert check_subscribe({}, 1000) == 1000
    assert check_subscribe({"activemq.prefetchSize": "0"}, 1000) == 1000
    assert check_subscribe({"activemq.prefetchSize": str(MAX_PREFETCH)}, 1) == MAX_PREFETCH
    for bad in ({"activemq.prefetchSize": str(MAX_PREFETCH + 1)},
                {"activemq.prefetchSize": "-1"}, {"activemq.prefetchSize": "1_0"},
                {"activemq.prefetchSize": "9" * 5000},
                {"id": "i" * 201},
                {"activemq.subscriptionName": "n" * (schema.SUBSCRIPTION_NAME_LENGTH + 1)},
                {"durable-subscription-name": "n" * (schema.SUBSCRIPTION_NAME_LENGTH + 1)}):
        with pytest.raises(BrokerError):
            check_subscribe(bad, 1000)


def test_ack_key_strict() -> None:
    assert parse_ack_key("12") == 12
    for bad in ("\u0661", "1_2", "9" * 5000, "", "-1"):
        assert parse_ack_key(bad) is None


def test_connect_client_id() -> None:
    check_connect({"client-id": "c" * schema.CLIENT_ID_LENGTH})
    check_connect({})
    with pytest.raises(ProtocolError) as info:
        check_connect({"client-id": "c" * (schema.CLIENT_ID_LENGTH + 1), "receipt": "r"})
    assert info.value.fault == "remote" and info.value.receipt_id == "r"


# --- headers every STOMP version can carry (class 3) ----------------------------------------


@pytest.mark.parametrize(("headers", "floor"), [
    ({"a:b": "v"}, "1.1"), ({"a\rb": "v"}, "1.2"), ({"ab\n": "v"}, "1.1"),
    ({"h": "v\r"}, "1.2"), ({"h": "a\rb"}, "1.2"), ({"h": "a\nb"}, "1.1"),
    ({"h": "a\nb", "k": "\r"}, "1.2"), ({"h": "a:b"}, "1.0"),
])
def test_user_headers_some_version_cannot_carry_are_accepted_with_their_floor(
        headers: dict[str, str], floor: str) -> None:
    chars, got = check_user_headers({"ok": "fine", **headers})
    assert got == floor
    assert chars == sum(len(k) + len(v) for k, v in {"ok": "fine", **headers}.items())


@pytest.mark.parametrize("version", ["1.0", "1.1", "1.2"])
def test_headers_for_an_older_consumer_leave_out_and_name_what_it_cannot_carry(
        version: str) -> None:
    headers = {"ok": "fine", "a:b": "v", "lf": "a\nb", "cr": "a\rb"}
    got = headers_for(version, headers)
    carried = {"1.0": {"ok"}, "1.1": {"ok", "a:b", "lf"}, "1.2": set(headers)}[version]
    assert {k: v for k, v in got.items() if k != OMITTED_HEADERS_HEADER} == {
        k: headers[k] for k in carried}
    omitted = [quote(k, safe="") for k in headers if k not in carried]
    assert got[OMITTED_HEADERS_HEADER] == ",".join(omitted)
    data = encode_frame(Frame("MESSAGE", {"destination": "/queue/a", "message-id": "m",
                                          "subscription": "s", **got}, b"b"), version)
    [frame] = FrameParser(version=version).feed(data)  # the framing holds
    assert frame.body == b"b"


def test_nul_in_a_user_header_is_refused() -> None:
    with pytest.raises(BrokerError):
        check_user_headers({"h": "a\x00b"})


def test_user_headers_accepted_are_encodable_for_every_version() -> None:
    headers = {"x-colon": "a:b:c", "x-back": "a\\b", "x-utf8": "ünï", "x-empty": "",
               "x-space": " v "}
    assert check_user_headers(headers)[1] == "1.0"
    for version in ("1.0", "1.1", "1.2"):
        data = encode_frame(Frame("MESSAGE", {"destination": "/queue/a", "message-id": "m",
                                              "subscription": "s", **headers}, b"b"), version)
        [frame] = FrameParser(version=version).feed(data)
        for name, value in headers.items():
            # STOMP 1.0 values are trimmed on receipt (issue 15, as ActiveMQ).
            expected = value.strip(" \t") if version == "1.0" else value
            assert frame.headers[name] == expected, (version, name)
