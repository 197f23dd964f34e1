"""A big frame arriving in many reads (``amqlite.codec.PIECES_AFTER``): its body is held as
the reads themselves and joined once, and the parser's answers are those of the frame fed
whole — the same frames, the same ``buffered`` after each read, the same errors — however
the stream is cut (issue 23: a 10 MiB partial frame used to be re-copied as it grew)."""

from __future__ import annotations

import itertools
import random

import pytest

from amqlite.codec import (
    HEARTBEAT,
    PIECE_MIN,
    PIECES_AFTER,
    Frame,
    FrameParser,
    Limits,
    ParsedItem,
    ProtocolError,
)

BODY = 3 * PIECES_AFTER + 12_345
SMALL = b"ACK\nid:7\n\n\x00"


def big(body: bytes, *, content_length: bool, command: str = "SEND") -> bytes:
    head = f"{command}\ndestination:/queue/big\nreceipt:r1\n"
    if content_length:
        head += f"content-length:{len(body)}\n"
    return (head + "\n").encode() + body + b"\x00"


def body_of(size: int, with_nuls: bool) -> bytes:
    rng = random.Random(size)
    data = bytearray(rng.randbytes(size))
    if not with_nuls:
        data = data.replace(b"\x00", b"z")
    return bytes(data)


def cuts(total: int, how: str, rng: random.Random) -> list[int]:
    """Read boundaries over a stream of ``total`` bytes."""
    if how == "64k":
        return [*range(0, total, 64 * 1024), total]
    if how == "trickle":  # a few bytes to a few KiB at a time
        points, at = [0], 0
        while at < total:
            at = min(total, at + rng.choice((1, 7, 300, 4096, 9000)))
            points.append(at)
        return points
    if how == "random":
        return [0, *sorted(rng.sample(range(1, total), 40)), total]
    raise AssertionError(how)


def fed(stream: bytes, points: list[int], limits: Limits | None = None,
        sizes: list[int] | None = None) -> tuple[list[ParsedItem], FrameParser]:
    parser = FrameParser(limits)
    out: list[ParsedItem] = []
    for a, b in itertools.pairwise(points):
        out += parser.feed(stream[a:b])
        if sizes is not None:
            sizes.append(parser.buffered)
    return out, parser


@pytest.mark.parametrize("how", ["64k", "trickle", "random"])
@pytest.mark.parametrize("content_length", [False, True], ids=["nul", "content-length"])
def test_big_frame_in_pieces_parses_as_fed_whole(how: str, content_length: bool) -> None:
    body = body_of(BODY, with_nuls=content_length)
    frame = big(body, content_length=content_length)
    stream = b"\n" + frame + SMALL + b"\r\n" + frame
    rng = random.Random(how)
    for _ in range(3):
        points = cuts(len(stream), how, rng)
        sizes: list[int] = []
        out, parser = fed(stream, points, sizes=sizes)
        assert out == FrameParser().feed(stream)
        assert [x.body == body for x in out if isinstance(x, Frame) and x.command == "SEND"
                ] == [True, True]
        assert parser.buffered == 0
        # buffered is what was read of the frame in progress, as before
        first = 1 + len(frame)
        for b, size in zip(points[1:], sizes, strict=True):
            if 1 <= b < first:
                assert size == b - 1, (b, size)


def test_the_pieces_are_the_reads_gathered_to_piece_min() -> None:
    """A client trickling a big frame does not make the parser hold an object per read."""
    body = body_of(8 * PIECE_MIN, with_nuls=False)
    stream = big(body, content_length=False)
    parser = FrameParser()
    for at in range(0, len(stream) - 1, 100):
        parser.feed(stream[at:min(at + 100, len(stream) - 1)])
    assert parser.buffered == len(stream) - 1
    assert len(parser._parts) <= len(body) // PIECE_MIN + 1
    [frame] = parser.feed(stream[-1:])
    assert isinstance(frame, Frame) and frame.body == body


def test_a_big_read_is_kept_as_it_is() -> None:
    body = body_of(4 * PIECES_AFTER, with_nuls=False)
    stream = big(body, content_length=False)
    parser = FrameParser()
    parser.feed(stream[:PIECES_AFTER + 100])
    read = stream[PIECES_AFTER + 100:len(stream) - 1]
    parser.feed(read)
    assert parser._parts[-1] is read
    [frame] = parser.feed(b"\x00")
    assert isinstance(frame, Frame) and frame.body == body


def error_of(stream: bytes, points: list[int], limits: Limits) -> tuple[str, str, str | None]:
    with pytest.raises(ProtocolError) as e:
        fed(stream, points, limits)
    return e.value.message, e.value.detail, e.value.receipt_id


LIMIT = Limits(max_frame_size=4 * PIECES_AFTER)


@pytest.mark.parametrize("case", ["too-big-before-nul", "too-big-at-nul", "no-nul-after-length"])
def test_errors_in_pieces_are_those_of_the_frame_fed_whole(case: str) -> None:
    if case == "too-big-before-nul":
        stream = big(body_of(5 * PIECES_AFTER, False), content_length=False)[:-1]
    elif case == "too-big-at-nul":
        stream = big(body_of(4 * PIECES_AFTER, False), content_length=False)
    else:
        stream = big(body_of(3 * PIECES_AFTER, True), content_length=True)[:-1] + b"x"
    whole = error_of(stream, [0, len(stream)], LIMIT)
    for how in ("64k", "trickle"):
        points = cuts(len(stream), how, random.Random(case))
        assert error_of(stream, points, LIMIT) == whole
    parser = FrameParser(LIMIT)
    with pytest.raises(ProtocolError):
        for at in range(0, len(stream), 64 * 1024):
            parser.feed(stream[at:at + 64 * 1024])
    assert parser.buffered == 0  # reset: the next frame parses
    assert parser.feed(SMALL) == [Frame("ACK", {"id": "7"})]


def test_the_size_limit_counts_the_head_in_pieces() -> None:
    """A body that fits only without its head: refused however it is cut."""
    head_len = len(big(b"", content_length=False)) - 1
    body = body_of(LIMIT.max_frame_size - head_len + 1, False)
    stream = big(body, content_length=False)
    whole = error_of(stream, [0, len(stream)], LIMIT)
    assert error_of(stream, cuts(len(stream), "64k", random.Random()), LIMIT) == whole
    exact = big(body[:-1], content_length=False)
    out, _ = fed(exact, cuts(len(exact), "64k", random.Random()), LIMIT)
    assert [x.body for x in out if isinstance(x, Frame)] == [body[:-1]]


def test_hold_after_a_big_frame_keeps_what_follows() -> None:
    body = body_of(2 * PIECES_AFTER, False)
    stream = big(body, content_length=False, command="CONNECT") + SMALL + b"\n"
    parser = FrameParser()
    parser.hold_after = frozenset({"CONNECT"})
    out: list[ParsedItem] = []
    for at in range(0, len(stream), 64 * 1024):
        out += parser.feed(stream[at:at + 64 * 1024])
    [connect] = out
    assert isinstance(connect, Frame) and connect.body == body and parser.held
    assert parser.buffered == len(SMALL) + 1
    parser.resume()
    assert parser.feed(b"") == [Frame("ACK", {"id": "7"}), HEARTBEAT]


def test_memoryview_and_bytearray_reads_are_copied_not_kept() -> None:
    body = body_of(2 * PIECES_AFTER, False)
    stream = big(body, content_length=False)
    parser = FrameParser()
    reads = [bytearray(stream[at:at + 64 * 1024]) for at in range(0, len(stream), 64 * 1024)]
    out: list[ParsedItem] = []
    for n, read in enumerate(reads):
        out += parser.feed(memoryview(read) if n % 2 else read)
        read[:] = b"!" * len(read)  # the caller reuses its buffer
    [frame] = out
    assert isinstance(frame, Frame) and frame.body == body
