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
import random
import socket
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

#: listen() backlog of the STOMP listener: a burst of reconnecting clients after a
#: failover arrives at once; 512 is below Linux's default somaxconn (4096), which caps it.
#: Not deeper: the queue also paces a connection flood into the broker, which admits
#: every socket it accepts and, past max_unauthenticated, closes one still logging in
#: (``amqlite.auth.crowded_out``). At 4096 a flood came in thousands per loop turn and
#: pushed out a real login waiting for its password check ("server busy", a CI run); at
#: 512 a flood overflows the queue instead, and the SYNs the kernel drops are resent
#: after 1 s.
STOMP_BACKLOG = 512
#: aiohttp's own default for its sites.
HTTP_BACKLOG = 128

#: Ports handed out for listeners are drawn from here up to the kernel's ephemeral range:
#: above the well-known and most registered service ports people run beside a broker.
PICK_FLOOR = 10000
#: Where Linux keeps the range it takes outgoing connections' local ports from.
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
#: Linux's default ephemeral range (the IANA one is 49152-65535).
EPHEMERAL_DEFAULT = (32768, 60999)
#: Candidates tried before a pick gives up (each one a bind on loopback).
PICK_ATTEMPTS = 1000
#: Ports this process handed out, oldest first (a dict as an ordered set).
_handed_out: dict[int, None] = {}


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


@contextlib.contextmanager
def naming(listener: str) -> Iterator[None]:
    """An OSError inside names ``listener`` (``exc.listener``): the node's error says
    which address could not be served."""
    try:
        yield
    except OSError as exc:
        exc.listener = listener  # type: ignore[attr-defined]
        raise


def listen_all(listeners: Sequence[tuple[str, tuple[str, int]]],
               backlog: int) -> list[list[socket.socket]]:
    """``listening_sockets`` of every (name, (host, port)), in the order given, opened in
    the reverse order: the first (the STOMP port, what clients and health checks try
    first) listens last, so once it accepts every listener does. OSError naming the
    listener that failed (``exc.listener``), with nothing left open."""
    opened: list[list[socket.socket]] = []
    try:
        for name, (host, port) in reversed(listeners):
            with naming(name):
                opened.append(listening_sockets(host, port, backlog))
    except OSError:
        for socks in opened:
            _close(socks)
        raise
    return opened[::-1]


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for outgoing connections' local ports."""
    try:
        low, high = (int(part) for part in EPHEMERAL_RANGE_FILE.read_text().split())
    except (OSError, ValueError):
        return EPHEMERAL_DEFAULT
    return low, high


def pick_ports(count: int, host: str = "127.0.0.1", taken: Iterable[int] = (),
               span: tuple[int, int] | None = None) -> list[int]:
    """``count`` distinct ports free on ``host`` now, none in ``taken`` nor handed out
    before by this process, and none in the ephemeral range: drawn from ``span`` (first
    and past-the-last port), by default all of ``PICK_FLOOR`` up to that range (a test
    run in several processes gives each its own slice).

    Why not bind to port 0: the kernel answers from the ephemeral range, where any
    outgoing connection (a client, a store session) may take the port as its local
    one before the listener binds it, and the listener then fails with "address in
    use". Ports below that range are only ever taken by someone who asks for them."""
    floor, ceiling = span or (PICK_FLOOR, ephemeral_range()[0])
    avoid = set(taken) | _handed_out.keys()
    ports: list[int] = []
    for _ in range(PICK_ATTEMPTS):
        if len(ports) == count:
            break
        port = (random.randrange(floor, ceiling) if ceiling > floor + count
                else 0)  # no room below the range: the kernel's choice
        if port in avoid:
            continue
        with socket.socket() as probe:
            try:
                probe.bind((host, port))
            except OSError:
                continue
            port = probe.getsockname()[1]
        if port not in avoid:
            avoid.add(port)
            ports.append(port)
    if len(ports) < count:
        raise OSError(errno.EADDRINUSE, f"no {count} free ports on {host}")
    _handed_out.update(dict.fromkeys(ports))
    # A long-lived process (a test run) forgets its oldest first: they are long closed,
    # and half the window stays open for new picks.
    for old in list(_handed_out)[:max(0, len(_handed_out) - (ceiling - floor) // 2)]:
        del _handed_out[old]
    return ports


def _close(socks: list[socket.socket]) -> None:
    for sock in socks:
        with contextlib.suppress(OSError):
            sock.close()
