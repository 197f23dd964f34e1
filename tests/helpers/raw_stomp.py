"""A bare TCP socket speaking STOMP by hand, for input no well-behaved client produces,
and the assertion that the broker answers such input with one ERROR and a close."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from tests.helpers.broker_process import HOST, WAIT


def recv_before(sock: socket.socket, deadline: float) -> tuple[bytes | None, bool]:
    """The next bytes the socket has before ``deadline``: ``(None, False)`` when none came
    in time, ``(b"", reset)`` when the stream ended, by the peer's FIN or by a reset."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        return None, False
    sock.settimeout(remaining)
    try:
        return sock.recv(65536), False
    except TimeoutError:
        return None, False
    except OSError as exc:
        return b"", isinstance(exc, ConnectionResetError)


@dataclass
class RawFrame:
    command: str
    headers: dict[str, str]
    body: bytes


class RawStomp:
    """A bare TCP socket speaking STOMP by hand, for input no well-behaved client produces."""

    def __init__(self, port: int, timeout: float = WAIT) -> None:
        self.sock = socket.create_connection((HOST, port), timeout=timeout)
        self.buf = b""
        self.closed = False
        #: The broker ended the stream with a reset, not its FIN (set with ``closed``).
        self.reset = False

    def __enter__(self) -> RawStomp:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    def send_raw(self, data: bytes) -> bool:
        """Write bytes; False if the broker already closed the connection."""
        try:
            self.sock.sendall(data)
            return True
        except OSError:
            return False

    def send_frame(self, command: str, headers: Mapping[str, str] | None = None,
                   body: bytes = b"") -> bool:
        head = command + "\n" + "".join(f"{k}:{v}\n" for k, v in (headers or {}).items())
        return self.send_raw(head.encode() + b"\n" + body + b"\x00")

    def connect(self, heart_beat: str = "0,0", extra: Mapping[str, str] | None = None,
                ) -> RawFrame:
        """CONNECT and return the CONNECTED frame (fails the test on anything else)."""
        self.send_frame("CONNECT", {"accept-version": "1.2", "host": "localhost",
                                    "heart-beat": heart_beat, **(extra or {})})
        return self.expect("CONNECTED", "CONNECT")

    def expect(self, command: str, what: str = "", timeout: float = WAIT) -> RawFrame:
        """The next frame, which must be a ``command`` (the answer to ``what``); fails the
        test on any other frame, a close or silence."""
        frame = self.read_frame(timeout)
        assert frame is not None and frame.command == command, (
            f"{what or 'expected ' + command}: answered {frame} (closed={self.closed})")
        return frame

    def _fill(self, deadline: float) -> bool:
        """Read more bytes before the deadline; False on EOF/reset (sets closed) or timeout."""
        data, reset = recv_before(self.sock, deadline)
        if data is None:
            return False
        if not data:
            self.closed, self.reset = True, reset
            return False
        self.buf += data
        return True

    def read_frame(self, timeout: float = WAIT) -> RawFrame | None:
        """The next frame (heart-beat EOLs skipped); None if closed or nothing came in time."""
        deadline = time.monotonic() + timeout
        while True:
            self.buf = self.buf.lstrip(b"\r\n")
            frame = self._parse()
            if frame is not None:
                return frame
            if self.closed or not self._fill(deadline):
                return None

    def _parse(self) -> RawFrame | None:
        end = self.buf.find(b"\n\n")
        alt = self.buf.find(b"\r\n\r\n")
        if end < 0 and alt < 0:
            return None
        if end < 0 or (0 <= alt < end):
            head, body_start = self.buf[:alt].decode(errors="replace"), alt + 4
        else:
            head, body_start = self.buf[:end].decode(errors="replace"), end + 2
        lines = head.replace("\r\n", "\n").split("\n")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            key, _, value = line.partition(":")
            headers.setdefault(key, value)
        if "content-length" in headers:
            stop = body_start + int(headers["content-length"])
            if len(self.buf) < stop + 1:
                return None
        else:
            stop = self.buf.find(b"\x00", body_start)
            if stop < 0:
                return None
        frame = RawFrame(lines[0], headers, self.buf[body_start:stop])
        self.buf = self.buf[stop + 1:]
        return frame

    def wait_closed(self, timeout: float) -> tuple[bool, list[RawFrame]]:
        """Read until the broker closes the socket; return (closed, frames read meanwhile)."""
        deadline = time.monotonic() + timeout
        frames: list[RawFrame] = []
        while not self.closed:
            frame = self.read_frame(max(0.0, deadline - time.monotonic()))
            if frame is not None:
                frames.append(frame)
            elif not self.closed:
                return False, frames
        return True, frames


def format_frames(frames: Iterable[RawFrame]) -> str:
    return "; ".join(f"{f.command} {f.headers} {f.body[:200]!r}" for f in frames)


#: How long the broker may take to answer bad input with ERROR and close.
CLOSE_DEADLINE = 5.0


def assert_error_then_closed(raw: RawStomp, what: str, message: str | None,
                             timeout: float = CLOSE_DEADLINE, *,
                             receipt: str | None = None) -> RawFrame:
    """The broker answers with one ERROR (and nothing else) and closes the socket; returns
    the ERROR.

    With ``message``, its ``message`` header is that text, so a test of one limit cannot
    pass on another limit's ERROR. ``None`` only where the cause varies by case (a
    parametrized set of malformed frames) and any ERROR is the point. With ``receipt``,
    the ERROR names it in ``receipt-id`` (the frame that was refused asked for it)."""
    closed, frames = raw.wait_closed(timeout)
    assert frames, f"{what}: no ERROR frame before close (closed={closed})"
    assert [f.command for f in frames] == ["ERROR"], f"{what}: got {format_frames(frames)}"
    if message is not None:
        assert frames[0].headers.get("message") == message, f"{what}: {format_frames(frames)}"
    assert closed, f"{what}: connection still open {timeout}s after the ERROR"
    if receipt is not None:
        assert frames[0].headers.get("receipt-id") == receipt, \
            f"{what}: ERROR without receipt-id {receipt}: {format_frames(frames)}"
    return frames[0]
