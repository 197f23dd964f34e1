"""Bounded work before authentication on the management API (issues 14 and 16), against
a real broker process: HTTP Basic checks share the STOMP side's bounded, fair check queue,
and repeated failures of one login from one address are answered 429 with Retry-After
and no password check. A flood of bad logins cannot keep an administrator out."""

from __future__ import annotations

import base64
import contextlib
import random
import select
import socket
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
#: Bad logins in flight at once, each on its own connection.
FLOOD_REQUESTS = 200
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


class Flood:
    """Raw HTTP connections that each sent one request with a random bad login."""

    def __init__(self, port: int, count: int) -> None:
        rng = random.Random(14)
        self.socks: list[socket.socket] = []
        for _ in range(count):
            sock = socket.create_connection((HOST, port), timeout=10)
            auth = basic(f"u{rng.getrandbits(40):x}", f"p{rng.getrandbits(64):x}")
            sock.sendall(f"GET /api/v1/node HTTP/1.1\r\nHost: {HOST}\r\n"
                         f"Authorization: {auth}\r\nConnection: close\r\n\r\n".encode())
            self.socks.append(sock)

    def wait_first_answer(self, timeout: float) -> bool:
        readable, _, _ = select.select(self.socks, [], [], timeout)
        return bool(readable)

    def unanswered(self) -> int:
        readable, _, _ = select.select(self.socks, [], [], 0)
        return len(self.socks) - len(readable)

    def statuses(self, timeout: float) -> list[int]:
        """Each request's status line (read to the end; the broker closes)."""
        out = []
        for sock in self.socks:
            sock.settimeout(timeout)
            head = sock.recv(64).split(b"\r\n", 1)[0]
            out.append(int(head.split()[1]))
        return out

    def close(self) -> None:
        for sock in self.socks:
            sock.close()


def test_valid_login_within_a_second_during_a_bad_login_flood(
        broker: BrokerProcess) -> None:
    """Hundreds of bad Basic logins in flight from the administrator's own address delay
    a valid login by a couple of password checks at most."""
    port = int(broker.http.rsplit(":", 1)[1])  # type: ignore[attr-defined]
    with contextlib.closing(Flood(port, FLOOD_REQUESTS)) as flood:
        check_flood(broker, flood)


def check_flood(broker: BrokerProcess, flood: Flood) -> None:
    assert flood.wait_first_answer(10.0), "no bad login was answered within 10s"

    start = time.monotonic()
    status, node = Api(broker.http, ADMIN, ADMIN_PASSWORD).get("/api/v1/node")  # type: ignore[attr-defined]
    elapsed = time.monotonic() - start
    still_waiting = flood.unanswered()

    assert status == 200 and node["role"] == "master", node
    assert elapsed <= LOGIN_DEADLINE, f"valid login took {elapsed:.2f}s during the flood"
    # It overtook the flood: bad logins were still waiting for their check.
    assert still_waiting >= 5, f"only {still_waiting} bad logins were still pending"
    # The flood cost bounded work: the queue refused its oldest (503, Retry-After) rather
    # than hashing them all; every other one got a plain 401.
    statuses = flood.statuses(timeout=30.0)
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
