"""Shared by the protocol unit tests: frames on the wire, and a server or client protocol
already past its handshake."""

from __future__ import annotations

from amqlite.codec import Frame, FrameParser, encode_frame
from amqlite.protocol import FrameReceived, HeartbeatReceived, StompProtocol


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


#: One well-formed frame per client command, per STOMP version.
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
