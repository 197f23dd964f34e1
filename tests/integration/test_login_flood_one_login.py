"""Issue 23 item 2: a flood of wrong passcodes for one login, from the victim's own address,
does not lock that login out (against a real broker process).

The flood is a thread opening sockets from 127.0.0.1 as fast as it can, each sending
``CONNECT login:alice passcode:<wrong>`` and staying open (the newest HOLD are kept; the
broker closes them itself once it answered). Meanwhile stomp.py logs in as alice with the
right passcode, from the same address, and must get CONNECTED within LOGIN_DEADLINE:

- alice logged in before (within the credential cache's time): every login, repeatedly,
  whatever the flood repeats (one wrong passcode, or a new one on every socket);
- alice never logged in, flood repeating one wrong passcode: the wrong passcode is hashed
  once, the rest of the flood is answered from the cache, and alice's check runs next;
- another login that never logged in, from the same address, during either flood.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.helpers.broker_proc import HOST, BrokerFactory, BrokerProcess, ClientPool, password_hash
from tests.helpers.poll import poll

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

ALICE, ALICE_PASS = "alice", "alice-s3cret"
CAROL, CAROL_PASS = "carol", "carol-s3cret"
#: The issue's promise: a correct passcode logs in within a second during the flood
#: (from CONNECT sent to CONNECTED read, measured on a raw socket).
LOGIN_DEADLINE = 1.0
#: stomp.py's whole login, TCP connect included. Under a connection flood the kernel's
#: accept queue (amqlite.listen.STOMP_BACKLOG, 512) overflows now and then and drops a SYN,
#: which the client resends after 1 s (seen once in about 35 logins here): outside the broker's
#: login path, so allowed for here, and the raw-socket time above is the one that must
#: stay within LOGIN_DEADLINE.
STOMP_PY_DEADLINE = LOGIN_DEADLINE + 1.5
#: Logins tried one after another during one flood.
ROUNDS = 5
#: Flood sockets kept open at once (the oldest is closed past this).
HOLD = 1000
#: The issue's flood ran at about 1,700 sockets a second; ours must be a real flood too.
MIN_FLOOD_RATE = 500.0
#: Threads opening flood sockets (one Python thread makes 600-2,000 a second).
FLOOD_THREADS = 4


def connect_bytes(login: str, passcode: str) -> bytes:
    return (f"CONNECT\naccept-version:1.2\nhost:localhost\nheart-beat:0,0\nlogin:{login}\n"
            f"passcode:{passcode}\n\n\x00").encode()


class OneLoginFlood(threading.Thread):
    """Sockets sending a wrong passcode for ``login``, opened as fast as one thread can."""

    def __init__(self, port: int, login: str, passcode: Callable[[int], str],
                 source: str = HOST) -> None:
        super().__init__(daemon=True)
        self.port, self.login, self.passcode = port, login, passcode
        self.source = source
        self.stopping = threading.Event()
        self.sent = 0
        self.failed = 0
        self.elapsed = 0.0

    def run(self) -> None:
        held: deque[socket.socket] = deque()
        start = time.monotonic()
        try:
            while not self.stopping.is_set():
                try:
                    sock = socket.create_connection((HOST, self.port), timeout=5,
                                                    source_address=(self.source, 0))
                    sock.sendall(connect_bytes(self.login, self.passcode(self.sent)))
                except OSError:
                    self.failed += 1
                    continue
                held.append(sock)
                self.sent += 1
                while len(held) > HOLD:
                    held.popleft().close()
        finally:
            self.elapsed = time.monotonic() - start
            for sock in held:
                sock.close()

    @property
    def rate(self) -> float:
        return self.sent / self.elapsed if self.elapsed else 0.0

    def stop(self) -> None:
        self.stopping.set()
        self.join(30)


#: How long the flood threads may take to get going on a loaded machine (s).
FLOOD_START_TIMEOUT = 15.0
#: How long the flood runs before the test logs in (s).
FLOOD_RUN_IN = 0.5

@pytest.fixture
def users_file(tmp_path: Path) -> Path:
    users = tmp_path / "users.toml"
    users.write_text(f'[users]\n{ALICE} = "{password_hash(ALICE_PASS)}"\n'
                     f'{CAROL} = "{password_hash(CAROL_PASS)}"\n')
    return users


@pytest.fixture
def broker(broker_factory: BrokerFactory, users_file: Path) -> BrokerProcess:
    return broker_factory.start(name="one-login-flood",
                                env={"AMQLITE_USERS_FILE": str(users_file)})


@pytest.fixture
def floods() -> Iterator[list[OneLoginFlood]]:
    started: list[OneLoginFlood] = []
    yield started
    for flood in started:
        flood.stop()


class Floods:
    """FLOOD_THREADS floods at once (sockets are opened and written outside the GIL)."""

    def __init__(self, floods: list[OneLoginFlood]) -> None:
        self.floods = floods

    @property
    def rate(self) -> float:
        return sum(flood.rate for flood in self.floods)

    def stop(self) -> None:
        for flood in self.floods:
            flood.stopping.set()
        for flood in self.floods:
            flood.stop()


def start_flood(floods: list[OneLoginFlood], port: int,
                passcode: Callable[[int], str], run_in: float = FLOOD_RUN_IN,
                sources: tuple[str, ...] = (HOST,)) -> Floods:
    new = []
    for n in range(FLOOD_THREADS):
        flood = OneLoginFlood(port, ALICE, lambda i, n=n: passcode(i * FLOOD_THREADS + n),
                              source=sources[n % len(sources)])
        floods.append(flood)
        new.append(flood)
        flood.start()
    # Every thread sending (a loaded machine may take a while to start them), and the
    # flood running FLOOD_RUN_IN s before anyone logs in (the issue saw lock-out in 0.1 s).
    started = time.monotonic()
    poll(lambda: min(flood.sent for flood in new), lambda sent: sent > 0,
         timeout=FLOOD_START_TIMEOUT, what="every flood thread sending wrong passcodes")
    time.sleep(max(0.0, run_in - (time.monotonic() - started)))  # pacing, not a wait
    return Floods(new)


def timed_login(clients: ClientPool, port: int, login: str, passcode: str) -> float:
    start = time.monotonic()
    client = clients(port, username=login, passcode=passcode, timeout=10.0)
    elapsed = time.monotonic() - start
    client.close()
    return elapsed


def raw_exchange(port: int, login: str, passcode: str) -> tuple[float, float, bytes]:
    """One CONNECT on a raw socket: (TCP connect time, CONNECT-to-answer time, the
    answer frame's bytes)."""
    start = time.monotonic()
    with socket.create_connection((HOST, port), timeout=10) as sock:
        connected = time.monotonic()
        sock.sendall(connect_bytes(login, passcode))
        data = b""
        while b"\x00" not in data:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
        done = time.monotonic()
    return connected - start, done - connected, data


def raw_login(port: int, login: str, passcode: str) -> tuple[float, float]:
    """(TCP connect time, CONNECT-to-CONNECTED time) of one login on a raw socket."""
    connect_s, login_s, data = raw_exchange(port, login, passcode)
    assert data.startswith(b"CONNECTED\n"), f"{login}'s login was answered {data[:80]!r}"
    return connect_s, login_s


def check_rounds(clients: ClientPool, broker: BrokerProcess, flood: Floods,
                 login: str, passcode: str) -> None:
    """ROUNDS logins on a raw socket and ROUNDS with stomp.py, during the flood."""
    raw, times = [], []
    for _ in range(ROUNDS):
        raw.append(raw_login(broker.port, login, passcode))
        times.append(timed_login(clients, broker.port, login, passcode))
        time.sleep(0.2)
    flood.stop()
    logins = [round(t, 3) for _, t in raw]
    connects = [round(t, 3) for t, _ in raw]
    said = (f"{login} during a flood of {flood.rate:.0f} sockets/s: CONNECT->CONNECTED "
            f"{logins} s (TCP connects {connects} s), stomp.py logins "
            f"{[round(t, 3) for t in times]} s")
    print(said)
    assert flood.rate >= MIN_FLOOD_RATE, f"the flood ran at {flood.rate:.0f}/s only"
    assert max(logins) <= LOGIN_DEADLINE, f"{said}\n{broker.log_tail()}"
    assert max(times) <= STOMP_PY_DEADLINE, f"{said}\n{broker.log_tail()}"


@pytest.mark.parametrize("passcodes", ["same", "distinct"])
def test_login_that_logged_in_before_gets_in_during_flood(
        broker: BrokerProcess, clients: ClientPool, floods: list[OneLoginFlood],
        passcodes: str) -> None:
    timed_login(clients, broker.port, ALICE, ALICE_PASS)  # verified once: in the cache
    flood = start_flood(floods, broker.port,
                        (lambda i: "wrong") if passcodes == "same" else (lambda i: f"wrong{i}"))
    check_rounds(clients, broker, flood, ALICE, ALICE_PASS)


def test_login_that_never_logged_in_gets_in_during_flood_of_one_wrong_passcode(
        broker: BrokerProcess, clients: ClientPool, floods: list[OneLoginFlood]) -> None:
    flood = start_flood(floods, broker.port, lambda i: "wrong")
    first = timed_login(clients, broker.port, ALICE, ALICE_PASS)  # not cached: hashed
    assert first <= LOGIN_DEADLINE, f"alice's first login took {first:.2f}s"
    check_rounds(clients, broker, flood, ALICE, ALICE_PASS)


@pytest.mark.parametrize("passcodes", ["same", "distinct"])
def test_other_login_from_same_address_gets_in_during_flood(
        broker: BrokerProcess, clients: ClientPool, floods: list[OneLoginFlood],
        passcodes: str) -> None:
    """carol never logged in: at most MAX_PENDING_PER_LOGIN of alice's guesses wait, so
    they cannot fill 127.0.0.1's share of the queue, and carol's check runs within a few
    checks (both the first login and the rounds are checked against the deadline)."""
    flood = start_flood(floods, broker.port,
                        (lambda i: "wrong") if passcodes == "same" else (lambda i: f"wrong{i}"))
    first = timed_login(clients, broker.port, CAROL, CAROL_PASS)
    assert first <= LOGIN_DEADLINE, f"carol's first login took {first:.2f}s"
    check_rounds(clients, broker, flood, CAROL, CAROL_PASS)


#: A flood warmed up this long (s) before the first login: the login queue has been at
#: its bounds for seconds, and every guess of the list has been tried many times.
LONG_RUN_IN = 4.0
#: The distinct wrong passcodes of the warmed flood (a dictionary attack's list, cycled):
#: far more than can be hashed while one login waits (a check takes 30-150 ms here).
DICTIONARY = 200
#: Logins of alice's, each with a password never verified before (a new one each round).
NEW_PASSWORD_ROUNDS = 4


def set_password(broker: BrokerProcess, users_file: Path, password: str) -> None:
    """Give alice ``password`` in the users file and have the broker reload it (SIGHUP):
    its hash is new, so nothing the broker remembers of alice's logins applies."""
    users_file.write_text(f'[users]\n{ALICE} = "{password_hash(password)}"\n'
                          f'{CAROL} = "{password_hash(CAROL_PASS)}"\n')
    since = len(broker.log_text())
    os.kill(broker.pid, signal.SIGHUP)
    broker.wait_log("users file reloaded", since=since)


@pytest.mark.parametrize("passcodes", ["same", "dictionary", "mixed"])
def test_login_never_verified_gets_in_during_warmed_flood(
        broker: BrokerProcess, users_file: Path, floods: list[OneLoginFlood],
        passcodes: str) -> None:
    """A flood of wrong passcodes for alice from her own address has run LONG_RUN_IN s
    (one repeated passcode, a cycled list of DICTIONARY, or both in turn); then, round
    after round, alice gets a new password (never verified) and logs in with it on a raw
    socket: CONNECTED within LOGIN_DEADLINE each time."""
    def passcode(i: int) -> str:
        if passcodes == "same" or (passcodes == "mixed" and i % 2):
            return "wrong"
        return f"guess{i % DICTIONARY}"

    flood = start_flood(floods, broker.port, passcode, run_in=LONG_RUN_IN)
    logins = []
    for n in range(NEW_PASSWORD_ROUNDS):
        password = f"alice-new-{n}"
        set_password(broker, users_file, password)
        logins.append(raw_login(broker.port, ALICE, password)[1])
    flood.stop()
    said = (f"alice with a new password each time, during a flood of {flood.rate:.0f} "
            f"sockets/s warmed {LONG_RUN_IN:g} s ({passcodes}): CONNECT->CONNECTED "
            f"{[round(t, 3) for t in logins]} s")
    print(said)
    assert flood.rate >= MIN_FLOOD_RATE, f"the flood ran at {flood.rate:.0f}/s only"
    assert max(logins) <= LOGIN_DEADLINE, f"{said}\n{broker.log_tail()}"


#: How long a real client waits before it tries again after "server busy" (s): the
#: brief's client retries every 200-500 ms.
RETRY_PAUSE = 0.3


def retrying_login(port: int, login: str, passcode: str, deadline: float) -> tuple[float, int]:
    """Log in on raw sockets, trying again RETRY_PAUSE after each "server busy", as a
    client library would: (seconds from the first CONNECT sent to CONNECTED, tries).
    Each try's TCP connect is left out, as in ``raw_login``: a SYN the kernel dropped
    from a full accept queue comes again a second later, outside the broker's login."""
    start = time.monotonic()
    connecting = 0.0  # TCP connects, summed
    tries = 0
    while time.monotonic() - start - connecting < deadline + 5:
        tries += 1
        connect_s, _, data = raw_exchange(port, login, passcode)
        connecting += connect_s
        if data.startswith(b"CONNECTED\n"):
            return time.monotonic() - start - connecting, tries
        assert b"server busy" in data, f"{login}'s login was answered {data[:80]!r}"
        time.sleep(RETRY_PAUSE)  # the client's own pacing between tries, not a wait
    raise AssertionError(f"{login} not logged in within {deadline + 5:g} s ({tries} tries)")


def retrying_rounds(broker: BrokerProcess, users_file: Path,
                    prefix: str) -> list[tuple[float, int]]:
    """NEW_PASSWORD_ROUNDS times: alice gets a new password, never verified, and logs in
    with it, retrying after "server busy" (``retrying_login``: seconds, tries)."""
    logins = []
    for n in range(NEW_PASSWORD_ROUNDS):
        password = f"{prefix}-{n}"
        set_password(broker, users_file, password)
        logins.append(retrying_login(broker.port, ALICE, password, LOGIN_DEADLINE))
    return logins


def test_login_never_verified_retrying_gets_in_during_flood_of_unique_passcodes(
        broker: BrokerProcess, users_file: Path, floods: list[OneLoginFlood]) -> None:
    """A flood of wrong passcodes for alice from her own address, a new one on every
    socket (each tried once); round after round alice gets a new password (never
    verified) and a client retries it every RETRY_PAUSE s after "server busy": CONNECTED
    within LOGIN_DEADLINE of its first try (its passcode, tried again, is preferred to
    the flood's, each tried once: ``amqlite.auth.CheckGroup.rank``)."""
    flood = start_flood(floods, broker.port, lambda i: f"unique-{i}")
    logins = retrying_rounds(broker, users_file, "alice-retry")
    flood.stop()
    said = (f"alice retrying a new password each round, during a flood of "
            f"{flood.rate:.0f} unique passcodes/s: (s, tries) {logins}")
    print(said)
    assert flood.rate >= MIN_FLOOD_RATE, f"the flood ran at {flood.rate:.0f}/s only"
    assert max(t for t, _ in logins) <= LOGIN_DEADLINE, f"{said}\n{broker.log_tail()}"


#: Loopback addresses the flood comes from in the test below (one a flood thread), none
#: of them alice's (127.0.0.1): many clients of a botnet, not her NAT.
OTHER_ADDRESSES = ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5")


@pytest.mark.parametrize("passcodes", ["same", "unique"])
def test_login_never_verified_gets_in_during_flood_from_other_addresses(
        broker: BrokerProcess, users_file: Path, floods: list[OneLoginFlood],
        passcodes: str) -> None:
    """The issue's "from any address": a flood of wrong passcodes for alice from four
    other addresses (one repeated passcode, or a new one on every socket); round after
    round alice gets a new password (never verified) and logs in from 127.0.0.1, trying
    again after "server busy" as a client would: CONNECTED within LOGIN_DEADLINE of her
    first try."""
    flood = start_flood(floods, broker.port,
                        (lambda i: "wrong") if passcodes == "same" else (lambda i: f"u-{i}"),
                        sources=OTHER_ADDRESSES)
    logins = retrying_rounds(broker, users_file, "alice-elsewhere")
    flood.stop()
    said = (f"alice from 127.0.0.1 with a new password each round, during a flood of "
            f"{flood.rate:.0f} sockets/s from {len(OTHER_ADDRESSES)} other addresses "
            f"({passcodes}): (s, tries) {[(round(t, 3), k) for t, k in logins]}")
    print(said)
    assert flood.rate >= MIN_FLOOD_RATE, f"the flood ran at {flood.rate:.0f}/s only"
    assert max(t for t, _ in logins) <= LOGIN_DEADLINE, f"{said}\n{broker.log_tail()}"
