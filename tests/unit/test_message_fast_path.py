"""A MESSAGE joined without a Frame (``Subscription._write_fast``) is byte for byte
the one ``encode_frame`` makes of the same delivery, or the general path is taken."""

from __future__ import annotations

import collections
import random
from types import SimpleNamespace
from typing import Any

import pytest

from amqlite.broker.message import Message
from amqlite.broker.session import Session
from amqlite.broker.subscription import Subscription
from amqlite.codec import Frame
from amqlite.protocol import State, StompProtocol
from amqlite.validation import header_floor
from amqlite.wire import AMQ_GROUP_FIRST, DELIVERY_COUNT_HEADER

#: Characters that take each branch: escapes, CR/LF, NUL, non-ASCII.
ALPHABET = ["a", "b", ":", "\\", "\n", "\r", "\x00", "é", "-", " "]
NAMES = ["persistent", "x", "", "subscription", "ack", "message-id", "redelivered",
         DELIVERY_COUNT_HEADER, AMQ_GROUP_FIRST, "content-length", "destination"]


class Conn:
    """The connection seam: records what each path wrote, encoded by a real protocol."""

    def __init__(self, version: str) -> None:
        self.proto = StompProtocol("server")
        self.proto.version = version
        self.proto._state = State.CONNECTED
        self.version = version
        self.closed = False
        self.fast: list[bytes] = []
        self.general: list[bytes] = []

    def write_frame(self, frame: Frame) -> None:
        self.general.append(self.proto.send(frame))

    def write_message(self, head: str, body: bytes) -> None:
        self.fast.append(self.proto.message(head, body))


def subscription(conn: Conn, ack_mode: str, sub_id: str = "sub-1") -> Subscription:
    broker = SimpleNamespace(stats=collections.Counter(), delivered=collections.Counter())
    source: Any = SimpleNamespace(broker=broker)
    return Subscription(Session(conn), sub_id, 3, "/queue/q", ack_mode, 10,  # type: ignore[arg-type]
                        source)


def message(headers: dict[str, str], body: bytes, message_id: str = "ID:g:42",
            destination: str = "/queue/q") -> Message:
    return Message(42, destination, message_id, headers, body, 4, 0, True,
                   floor=header_floor(headers))


def both(sub: Subscription, conn: Conn, m: Message, previous: int,
         group_first: bool) -> tuple[bytes | None, bytes]:
    fast = sub._write_fast(m, previous, group_first)
    sub._write_frame(m, previous, group_first)
    return (conn.fast.pop() if fast else None), conn.general.pop()


def test_a_w1_message_takes_the_fast_path_to_the_same_bytes() -> None:
    conn = Conn("1.2")
    sub = subscription(conn, "client-individual")
    m = message({"persistent": "true", "bench_ts": "1732600000.5",
                 "amqlite.producerId": "bench-3", "amqlite.producerSeq": "17"}, b"x" * 1024)
    fast, general = both(sub, conn, m, 0, False)
    assert fast is not None
    assert fast == general
    assert b"\nack:3\\cID\\cg\\c42\n" in fast and b"\ncontent-length:1024\n\n" in fast


@pytest.mark.parametrize("version", ["1.0", "1.1", "1.2"])
def test_random_deliveries_encode_alike_on_both_paths(version: str) -> None:
    rng = random.Random(f"fast-path-{version}")

    def text(n: int) -> str:
        return "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, n)))

    taken = 0
    for _ in range(3000):
        conn = Conn(version)
        sub = subscription(conn, rng.choice(["auto", "client", "client-individual"]),
                           sub_id=rng.choice(["1", text(3) or "s"]))
        headers = {rng.choice([*NAMES, text(4)]): text(5) for _ in range(rng.randint(0, 4))}
        m = message(headers, rng.choice([b"", b"body\x00with nul"]),
                    message_id=rng.choice(["ID:g:1", text(4)]),
                    destination=rng.choice(["/queue/q", "/queue/" + text(3)]))
        previous, group_first = rng.choice([0, 0, 2]), rng.random() < 0.2
        try:
            fast, general = both(sub, conn, m, previous, group_first)
        except Exception as exc:  # the general path refuses it: so must the fast one
            assert not sub._write_fast(m, previous, group_first), exc
            continue
        if fast is not None:
            taken += 1
            assert fast == general, (headers, m.message_id, m.destination)
    if version == "1.0":
        assert taken == 0  # 1.0 does not escape: always the general path
    else:
        assert taken > 150  # the seeded draws hold enough clean deliveries
