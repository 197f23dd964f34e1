"""Unit tests of the sans-I/O STOMP codec: parsing, limits, escaping, encoding."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from amqlite.codec import (
    DEFAULT_MAX_FRAME_SIZE,
    DEFAULT_MAX_HEADER_COUNT,
    DEFAULT_MAX_HEADER_LENGTH,
    HEARTBEAT,
    Frame,
    FrameParser,
    Limits,
    ParsedItem,
    ProtocolError,
    encode_frame,
)

VERSIONS = ("1.0", "1.1", "1.2")


def feed_bytewise(parser: FrameParser, data: bytes) -> list[ParsedItem]:
    out: list[ParsedItem] = []
    for i in range(len(data)):
        out += parser.feed(data[i : i + 1])
    return out


def frames_only(items: list[ParsedItem]) -> list[Frame]:
    return [item for item in items if isinstance(item, Frame)]


# --- basic parsing --------------------------------------------------------------------


def test_parses_one_frame_with_headers_and_body() -> None:
    [frame] = FrameParser().feed(b"SEND\ndestination:/queue/a\nreceipt:r1\n\nhello\x00")
    assert frame == Frame("SEND", {"destination": "/queue/a", "receipt": "r1"}, b"hello")
    assert frame.get("receipt") == "r1"
    assert frame.get("missing", "dflt") == "dflt"


def test_parses_frame_without_headers_or_body() -> None:
    assert FrameParser().feed(b"DISCONNECT\n\n\x00") == [Frame("DISCONNECT", {}, b"")]


def test_parses_several_frames_in_one_chunk_in_order() -> None:
    data = b"BEGIN\ntransaction:t\n\n\x00SEND\ndestination:/q\n\nA\x00COMMIT\ntransaction:t\n\n\x00"
    frames = FrameParser().feed(data)
    assert [f.command for f in frames] == ["BEGIN", "SEND", "COMMIT"]
    assert frames[1].body == b"A"


def test_partial_frame_is_kept_until_it_completes() -> None:
    parser = FrameParser()
    assert parser.feed(b"SEND\ndestination:/q\n\nhel") == []
    assert parser.buffered > 0
    assert parser.feed(b"lo\x00") == [Frame("SEND", {"destination": "/q"}, b"hello")]
    assert parser.buffered == 0


def test_header_value_may_contain_colons() -> None:
    [frame] = FrameParser(version="1.0").feed(b"SEND\ndestination:/q\nx:a:b:c\n\n\x00")
    assert frame.headers["x"] == "a:b:c"


def test_empty_header_value_is_kept() -> None:
    [frame] = FrameParser().feed(b"SEND\ndestination:/q\nempty:\n\n\x00")
    assert frame.headers["empty"] == ""


def test_repeated_header_first_occurrence_wins() -> None:
    [frame] = FrameParser().feed(b"MESSAGE\nfoo:first\nfoo:second\nbar:x\n\n\x00")
    assert frame.headers == {"foo": "first", "bar": "x"}


def test_header_order_is_preserved() -> None:
    [frame] = FrameParser().feed(b"SEND\nz:1\na:2\nm:3\n\n\x00")
    assert list(frame.headers) == ["z", "a", "m"]


def test_utf8_headers_and_body_are_decoded() -> None:
    data = "SEND\ndestination:/queue/\u00e9t\u00e9\n\n\u20ac\x00".encode()
    [frame] = FrameParser().feed(data)
    assert frame.headers["destination"] == "/queue/\u00e9t\u00e9"
    assert frame.body == "\u20ac".encode()


def test_non_utf8_headers_are_a_remote_error() -> None:
    with pytest.raises(ProtocolError) as info:
        FrameParser().feed(b"\x16\x03\x01\xff NOT STOMP\n\n\x00")
    assert info.value.fault == "remote"


@pytest.mark.parametrize("line", [b"no-colon-here", b":value-without-name"])
def test_malformed_header_line_is_a_remote_error(line: bytes) -> None:
    with pytest.raises(ProtocolError) as info:
        FrameParser().feed(b"SEND\ndestination:/q\n" + line + b"\n\nhi\x00")
    assert info.value.fault == "remote"
    assert info.value.message == "malformed header"


def test_parser_after_error_is_reset_and_usable() -> None:
    parser = FrameParser()
    with pytest.raises(ProtocolError):
        parser.feed(b"SEND\nbroken\n\n\x00")
    assert parser.buffered == 0
    assert parser.feed(b"DISCONNECT\n\n\x00") == [Frame("DISCONNECT", {}, b"")]


def test_accepts_memoryview_and_bytearray_input() -> None:
    data = b"SEND\ndestination:/q\n\nx\x00"
    assert FrameParser().feed(memoryview(data))[0] == Frame("SEND", {"destination": "/q"}, b"x")
    assert FrameParser().feed(bytearray(data))[0].body == b"x"


# --- heart-beats and EOLs -------------------------------------------------------------


def test_bare_eol_between_frames_is_a_heartbeat() -> None:
    items = FrameParser().feed(b"\nSEND\ndestination:/q\n\nx\x00\n")
    assert items[0] is HEARTBEAT
    assert isinstance(items[1], Frame)
    assert items[2] is HEARTBEAT


def test_crlf_heartbeat_split_between_chunks() -> None:
    parser = FrameParser()
    assert parser.feed(b"\r") == []
    assert parser.feed(b"\n") == [HEARTBEAT]
    assert parser.buffered == 0


def test_run_of_eols_in_one_chunk_is_one_heartbeat() -> None:
    assert FrameParser().feed(b"\n\r\n\n") == [HEARTBEAT]


def test_stray_cr_between_frames_is_a_remote_error() -> None:
    with pytest.raises(ProtocolError) as info:
        FrameParser().feed(b"\rSEND\n\n\x00")
    assert info.value.fault == "remote"


def test_crlf_line_endings_are_accepted() -> None:
    data = b"SEND\r\ndestination:/q\r\nreceipt:7\r\n\r\nbody\x00\r\n"
    items = FrameParser().feed(data)
    assert items == [Frame("SEND", {"destination": "/q", "receipt": "7"}, b"body"), HEARTBEAT]


def test_crlf_frame_without_headers() -> None:
    assert FrameParser().feed(b"DISCONNECT\r\n\r\n\x00") == [Frame("DISCONNECT", {}, b"")]


def test_mixed_eols_in_one_frame() -> None:
    [frame] = FrameParser().feed(b"SEND\r\ndestination:/q\nx:y\r\n\nz\x00")
    assert frame == Frame("SEND", {"destination": "/q", "x": "y"}, b"z")


def test_crlf_frames_batched_with_lf_frames() -> None:
    data = b"SEND\r\na:1\r\n\r\nA\x00SEND\nb:2\n\nB\x00" * 3
    frames = frames_only(FrameParser().feed(data))
    assert [f.body for f in frames] == [b"A", b"B"] * 3
    assert [f.headers for f in frames[:2]] == [{"a": "1"}, {"b": "2"}]


# --- byte-at-a-time feeding -----------------------------------------------------------

STREAM = (
    b"\n"
    b"CONNECT\naccept-version:1.2\nhost:h\n\n\x00\n"
    b"SEND\r\ndestination:/queue/a\r\ncontent-length:5\r\n\r\na\x00b\x00c\x00"
    b"SEND\ndestination:/queue/b\n\nplain body\x00\r\n\n"
    b"DISCONNECT\nreceipt:bye\n\n\x00"
)
EXPECTED = [
    HEARTBEAT,
    Frame("CONNECT", {"accept-version": "1.2", "host": "h"}),
    HEARTBEAT,
    Frame("SEND", {"destination": "/queue/a", "content-length": "5"}, b"a\x00b\x00c"),
    Frame("SEND", {"destination": "/queue/b"}, b"plain body"),
    HEARTBEAT,
    Frame("DISCONNECT", {"receipt": "bye"}),
]


def test_stream_in_one_chunk() -> None:
    assert FrameParser().feed(STREAM) == EXPECTED


def test_stream_fed_one_byte_at_a_time() -> None:
    items = feed_bytewise(FrameParser(), STREAM)
    assert frames_only(items) == frames_only(EXPECTED)
    assert HEARTBEAT in items


@pytest.mark.parametrize("split", range(1, len(STREAM)))
def test_stream_split_at_every_boundary(split: int) -> None:
    parser = FrameParser()
    items = parser.feed(STREAM[:split]) + parser.feed(STREAM[split:])
    assert frames_only(items) == frames_only(EXPECTED)
    assert parser.buffered == 0


# --- content-length bodies ------------------------------------------------------------


def test_content_length_body_may_contain_nuls() -> None:
    body = bytes(range(256)) * 4
    data = b"SEND\ndestination:/q\ncontent-length:1024\n\n" + body + b"\x00"
    [frame] = FrameParser().feed(data)
    assert frame.body == body


def test_content_length_body_trickled_in() -> None:
    body = b"\x00" * 10
    data = b"SEND\ndestination:/q\ncontent-length:10\n\n" + body + b"\x00"
    frames = frames_only(feed_bytewise(FrameParser(), data))
    assert [f.body for f in frames] == [body]


def test_zero_content_length() -> None:
    [frame] = FrameParser().feed(b"SEND\ndestination:/q\ncontent-length:0\n\n\x00")
    assert frame.body == b""


def test_content_length_not_followed_by_nul_is_a_remote_error() -> None:
    with pytest.raises(ProtocolError) as info:
        FrameParser().feed(b"SEND\ndestination:/q\nreceipt:r9\ncontent-length:2\n\nabc\x00")
    assert info.value.fault == "remote"
    assert info.value.receipt_id == "r9"


@pytest.mark.parametrize("value", ["abc", "-5", "+5", "1.5", " 5", "", "\u0665"])
def test_invalid_content_length_is_a_remote_error(value: str) -> None:
    data = f"SEND\ndestination:/q\nreceipt:r1\ncontent-length:{value}\n\nhello\x00".encode()
    with pytest.raises(ProtocolError) as info:
        FrameParser(version="1.2").feed(data)  # (1.0 trims " 5" to a valid "5")
    assert info.value.fault == "remote"
    assert info.value.message == "invalid content-length"
    assert info.value.receipt_id == "r1"


def test_stomp10_values_are_trimmed() -> None:
    """Issue 15: ActiveMQ trims 1.0 header values; the 1.0 spec writes "login: <user>"."""
    [frame] = FrameParser(version="1.0").feed(
        b"SEND\ndestination: /q\t\nreceipt:  r1 \ncontent-length: 5\n\nhello\x00")
    assert frame.headers == {"destination": "/q", "receipt": "r1", "content-length": "5"}
    assert frame.body == b"hello"


@pytest.mark.parametrize(("head", "trimmed"), [
    ("CONNECT\nlogin: guest", True),  # a 1.0 client (no accept-version)
    ("CONNECT\naccept-version:1.0\nlogin: guest", True),
    ("CONNECT\naccept-version:1.1,1.2\nlogin: guest", False),
    ("CONNECTED\nversion:1.2\nsession: s", False),
])
def test_handshake_trimmed_only_when_it_stays_on_10(head: str, trimmed: bool) -> None:
    [frame] = FrameParser(version="1.0").feed(head.encode() + b"\n\n\x00")
    value = frame.headers.get("login", frame.headers.get("session"))
    assert value == (value.strip() if trimmed else " " + value.strip())


@pytest.mark.parametrize("version", ["1.1", "1.2"])
def test_stomp11_12_values_keep_their_spaces(version: str) -> None:
    [frame] = FrameParser(version=version).feed(b"SEND\ndestination:/q\nx: y \n\n\x00")
    assert frame.headers["x"] == " y "


@pytest.mark.parametrize(("version", "line"), [
    ("1.0", b"receipt:tail\r\r"), ("1.1", b"receipt:tail\r\r"),
    ("1.0", b"receipt:tail\r \r"),  # 1.0 trims the space, leaving the CR last
    ("1.0", b"x\r:v"), ("1.1", b"x\r:v"),
])
def test_trailing_cr_that_cannot_be_echoed_is_a_remote_error(version: str,
                                                             line: bytes) -> None:
    """Fuzz seed 1734290163: a 1.0 ``receipt`` ending with CR reached the RECEIPT encoder,
    which cannot write it back; the parser refuses it (1.0 trims spaces first)."""
    with pytest.raises(ProtocolError) as info:
        FrameParser(version=version).feed(b"SEND\ndestination:/q\n" + line + b"\n\n\x00")
    assert info.value.fault == "remote"
    assert info.value.message == "malformed header"
    assert "ends with CR" in info.value.detail


def test_version_12_keeps_a_trailing_cr_it_can_escape_back() -> None:
    [frame] = FrameParser(version="1.2").feed(b"SEND\nreceipt:tail\r\r\n\n\x00")
    assert frame.headers["receipt"] == "tail\r"
    assert b"receipt-id:tail\\r\n" in encode_frame(
        Frame("RECEIPT", {"receipt-id": "tail\r"}), "1.2")


# --- escaping -------------------------------------------------------------------------

ESCAPED = b"SEND\ndestination:/q\nk\\cey:a\\nb\\\\c\\cd\n\n\x00"


def test_version_10_does_not_unescape() -> None:
    [frame] = FrameParser(version="1.0").feed(ESCAPED)
    assert frame.headers["k\\cey"] == "a\\nb\\\\c\\cd"


@pytest.mark.parametrize("version", ["1.1", "1.2"])
def test_versions_11_and_12_unescape_names_and_values(version: str) -> None:
    [frame] = FrameParser(version=version).feed(ESCAPED)
    assert frame.headers["k:ey"] == "a\nb\\c:d"


def test_version_12_unescapes_cr() -> None:
    [frame] = FrameParser(version="1.2").feed(b"SEND\nx:a\\rb\n\n\x00")
    assert frame.headers["x"] == "a\rb"


@pytest.mark.parametrize(
    ("version", "raw"),
    [("1.1", b"x:a\\rb"), ("1.1", b"x:a\\tb"), ("1.2", b"x:a\\tb"), ("1.2", b"x:ab\\"),
     ("1.2", b"x\\q:ab")],
)
def test_undefined_escape_is_a_remote_error(version: str, raw: bytes) -> None:
    with pytest.raises(ProtocolError) as info:
        FrameParser(version=version).feed(b"SEND\nreceipt:r\n" + raw + b"\n\n\x00")
    assert info.value.fault == "remote"
    assert info.value.message == "invalid header escape"


@pytest.mark.parametrize("command", ["CONNECT", "CONNECTED"])
def test_handshake_frames_are_never_unescaped(command: str) -> None:
    data = command.encode() + b"\nlogin:a\\nb\npasscode:p\\tq\n\n\x00"
    [frame] = FrameParser(version="1.2").feed(data)
    assert frame.headers == {"login": "a\\nb", "passcode": "p\\tq"}


TRICKY = {"dest:ination": "a:b\nc\\d", "plain": "value", "cr": "x\ry"}


@pytest.mark.parametrize("version", ["1.1", "1.2"])
def test_escaping_round_trips(version: str) -> None:
    headers = dict(TRICKY) if version == "1.2" else {k: v for k, v in TRICKY.items() if k != "cr"}
    frame = Frame("MESSAGE", headers, b"body")
    [parsed] = FrameParser(version=version).feed(encode_frame(frame, version))
    assert parsed == Frame("MESSAGE", {**headers, "content-length": "4"}, b"body")


def test_escaping_uses_spec_sequences_in_12() -> None:
    wire = encode_frame(Frame("SEND", {"a:b": "c\\d\ne\rf"}), "1.2")
    assert wire == b"SEND\na\\cb:c\\\\d\\ne\\rf\n\n\x00"


def test_version_11_leaves_inner_cr_raw() -> None:
    wire = encode_frame(Frame("SEND", {"a": "x\ry", "b": "c:d"}), "1.1")
    assert wire == b"SEND\na:x\ry\nb:c\\cd\n\n\x00"


def test_version_10_round_trips_backslashes_and_colons_in_values() -> None:
    frame = Frame("SEND", {"destination": "/q", "x": "a\\n:b"})
    [parsed] = FrameParser(version="1.0").feed(encode_frame(frame, "1.0"))
    assert parsed == frame


@pytest.mark.parametrize("command", ["CONNECT", "CONNECTED"])
def test_handshake_frames_are_not_escaped_on_encode(command: str) -> None:
    wire = encode_frame(Frame(command, {"login": "a\\b:c"}), "1.2")
    assert wire == command.encode() + b"\nlogin:a\\b:c\n\n\x00"


@pytest.mark.parametrize(
    ("version", "command", "headers"),
    [
        ("1.0", "SEND", {"x": "a\nb"}),
        ("1.0", "SEND", {"a:b": "c"}),
        ("1.2", "CONNECT", {"login": "a\nb"}),
        ("1.1", "SEND", {"x": "ends with cr\r"}),
        ("1.2", "SEND", {"": "empty name"}),
        ("1.0", "SEND", {"": "empty name"}),
    ],
)
def test_unencodable_header_is_a_local_error(
    version: str, command: str, headers: dict[str, str]
) -> None:
    with pytest.raises(ProtocolError) as info:
        encode_frame(Frame(command, headers), version)
    assert info.value.fault == "local"


@pytest.mark.parametrize("command", ["", "SE\nND", "A:B"])
def test_invalid_command_is_a_local_error(command: str) -> None:
    with pytest.raises(ProtocolError) as info:
        encode_frame(Frame(command, {}), "1.2")
    assert info.value.fault == "local"


def test_unknown_version_is_a_local_error() -> None:
    with pytest.raises(ProtocolError) as info:
        encode_frame(Frame("SEND", {"destination": "/q"}), "2.0")
    assert info.value.fault == "local"


# --- encoding -------------------------------------------------------------------------


def test_encode_adds_content_length_for_non_empty_body() -> None:
    wire = encode_frame(Frame("SEND", {"destination": "/q"}, b"a\x00b"), "1.2")
    assert wire == b"SEND\ndestination:/q\ncontent-length:3\n\na\x00b\x00"


def test_encode_omits_content_length_for_empty_body() -> None:
    assert encode_frame(Frame("RECEIPT", {"receipt-id": "1"}), "1.2") == (
        b"RECEIPT\nreceipt-id:1\n\n\x00"
    )


def test_encode_replaces_a_wrong_caller_content_length() -> None:
    frame = Frame("MESSAGE", {"content-length": "999", "destination": "/q"}, b"abc")
    [parsed] = FrameParser(version="1.2").feed(encode_frame(frame, "1.2"))
    assert parsed.body == b"abc"
    assert parsed.headers == {"destination": "/q", "content-length": "3"}


def test_encode_drops_caller_content_length_on_empty_body() -> None:
    wire = encode_frame(Frame("MESSAGE", {"content-length": "5"}), "1.2")
    assert b"content-length" not in wire


def test_encode_keeps_header_order() -> None:
    wire = encode_frame(Frame("SEND", {"z": "1", "a": "2"}), "1.2")
    assert wire.index(b"z:1") < wire.index(b"a:2")


@pytest.mark.parametrize("version", VERSIONS)
def test_binary_message_round_trips_in_every_version(version: str) -> None:
    frame = Frame("MESSAGE", {"destination": "/q", "message-id": "m1"}, b"\x00\xff\x00\n\n")
    parser = FrameParser(version=version)
    [parsed] = parser.feed(encode_frame(frame, version) * 1)
    assert parsed.body == frame.body


def test_encode_then_parse_unicode() -> None:
    frame = Frame("SEND", {"destination": "/queue/\u65e5\u672c"}, "\u00fc".encode())
    [parsed] = FrameParser(version="1.2").feed(encode_frame(frame, "1.2"))
    assert parsed.headers["destination"] == "/queue/\u65e5\u672c"


# --- limits ---------------------------------------------------------------------------

SMALL = Limits(max_frame_size=200, max_header_count=4, max_header_length=40)


def test_default_limits_follow_activemq_and_memory_budget() -> None:
    limits = Limits()
    assert limits.max_header_count == DEFAULT_MAX_HEADER_COUNT == 1000
    assert limits.max_header_length == DEFAULT_MAX_HEADER_LENGTH == 10240
    assert limits.max_frame_size == DEFAULT_MAX_FRAME_SIZE == 10 * 1024 * 1024


@pytest.mark.parametrize("field", ["max_frame_size", "max_header_count", "max_header_length"])
def test_limits_reject_non_positive_values(field: str) -> None:
    with pytest.raises(ValueError, match=field):
        Limits(**{field: 0})


def _oversized_body_frame() -> bytes:
    return b"SEND\ndestination:/q\n\n" + b"x" * 300 + b"\x00"


def _oversized_content_length_frame() -> bytes:
    return b"SEND\nreceipt:big\ncontent-length:500\n\n" + b"x" * 500 + b"\x00"


def _too_many_headers_frame() -> bytes:
    return b"SEND\n" + b"".join(b"h%d:v\n" % i for i in range(5)) + b"\n\x00"


def _too_long_header_frame() -> bytes:
    return b"SEND\nx:" + b"v" * 50 + b"\n\n\x00"


def _too_long_command_frame() -> bytes:
    return b"S" * 50 + b"\n\n\x00"


LIMIT_CASES = {
    "frame-size-body": (_oversized_body_frame, "frame too large"),
    "frame-size-content-length": (_oversized_content_length_frame, "frame too large"),
    "header-count": (_too_many_headers_frame, "too many headers"),
    "header-length": (_too_long_header_frame, "header too long"),
    "command-length": (_too_long_command_frame, "header too long"),
}


@pytest.mark.parametrize(("make", "message"), LIMIT_CASES.values(), ids=LIMIT_CASES.keys())
def test_limit_violation_in_one_chunk_is_a_remote_error(
    make: Callable[[], bytes], message: str
) -> None:
    with pytest.raises(ProtocolError) as info:
        FrameParser(SMALL).feed(make())
    assert info.value.fault == "remote"
    assert info.value.message == message


@pytest.mark.parametrize(("make", "message"), LIMIT_CASES.values(), ids=LIMIT_CASES.keys())
def test_limit_violation_trickling_in_is_a_remote_error(
    make: Callable[[], bytes], message: str
) -> None:
    parser = FrameParser(SMALL)
    data = make()
    with pytest.raises(ProtocolError) as info:
        feed_bytewise(parser, data)
    assert info.value.fault == "remote"
    assert info.value.message == message


def test_oversized_body_is_rejected_before_the_nul_arrives() -> None:
    parser = FrameParser(SMALL)
    parser.feed(b"SEND\ndestination:/q\n\n")
    with pytest.raises(ProtocolError, match="frame too large"):
        for _ in range(1000):  # never terminated: must fail at the limit, not buffer on
            parser.feed(b"x" * 10)
    assert parser.buffered == 0


def test_oversized_headers_without_blank_line_are_rejected_early() -> None:
    parser = FrameParser(Limits(max_frame_size=100, max_header_count=1000,
                                max_header_length=1000))
    with pytest.raises(ProtocolError, match="frame too large"):
        for i in range(1000):
            parser.feed(b"h%d:v\n" % i)


def test_declared_content_length_over_limit_fails_before_the_body() -> None:
    parser = FrameParser(SMALL)
    with pytest.raises(ProtocolError) as info:
        parser.feed(b"SEND\nreceipt:r5\ncontent-length:100000\n\n")
    assert info.value.message == "frame too large"
    assert info.value.receipt_id == "r5"


def test_endless_header_line_is_rejected_while_it_trickles() -> None:
    parser = FrameParser(SMALL)
    parser.feed(b"SEND\nx:")
    with pytest.raises(ProtocolError, match="header too long"):
        for _ in range(100):
            parser.feed(b"v")


def test_frames_exactly_at_the_limits_are_accepted() -> None:
    limits = Limits(max_frame_size=64, max_header_count=2, max_header_length=10)
    head = b"SEND\nabcd:efgh\r\nx:y\n\n"  # a 9-byte line plus CR, two headers
    body = b"z" * (64 - len(head))
    data = head + body + b"\x00"
    [frame] = FrameParser(limits).feed(data)
    assert frame.body == body
    assert frames_only(feed_bytewise(FrameParser(limits), data)) == [frame]


def test_frame_one_byte_over_the_size_limit_is_rejected() -> None:
    limits = Limits(max_frame_size=64, max_header_count=2, max_header_length=10)
    head = b"SEND\nabcd:efgh\nx:y\n\n"
    with pytest.raises(ProtocolError, match="frame too large"):
        FrameParser(limits).feed(head + b"z" * (65 - len(head)) + b"\x00")


def test_limits_apply_per_frame_not_per_chunk() -> None:
    frame = b"SEND\ndestination:/q\n\n" + b"x" * 100 + b"\x00"
    frames = FrameParser(SMALL).feed(frame * 10)
    assert len(frames) == 10


# --- hold after a handshake frame -----------------------------------------------------


def test_hold_after_pauses_parsing_until_resume() -> None:
    parser = FrameParser()
    parser.hold_after = frozenset({"CONNECT"})
    data = b"CONNECT\naccept-version:1.2\n\n\x00SEND\ndestination:/q\nx:a\\cb\n\n\x00"
    assert parser.feed(data) == [Frame("CONNECT", {"accept-version": "1.2"})]
    assert parser.held
    assert parser.feed(b"") == []
    parser.version = "1.2"
    parser.resume()
    assert parser.feed(b"") == [Frame("SEND", {"destination": "/q", "x": "a:b"})]


def test_held_parser_does_not_buffer_unboundedly() -> None:
    parser = FrameParser(SMALL)
    parser.hold_after = frozenset({"CONNECT"})
    parser.feed(b"CONNECT\n\n\x00")
    with pytest.raises(ProtocolError) as info:
        for _ in range(100):
            parser.feed(b"x" * 10)
    assert info.value.fault == "remote"


# --- ProtocolError --------------------------------------------------------------------


def test_protocol_error_carries_fault_message_detail_receipt() -> None:
    exc = ProtocolError("bad", "because", fault="local", receipt_id="r", headers={"v": "1"})
    assert (exc.fault, exc.message, exc.detail, exc.receipt_id) == ("local", "bad", "because", "r")
    assert exc.headers == {"v": "1"}
    assert str(exc) == "bad: because"
    assert ProtocolError("bad").fault == "remote"


@pytest.mark.parametrize(("head", "receipt_id"), [
    (b"SEND\ndestination:/q\nreceipt:r7\r\nx-evil:a\x00b\n", "r7"),  # its own line is clean
    (b"SEND\ndestination:/q\nreceipt:r\x007\n", None),  # the NUL is in the receipt itself
    (b"SEND\ndestination:/q\nx-evil:a\x00b\n", None),  # no receipt asked for
])
def test_head_with_a_nul_is_refused_with_its_receipt_when_that_is_clean(
        head: bytes, receipt_id: str | None) -> None:
    """The ERROR for a head the parser cannot take names the frame's ``receipt`` when that
    line itself is clean, so the client can match the ERROR to what it sent."""
    with pytest.raises(ProtocolError) as info:
        FrameParser(version="1.2").feed(head + b"\nbody\x00")
    assert info.value.fault == "remote"
    assert info.value.message == "malformed frame"
    assert info.value.receipt_id == receipt_id
