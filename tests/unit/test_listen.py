"""Listening sockets bound and listening in one step (amqlite.listen): a port taken
between another process's bind and listen is an OSError here, never a dead listener."""

from __future__ import annotations

import errno
import socket
import threading

import pytest

from amqlite import listen
from amqlite.listen import (
    bound_sockets,
    ephemeral_range,
    listen_all,
    listening_sockets,
    pick_ports,
)

RACERS = 16
ROUNDS = 20


def test_sockets_listen_and_do_not_block() -> None:
    (sock,) = listening_sockets("127.0.0.1", 0, backlog=8)
    with sock, socket.create_connection(sock.getsockname(), timeout=5):
        assert sock.getblocking() is False
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 1


def test_bound_sockets_accept_nothing() -> None:
    """What a node probes its STOMP address with before it claims an epoch: a client
    connecting then must be refused, not accepted by the probe and reset when it
    closes (a CI run saw a client connect to a node in that window and be dropped)."""
    (sock,) = bound_sockets("127.0.0.1", 0)
    with sock, pytest.raises(ConnectionRefusedError):
        socket.create_connection(sock.getsockname(), timeout=5).close()


def test_a_port_in_use_is_an_oserror() -> None:
    (held,) = listening_sockets("127.0.0.1", 0, backlog=8)
    with held:
        with pytest.raises(OSError) as caught:
            listening_sockets("127.0.0.1", held.getsockname()[1], backlog=8)
        assert caught.value.errno == errno.EADDRINUSE


def test_an_unresolvable_host_is_an_oserror() -> None:
    with pytest.raises(OSError) as caught:
        listening_sockets("no-such-host.invalid", 0, backlog=8)
    assert caught.value.errno == errno.EADDRNOTAVAIL and "cannot resolve" in str(caught.value)


def _race_for(port: int) -> tuple[list[socket.socket], list[OSError]]:
    """RACERS threads call listening_sockets on ``port`` at once: (won, lost)."""
    barrier = threading.Barrier(RACERS)
    won: list[socket.socket] = []
    lost: list[OSError] = []

    def race() -> None:
        barrier.wait()
        try:
            won.extend(listening_sockets("127.0.0.1", port, backlog=8))
        except OSError as exc:
            lost.append(exc)

    threads = [threading.Thread(target=race) for _ in range(RACERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return won, lost


def test_racers_for_one_port_get_one_listener_and_oserrors() -> None:
    """Bind and listen release the GIL, so the threads really race for the port, as
    nodes started together race for the same automatic HTTP port."""
    for _ in range(ROUNDS):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        won, lost = _race_for(port)
        try:
            assert len(won) == 1 and len(lost) == RACERS - 1
            assert {exc.errno for exc in lost} == {errno.EADDRINUSE}
            assert won[0].getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 1
        finally:
            for sock in won:
                sock.close()


def test_picked_ports_are_free_distinct_and_below_the_ephemeral_range() -> None:
    """A CI run lost a bench broker to "address in use": its port came from bind(0),
    the ephemeral range, where an outgoing connection had taken it in between."""
    low, _ = ephemeral_range()
    ports = pick_ports(50)
    assert len(set(ports)) == 50
    assert all(port < low for port in ports)
    for port in ports:
        (sock,) = listening_sockets("127.0.0.1", port, backlog=1)
        sock.close()


def test_ports_taken_or_in_use_are_never_picked(monkeypatch: pytest.MonkeyPatch) -> None:
    """In a window of a few ports (PICK_FLOOR just below the range), every free one but
    the one another container was given (``taken``) and the one something holds."""
    low, _ = ephemeral_range()
    monkeypatch.setattr(listen, "PICK_FLOOR", low - 12)
    monkeypatch.setattr(listen, "_handed_out", {})
    window = range(low - 12, low)
    free = []
    for port in window:
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        free.append(port)
    assert len(free) >= 3, f"the window {window} is mostly in use on this machine"
    taken = free[0]
    with socket.socket() as held:
        held.bind(("127.0.0.1", free[1]))
        ports = pick_ports(len(free) - 2, taken=[taken])
    assert taken not in ports and free[1] not in ports
    assert sorted(ports) == free[2:]


def test_a_process_is_never_handed_the_same_port_twice() -> None:
    first = set(pick_ports(200))
    assert first.isdisjoint(pick_ports(200))


def test_ports_come_from_the_span_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two test processes (pytest-xdist) draw from slices of the range that do not meet:
    neither hands out a port the other picked and has not bound yet."""
    monkeypatch.setattr(listen, "_handed_out", {})
    low, _ = ephemeral_range()
    span = (listen.PICK_FLOOR + 1000, listen.PICK_FLOOR + 1100)
    ports = pick_ports(20, span=span)
    assert len(set(ports)) == 20
    assert all(span[0] <= port < span[1] for port in ports), ports
    assert span[1] < low


def test_every_listener_listens_or_none_does() -> None:
    """A broker's listeners (STOMP, TLS, WebSocket) open together, in one go: a client that
    finds the STOMP port accepting finds the WebSocket port accepting too (a test that
    connected to the WebSocket port as soon as STOMP served was refused), and one port
    in use leaves none of the others open."""
    first, second = pick_ports(2)
    opened = listen_all([("stomp", ("127.0.0.1", first)), ("ws", ("127.0.0.1", second))], 8)
    try:
        assert [s[0].getsockname()[1] for s in opened] == [first, second]
    finally:
        for socks in opened:
            for sock in socks:
                sock.close()
    with socket.socket() as held:  # the STOMP port, opened last, is in use
        held.bind(("127.0.0.1", first))
        held.listen()
        with pytest.raises(OSError) as failed:
            listen_all([("stomp", ("127.0.0.1", first)), ("ws", ("127.0.0.1", second))], 8)
        assert failed.value.listener == "stomp"  # type: ignore[attr-defined]
    (again,) = listening_sockets("127.0.0.1", second, backlog=1)  # ws's was closed
    again.close()
