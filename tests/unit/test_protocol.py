"""Unit tests of the sans-I/O STOMP connection state machine (server and client roles)."""

from __future__ import annotations

import pytest

from amqlite.codec import Frame, FrameParser, Limits, ProtocolError, encode_frame
from amqlite.protocol import (
    HEARTBEAT_GRACE,
    MAX_HEARTBEAT_MS,
    ConnectionClosed,
    FrameReceived,
    Heartbeat,
    HeartbeatReceived,
    StompProtocol,
    negotiate_heartbeat,
    negotiate_version,
    parse_heartbeat,
    receive_deadline_ms,
)


def wire(command: str, headers: dict[str, str] | None = None, body: bytes = b"",
         version: str = "1.2") -> bytes:
    return encode_frame(Frame(command, headers or {}, body), version)


def decode(data: bytes, version: str = "1.2") -> Frame:
    [frame] = FrameParser(version=version).feed(data)
    assert isinstance(frame, Frame)
    return frame


def frames(events: list[FrameReceived | HeartbeatReceived]) -> list[Frame]:
    return [e.frame for e in events if isinstance(e, FrameReceived)]


def receive_connect(proto: StompProtocol, data: bytes) -> Frame:
    """Feed a CONNECT and return it, checking it is the only event."""
    [event] = proto.receive_data(data)
    assert isinstance(event, FrameReceived)
    return event.frame


def connected_server(
    accept_version: str | None = "1.2", heart_beat: str | None = None,
    server_heartbeat: tuple[int, int] = (0, 0),
) -> StompProtocol:
    proto = StompProtocol("server")
    headers = {"host": "h"}
    if accept_version is not None:
        headers["accept-version"] = accept_version
    if heart_beat is not None:
        headers["heart-beat"] = heart_beat
    connect = receive_connect(proto, wire("CONNECT", headers, version="1.0"))
    proto.accept_connect(connect, server_heartbeat=server_heartbeat)
    return proto


def connected_client(version: str = "1.2") -> StompProtocol:
    proto = StompProtocol("client")
    proto.connect_frame("h")
    proto.receive_data(wire("CONNECTED", {"version": version}, version="1.0"))
    assert proto.connected
    return proto


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


VALID_CLIENT_FRAMES = {
    "1.0": [
        ("SEND", {"destination": "/q"}),
        ("SUBSCRIBE", {"destination": "/q"}),
        ("UNSUBSCRIBE", {"destination": "/q"}),
        ("UNSUBSCRIBE", {"id": "s"}),
        ("ACK", {"message-id": "m"}),
        ("BEGIN", {"transaction": "t"}),
        ("COMMIT", {"transaction": "t"}),
        ("ABORT", {"transaction": "t"}),
        ("DISCONNECT", {}),
    ],
    "1.1": [
        ("SEND", {"destination": "/q"}),
        ("SUBSCRIBE", {"destination": "/q", "id": "s", "ack": "client-individual"}),
        ("UNSUBSCRIBE", {"id": "s"}),
        ("ACK", {"message-id": "m", "subscription": "s"}),
        ("NACK", {"message-id": "m", "subscription": "s"}),
        ("BEGIN", {"transaction": "t"}),
        ("COMMIT", {"transaction": "t"}),
        ("ABORT", {"transaction": "t"}),
        ("DISCONNECT", {}),
    ],
    "1.2": [
        ("SEND", {"destination": "/q"}),
        ("SUBSCRIBE", {"destination": "/q", "id": "s", "ack": "client"}),
        ("UNSUBSCRIBE", {"id": "s"}),
        ("ACK", {"id": "a"}),
        ("NACK", {"id": "a"}),
        ("BEGIN", {"transaction": "t"}),
        ("COMMIT", {"transaction": "t"}),
        ("ABORT", {"transaction": "t"}),
        ("DISCONNECT", {}),
    ],
}


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


# --- client role ----------------------------------------------------------------------


def test_client_connect_frame() -> None:
    proto = StompProtocol("client")
    frame = decode(proto.connect_frame("broker", "user", "p:w", (1000, 2000),
                                       extra={"client-id": "c1"}), "1.0")
    assert frame == Frame("CONNECT", {"accept-version": "1.0,1.1,1.2", "host": "broker",
                                      "heart-beat": "1000,2000", "login": "user",
                                      "passcode": "p:w", "client-id": "c1"})
    assert proto.state == "connecting"


def test_client_handshake_sets_version_and_heartbeat() -> None:
    proto = StompProtocol("client")
    proto.connect_frame("h", heartbeat=(1000, 2000))
    events = proto.receive_data(b"CONNECTED\nversion:1.2\nheart-beat:3000,500\n\n\x00")
    assert frames(events)[0].command == "CONNECTED"
    assert proto.version == "1.2"
    # client sends every max(cx=1000, sy=500); expects every max(sx=3000, cy=2000)
    assert proto.heartbeat == Heartbeat(send_ms=1000, expect_ms=3000)


def test_client_and_server_agree_end_to_end() -> None:
    client, server = StompProtocol("client"), StompProtocol("server")
    connect = receive_connect(server, client.connect_frame("h", heartbeat=(4000, 6000)))
    reply = server.accept_connect(connect, server_heartbeat=(5000, 1000))
    client.receive_data(reply)
    assert client.version == server.version == "1.2"
    assert client.heartbeat == Heartbeat(send_ms=server.heartbeat.expect_ms,
                                         expect_ms=server.heartbeat.send_ms)
    sent = Frame("SEND", {"destination": "/q", "x": "a:b\nc"}, b"\x00")
    assert frames(server.receive_data(client.send(sent))) == [
        Frame("SEND", {**sent.headers, "content-length": "1"}, b"\x00")]


def test_client_decodes_frames_pipelined_behind_connected_with_new_version() -> None:
    proto = StompProtocol("client")
    proto.connect_frame("h")
    data = (b"CONNECTED\nversion:1.2\n\n\x00"
            + b"MESSAGE\ndestination:/q\nmessage-id:a\\cb\nsubscription:s\n\nx\x00")
    events = proto.receive_data(data)
    assert frames(events)[1].headers["message-id"] == "a:b"


def test_connected_without_version_means_10() -> None:
    proto = StompProtocol("client")
    proto.connect_frame("h", heartbeat=(1000, 1000))
    proto.receive_data(b"CONNECTED\nsession:x\n\n\x00")
    assert proto.version == "1.0"
    assert proto.heartbeat == Heartbeat(0, 0)


def test_connected_with_version_we_did_not_offer_is_a_remote_error() -> None:
    proto = StompProtocol("client")
    proto.connect_frame("h", versions=("1.1",))
    with pytest.raises(ProtocolError) as info:
        proto.receive_data(b"CONNECTED\nversion:1.2\n\n\x00")
    assert info.value.fault == "remote"


def test_client_gets_error_frame_during_handshake() -> None:
    proto = StompProtocol("client")
    proto.connect_frame("h")
    events = proto.receive_data(b"ERROR\nmessage:authentication failed\n\n\x00")
    assert frames(events)[0].headers["message"] == "authentication failed"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"MESSAGE\ndestination:/q\nmessage-id:1\nsubscription:s\n\n\x00", "unexpected frame"),
        (b"CONNECTED\nversion:1.2\n\n\x00", "unexpected frame"),
    ],
)
def test_client_rejects_frames_before_connect_sent(data: bytes, message: str) -> None:
    with pytest.raises(ProtocolError) as info:
        StompProtocol("client").receive_data(data)
    assert info.value.message == message


def test_client_rejects_message_before_connected() -> None:
    proto = StompProtocol("client")
    proto.connect_frame("h")
    with pytest.raises(ProtocolError, match="before CONNECTED"):
        proto.receive_data(b"MESSAGE\ndestination:/q\nmessage-id:1\nsubscription:s\n\n\x00")


@pytest.mark.parametrize(
    ("command", "headers"),
    [("MESSAGE", {"destination": "/q", "message-id": "1", "subscription": "s"}),
     ("RECEIPT", {"receipt-id": "r"}),
     ("ERROR", {"message": "m"})],
)
def test_client_accepts_every_valid_server_frame(command: str, headers: dict[str, str]) -> None:
    proto = connected_client()
    assert frames(proto.receive_data(wire(command, headers))) == [Frame(command, headers)]


@pytest.mark.parametrize(
    ("command", "headers", "message"),
    [("MESSAGE", {"destination": "/q", "message-id": "1"}, "missing required header"),
     ("MESSAGE", {"destination": "/q", "subscription": "s"}, "missing required header"),
     ("RECEIPT", {}, "missing required header"),
     ("CONNECTED", {"version": "1.2"}, "unexpected frame"),
     ("SEND", {"destination": "/q"}, "unknown command"),
     ("BOGUS", {}, "unknown command")],
)
def test_client_rejects_invalid_server_frames(command: str, headers: dict[str, str],
                                              message: str) -> None:
    proto = connected_client()
    with pytest.raises(ProtocolError) as info:
        proto.receive_data(wire(command, headers))
    assert info.value.fault == "remote"
    assert info.value.message == message


@pytest.mark.parametrize(
    ("command", "headers"),
    [(c, h) for c, h in VALID_CLIENT_FRAMES["1.2"]],
)
def test_client_sends_every_valid_client_frame(command: str, headers: dict[str, str]) -> None:
    proto = connected_client()
    assert decode(proto.send(Frame(command, headers))) == Frame(command, headers)


@pytest.mark.parametrize(
    ("command", "headers"),
    [("SEND", {}), ("ACK", {"message-id": "m"}), ("MESSAGE", {"destination": "/q"}),
     ("CONNECT", {}), ("NACK", {})],
)
def test_client_sending_invalid_frame_is_a_local_error(command: str,
                                                       headers: dict[str, str]) -> None:
    with pytest.raises(ProtocolError) as info:
        connected_client().send(Frame(command, headers))
    assert info.value.fault == "local"


def test_client_cannot_send_before_connected_or_after_disconnect() -> None:
    proto = StompProtocol("client")
    with pytest.raises(ProtocolError) as info:
        proto.send(Frame("SEND", {"destination": "/q"}))
    assert info.value.fault == "local"
    proto = connected_client()
    proto.send(Frame("DISCONNECT", {"receipt": "r"}))
    with pytest.raises(ProtocolError, match="disconnecting"):
        proto.send(Frame("SEND", {"destination": "/q"}))
    assert frames(proto.receive_data(wire("RECEIPT", {"receipt-id": "r"})))[0].command == "RECEIPT"


def test_connect_frame_rejects_bad_settings_locally() -> None:
    with pytest.raises(ProtocolError) as info:
        StompProtocol("client").connect_frame("h", versions=("2.0",))
    assert info.value.fault == "local"
    with pytest.raises(ProtocolError) as info:
        StompProtocol("client").connect_frame("h", heartbeat=(0, -5))
    assert info.value.fault == "local"
    with pytest.raises(ProtocolError) as info:
        StompProtocol("server").connect_frame("h")
    assert info.value.fault == "local"


def test_invalid_role_is_rejected() -> None:
    with pytest.raises(ValueError, match="role"):
        StompProtocol("peer")  # type: ignore[arg-type]


# --- heart-beat arithmetic ------------------------------------------------------------


@pytest.mark.parametrize(
    ("client", "server", "server_view"),
    [
        ((0, 0), (0, 0), Heartbeat(0, 0)),
        ((1000, 0), (0, 0), Heartbeat(0, 0)),  # server does not want client beats
        ((0, 0), (1000, 1000), Heartbeat(0, 0)),  # client neither sends nor wants beats
        ((1000, 0), (0, 2000), Heartbeat(send_ms=0, expect_ms=2000)),
        ((3000, 0), (0, 2000), Heartbeat(send_ms=0, expect_ms=3000)),
        ((0, 500), (1000, 0), Heartbeat(send_ms=1000, expect_ms=0)),
        ((0, 5000), (1000, 0), Heartbeat(send_ms=5000, expect_ms=0)),
        ((1000, 2000), (3000, 500), Heartbeat(send_ms=3000, expect_ms=1000)),
        ((10000, 10000), (10000, 10000), Heartbeat(10000, 10000)),
    ],
)
def test_heartbeat_negotiation_table(client: tuple[int, int], server: tuple[int, int],
                                     server_view: Heartbeat) -> None:
    assert negotiate_heartbeat(client, server) == server_view
    assert negotiate_heartbeat(client, server, role="client") == Heartbeat(
        send_ms=server_view.expect_ms, expect_ms=server_view.send_ms)


@pytest.mark.parametrize(
    ("value", "parsed"),
    [(None, (0, 0)), ("0,0", (0, 0)), ("1000,2500", (1000, 2500)),
     (f"{MAX_HEARTBEAT_MS},0", (MAX_HEARTBEAT_MS, 0))],
)
def test_parse_heartbeat(value: str | None, parsed: tuple[int, int]) -> None:
    assert parse_heartbeat(value) == parsed


def test_parse_heartbeat_rejects_values_over_the_maximum() -> None:
    with pytest.raises(ProtocolError) as info:
        parse_heartbeat(f"{MAX_HEARTBEAT_MS + 1},0")
    assert info.value.fault == "remote"


def test_receive_deadline_uses_the_grace_factor() -> None:
    assert HEARTBEAT_GRACE == 2.0
    assert receive_deadline_ms(Heartbeat(send_ms=0, expect_ms=1000)) == 2000
    assert receive_deadline_ms(Heartbeat(send_ms=0, expect_ms=333), grace=1.5) == 500
    assert receive_deadline_ms(Heartbeat(send_ms=1000, expect_ms=0)) is None
