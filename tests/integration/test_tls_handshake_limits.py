"""Issue 23 item 6: sockets in their TLS handshake count against max_connections and
max_unauthenticated, and against connect_timeout, like any socket before CONNECT
(against a real broker process with a TLS listener only); on the management API's
HTTPS listener, against MAX_HTTP_CONNECTIONS and MAX_HTTP_HANDSHAKES
(``amqlite.management.tls_gate``, ``amqlite.management.connections``).

The rule is the plain listener's: past max_unauthenticated the oldest socket that has not
logged in is closed (one still in its handshake is closed without a word: there is no TLS
to say "server busy" in), so a client connecting now gets in; past max_connections the new
socket is refused (closed at once). Half-open handshakes are raw TCP sockets that connect
to the TLS port and never send a byte.
"""

from __future__ import annotations

import socket
import ssl
import time
import urllib.request

import pytest
import stomp
import stomp.exception

from amqlite.management.tls_gate import MAX_HTTP_CONNECTIONS, MAX_HTTP_HANDSHAKES
from tests.helpers.broker_proc import HOST, BrokerFactory, BrokerProcess, Collector
from tests.helpers.poll import poll
from tests.helpers.servers import free_port
from tests.helpers.sockets import closed_by_broker
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


def half_open(port: int, count: int, into: list[socket.socket]) -> list[socket.socket]:
    """``count`` TCP connections to the TLS port that never start a handshake."""
    new = []
    for _ in range(count):
        sock = socket.create_connection((HOST, port), timeout=5)
        new.append(sock)
        into.append(sock)
        time.sleep(0.01)  # accepted in this order: "oldest" is well defined
    return new


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


# -- the management API over HTTPS -----------------------------------------------------

def start_https(factory: BrokerFactory, pki: Pki) -> tuple[BrokerProcess, int]:
    """A broker whose management API serves HTTPS (the STOMP listener's certificate)."""
    http_port = free_port()
    broker = factory.start(
        extra_args=["--ssl-cert", str(pki.server_cert), "--ssl-key", str(pki.server_key),
                    "--http", f"{HOST}:{http_port}"],
        env={"AMQLITE_CONNECT_TIMEOUT": str(CONNECT_TIMEOUT)})
    return broker, http_port


def https_get(port: int, pki: Pki, path: str = "/healthz") -> int:
    """The status of one HTTPS request by a real client (CA-verified)."""
    context = ssl.create_default_context(cafile=str(pki.ca))
    with urllib.request.urlopen(f"https://{HOST}:{port}{path}", context=context,
                                timeout=CONNECT_TIMEOUT) as resp:
        return int(resp.status)


def try_get(port: int, pki: Pki, path: str = "/healthz") -> int:
    """``https_get``, or 0 when the request failed (refused, closed, timed out)."""
    try:
        return https_get(port, pki, path)
    except OSError:
        return 0


def tls_closed(sock: ssl.SSLSocket) -> bool:
    """True if the broker closed this TLS connection; checked without waiting."""
    sock.setblocking(False)
    try:
        return sock.recv(1) == b""  # no request was sent: nothing else can come
    except ssl.SSLWantReadError:
        return False  # open, nothing to read (session tickets are TLS's own)
    except OSError:
        return True
    finally:
        sock.setblocking(True)


def tls_idle(port: int, pki: Pki, count: int, into: list[ssl.SSLSocket]) -> None:
    """``count`` HTTPS connections with their handshake done and no request yet."""
    context = ssl.create_default_context(cafile=str(pki.ca))
    for _ in range(count):
        raw = socket.create_connection((HOST, port), timeout=5)
        into.append(context.wrap_socket(raw, server_hostname=HOST))


def test_https_handshakes_are_bounded_and_the_api_still_answers(
        broker_factory: BrokerFactory, pki: Pki, sockets: list[socket.socket]) -> None:
    """Three times MAX_HTTP_HANDSHAKES half-open handshakes on the HTTPS management port:
    only the newest MAX_HTTP_HANDSHAKES stay, the older ones are closed at once (before,
    every one was held for the whole handshake timeout); a real HTTPS client connecting
    after them is answered, and connect_timeout ends the rest."""
    broker, port = start_https(broker_factory, pki)
    poll(lambda: try_get(port, pki) == 200, timeout=30, what="the HTTPS API up")
    socks = half_open(port, 3 * MAX_HTTP_HANDSHAKES, sockets)
    oldest, newest = socks[:-MAX_HTTP_HANDSHAKES], socks[-MAX_HTTP_HANDSHAKES:]
    assert all(wait_closed(oldest, CLOSE_WITHIN)), "half-open handshakes past the cap stayed"
    assert not any(closed_by_broker(s) for s in newest), "one of the newest was closed"
    assert https_get(port, pki, "/api/v1/node") == 200
    assert all(wait_closed(newest, CONNECT_TIMEOUT + CLOSE_WITHIN)), (
        "half-open handshakes outlived connect_timeout")
    assert broker.alive


def test_https_connections_are_bounded(broker_factory: BrokerFactory, pki: Pki,
                                       sockets: list[socket.socket]) -> None:
    """MAX_HTTP_CONNECTIONS idle HTTPS connections held open: a real client connecting
    after them is answered at once, the oldest idle one is closed to make room for it
    (``amqlite.management.connections``) and the newest are kept."""
    broker, port = start_https(broker_factory, pki)
    poll(lambda: try_get(port, pki) == 200, timeout=30, what="the HTTPS API up")
    held: list[ssl.SSLSocket] = []
    tls_idle(port, pki, MAX_HTTP_CONNECTIONS, held)
    sockets.extend(held)
    began = time.monotonic()
    assert https_get(port, pki, "/api/v1/node") == 200
    assert time.monotonic() - began < CLOSE_WITHIN
    poll(lambda: tls_closed(held[0]), timeout=CLOSE_WITHIN,
         what="the oldest idle connection closed to make room")
    assert not any(tls_closed(s) for s in held[-10:]), "one of the newest was closed"
    assert broker.alive
