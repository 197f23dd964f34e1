"""The frames a WebSocket client sends (RFC 6455 section 5), read without I/O once the
upgrade is done: what ``amqlite.websocket.WsGate`` hands the STOMP connection.

wsproto reads the HTTP upgrade; its frame reader cost the broker ~50 us of event-loop
time per message in W1 (a generic parser with an event object per frame), more than the
STOMP work itself. This one does what a STOMP listener needs and no more: masked client
frames, no extensions (none is ever accepted), fragmented messages with control frames
between the fragments, UTF-8 checked across fragments of a text message, and payload
handed over as it arrives (a large frame is never held whole, so the STOMP limits and
the memory budget see its bytes as they come, as on TCP). Anything else is a
``FrameError`` with the close code RFC 6455 gives it.
"""

from __future__ import annotations

import codecs
import enum
from dataclasses import dataclass

#: Close codes (RFC 6455 section 7.4.1).
CLOSE_PROTOCOL_ERROR = 1002
CLOSE_INVALID_DATA = 1007
#: Control frames carry at most this many payload bytes (section 5.5).
MAX_CONTROL_PAYLOAD = 125

_FIN, _RSV, _OPCODE = 0x80, 0x70, 0x0F
#: Looked up once: a text message's UTF-8 check makes one per message.
_UTF8_DECODER = codecs.getincrementaldecoder("utf-8")
_MASKED, _LENGTH = 0x80, 0x7F
_LEN_16, _LEN_64 = 126, 127


class Op(enum.IntEnum):
    CONTINUATION = 0x0
    TEXT = 0x1
    BINARY = 0x2
    CLOSE = 0x8
    PING = 0x9
    PONG = 0xA


class FrameError(Exception):
    """The client broke RFC 6455: close the WebSocket with ``code``."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code


class Kind(enum.Enum):
    DATA = "data"  # payload bytes of a text or binary message (maybe part of it)
    PING = "ping"
    CLOSE = "close"


@dataclass(frozen=True)
class Item:
    kind: Kind
    payload: bytes = b""
    text: bool = False  # DATA: of a text message
    code: int | None = None  # CLOSE: the client's code, None when it gave none


def unmask(data: bytes | bytearray, key: bytes, offset: int) -> bytes:
    """``data`` XOR the masking key, starting ``offset`` bytes into it (one big-integer
    XOR: C speed, whatever the length); an empty key (unmasked frames) leaves it."""
    n = len(data)
    if not key or not n:
        return bytes(data)
    rotated = key[offset:] + key[:offset]
    mask = (rotated * (n // 4 + 1))[:n]
    return (int.from_bytes(data, "little") ^ int.from_bytes(mask, "little")).to_bytes(
        n, "little")


class FrameReader:
    """Bytes from the client in, ``Item``s out; FrameError on a violation. With
    ``masked=False`` it reads a server's frames instead (the load generator's side)."""

    def __init__(self, masked: bool = True) -> None:
        self.masked = masked
        self._buf = bytearray()
        self._in_message = False  # between a message's first frame and its final one
        self._text = False
        self._utf8: codecs.IncrementalDecoder | None = None
        self._remaining = 0  # payload bytes of the current data frame not yet read
        self._key = b""
        self._offset = 0
        self._fin = False
        self.closed = False  # a close frame was read: nothing after it counts

    def feed(self, data: bytes) -> list[Item]:
        if self.closed:
            return []
        buf = self._buf
        buf += data
        out: list[Item] = []
        pos = 0
        try:
            while not self.closed:
                if self._remaining:
                    take = min(self._remaining, len(buf) - pos)
                    if not take:
                        break
                    chunk = unmask(buf[pos:pos + take], self._key, self._offset)
                    pos += take
                    self._remaining -= take
                    self._offset = (self._offset + take) % 4
                    self._data(chunk, out)
                    continue
                used = self._header(buf, pos, out)
                if not used:
                    break
                pos += used
        finally:
            del buf[:pos]
        return out

    def _data(self, chunk: bytes, out: list[Item]) -> None:
        last = self._fin and not self._remaining
        if self._utf8 is not None:
            try:
                self._utf8.decode(chunk, last)
            except UnicodeDecodeError:
                raise FrameError(CLOSE_INVALID_DATA, "text message is not UTF-8") from None
        if chunk:
            out.append(Item(Kind.DATA, chunk, self._text))
        if last:
            self._in_message, self._utf8 = False, None

    def _header(self, buf: bytearray, pos: int, out: list[Item]) -> int:
        """Read one frame header at ``pos`` (and a control frame whole); the bytes used,
        0 when more are needed."""
        have = len(buf) - pos
        if have < 2:
            return 0
        b0, b1 = buf[pos], buf[pos + 1]
        if b0 & _RSV:
            raise FrameError(CLOSE_PROTOCOL_ERROR, "reserved bits set (no extension agreed)")
        if bool(b1 & _MASKED) != self.masked:
            raise FrameError(CLOSE_PROTOCOL_ERROR, "client frames must be masked, server "
                             "frames must not")
        fin, opcode, length, size = bool(b0 & _FIN), b0 & _OPCODE, b1 & _LENGTH, 2
        if length == _LEN_16:
            size = 4
        elif length == _LEN_64:
            size = 10
        key_size = 4 if self.masked else 0
        if have < size + key_size:
            return 0
        if size > 2:
            length = int.from_bytes(buf[pos + 2:pos + size], "big")
            if length >> 63:
                raise FrameError(CLOSE_PROTOCOL_ERROR, "payload length out of range")
        key = bytes(buf[pos + size:pos + size + key_size])
        size += key_size
        try:
            op = Op(opcode)
        except ValueError:
            raise FrameError(CLOSE_PROTOCOL_ERROR, f"unknown opcode {opcode:#x}") from None
        if op >= Op.CLOSE:
            if not fin or length > MAX_CONTROL_PAYLOAD:
                raise FrameError(CLOSE_PROTOCOL_ERROR, "fragmented or long control frame")
            if have < size + length:
                return 0
            self._control(op, unmask(buf[pos + size:pos + size + length], key, 0), out)
            return size + length
        if op is Op.CONTINUATION:
            if not self._in_message:
                raise FrameError(CLOSE_PROTOCOL_ERROR, "continuation outside a message")
        elif self._in_message:
            raise FrameError(CLOSE_PROTOCOL_ERROR, "new message inside a fragmented one")
        else:
            self._in_message, self._text = True, op is Op.TEXT
            self._utf8 = _UTF8_DECODER() if self._text else None
        self._key, self._offset, self._fin, self._remaining = key, 0, fin, length
        if not length:
            self._data(b"", out)
        return size

    def _control(self, op: Op, payload: bytes, out: list[Item]) -> None:
        if op is Op.PING:
            out.append(Item(Kind.PING, payload))
        elif op is Op.CLOSE:
            if len(payload) == 1:
                raise FrameError(CLOSE_PROTOCOL_ERROR, "close frame of one byte")
            code = int.from_bytes(payload[:2], "big") if payload else None
            self.closed = True
            out.append(Item(Kind.CLOSE, code=code))
