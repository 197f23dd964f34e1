"""Past max_unauthenticated, which socket goes (``StompServer._crowded_out``, issue 23
item 2): one waiting for a passcode tried again and again before the oldest, so a login
waiting for its check is not closed for a flood's sockets. Pure logic: the sockets are
stand-ins with the one attribute the choice reads."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from amqlite.server import EVICTION_SCAN, StompServer


class Sock:
    """A socket not logged in: no CONNECT yet (None), or one whose passcode was tried
    ``seen`` times (hashable by identity, as a ClientConnection is)."""

    def __init__(self, seen: int | None) -> None:
        self.check = (None if seen is None
                      else SimpleNamespace(group=SimpleNamespace(seen=seen)))


def sock(seen: int | None) -> Any:
    return Sock(seen)


def crowded_out(socks: list[Any]) -> Any:
    server = StompServer.__new__(StompServer)
    server.unauthenticated = dict.fromkeys(socks)
    return server._crowded_out()


def test_a_socket_waiting_on_a_repeated_guess_goes_before_the_oldest() -> None:
    user, idle, guess = sock(1), sock(None), sock(40)
    assert crowded_out([user, idle, guess, sock(1)]) is guess


def test_the_oldest_goes_when_nothing_repeats() -> None:
    oldest = sock(1)
    assert crowded_out([oldest, sock(None), sock(1)]) is oldest


def test_only_the_oldest_few_are_looked_at() -> None:
    oldest = sock(1)
    late_guess = sock(40)
    assert crowded_out([oldest, *[sock(1) for _ in range(EVICTION_SCAN)], late_guess]) \
        is oldest
