"""Issue 23 item 6: sockets in their TLS handshake count against max_connections and
max_unauthenticated, and against connect_timeout, like any socket before CONNECT
(against a real broker process with a TLS listener only).

The rule is the plain listener's: past max_unauthenticated the oldest socket that has not
logged in is closed (one still in its handshake is closed without a word: there is no TLS
to say "server busy" in), so a client connecting now gets in; past max_connections the new
socket is refused (closed at once). Half-open handshakes are raw TCP sockets that connect
to the TLS port and never send a byte.
"""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Iterator

import pytest
import stomp
import stomp.exception

from tests.helpers.broker_proc import HOST, BrokerFactory, BrokerProcess, Collector
from tests.helpers.servers import free_port
from tests.helpers.tls import Pki, make_pki

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

MAX_CONNECTIONS = 20
MAX_UNAUTHENTICATED = 10
#: Longer than CLOSE_WITHIN: a socket closed by the caps is told from one timed out.
CONNECT_TIMEOUT = 6.0
#: How long the broker may take to close a socket it decided to close.
CLOSE_WITHIN = 2.0


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def start_tls(factory: BrokerFactory, pki: Pki, max_unauthenticated: int) -> BrokerProcess:
    port = free_port()
    args = ["--ssl-bind", f"{HOST}:{port}", "--bind", "off", "--ssl-cert",
            str(pki.server_cert), "--ssl-key", str(pki.server_key), "--http", "off"]
    return factory.start(port=port, extra_args=args, env={
        "AMQLITE_MAX_CONNECTIONS": str(MAX_CONNECTIONS),
        "AMQLITE_MAX_UNAUTHENTICATED": str(max_unauthenticated),
        "AMQLITE_CONNECT_TIMEOUT": str(CONNECT_TIMEOUT),
    })


@pytest.fixture
def sockets() -> Iterator[list[socket.socket]]:
    opened: list[socket.socket] = []
    yield opened
    for sock in opened:
        sock.close()


def half_open(port: int, count: int, into: list[socket.socket]) -> list[socket.socket]:
    """``count`` TCP connections to the TLS port that never start a handshake."""
    new = []
    for _ in range(count):
        sock = socket.create_connection((HOST, port), timeout=5)
        new.append(sock)
        into.append(sock)
        time.sleep(0.01)  # accepted in this order: "oldest" is well defined
    return new


def closed_by_broker(sock: socket.socket) -> bool:
    """True if the broker closed (or reset) it; checked without waiting."""
    readable, _, _ = select.select([sock], [], [], 0)
    if not readable:
        return False
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


def wait_closed(socks: list[socket.socket], timeout: float) -> list[bool]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = [closed_by_broker(s) for s in socks]
        if all(states):
            return states
        time.sleep(0.05)
    return [closed_by_broker(s) for s in socks]


def tls_login(port: int, pki: Pki) -> tuple[stomp.Connection12, Collector]:
    conn = stomp.Connection12([(HOST, port)], heartbeats=(0, 0), reconnect_attempts_max=1,
                              timeout=5)
    conn.set_ssl(for_hosts=[(HOST, port)], ca_certs=str(pki.ca))
    listener = Collector()
    conn.set_listener("collector", listener)
    conn.connect(wait=False)
    listener.wait_for(lambda: listener.connected is not None or bool(listener.errors)
                      or listener.disconnected, 10.0)
    return conn, listener


def test_half_open_handshakes_over_max_unauthenticated_close_oldest(
        broker_factory: BrokerFactory, pki: Pki, sockets: list[socket.socket]) -> None:
    broker = start_tls(broker_factory, pki, MAX_UNAUTHENTICATED)
    socks = half_open(broker.port, 30, sockets)
    oldest, newest = socks[:-MAX_UNAUTHENTICATED], socks[-MAX_UNAUTHENTICATED:]
    assert all(wait_closed(oldest, CLOSE_WITHIN)), "half-open handshakes past the cap stayed"
    assert not any(closed_by_broker(s) for s in newest), "one of the newest was closed"
    # A real TLS client is the newest socket: it gets in, the oldest half-open one goes.
    conn, listener = tls_login(broker.port, pki)
    try:
        assert listener.connected is not None, f"TLS login failed: {listener.error_texts()}"
        assert closed_by_broker(newest[0]) or all(wait_closed(newest[:1], CLOSE_WITHIN))
        assert not any(closed_by_broker(s) for s in newest[1:])
    finally:
        conn.disconnect()
    # The handshake is bounded by connect_timeout: the rest go too.
    assert all(wait_closed(newest, CONNECT_TIMEOUT + CLOSE_WITHIN)), (
        "half-open handshakes outlived connect_timeout")


def test_half_open_handshakes_count_against_max_connections(
        broker_factory: BrokerFactory, pki: Pki, sockets: list[socket.socket]) -> None:
    """max_unauthenticated = max_connections: 25 half-open handshakes leave the 20 oldest
    open and the 5 newest refused; a TLS client is refused too until connect_timeout
    frees the slots, then it gets in."""
    broker = start_tls(broker_factory, pki, MAX_CONNECTIONS)
    socks = half_open(broker.port, MAX_CONNECTIONS + 5, sockets)
    held, refused = socks[:MAX_CONNECTIONS], socks[MAX_CONNECTIONS:]
    assert all(wait_closed(refused, CLOSE_WITHIN)), "sockets past max_connections were kept"
    assert not any(closed_by_broker(s) for s in held), "a socket within the limit was closed"
    try:
        conn, listener = tls_login(broker.port, pki)
    except stomp.exception.ConnectFailedException:
        pass  # closed during its handshake: the refusal of a TLS socket
    else:
        assert listener.connected is None, "a TLS login got in past max_connections"
        conn.disconnect()
    assert all(wait_closed(held, CONNECT_TIMEOUT + CLOSE_WITHIN)), (
        "half-open handshakes outlived connect_timeout")
    conn, listener = tls_login(broker.port, pki)
    try:
        assert listener.connected is not None, f"TLS login failed: {listener.error_texts()}"
    finally:
        conn.disconnect()
    assert broker.alive
