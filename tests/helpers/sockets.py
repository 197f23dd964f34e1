"""Raw client sockets the tests hold against a broker's listeners."""

from __future__ import annotations

import select
import socket
from collections.abc import Iterator

import pytest


def closed_by_broker(sock: socket.socket) -> bool:
    """True if the broker closed (or reset) ``sock``; checked without waiting (``poll``:
    ``select`` takes no descriptor past 1023, and floods hold thousands)."""
    looker = select.poll()
    looker.register(sock, select.POLLIN)
    if not looker.poll(0):
        return False
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


@pytest.fixture
def sockets() -> Iterator[list[socket.socket]]:
    """The raw sockets a test opened, closed at its end (a module imports it)."""
    opened: list[socket.socket] = []
    yield opened
    for sock in opened:
        sock.close()
