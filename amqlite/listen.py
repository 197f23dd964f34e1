"""Listening sockets made here, bound *and* listening before an event loop sees them.

Why not ``loop.create_server(host, port)``: uvloop binds there but calls ``listen()``
later, and a ``listen()`` that fails (two processes bound the same port with
SO_REUSEADDR and the other one listened first) goes to the loop's exception handler,
not to the caller. The caller then holds a server with a dead socket: the STOMP
listener would look started and accept nothing, and aiohttp's ``TCPSite`` crashes on
``sockets[0] is None``. Listening here makes that race an OSError like any other
address in use, so an automatic port moves on to the next one.
"""

from __future__ import annotations

import contextlib
import errno
import socket

#: listen() backlog of the STOMP listener: a burst of reconnecting clients after a
#: failover arrives at once; 512 is below Linux's default somaxconn (4096), which caps it.
STOMP_BACKLOG = 512
#: aiohttp's own default for its sites.
HTTP_BACKLOG = 128


def bound_sockets(host: str, port: int) -> list[socket.socket]:
    """One socket per address ``host`` resolves to (as ``create_server`` would make),
    bound but not listening; OSError, with nothing left open, when any cannot be bound.
    Blocking: resolves ``host``."""
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise OSError(errno.EADDRNOTAVAIL, f"cannot resolve {host!r}: {exc.strerror}") from None
    made: list[socket.socket] = []
    try:
        for family, kind, proto, _, addr in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            made.append(sock)
            # A restarted node must get its port back while old connections sit in
            # TIME_WAIT.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                # One socket per family, as create_server does, not a dual-stack one.
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(addr)
    except OSError:
        _close(made)
        raise
    return made


def listening_sockets(host: str, port: int, backlog: int) -> list[socket.socket]:
    """``bound_sockets``, listening and non-blocking; OSError, with nothing left open,
    when any of them cannot listen."""
    socks = bound_sockets(host, port)
    try:
        for sock in socks:
            sock.listen(backlog)
            sock.setblocking(False)
    except OSError:
        _close(socks)
        raise
    return socks


def _close(socks: list[socket.socket]) -> None:
    for sock in socks:
        with contextlib.suppress(OSError):
            sock.close()
