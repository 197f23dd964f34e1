"""The codec on fixed cases, as one JSON line: run by path under either build of amqlite
(PYTHONPATH chooses it) so tests/integration/test_compiled_build.py can compare them.

Prints {"compiled": bool, "cases": [...]}: per case what ``FrameParser.feed`` returned
(fed whole and one byte at a time) or the ProtocolError it raised, and the bytes of
``encode_frame``. Imports nothing of tests/ (it runs outside the repository's path).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from amqlite.codec import HEARTBEAT, Frame, FrameParser, Limits, ProtocolError, encode_frame
from amqlite.native import is_compiled

SMALL = Limits(max_frame_size=256, max_header_count=4, max_header_length=40)

#: (stream, version, limits): streams the parser must take apart, or refuse.
PARSE_CASES: list[tuple[bytes, str, Limits | None]] = [
    (b"CONNECT\naccept-version:1.2\nhost:/\n\n\x00", "1.0", None),
    (b"SEND\ndestination:/queue/a\ncontent-length:5\n\na\x00b\x00c\x00\n\n", "1.2", None),
    (b"MESSAGE\nk\\cey:v\\na\\\\l\\r\nk\\cey:second\n\nbody\x00", "1.2", None),
    (b"MESSAGE\nk\\cey:v\\na\n\nbody\x00", "1.0", None),
    (b"\n\r\n\nACK\nid:1\n\n\x00\r\n", "1.2", None),
    (b"SEND\r\ndestination:/q\r\n\r\nx\x00", "1.2", None),
    (b"SEND\ndestination:/q\nbad:\\t\n\n\x00", "1.2", None),
    (b"SEND\ncontent-length:x\n\n\x00", "1.2", None),
    (b"SEND\ncontent-length:3\n\nabcd\x00", "1.2", None),
    (b"SEND\na:1\nb:2\nc:3\nd:4\ne:5\n\n\x00", "1.2", SMALL),
    (b"SEND\nh:" + b"v" * 64 + b"\n\n\x00", "1.2", SMALL),
    (b"SEND\n\n" + b"x" * 300 + b"\x00", "1.2", SMALL),
    (b"SEND\ndestination:/q\n\n\xff\xfe\x00SUBSCRIBE\nid:0\ndestination:/t\n\n\x00", "1.1", None),
]

#: Big frames (past amqlite.codec.PIECES_AFTER, whose body is held as the reads it
#: arrives in), fed in 64 KiB and in 1,000-byte reads: with and without content-length,
#: a frame behind them in the same read, and each refusal of the body state.
_BIG = 600 * 1024
_BIG_LIMITS = Limits(max_frame_size=_BIG)
BIG_CASES: list[tuple[bytes, str, Limits | None]] = [
    (b"SEND\ndestination:/q\n\n" + b"a" * _BIG + b"\x00ACK\nid:1\n\n\x00\n", "1.2", None),
    (b"SEND\ncontent-length:%d\n\n" % _BIG + b"\x00b" * (_BIG // 2) + b"\x00\n", "1.2", None),
    (b"SEND\ndestination:/q\nreceipt:r\n\n" + b"c" * _BIG, "1.2", _BIG_LIMITS),
    (b"SEND\nreceipt:r\n\n" + b"d" * (_BIG - 16) + b"\x00", "1.2", _BIG_LIMITS),
    (b"SEND\ncontent-length:%d\n\n" % (_BIG // 2) + b"e" * (_BIG // 2) + b"!", "1.2", None),
]

#: (frame, version): frames the encoder writes (escapes per version, content-length).
ENCODE_CASES: list[tuple[Frame, str]] = [
    (Frame("MESSAGE", {"destination": "/queue/a", "k:ey": "v\na\\l"}, b"body"), "1.2"),
    (Frame("MESSAGE", {"destination": "/queue/a", "k:ey": "v\na\\l"}, b"body"), "1.1"),
    (Frame("MESSAGE", {"destination": "/queue/a"}, b"bin\x00ary"), "1.0"),
    (Frame("RECEIPT", {"receipt-id": "77"}), "1.2"),
    (Frame("ERROR", {"message": "bad\rthing"}, b"detail"), "1.2"),
]


def item(x: Any) -> Any:
    if x is HEARTBEAT:
        return "heartbeat"
    assert isinstance(x, Frame)
    body = x.body.hex() if len(x.body) <= 1024 else hashlib.sha256(x.body).hexdigest()
    return [x.command, list(x.headers.items()), body]


def parse(stream: bytes, version: str, limits: Limits | None, chunk: int) -> Any:
    parser = FrameParser(limits, version=version)
    out: list[Any] = []
    try:
        for i in range(0, len(stream), chunk):
            out += [item(x) for x in parser.feed(stream[i:i + chunk])]
    except ProtocolError as e:
        out.append(["error", e.message, e.detail, e.fault, e.receipt_id])
    return out


def encode(frame: Frame, version: str) -> Any:
    try:
        return encode_frame(frame, version).hex()
    except ProtocolError as e:
        return ["error", e.message, e.detail, e.fault]


def main() -> None:
    cases = [[parse(s, v, lim, len(s)), parse(s, v, lim, 1)] for s, v, lim in PARSE_CASES]
    cases += [[parse(s, v, lim, 64 * 1024), parse(s, v, lim, 1000)] for s, v, lim in BIG_CASES]
    cases += [encode(f, v) for f, v in ENCODE_CASES]
    print(json.dumps({"compiled": is_compiled("amqlite.codec"), "cases": cases}))


if __name__ == "__main__":
    main()
