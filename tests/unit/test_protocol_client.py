"""Unit tests of the sans-I/O STOMP connection state machine, client role."""

from __future__ import annotations

import pytest

from amqlite.codec import Frame, ProtocolError
from amqlite.protocol import Heartbeat, StompProtocol
from tests.helpers.protocol import (
    VALID_CLIENT_FRAMES,
    connected_client,
    decode,
    frames,
    receive_connect,
    wire,
)

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
