"""amqlite/wsframes.py, the reader of client WebSocket frames, against frames made by
wsproto's client (a second implementation of RFC 6455) cut into every chunking."""

from __future__ import annotations

import os

import pytest
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, CloseConnection, Message, Ping, Request

from amqlite.wsframes import FrameError, FrameReader, Item, Kind, unmask


def client() -> WSConnection:
    """A wsproto client past its upgrade: what it sends are masked frames."""
    c, server = WSConnection(ConnectionType.CLIENT), WSConnection(ConnectionType.SERVER)
    server.receive_data(c.send(Request(host="h", target="/ws")))
    list(server.events())
    c.receive_data(server.send(AcceptConnection()))
    list(c.events())
    return c


def read(data: bytes, step: int) -> list[Item]:
    reader, items = FrameReader(), []
    for i in range(0, len(data), step):
        items += reader.feed(data[i:i + step])
    return items


def joined(items: list[Item]) -> bytes:
    return b"".join(i.payload for i in items if i.kind is Kind.DATA)


@pytest.mark.parametrize("step", [1, 3, 7, 1000, 1 << 20])
def test_messages_fragments_and_control_frames_in_any_chunking(step: int) -> None:
    c = client()
    big = os.urandom(70_000)
    wire = (c.send(Message(data="SEND\n\nhé\x00")) + c.send(Message(data=big))
            + c.send(Message(data="frag", message_finished=False)) + c.send(Ping(b"p"))
            + c.send(Message(data="ment\n", message_finished=True))
            + c.send(Message(data="")) + c.send(CloseConnection(code=1000)))
    items = read(wire, step)
    assert joined(items) == "SEND\n\nhé\x00".encode() + big + b"fragment\n"
    assert {i.text for i in items if i.kind is Kind.DATA} == {True, False}
    assert [i.payload for i in items if i.kind is Kind.PING] == [b"p"]
    assert items[-1] == Item(Kind.CLOSE, code=1000)


def test_nothing_after_close_counts() -> None:
    c = client()
    reader = FrameReader()
    assert reader.feed(c.send(CloseConnection(code=1001)))[-1].code == 1001
    assert reader.feed(b"\x81\x80\x00\x00\x00\x00") == []


def frame(b0: int, payload: bytes, key: bytes = b"\x01\x02\x03\x04",
          masked: bool = True) -> bytes:
    return bytes((b0, (0x80 if masked else 0) | len(payload))) + (
        key + unmask(payload, key, 0) if masked else payload)


@pytest.mark.parametrize(("wire", "code"), [
    (frame(0x81, b"x", masked=False), 1002),  # unmasked client frame
    (frame(0xC1, b"x"), 1002),  # RSV1 without an extension
    (frame(0x83, b"x"), 1002),  # unknown opcode
    (frame(0x80, b"x"), 1002),  # continuation outside a message
    (frame(0x01, b"a") + frame(0x81, b"b"), 1002),  # new message inside a fragmented one
    (frame(0x09, b"p"), 1002),  # fragmented control frame
    (frame(0x88, b"\x03"), 1002),  # close frame of one byte
    (frame(0x81, b"\xff\xfe"), 1007),  # text that is not UTF-8
    (frame(0x01, b"\xc3") + frame(0x80, b"("), 1007),  # not UTF-8 across fragments
])
def test_violations_close_with_their_code(wire: bytes, code: int) -> None:
    with pytest.raises(FrameError) as err:
        FrameReader().feed(wire)
    assert err.value.code == code


def test_long_control_frame_refused() -> None:
    wire = bytes((0x89, 0x80 | 126)) + (126).to_bytes(2, "big") + b"\0\0\0\0" + b"p" * 126
    with pytest.raises(FrameError):
        FrameReader().feed(wire)


def test_utf8_split_across_fragments_is_fine() -> None:
    data = "é".encode()
    items = FrameReader().feed(frame(0x01, data[:1]) + frame(0x80, data[1:]))
    assert joined(items) == data


def test_server_frames_when_not_masked() -> None:
    """``masked=False`` reads what a server sends (bench/wsclient.py), and refuses a
    masked frame there."""
    from amqlite.websocket import OPCODE_TEXT, data_frame_header

    payload = b"RECEIPT\nreceipt-id:1\n\n\x00" * 100
    wire = data_frame_header(OPCODE_TEXT, len(payload)) + payload
    assert joined(read_unmasked(wire)) == payload
    with pytest.raises(FrameError):
        FrameReader(masked=False).feed(frame(0x81, b"x"))


def read_unmasked(data: bytes) -> list[Item]:
    reader, items = FrameReader(masked=False), []
    for i in range(0, len(data), 5):
        items += reader.feed(data[i:i + 5])
    return items
