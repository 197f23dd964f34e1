"""Sans-I/O STOMP 1.0/1.1/1.2 frame codec: bytes in, frames out, and back.

No sockets, no clock: the asyncio layer feeds whatever bytes arrived and writes whatever
bytes it is handed, so the codec is testable at every byte boundary and reusable by the
broker and the client alike.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from amqlite.frame_rules import (
    DEFAULT_MAX_FRAME_SIZE,
    DEFAULT_MAX_HEADER_COUNT,
    DEFAULT_MAX_HEADER_LENGTH,
    MAX_CONTENT_LENGTH,
    TRIMMED_1_0,
    Limits,
    ProtocolError,
    header_too_long,
    parse_uint,
    receipt_line,
    refuse_trailing_cr,
    too_many_headers,
    trims_values,
)
from amqlite.wire import STOMP_1_0, STOMP_1_2, SUPPORTED_VERSIONS

__all__ = [
    "DEFAULT_MAX_FRAME_SIZE",
    "DEFAULT_MAX_HEADER_COUNT",
    "DEFAULT_MAX_HEADER_LENGTH",
    "HEARTBEAT",
    "NO_ESCAPE_COMMANDS",
    "SUPPORTED_VERSIONS",
    "Frame",
    "FrameParser",
    "HeartbeatMarker",
    "Limits",
    "ParsedItem",
    "ProtocolError",
    "encode_frame",
    "join_head",
    "parse_uint",
]

# SUPPORTED_VERSIONS (amqlite.wire, re-exported): the versions this codec knows how to
# escape; anything else is a caller bug (local).

# STOMP 1.2 "Value Encoding": CONNECT and CONNECTED frames do not escape or unescape
# headers, so that 1.0 peers can still read the handshake.
NO_ESCAPE_COMMANDS: frozenset[str] = frozenset({"CONNECT", "CONNECTED"})


@dataclass(slots=True, init=False)
class Frame:
    """One STOMP frame. Header order is kept; on parse the first of a repeated header wins.

    The constructor is written out (``init=False``): mypyc compiles a method of the
    class, while the one ``dataclass`` generates runs as interpreted Python even in the
    compiled build (190 against 50 ns per frame)."""

    command: str
    headers: dict[str, str]
    body: bytes

    def __init__(self, command: str, headers: dict[str, str] | None = None,
                 body: bytes = b"") -> None:
        self.command = command
        self.headers = {} if headers is None else headers
        self.body = body

    def get(self, name: str, default: str | None = None) -> str | None:
        return self.headers.get(name, default)


class HeartbeatMarker(enum.Enum):
    """Type of :data:`HEARTBEAT`, so ``item is HEARTBEAT`` type-checks."""

    HEARTBEAT = "heartbeat"


# Yielded by FrameParser.feed for a run of bare EOLs between frames. Only a liveness
# signal: how many you get for N newlines depends on how the bytes were chunked.
HEARTBEAT = HeartbeatMarker.HEARTBEAT

ParsedItem = Frame | Literal[HeartbeatMarker.HEARTBEAT]

# --- escaping -------------------------------------------------------------------------

_ESCAPE_11 = str.maketrans({"\\": "\\\\", "\n": "\\n", ":": "\\c"})
_ESCAPE_12 = str.maketrans({"\\": "\\\\", "\n": "\\n", ":": "\\c", "\r": "\\r"})
# A raw name that would break the framing when it cannot be escaped (1.0, CONNECT).
_UNSENDABLE_RAW_NAME = re.compile(r"[\n\r:]")
_UNESCAPE_MAP_11 = {"n": "\n", "c": ":", "\\": "\\"}
_UNESCAPE_MAP_12 = {"n": "\n", "c": ":", "\\": "\\", "r": "\r"}
_ESCAPE_SEQUENCE = re.compile(r"\\(.?)", re.DOTALL)
_EOLS = re.compile(rb"(?:\r?\n)+")


def _unescape(text: str, version: str) -> str:
    """Undo STOMP header escaping; an undefined escape is the sender's error (spec)."""
    # Only escaped colons (ids like ID\cgroup\c42, the usual case): one C pass.
    if text.count("\\") == text.count("\\c"):
        return text.replace("\\c", ":")
    table = _UNESCAPE_MAP_12 if version == STOMP_1_2 else _UNESCAPE_MAP_11

    def replace(match: re.Match[str]) -> str:
        char = match.group(1)
        try:
            return table[char]
        except KeyError:
            shown = f"\\{char}" if char else "trailing \\"
            raise ProtocolError(
                "invalid header escape",
                f"undefined escape sequence {shown!r} in STOMP {version} header {text!r}",
            ) from None

    return _ESCAPE_SEQUENCE.sub(replace, text)


# --- encoding -------------------------------------------------------------------------


def encode_frame(frame: Frame, version: str) -> bytes:
    """Serialise ``frame`` for a peer speaking ``version``.

    ``content-length`` is recomputed (never trusted from the caller) and written whenever the
    body is non-empty, so bodies with NUL bytes survive. Raises a local ProtocolError when a
    header cannot be represented in ``version`` (e.g. a newline in a 1.0 or CONNECT header).
    """
    command = frame.command
    headers = frame.headers
    body = frame.body
    # Name and value joined by NUL, which no header may hold: after the checks in
    # join_head, every NUL is a separator (see there).
    parts = [command]
    for name, value in headers.items():
        if name != "content-length":
            parts.append(name + "\x00" + value)
    if body:
        parts.append("content-length\x00" + str(len(body)))
    text = None
    if version in SUPPORTED_VERSIONS and command and "" not in headers:
        escape = (version != STOMP_1_0 and command not in NO_ESCAPE_COMMANDS
                  and ":" not in command)
        text = join_head(parts, escape, headers)
    if text is None:
        text = _encode_head_checked(frame, version)
    return b"".join((text.encode("utf-8"), body, b"\x00"))


def join_head(parts: list[str], escape: bool, names: Iterable[str] = ()) -> str | None:
    """A frame's head (command line to blank line) from ``parts``: the command, then one
    ``name + "\\x00" + value`` per header, in a few C-level passes instead of per-header
    work; ``escape``: colons become ``\\c`` (1.1 and 1.2 outside the handshake). None
    when a name or value holds a backslash, CR, LF or NUL, or (not ``escape``) one of
    ``names`` a colon: the caller takes the checked path (``_encode_head_checked``).
    ``parts`` is extended."""
    count = len(parts) - 1
    parts += ("", "")
    text = "\n".join(parts)
    # Nothing but our own separators and colons, which is true of almost every frame
    # (colons are in every MESSAGE's ids: ID:group:42).
    if (
        "\\" in text
        or "\r" in text
        or text.count("\n") != count + 2
        or text.count("\x00") != count
    ):
        return None
    if ":" not in text:
        return text.replace("\x00", ":")
    if escape:
        return text.replace(":", "\\c").replace("\x00", ":")
    if ":" in parts[0] or any(":" in name for name in names):
        return None  # 1.0 and CONNECT cannot escape a name
    return text.replace("\x00", ":")  # 1.0 and CONNECT carry value colons as they are


def _encode_head_checked(frame: Frame, version: str) -> str:
    """Slow path of encode_frame: escape per version, reject what cannot be represented."""
    if version not in SUPPORTED_VERSIONS:
        raise ProtocolError(
            "unsupported version", f"cannot encode for STOMP {version!r}", fault="local"
        )
    command = frame.command
    if not command or _UNSENDABLE_RAW_NAME.search(command):
        raise ProtocolError("invalid command", f"cannot send command {command!r}", fault="local")
    items = [(k, v) for k, v in frame.headers.items() if k != "content-length"]
    if frame.body:
        items.append(("content-length", str(len(frame.body))))
    raw = version == STOMP_1_0 or command in NO_ESCAPE_COMMANDS
    if not raw and items:
        flat = "".join([name + value for name, value in items])
        if (
            "\x00" not in flat
            and "\x01" not in flat
            and (version == STOMP_1_2 or "\r" not in flat)
            and all(name for name, _ in items)
        ):
            # Escape every header in a few C-level passes: join with placeholder separators
            # that cannot occur in the text, escape, then turn the placeholders into ":"/"\n".
            text = "\x00".join([name + "\x01" + value for name, value in items])
            text = text.replace("\\", "\\\\").replace("\n", "\\n").replace(":", "\\c")
            if version == STOMP_1_2:
                text = text.replace("\r", "\\r")
            return f"{command}\n{text.replace(chr(1), ':').replace(chr(0), chr(10))}\n\n"
    table = _ESCAPE_12 if version == STOMP_1_2 else _ESCAPE_11
    lines = [command]
    for name, value in items:
        if raw:
            bad = not name or _UNSENDABLE_RAW_NAME.search(name) or "\n" in value
        else:
            bad = not name
            name = name.translate(table)
            value = value.translate(table)
        # A CR that ends a line is read back as part of a CRLF EOL, so it cannot survive
        # unless 1.2 escaped it above.
        bad = bad or name.endswith("\r") or value.endswith("\r")
        if bad:
            raise ProtocolError(
                "unencodable header",
                f"header {name!r}: {value[:100]!r} cannot be sent in STOMP {version} {command}",
                fault="local",
            )
        lines.append(f"{name}:{value}")
    lines += ("", "")
    return "\n".join(lines)


# --- parsing --------------------------------------------------------------------------

_IDLE = 0  # between frames: skipping EOLs
_HEAD = 1  # inside command + headers
_BODY = 2  # headers parsed, waiting for the body / NUL

#: A frame whose body has this much buffered without being complete is held as the
#: list of reads it arrives in (``FrameParser._pieces``), joined once when it completes,
#: instead of one buffer grown by each read: a bytearray grows by about 1/8 at a time, so
#: a 10 MiB body was reallocated some 37 times (each a copy unless the allocator extends
#: or remaps it) and held up to 1/8 spare capacity; the held-memory tests' brokers peak
#: 7-13 MiB lower this way (bench/README.md, "Partial frames held as their reads").
#: Below it (every frame of the usual traffic) one buffer is cheaper than a list.
#: 128 KiB: two of a slow sender's 64 KiB reads.
PIECES_AFTER = 128 * 1024
#: Reads shorter than this are gathered before they join the pieces, so that a client
#: trickling a big frame a few bytes at a time does not make the broker hold one bytes
#: object (33 bytes of header, 8 of list slot) per few bytes; 64 KiB: 0.06 % of it.
PIECE_MIN = 64 * 1024


class FrameParser:
    """Incremental STOMP frame parser.

    ``feed`` may be called with any slicing of the stream; parsed frames and heart-beats come
    back in order. Limits are enforced as bytes arrive, so a hostile peer can never make us
    buffer more than ``max_frame_size`` (plus one chunk) for a frame. A body past
    ``PIECES_AFTER`` is kept as the reads it arrives in and joined once (no re-copying
    as it grows); the answers are the same however the stream is cut.

    ``version`` selects header unescaping; the owner sets it after negotiation. ``hold_after``
    names commands after which parsing pauses (data is kept) until :meth:`resume`: the
    handshake frame must be acted on before the frames pipelined behind it are unescaped
    with the negotiated version.
    """

    def __init__(self, limits: Limits | None = None, version: str = STOMP_1_0) -> None:
        self.limits = limits if limits is not None else Limits()
        self.version = version
        self.hold_after: frozenset[str] = frozenset()
        self._held = False
        self._buf = bytearray()
        self._state = _IDLE
        # Offsets below are relative to the start of _buf, which is where the current
        # frame starts (the buffer is compacted at the end of every feed).
        self._head_scan = 0  # where to resume looking for the blank line
        self._line_start = 0  # start of the first header line not yet limit-checked
        self._line_count = 0  # complete lines (command included) checked so far
        self._body_start = 0
        self._body_scan = 0
        self._content_length: int | None = None
        self._command = ""
        self._headers: dict[str, str] = {}
        # A big body in progress (PIECES_AFTER), outside _buf: the head's length, the
        # reads so far (PIECE_MIN or more each) and the short ones not yet among them.
        self._pieces = False
        self._head_len = 0
        self._parts: list[bytes] = []
        self._parts_len = 0  # body bytes in _parts and _tail
        self._tail = bytearray()

    @property
    def held(self) -> bool:
        """True while parsing is paused after a ``hold_after`` command."""
        return self._held

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as frames."""
        if self._pieces:
            return self._head_len + self._parts_len
        return len(self._buf)

    def resume(self) -> None:
        """Lift a hold; buffered data is parsed on the next ``feed`` (``feed(b"")`` works)."""
        self._held = False

    def feed(self, data: bytes | bytearray | memoryview) -> list[ParsedItem]:
        """Consume ``data`` and return every frame and heart-beat it completes."""
        if not isinstance(data, bytes | bytearray):
            data = bytes(data)
        if self._pieces:
            return self._feed_pieces(data)
        buf: bytes | bytearray
        if self._buf:
            self._buf += data
            buf = self._buf
        else:
            # Fast path: parse straight out of the caller's bytes, no copy into our buffer.
            buf = data
        if self._held:
            self._check_held_size(len(buf))
            if buf is data:
                self._buf += data
            return []
        out: list[ParsedItem] = []
        try:
            pos = self._parse(buf, out)
        except ProtocolError:
            # The stream is out of sync after a violation: drop everything.
            self._reset()
            raise
        if buf is data:
            if pos < len(data):
                self._buf += memoryview(data)[pos:]
        elif pos >= len(buf):
            self._buf = bytearray()  # also drops the capacity a big frame left behind
        elif pos:
            del self._buf[:pos]  # O(1)-ish in CPython: bytearray moves its start pointer
        if self._state == _BODY and len(self._buf) - self._body_start >= PIECES_AFTER:
            self._to_pieces()
        return out

    def _reset(self) -> None:
        self._buf = bytearray()
        self._state = _IDLE
        self._held = False
        self._headers = {}
        self._end_pieces()

    def _to_pieces(self) -> None:
        """Hold the body in progress as pieces from now on (its head is parsed)."""
        body_start = self._body_start
        with memoryview(self._buf) as view:
            first = view[body_start:].tobytes()
        self._buf = bytearray()
        self._pieces = True
        self._head_len = body_start
        self._parts = [first]
        self._parts_len = len(first)

    def _end_pieces(self) -> None:
        self._pieces = False
        self._head_len = self._parts_len = 0
        self._parts = []
        self._tail = bytearray()

    def _feed_pieces(self, data: bytes | bytearray) -> list[ParsedItem]:
        """``feed`` while a big body is held in pieces: the same checks and errors as
        ``_parse``'s body state, on this read alone (the pieces held hold no NUL)."""
        if type(data) is not bytes:
            data = bytes(data)  # kept by reference below: it must not change
        try:
            at = self._body_end(data)
        except ProtocolError:
            self._reset()
            raise
        if at < 0:
            self._keep(data)
            return []
        if at:
            self._keep(data[:at])
        if self._tail:
            self._parts.append(bytes(self._tail))
        frame = Frame(self._command, self._headers, b"".join(self._parts))
        self._headers = {}
        self._end_pieces()
        self._state = _IDLE
        rest = data[at + 1:]
        if frame.command in self.hold_after:
            self._held = True
            self._buf += rest
            return [frame]
        if not rest:
            return [frame]
        return [frame, *self.feed(rest)]

    def _body_end(self, data: bytes) -> int:
        """Where in ``data`` the held body's NUL is, or -1 if not in it; raises what
        ``_parse`` raises for the same frame."""
        held = self._parts_len
        length = self._content_length
        if length is not None:  # its size was checked against the limit with the head
            at = length - held
            if at >= len(data):
                return -1
            if data[at] != 0:
                raise self._unterminated(length)
            return at
        max_frame = self.limits.max_frame_size
        at = data.find(b"\x00")
        if at < 0:
            if self._head_len + held + len(data) > max_frame:
                raise self._limit_error(
                    "frame too large", f"frame exceeds {max_frame} bytes before its NUL")
            return -1
        if self._head_len + held + at > max_frame:
            raise self._limit_error("frame too large", f"frame exceeds {max_frame} bytes")
        return at

    def _keep(self, data: bytes) -> None:
        """Add ``data`` to the held body: as a piece of its own, or gathered when short."""
        self._parts_len += len(data)
        if len(data) >= PIECE_MIN:
            if self._tail:
                self._parts.append(bytes(self._tail))
                self._tail = bytearray()
            self._parts.append(data)
            return
        self._tail += data
        if len(self._tail) >= PIECE_MIN:
            self._parts.append(bytes(self._tail))
            self._tail = bytearray()

    def _check_held_size(self, size: int) -> None:
        if size > self.limits.max_frame_size:
            raise ProtocolError(
                "too much data before handshake completed",
                f"{size} bytes pipelined behind the handshake frame, limit "
                f"{self.limits.max_frame_size}",
            )

    def _parse(self, buf: bytes | bytearray, out: list[ParsedItem]) -> int:
        """Parse from offset 0 of ``buf``; return how many bytes were consumed."""
        end = len(buf)
        pos = 0  # start of the current frame
        limits = self.limits
        max_frame = limits.max_frame_size
        state = self._state
        while True:
            if state == _IDLE:
                if pos >= end:
                    break
                first = buf[pos]
                if first == 10 or first == 13:
                    match = _EOLS.match(buf, pos)
                    if match is None:
                        # A lone CR: either the start of CRLF still in flight or garbage.
                        if pos + 1 >= end:
                            break
                        raise ProtocolError("malformed frame", "stray CR between frames")
                    out.append(HEARTBEAT)
                    pos = match.end()
                    continue
                state = _HEAD
                self._head_scan = pos
                self._line_start = pos
                self._line_count = 0
            if state == _HEAD:
                scan = self._head_scan
                # Search unbounded only for the terminator matching the command line's EOL
                # style, and the other one only up to there: in a chunk holding many frames
                # an unbounded miss would rescan the rest of the chunk for every frame.
                command_nl = buf.find(b"\n", pos, end)
                if command_nl > pos and buf[command_nl - 1] == 13:
                    crlf = buf.find(b"\n\r\n", scan)
                    blank = buf.find(b"\n\n", scan, crlf + 1 if crlf >= 0 else end)
                else:
                    blank = buf.find(b"\n\n", scan)
                    crlf = buf.find(b"\n\r\n", scan, blank + 1 if blank >= 0 else end)
                if crlf >= 0 and (blank < 0 or crlf < blank):
                    head_end, body_start = crlf, crlf + 3
                elif blank >= 0:
                    head_end, body_start = blank, blank + 2
                else:
                    self._check_partial_head(buf, pos, end)
                    self._head_scan = max(pos, end - 2)
                    break
                self._parse_head(buf, pos, head_end)
                self._body_start = body_start
                self._body_scan = body_start
                state = _BODY
            # state == _BODY
            body_start = self._body_start
            length = self._content_length
            if length is not None:
                if body_start - pos + length > max_frame:
                    raise self._limit_error(
                        "frame too large",
                        f"content-length {length} makes the frame larger than {max_frame} bytes",
                    )
                nul = body_start + length
                if nul >= end:
                    break
                if buf[nul] != 0:
                    raise self._unterminated(length)
            else:
                nul = buf.find(b"\x00", self._body_scan)
                if nul < 0:
                    if end - pos > max_frame:
                        raise self._limit_error(
                            "frame too large", f"frame exceeds {max_frame} bytes before its NUL"
                        )
                    self._body_scan = end
                    break
                if nul - pos > max_frame:
                    raise self._limit_error("frame too large", f"frame exceeds {max_frame} bytes")
            if type(buf) is bytes:
                body = buf[body_start:nul]
            elif nul > body_start:
                with memoryview(buf) as view:
                    body = view[body_start:nul].tobytes()
            else:
                body = b""
            frame = Frame(self._command, self._headers, body)
            self._headers = {}
            out.append(frame)
            pos = nul + 1
            state = _IDLE
            if frame.command in self.hold_after:
                self._held = True
                break
        self._state = state
        # Rebase offsets kept across feeds: the caller drops buf[:pos].
        if state == _HEAD:
            self._head_scan -= pos
            self._line_start -= pos
        elif state == _BODY:
            self._body_start -= pos
            self._body_scan -= pos
        return pos

    def _limit_error(self, message: str, detail: str) -> ProtocolError:
        return ProtocolError(message, detail, receipt_id=self._headers.get("receipt"))

    def _unterminated(self, length: int) -> ProtocolError:
        return ProtocolError(
            "malformed frame",
            f"{self._command} frame not terminated by NUL after content-length {length} "
            f"bytes",
            receipt_id=self._headers.get("receipt"),
        )

    def _check_partial_head(self, buf: bytes | bytearray, start: int, end: int) -> None:
        """Enforce limits on headers still in flight, resuming where the last call stopped."""
        limits = self.limits
        if end - start > limits.max_frame_size:
            raise ProtocolError(
                "frame too large", f"headers exceed {limits.max_frame_size} bytes"
            )
        max_len = limits.max_header_length
        line_start = self._line_start
        count = self._line_count
        while True:
            nl = buf.find(b"\n", line_start, end)
            if nl < 0:
                break
            self._check_line_length(buf, line_start, nl, max_len)
            count += 1
            if count - 1 > limits.max_header_count:
                raise too_many_headers(limits.max_header_count)
            line_start = nl + 1
        # The incomplete tail may still get its CR; allow that one byte.
        if end - line_start > max_len + 1:
            raise header_too_long(max_len, end - line_start)
        self._line_start = line_start
        self._line_count = count

    @staticmethod
    def _check_line_length(buf: bytes | bytearray, start: int, nl: int, max_len: int) -> None:
        length = nl - start
        if length > 0 and buf[nl - 1] == 13:
            length -= 1
        if length > max_len:
            raise header_too_long(max_len, length)

    def _receipt_of_bad_head(self, raw: bytes) -> str | None:
        """Best effort, for the ERROR of a head we refuse: its ``receipt``, when that
        header itself is clean (the client can then match the ERROR to its frame)."""
        value = receipt_line(raw)
        if value is None or b"\x00" in value:
            return None
        try:
            text = value.decode("utf-8")
            if self.version != STOMP_1_0 and "\\" in text:
                text = _unescape(text, self.version)
        except (UnicodeDecodeError, ProtocolError):
            return None
        return text

    def _parse_head(self, buf: bytes | bytearray, start: int, head_end: int) -> None:
        """Parse command and headers from ``buf[start:head_end]`` (no trailing EOL)."""
        limits = self.limits
        raw = buf[start:head_end]
        if len(raw) > limits.max_header_length:
            # Slow path only for big header blocks: check each line in bytes.
            line_start = start
            while line_start <= head_end:
                nl = buf.find(b"\n", line_start, head_end)
                if nl < 0:
                    nl = head_end
                self._check_line_length(buf, line_start, nl, limits.max_header_length)
                line_start = nl + 1
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ProtocolError("malformed frame", f"headers are not UTF-8: {exc}") from None
        if "\x00" in text:  # (a str scan: several times cheaper than one on bytes)
            # stomp.py (and most clients) end a frame at the first NUL: relaying one in a
            # header would let this client forge frames for the consumers it reaches.
            raise ProtocolError("malformed frame", "NUL byte in a header name or value",
                                receipt_id=self._receipt_of_bad_head(bytes(raw)))
        lines = text.split("\n")
        has_cr = "\r" in text
        if has_cr:
            lines = [line[:-1] if line.endswith("\r") else line for line in lines]
        if len(lines) - 1 > limits.max_header_count:
            raise too_many_headers(limits.max_header_count)
        command = lines[0]
        if not command:
            raise ProtocolError("malformed frame", "empty command line")
        headers: dict[str, str] = {}
        unescape = (
            "\\" in text and self.version != STOMP_1_0 and command not in NO_ESCAPE_COMMANDS
        )
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep or not name:
                raise ProtocolError(
                    "malformed header",
                    f"header line {line[:100]!r} in {command[:40]} frame is not 'name:value'",
                )
            if unescape and "\\" in line:
                name = _unescape(name, self.version)
                value = _unescape(value, self.version)
            if name not in headers:  # spec: the first of repeated headers wins
                headers[name] = value
        if self.version == STOMP_1_0 and trims_values(command, headers):
            headers = {name: value.strip(TRIMMED_1_0) for name, value in headers.items()}
        if has_cr and self.version != STOMP_1_2:
            refuse_trailing_cr(command, headers, self.version)
        self._command = command
        self._headers = headers
        length_text = headers.get("content-length")
        if length_text is None:
            self._content_length = None
            return
        length = parse_uint(length_text, MAX_CONTENT_LENGTH)
        if length is None:
            raise ProtocolError(
                "invalid content-length",
                f"content-length {length_text[:40]!r} is not a non-negative integer of at "
                f"most {len(str(MAX_CONTENT_LENGTH))} ASCII digits",
                receipt_id=headers.get("receipt"),
            )
        self._content_length = length

