"""Which socket ``HttpConnections`` closes to make room, and when it refuses a new one
(pure bookkeeping: sockets are stand-ins whose abort is recorded)."""

from __future__ import annotations

import asyncio

from amqlite.management.connections import HttpConnection, HttpConnections, Phase


class Handler(asyncio.Protocol):
    """Stands for aiohttp's protocol of one socket (the key ``request.protocol`` gives)."""


def make(closed: list[str], name: str, phase: Phase = Phase.IDLE) -> HttpConnection:
    return HttpConnection(lambda: closed.append(name), phase)


def test_past_the_cap_the_longest_waiting_is_closed_and_a_busy_one_is_kept() -> None:
    closed: list[str] = []
    limits = HttpConnections(max_connections=3)
    conns = {n: make(closed, n) for n in "abc"}
    handlers = {n: Handler() for n in "abc"}
    for n in "abc":
        assert limits.accepted(conns[n])
        limits.started(conns[n], handlers[n])
    limits.begin(handlers["a"])  # a is handling a request: not closed
    limits.begin(handlers["b"])
    limits.end(handlers["b"])    # b answered: it now waits, newer than c
    assert limits.accepted(make(closed, "d"))
    assert closed == ["c"]
    assert limits.accepted(make(closed, "e"))
    assert closed == ["c", "b"]
    assert conns["a"] in limits.open and conns["a"].phase is Phase.BUSY


def test_when_every_socket_is_busy_the_new_one_is_refused() -> None:
    closed: list[str] = []
    limits = HttpConnections(max_connections=2)
    for n in "ab":
        conn, handler = make(closed, n), Handler()
        assert limits.accepted(conn)
        limits.started(conn, handler)
        limits.begin(handler)
    assert not limits.accepted(make(closed, "c"))
    assert closed == []
    assert len(limits.open) == 2


def test_handshakes_past_their_cap_close_the_oldest_handshake() -> None:
    closed: list[str] = []
    limits = HttpConnections(max_connections=10, max_handshakes=2)
    done = make(closed, "done", Phase.HANDSHAKE)
    assert limits.accepted(done)
    limits.started(done, Handler())  # its handshake completed: idle, not a handshake
    for n in "xyz":
        assert limits.accepted(make(closed, n, Phase.HANDSHAKE))
    assert closed == ["x"]
    assert len(limits.handshaking) == 2 and done not in limits.handshaking


def test_a_late_head_is_closed_and_a_whole_one_is_not() -> None:
    async def run() -> list[str]:
        closed: list[str] = []
        limits = HttpConnections(header_timeout=0.05)
        slow, quick = make(closed, "slow"), make(closed, "quick")
        quick_handler = Handler()
        for conn, handler in ((slow, Handler()), (quick, quick_handler)):
            limits.accepted(conn)
            limits.started(conn, handler)
            limits.received(conn)
        limits.begin(quick_handler)  # its head was complete: its handler runs
        assert slow.phase is Phase.HEAD
        while slow in limits.open:
            await asyncio.sleep(0.01)
        return closed

    assert asyncio.run(run()) == ["slow"]
