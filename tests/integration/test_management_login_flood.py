"""Bounded work before authentication on the management API (issues 14 and 16), against
a real broker process: HTTP Basic checks share the STOMP side's bounded, fair check queue,
and repeated failures of one login from one address are answered 429 with Retry-After
and no password check. A flood of bad logins cannot keep an administrator out."""

from __future__ import annotations

import base64
import contextlib
import json
import random
import select
import socket
import struct
import time
from pathlib import Path

import pytest

from tests.helpers.broker_proc import HOST, BrokerFactory, BrokerProcess, password_hash
from tests.helpers.mgmt import Api, start_with_http

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

ADMIN, ADMIN_PASSWORD = "admin", "adm1n-pw"
USER, USER_PASSWORD = "bob", "b0b-pw"
#: The promise: a valid login succeeds within a second during a flood.
LOGIN_DEADLINE = 1.0
#: Bad logins in flight at once, each on its own connection: more than the broker keeps
#: waiting per address (MAX_PENDING_PER_PEER, 32), so some are refused 503, and fewer than
#: the listener's backlog (amqlite.listen.HTTP_BACKLOG, 128). With 200, the connections
#: past the backlog had their SYN dropped and retransmitted a second later, and the flood
#: trickled in while the queue drained: how much of it was left to overtake was a race.
FLOOD_REQUESTS = 100
#: The broker's FAILURES_BEFORE_THROTTLE (amqlite.management.security).
FAILURES_BEFORE_THROTTLE = 5


@pytest.fixture(scope="module")
def users_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    users = tmp_path_factory.mktemp("mgmtflood") / "users.toml"
    users.write_text(f'[users]\n{ADMIN} = "{password_hash(ADMIN_PASSWORD)}"\n'
                     f'{USER} = "{password_hash(USER_PASSWORD)}"\n'
                     f'[groups]\nadmins = ["{ADMIN}"]\n')
    return users


@pytest.fixture
def broker(broker_factory: BrokerFactory, users_file: Path) -> BrokerProcess:
    """A fresh broker per test: neither a queue of checks nor a throttle carries over."""
    return start_with_http(broker_factory, "mgmtflood", users_file)


def basic(login: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{login}:{password}".encode()).decode()


#: Linux's SO_TIMESTAMPNS (SO_TIMESTAMPNS_OLD in <asm-generic/socket.h>, also the control
#: message's type), which Python's socket module does not export; with it the kernel
#: hands a ``struct timespec`` (two 64-bit fields here) over with the received data.
SO_TIMESTAMPNS = 35
TIMESPEC = struct.Struct("qq")


def stamped_request(port: int, auth: str) -> socket.socket:
    """A connection that sent one GET /api/v1/node and has the kernel stamp what it
    receives (SO_TIMESTAMPNS): the order of answers is then the order they arrived in,
    not the order this process, busy or descheduled, got round to reading them."""
    sock = socket.create_connection((HOST, port), timeout=10)
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    sock.sendall(f"GET /api/v1/node HTTP/1.1\r\nHost: {HOST}\r\n"
                 f"Authorization: {auth}\r\nConnection: close\r\n\r\n".encode())
    return sock


def read_stamped(sock: socket.socket, timeout: float) -> tuple[bytes, float]:
    """The whole answer (the broker closes) and the wall-clock time its first bytes
    arrived, as the kernel stamped them."""
    sock.settimeout(timeout)
    data, ancillary, _, _ = sock.recvmsg(65536, socket.CMSG_SPACE(TIMESPEC.size))
    stamps = [TIMESPEC.unpack(d[:TIMESPEC.size]) for level, kind, d in ancillary
              if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS]
    assert stamps, "the kernel did not stamp the answer"
    while chunk := sock.recv(65536):
        data += chunk
    return data, stamps[0][0] + stamps[0][1] / 1e9


class Flood:
    """Raw HTTP connections that each sent one request with a random bad login."""

    def __init__(self, port: int, count: int) -> None:
        rng = random.Random(14)
        self.socks = [stamped_request(port, basic(f"u{rng.getrandbits(40):x}",
                                                  f"p{rng.getrandbits(64):x}"))
                      for _ in range(count)]

    def wait_first_answer(self, timeout: float) -> bool:
        readable, _, _ = select.select(self.socks, [], [], timeout)
        return bool(readable)

    def answers(self, timeout: float) -> list[tuple[int, float]]:
        """Each request's status and when its answer arrived (read_stamped)."""
        out = []
        for sock in self.socks:
            data, at = read_stamped(sock, timeout)
            out.append((int(data.split(b"\r\n", 1)[0].split()[1]), at))
        return out

    def close(self) -> None:
        for sock in self.socks:
            sock.close()


def test_valid_login_within_a_second_during_a_bad_login_flood(
        broker: BrokerProcess) -> None:
    """A hundred bad Basic logins in flight from the administrator's own address delay
    a valid login by a couple of password checks at most."""
    port = int(broker.http.rsplit(":", 1)[1])  # type: ignore[attr-defined]
    with contextlib.closing(Flood(port, FLOOD_REQUESTS)) as flood:
        check_flood(port, flood)


def check_flood(port: int, flood: Flood) -> None:
    assert flood.wait_first_answer(10.0), "no bad login was answered within 10s"

    start = time.time()  # the kernel's stamps are wall-clock time
    with stamped_request(port, basic(ADMIN, ADMIN_PASSWORD)) as admin:
        data, answered_at = read_stamped(admin, timeout=10.0)
    head, _, body = data.partition(b"\r\n\r\n")
    status, node = int(head.split()[1]), json.loads(body)
    elapsed = answered_at - start

    assert status == 200 and node["role"] == "master", node
    assert elapsed <= LOGIN_DEADLINE, f"valid login took {elapsed:.2f}s during the flood"
    answers = flood.answers(timeout=30.0)
    # It overtook the flood: bad logins sent before it were answered after it.
    later = sum(at > answered_at for _, at in answers)
    assert later >= 5, f"only {later} bad logins were answered after the valid one"
    # The flood cost bounded work: the queue refused its oldest (503, Retry-After) rather
    # than hashing them all; every other one got a plain 401.
    statuses = [code for code, _ in answers]
    assert set(statuses) <= {401, 503}, sorted(set(statuses))
    assert statuses.count(503) > 0 and statuses.count(401) > 0


def test_repeated_failures_of_one_login_are_throttled_with_retry_after(
        broker: BrokerProcess) -> None:
    base = broker.http  # type: ignore[attr-defined]
    guesser = Api(base, ADMIN, "wrong")
    for _ in range(FAILURES_BEFORE_THROTTLE):
        assert guesser.get("/api/v1/node")[0] == 401
    status, body, headers = guesser.call("GET", "/api/v1/node")
    assert status == 429, body
    assert "too many failed logins" in body["error"]
    assert 1 <= int(headers["Retry-After"]) <= 10
    # Throttled, the right password is not checked either (a guess gets no answer) ...
    assert Api(base, ADMIN, ADMIN_PASSWORD).get("/api/v1/node")[0] == 429
    # ... while another login from the same address is unaffected.
    assert Api(base, USER, USER_PASSWORD).get("/api/v1/node")[0] == 200
    assert broker.alive
    assert "failed logins for 'admin'" in broker.log_text()
