"""StompProtocol(hold_handshake=True): what follows CONNECT stays bytes until released."""

from __future__ import annotations

from amqlite.protocol import StompProtocol
from tests.helpers.protocol import frames, wire


def test_frames_behind_connect_are_held_as_bytes_until_released() -> None:
    proto = StompProtocol("server", hold_handshake=True)
    pipelined = b"SEND\ndestination:/q\nk:a\\cb\n\nx\x00"  # escaped colon, as 1.2 writes it
    events = proto.receive_data(wire("CONNECT", {"accept-version": "1.2"}, version="1.0")
                                + pipelined)
    assert [f.command for f in frames(events)] == ["CONNECT"]
    assert proto.buffered == len(pipelined)
    assert proto.receive_data(b"SEND\n") == []  # still held: nothing parsed
    proto.accept_connect(frames(events)[0])
    [send] = frames(proto.release_handshake())
    assert send.headers["k"] == "a:b"  # decoded with the negotiated 1.2
    assert proto.buffered == len(b"SEND\n")


def test_release_without_anything_held_is_empty() -> None:
    proto = StompProtocol("server", hold_handshake=True)
    [connect] = frames(proto.receive_data(wire("CONNECT", {"accept-version": "1.2"},
                                               version="1.0")))
    proto.accept_connect(connect)
    assert proto.release_handshake() == []
    assert proto.buffered == 0
