"""Unit tests of the sans-I/O STOMP connection state machine, server role: handshake,
states, what the server may send and ERROR. The client role is in test_protocol_client,
the heart-beat arithmetic in test_protocol_heartbeat."""

from __future__ import annotations

import pytest

from amqlite.codec import Frame, Limits, ProtocolError
from amqlite.protocol import (
    ConnectionClosed,
    FrameReceived,
    Heartbeat,
    HeartbeatReceived,
    StompProtocol,
    negotiate_version,
)
from tests.helpers.protocol import (
    VALID_CLIENT_FRAMES,
    connected_server,
    decode,
    frames,
    receive_connect,
    wire,
)

# --- server: handshake ----------------------------------------------------------------


def test_server_handshake_negotiates_highest_common_version() -> None:
    proto = StompProtocol("server")
    events = proto.receive_data(b"CONNECT\naccept-version:1.0,1.1,1.2\nhost:h\n\n\x00")
    assert events == [FrameReceived(Frame("CONNECT", {"accept-version": "1.0,1.1,1.2",
                                                      "host": "h"}))]
    assert proto.state == "connecting"
    reply = decode(proto.accept_connect(events[0].frame))
    assert reply.command == "CONNECTED"
    assert reply.headers["version"] == "1.2"
    assert reply.headers["heart-beat"] == "0,0"
    assert reply.headers["server"].startswith("amqlite")
    assert reply.headers["session"]
    assert proto.version == "1.2"
    assert proto.connected


@pytest.mark.parametrize(
    ("accept", "supported", "expected"),
    [
        ("1.0,1.1,1.2", ("1.0", "1.1", "1.2"), "1.2"),
        ("1.1", ("1.0", "1.1", "1.2"), "1.1"),
        ("1.2, 1.1", ("1.0", "1.1"), "1.1"),
        ("1.0,2.0", ("1.0", "1.1", "1.2"), "1.0"),
        (None, ("1.0", "1.1", "1.2"), "1.0"),
    ],
)
def test_version_negotiation(accept: str | None, supported: tuple[str, ...],
                             expected: str) -> None:
    assert negotiate_version(accept, supported) == expected


def test_no_common_version_is_a_remote_error_listing_supported_versions() -> None:
    proto = StompProtocol("server", supported_versions=("1.1", "1.2"))
    with pytest.raises(ProtocolError) as info:
        proto.receive_data(wire("CONNECT", {"accept-version": "1.0"}, version="1.0"))
    assert info.value.fault == "remote"
    assert info.value.headers == {"version": "1.1,1.2"}
    error = decode(proto.error(info.value), "1.0")
    assert error.command == "ERROR"
    assert error.headers["version"] == "1.1,1.2"


def test_accept_connect_with_narrower_versions_rejects_old_client() -> None:
    proto = StompProtocol("server")
    connect = receive_connect(proto, wire("CONNECT", {}, version="1.0"))  # a 1.0 client
    with pytest.raises(ProtocolError) as info:
        proto.accept_connect(connect, supported_versions=("1.2",))
    assert info.value.fault == "remote"
    assert info.value.headers == {"version": "1.2"}


def test_absent_accept_version_means_10_without_heartbeats() -> None:
    proto = StompProtocol("server")
    connect = receive_connect(proto, b"CONNECT\nlogin:u\npasscode:p\n\n\x00")
    reply = decode(proto.accept_connect(connect, server_heartbeat=(5000, 5000)),
                   "1.0")
    assert reply.headers["version"] == "1.0"
    assert "heart-beat" not in reply.headers
    assert proto.version == "1.0"
    assert proto.heartbeat == Heartbeat(0, 0)


def test_stomp_command_is_accepted_as_connect() -> None:
    proto = StompProtocol("server")
    connect = receive_connect(proto, b"STOMP\naccept-version:1.2\nhost:h\n\n\x00")
    decode(proto.accept_connect(connect))
    assert proto.connected


def test_missing_host_is_tolerated() -> None:
    proto = StompProtocol("server")
    connect = receive_connect(proto, b"CONNECT\naccept-version:1.2\n\n\x00")
    decode(proto.accept_connect(connect))
    assert proto.version == "1.2"


def test_connect_headers_are_not_unescaped() -> None:
    proto = StompProtocol("server")
    connect = receive_connect(proto, b"CONNECT\naccept-version:1.2\npasscode:a\\tb\\c\n\n\x00")
    assert connect.headers["passcode"] == "a\\tb\\c"


def test_accept_connect_extra_headers_override_server_and_session() -> None:
    proto = StompProtocol("server")
    connect = receive_connect(proto, wire("CONNECT", {"accept-version": "1.2"}, version="1.0"))
    reply = decode(proto.accept_connect(
        connect, extra_headers={"server": "amqlite/9 b1", "session": "s-1", "x": "y"}))
    assert reply.headers["server"] == "amqlite/9 b1"
    assert reply.headers["session"] == "s-1"
    assert reply.headers["x"] == "y"


@pytest.mark.parametrize("key", ["version", "heart-beat"])
def test_accept_connect_refuses_to_override_negotiated_headers(key: str) -> None:
    proto = StompProtocol("server")
    connect = receive_connect(proto, wire("CONNECT", {"accept-version": "1.2"}, version="1.0"))
    with pytest.raises(ProtocolError) as info:
        proto.accept_connect(connect, extra_headers={key: "x"})
    assert info.value.fault == "local"


def test_accept_connect_before_connect_is_a_local_error() -> None:
    with pytest.raises(ProtocolError) as info:
        StompProtocol("server").accept_connect(Frame("CONNECT", {}))
    assert info.value.fault == "local"


def test_accept_connect_with_invalid_server_heartbeat_is_a_local_error() -> None:
    proto = StompProtocol("server")
    connect = receive_connect(proto, wire("CONNECT", {"accept-version": "1.2"}, version="1.0"))
    with pytest.raises(ProtocolError) as info:
        proto.accept_connect(connect, server_heartbeat=(-1, 0))
    assert info.value.fault == "local"


def test_server_heartbeat_negotiated_in_handshake() -> None:
    proto = connected_server(heart_beat="1000,3000", server_heartbeat=(5000, 500))
    # server sends every max(sx=5000, cy=3000); expects every max(cx=1000, sy=500)
    assert proto.heartbeat == Heartbeat(send_ms=5000, expect_ms=1000)


@pytest.mark.parametrize("value", ["1000", "1000,", "a,b", "-1,0", "1000, 0", "1,2,3", "",
                                   "99999999999,0", "\u0661,0"])
def test_invalid_heartbeat_header_is_a_remote_error(value: str) -> None:
    proto = StompProtocol("server")
    data = wire("CONNECT", {"accept-version": "1.2", "heart-beat": value}, version="1.0")
    with pytest.raises(ProtocolError) as info:
        proto.receive_data(data)
    assert info.value.fault == "remote"
    assert info.value.message == "invalid heart-beat header"


def test_frames_pipelined_behind_connect_use_the_negotiated_version() -> None:
    proto = StompProtocol("server")
    data = (wire("CONNECT", {"accept-version": "1.2"}, version="1.0")
            + b"SEND\ndestination:/q\nk:a\\cb\\rc\n\nx\x00")
    events = proto.receive_data(data)
    assert [f.command for f in frames(events)] == ["CONNECT", "SEND"]
    assert frames(events)[1].headers["k"] == "a:b\rc"
    decode(proto.accept_connect(frames(events)[0]))
    assert proto.version == "1.2"


def test_pipelined_frames_are_validated_with_the_negotiated_version() -> None:
    proto = StompProtocol("server")
    data = (wire("CONNECT", {"accept-version": "1.2"}, version="1.0")
            + wire("ACK", {"message-id": "m", "subscription": "s"}))  # 1.1 style ACK
    with pytest.raises(ProtocolError, match="'id'"):
        proto.receive_data(data)


def test_accept_connect_refuses_a_version_change_after_pipelined_frames() -> None:
    proto = StompProtocol("server")
    events = proto.receive_data(wire("CONNECT", {"accept-version": "1.1,1.2"}, version="1.0")
                                + wire("SEND", {"destination": "/q"}))
    with pytest.raises(ProtocolError) as info:
        proto.accept_connect(frames(events)[0], supported_versions=("1.1",))
    assert info.value.fault == "local"


# --- server: state machine ------------------------------------------------------------


@pytest.mark.parametrize("command", ["SEND", "SUBSCRIBE", "DISCONNECT", "ACK"])
def test_frame_before_connect_is_a_remote_error(command: str) -> None:
    proto = StompProtocol("server")
    with pytest.raises(ProtocolError) as info:
        proto.receive_data(wire(command, {"destination": "/q", "receipt": "r1"}))
    assert info.value.fault == "remote"
    assert info.value.message == "not connected"
    assert info.value.receipt_id == "r1"


def test_second_connect_is_a_remote_error() -> None:
    proto = connected_server()
    with pytest.raises(ProtocolError) as info:
        proto.receive_data(wire("CONNECT", {"accept-version": "1.2"}, version="1.0"))
    assert info.value.message == "already connected"


@pytest.mark.parametrize("command", ["GARBAGE", "MESSAGE", "CONNECTED", "RECEIPT"])
def test_unknown_or_server_command_from_client_is_a_remote_error(command: str) -> None:
    proto = connected_server()
    with pytest.raises(ProtocolError) as info:
        proto.receive_data(wire(command, {"destination": "/q", "message-id": "1",
                                          "subscription": "s", "receipt-id": "r"}, version="1.0"))
    assert info.value.fault == "remote"
    assert info.value.message == "unknown command"


def test_heartbeat_events_are_reported() -> None:
    proto = connected_server()
    assert proto.receive_data(b"\n") == [HeartbeatReceived()]
    assert proto.receive_data(b"\r\n") == [HeartbeatReceived()]


@pytest.mark.parametrize(
    ("version", "command", "headers"),
    [(v, c, h) for v, cases in VALID_CLIENT_FRAMES.items() for c, h in cases],
)
def test_every_valid_client_frame_is_accepted(version: str, command: str,
                                              headers: dict[str, str]) -> None:
    proto = connected_server(accept_version=None if version == "1.0" else version)
    assert proto.version == version
    events = proto.receive_data(wire(command, headers, version=version))
    assert frames(events) == [Frame(command, headers)]


MISSING_HEADERS = [
    ("1.0", "SEND", {}),
    ("1.0", "SUBSCRIBE", {"id": "s"}),
    ("1.0", "UNSUBSCRIBE", {}),
    ("1.0", "ACK", {"id": "a"}),
    ("1.0", "NACK", {"message-id": "m"}),  # NACK does not exist in 1.0
    ("1.0", "BEGIN", {}),
    ("1.1", "SUBSCRIBE", {"destination": "/q"}),
    ("1.1", "UNSUBSCRIBE", {"destination": "/q"}),
    ("1.1", "ACK", {"message-id": "m"}),
    ("1.1", "NACK", {"subscription": "s"}),
    ("1.1", "ACK", {"id": "a"}),
    ("1.2", "SEND", {"receipt": "r"}),
    ("1.2", "SUBSCRIBE", {"destination": "/q"}),
    ("1.2", "UNSUBSCRIBE", {"destination": "/q"}),
    ("1.2", "ACK", {"message-id": "m", "subscription": "s"}),
    ("1.2", "NACK", {"message-id": "m"}),
    ("1.2", "COMMIT", {}),
    ("1.2", "ABORT", {}),
]


@pytest.mark.parametrize(("version", "command", "headers"), MISSING_HEADERS)
def test_missing_required_header_is_a_remote_error(version: str, command: str,
                                                   headers: dict[str, str]) -> None:
    proto = connected_server(accept_version=None if version == "1.0" else version)
    with pytest.raises(ProtocolError) as info:
        proto.receive_data(wire(command, {**headers, "receipt": "rx"}, version=version))
    assert info.value.fault == "remote"
    assert info.value.receipt_id == "rx"


def test_invalid_ack_mode_is_a_remote_error() -> None:
    proto = connected_server()
    with pytest.raises(ProtocolError, match="ack"):
        proto.receive_data(wire("SUBSCRIBE", {"destination": "/q", "id": "1", "ack": "bogus"}))


def test_body_on_a_frame_that_cannot_have_one_is_a_remote_error() -> None:
    proto = connected_server()
    with pytest.raises(ProtocolError, match="body"):
        proto.receive_data(wire("BEGIN", {"transaction": "t"}, b"oops"))


def test_frame_after_disconnect_is_a_remote_error() -> None:
    proto = connected_server()
    proto.receive_data(wire("DISCONNECT", {"receipt": "bye"}))
    assert proto.state == "disconnecting"
    assert decode(proto.send(Frame("RECEIPT", {"receipt-id": "bye"}))).command == "RECEIPT"
    with pytest.raises(ProtocolError, match="DISCONNECT"):
        proto.receive_data(wire("SEND", {"destination": "/q"}))


def test_receive_after_a_protocol_error_raises_connection_closed() -> None:
    proto = StompProtocol("server")
    with pytest.raises(ProtocolError):
        proto.receive_data(wire("SEND", {"destination": "/q"}))
    with pytest.raises(ConnectionClosed) as info:
        proto.receive_data(b"\n")
    assert info.value.fault == "local"
    decode(proto.error(ProtocolError("not connected")), "1.0")  # the ERROR still goes out


def test_codec_limits_are_applied_by_the_protocol() -> None:
    proto = StompProtocol("server", Limits(max_frame_size=100))
    with pytest.raises(ProtocolError) as info:
        proto.receive_data(b"CONNECT\n" + b"x:y\n" * 50)
    assert info.value.message == "frame too large"


# --- server: sending and ERROR ----------------------------------------------------------


def test_server_sends_message_and_receipt_with_negotiated_escaping() -> None:
    proto = connected_server()
    data = proto.send(Frame("MESSAGE", {"destination": "/q", "message-id": "ID:1",
                                        "subscription": "s"}, b"hi"))
    assert b"message-id:ID\\c1" in data
    assert decode(data).headers["message-id"] == "ID:1"
    assert decode(proto.send(Frame("RECEIPT", {"receipt-id": "r"}))).headers == {
        "receipt-id": "r"}


@pytest.mark.parametrize("version", ["1.0", "1.1", "1.2"])
@pytest.mark.parametrize("receipt_id", ["r7", "", "a:b", "back\\slash", "new\nline",
                                        "cr\r", "message-12 x"])
def test_receipt_shortcut_writes_what_send_would(version: str, receipt_id: str) -> None:
    """StompProtocol.receipt skips building a frame for ids with nothing to escape; for
    every id and version it must give send()'s bytes, or send()'s error."""
    proto = connected_server(accept_version=version)
    try:
        expected: bytes | type[ProtocolError] = proto.send(
            Frame("RECEIPT", {"receipt-id": receipt_id}))
    except ProtocolError:
        expected = ProtocolError
    if expected is ProtocolError:
        with pytest.raises(ProtocolError):
            proto.receipt(receipt_id)
    else:
        assert proto.receipt(receipt_id) == expected


@pytest.mark.parametrize("command", ["SEND", "CONNECT", "SUBSCRIBE", "CONNECTED", "BOGUS"])
def test_server_sending_a_non_server_frame_is_a_local_error(command: str) -> None:
    proto = connected_server()
    with pytest.raises(ProtocolError) as info:
        proto.send(Frame(command, {"destination": "/q"}))
    assert info.value.fault == "local"


@pytest.mark.parametrize(
    ("version", "headers"),
    [("1.2", {"destination": "/q", "message-id": "1"}),
     ("1.0", {"destination": "/q"}),
     ("1.1", {"message-id": "1", "subscription": "s"})],
)
def test_server_sending_incomplete_message_is_a_local_error(version: str,
                                                            headers: dict[str, str]) -> None:
    proto = connected_server(accept_version=None if version == "1.0" else version)
    with pytest.raises(ProtocolError) as info:
        proto.send(Frame("MESSAGE", headers))
    assert info.value.fault == "local"


def test_message_without_subscription_is_fine_in_10() -> None:
    proto = connected_server(accept_version=None)
    frame = Frame("MESSAGE", {"destination": "/q", "message-id": "1"}, b"x")
    assert decode(proto.send(frame), "1.0").body == b"x"


def test_server_cannot_send_message_before_connected() -> None:
    proto = StompProtocol("server")
    with pytest.raises(ProtocolError) as info:
        proto.send(Frame("MESSAGE", {"destination": "/q", "message-id": "1",
                                     "subscription": "s"}))
    assert info.value.fault == "local"


def test_error_frame_contents_and_closed_state() -> None:
    proto = connected_server()
    exc = ProtocolError("missing required header", "SEND frame requires header 'destination'",
                        receipt_id="r:42")
    error = decode(proto.error(exc))
    assert error.command == "ERROR"
    assert error.headers["message"] == "missing required header"
    assert error.headers["receipt-id"] == "r:42"
    assert error.headers["content-type"].startswith("text/plain")
    assert error.body == b"SEND frame requires header 'destination'"
    assert proto.state == "closed"
    with pytest.raises(ConnectionClosed):
        proto.receive_data(b"\n")
    with pytest.raises(ConnectionClosed):
        proto.send(Frame("RECEIPT", {"receipt-id": "x"}))
    with pytest.raises(ConnectionClosed):
        proto.error(exc)


def test_error_without_receipt_or_detail() -> None:
    error = decode(StompProtocol("server").error(ProtocolError("too many connections")), "1.0")
    assert error == Frame("ERROR", {"message": "too many connections"})


def test_error_message_is_kept_on_one_line() -> None:
    error = decode(StompProtocol("server").error(ProtocolError("bad\nthing")), "1.0")
    assert error.headers["message"] == "bad thing"


def test_error_for_missing_header_carries_the_offending_receipt() -> None:
    proto = connected_server()
    with pytest.raises(ProtocolError) as info:
        proto.receive_data(wire("SEND", {"receipt": "abc"}, b"x"))
    error = decode(proto.error(info.value))
    assert error.headers["receipt-id"] == "abc"
    assert b"destination" in error.body


def test_client_cannot_send_error() -> None:
    with pytest.raises(ProtocolError) as info:
        StompProtocol("client").error(ProtocolError("x"))
    assert info.value.fault == "local"


def test_heartbeat_data_is_a_bare_eol() -> None:
    assert connected_server().heartbeat_data() == b"\n"
