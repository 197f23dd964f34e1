"""Issue 23: the management listener's plain-HTTP connections are bounded
(``amqlite.management.connections``), against a real broker process.

A flood of idle sockets and of slowloris requests (a request line and headers trickled,
never finished) is held open; a real request made during it is answered within a second,
the broker's file descriptors stay within MAX_HTTP_CONNECTIONS of where they were and its
RSS within a few MB; a request's head that is not complete within HEADER_TIMEOUT, and an
idle connection past KEEPALIVE_TIMEOUT, are closed; a body trickled past BODY_TIMEOUT is a
408.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import socket
import time
import urllib.request
from pathlib import Path

import pytest

from amqlite.management.connections import (
    HEADER_TIMEOUT,
    KEEPALIVE_TIMEOUT,
    MAX_HTTP_CONNECTIONS,
)
from amqlite.management.inputs import BODY_TIMEOUT
from tests.helpers.broker_proc import HOST, BrokerFactory, BrokerProcess
from tests.helpers.poll import poll
from tests.helpers.servers import free_port
from tests.helpers.sockets import closed_by_broker

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

#: Sockets of each kind in the flood: 2,000 in all, eight times the cap.
IDLE = 1_000
SLOWLORIS = 1_000
#: What a real request may take while the flood is held (the brief: within a second).
ANSWER_WITHIN = 1.0
#: File descriptors the broker may hold over its count before the flood besides the
#: capped sockets (a store connection opened meanwhile, a log rotation).
FD_SLACK = 32
#: RSS the flood may leave: 256 sockets with aiohttp's protocol, parser and buffers are
#: about 2 MB; the rest is the allocator's slack.
RSS_GROWTH = 24 * 1024 * 1024
#: How long the broker may take to close a socket it decided to close.
CLOSE_WITHIN = 3.0


def start(factory: BrokerFactory) -> tuple[BrokerProcess, int]:
    port = free_port()
    broker = factory.start(extra_args=["--http", f"{HOST}:{port}"])
    poll(lambda: get(port) == 200, timeout=30, what="the management API up")
    return broker, port


def get(port: int, path: str = "/api/v1/node", timeout: float = 5.0) -> int:
    """The status of one request by a real client (a new connection), 0 if it failed."""
    try:
        with urllib.request.urlopen(f"http://{HOST}:{port}{path}", timeout=timeout) as r:
            return int(r.status)
    except OSError:
        return 0


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS in /proc/{pid}/status")


def connect(port: int, into: list[socket.socket]) -> socket.socket:
    sock = socket.create_connection((HOST, port), timeout=5)
    into.append(sock)
    return sock


def slowloris_start(port: int, into: list[socket.socket]) -> socket.socket:
    """A request whose head is begun and never finished."""
    sock = connect(port, into)
    sock.sendall(f"GET /api/v1/node HTTP/1.1\r\nHost: {HOST}:{port}\r\n".encode())
    return sock


def trickle(socks: list[socket.socket], n: int) -> None:
    """One more header line on each (still open) slowloris socket."""
    for sock in socks:
        with contextlib.suppress(OSError):  # closed by the broker: what most should be
            sock.sendall(f"X-Slow-{n}: {n}\r\n".encode())


def test_a_flood_of_idle_and_slowloris_sockets_leaves_the_api_answering(
        broker_factory: BrokerFactory, sockets: list[socket.socket]) -> None:
    """2,000 idle and slowloris sockets, eight times MAX_HTTP_CONNECTIONS: the oldest are
    closed to make room, a real request is answered within a second while the newest are
    still held, and the broker's fds and RSS stay bounded."""
    broker, port = start(broker_factory)
    fds_before, rss_before = fds(broker.pid), rss(broker.pid)
    slow: list[socket.socket] = []
    for i in range(IDLE + SLOWLORIS):
        if i % 2:
            slow.append(slowloris_start(port, sockets))
        else:
            connect(port, sockets)
    trickle(slow, 1)
    # The broker accepted them all and closed all but the newest MAX_HTTP_CONNECTIONS.
    poll(lambda: sum(closed_by_broker(s) for s in sockets),
         lambda n: n >= len(sockets) - MAX_HTTP_CONNECTIONS, timeout=30,
         what="the sockets past the cap closed")
    held = [s for s in sockets if not closed_by_broker(s)]
    assert len(held) >= MAX_HTTP_CONNECTIONS - FD_SLACK, (
        f"only {len(held)} of the newest sockets held: the flood is not held")
    assert fds(broker.pid) <= fds_before + MAX_HTTP_CONNECTIONS + FD_SLACK
    # A real client, while the flood is held: a new connection, answered within 1 s.
    for path in ("/api/v1/node", "/api/v1/destinations", "/"):
        began = time.monotonic()
        assert get(port, path, timeout=ANSWER_WITHIN) == 200, f"{path} not answered"
        assert time.monotonic() - began < ANSWER_WITHIN
    # Another wave: the first real connection is kept while it is used (keep-alive),
    # the flood's sockets go instead.
    client = http.client.HTTPConnection(HOST, port, timeout=ANSWER_WITHIN)
    client.request("GET", "/api/v1/node")
    first = client.getresponse()
    first.read()
    assert first.status == 200
    for _ in range(MAX_HTTP_CONNECTIONS // 2):
        slowloris_start(port, sockets)
    client.request("GET", "/healthz")
    assert client.getresponse().status == 200
    client.close()
    assert fds(broker.pid) <= fds_before + MAX_HTTP_CONNECTIONS + FD_SLACK
    assert rss(broker.pid) - rss_before < RSS_GROWTH, (
        f"RSS grew {(rss(broker.pid) - rss_before) / 1e6:.1f} MB")
    assert broker.alive


def test_slow_heads_idle_connections_and_slow_bodies_time_out(
        broker_factory: BrokerFactory, sockets: list[socket.socket]) -> None:
    """A request head trickled a line a second is closed HEADER_TIMEOUT after its first
    byte; an idle connection after KEEPALIVE_TIMEOUT; a body trickled past BODY_TIMEOUT
    gets a 408."""
    broker, port = start(broker_factory)
    began = time.monotonic()
    slow = [slowloris_start(port, sockets) for _ in range(3)]
    idle = [connect(port, sockets) for _ in range(3)]
    body = connect(port, sockets)
    body.sendall((f"POST /api/v1/send/queue/slow HTTP/1.1\r\nHost: {HOST}:{port}\r\n"
                  f"Origin: http://{HOST}:{port}\r\nX-Requested-By: test\r\n"
                  "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{").encode())
    body.settimeout(BODY_TIMEOUT + CLOSE_WITHIN + 5)
    n = 0
    while not all(closed_by_broker(s) for s in slow):
        elapsed = time.monotonic() - began
        assert elapsed < HEADER_TIMEOUT + CLOSE_WITHIN, "a slow head outlived HEADER_TIMEOUT"
        assert elapsed > HEADER_TIMEOUT - 1 or not any(closed_by_broker(s) for s in slow), (
            "a slow head was closed before HEADER_TIMEOUT")
        n += 1
        trickle(slow, n)
        time.sleep(0.5)  # the trickle's pace (a line each half second), not a wait
    answer = body.recv(4096).decode(errors="replace")
    assert answer.startswith("HTTP/1.1 408"), answer
    assert time.monotonic() - began >= BODY_TIMEOUT - 1
    assert not any(closed_by_broker(s) for s in idle) or (
        time.monotonic() - began > KEEPALIVE_TIMEOUT - 1), "idle closed before its time"
    poll(lambda: all(closed_by_broker(s) for s in idle),
         timeout=KEEPALIVE_TIMEOUT + CLOSE_WITHIN - (time.monotonic() - began),
         what="idle connections closed after KEEPALIVE_TIMEOUT")
    assert time.monotonic() - began >= KEEPALIVE_TIMEOUT - 1
    assert get(port) == 200
    assert broker.alive
