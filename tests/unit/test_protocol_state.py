"""The protocol's states are one enum, and ``handshake_done`` (what the server's
connection reads as ``connected``) stays true from CONNECTED on, through DISCONNECT
and an ERROR, as the server's own flag did."""

from __future__ import annotations

from amqlite.codec import ProtocolError
from amqlite.protocol import State, StompProtocol


def test_server_walks_through_every_state_and_stays_past_the_handshake() -> None:
    proto = StompProtocol("server")
    seen = [proto.state]
    assert not proto.handshake_done
    [event] = proto.receive_data(b"CONNECT\naccept-version:1.2\nhost:h\n\n\x00")
    seen.append(proto.state)
    assert not proto.handshake_done
    proto.accept_connect(event.frame)
    seen.append(proto.state)
    assert proto.handshake_done and proto.version == "1.2"
    proto.receive_data(b"DISCONNECT\nreceipt:1\n\n\x00")
    seen.append(proto.state)
    assert proto.handshake_done and not proto.connected
    proto.error(ProtocolError("bye"))
    seen.append(proto.state)
    assert proto.handshake_done
    assert seen == [State.IDLE, State.CONNECTING, State.CONNECTED, State.DISCONNECTING,
                    State.CLOSED]
    assert all(type(s) is State for s in seen)


def test_an_error_before_connected_leaves_the_handshake_undone() -> None:
    proto = StompProtocol("server")
    proto.receive_data(b"CONNECT\naccept-version:1.2\nhost:h\n\n\x00")
    proto.error(ProtocolError("authentication failed"))
    assert proto.state is State.CLOSED
    assert not proto.handshake_done


def test_client_is_done_with_the_handshake_once_connected_arrives() -> None:
    proto = StompProtocol("client")
    proto.connect_frame("h", versions=("1.1", "1.2"))
    assert proto.state is State.CONNECTING and not proto.handshake_done
    proto.receive_data(b"CONNECTED\nversion:1.1\n\n\x00")
    assert proto.state is State.CONNECTED and proto.handshake_done
