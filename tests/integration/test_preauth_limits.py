"""Limits before authentication (issue 12, class 5), against real broker processes.

A client that has not logged in yet must cost the broker little and bounded: a few KiB of
buffer, a place in a bounded, fair queue of password checks that is dropped when its socket
goes, a bounded number of sockets, and a bounded time. A client that is connected must not
be able to hold a frame open forever by trickling it. Traffic no well-behaved client makes
is written on raw sockets.
"""

from __future__ import annotations

import random
import re
import select
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.broker_proc import (
    CLOSE_DEADLINE,
    HOST,
    BrokerFactory,
    BrokerProcess,
    ClientPool,
    RawStomp,
    assert_broker_serves,
    assert_error_then_closed,
    format_frames,
    password_hash,
    unique,
)
from tests.helpers.poll import poll

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

LOGIN, PASSCODE = "alice", "s3cret"
#: The brief's promise: a valid login succeeds within a second during a flood.
LOGIN_DEADLINE = 1.0
#: Bad CONNECTs in flight during the flood (below the default unauthenticated cap, 250).
FLOOD_SOCKETS = 200


@pytest.fixture(scope="module")
def users_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    users = tmp_path_factory.mktemp("preauth") / "users.toml"
    users.write_text(f'[users]\n{LOGIN} = "{password_hash(PASSCODE)}"\n')
    return users


@pytest.fixture
def auth_broker(broker_factory: BrokerFactory, users_file: Path) -> BrokerProcess:
    """A fresh broker per test: a flood must not leave a queue behind for the next test."""
    return broker_factory.start(name="preauth", env={"AMQLITE_USERS_FILE": str(users_file)})


def connect_bytes(login: str, passcode: str, extra: dict[str, str] | None = None) -> bytes:
    headers = {"accept-version": "1.2", "host": "localhost", "heart-beat": "0,0",
               "login": login, "passcode": passcode, **(extra or {})}
    return ("CONNECT\n" + "".join(f"{k}:{v}\n" for k, v in headers.items()) + "\n").encode() \
        + b"\x00"


def answered(sock: socket.socket) -> bool:
    """True if the broker wrote to or closed this socket (checked without waiting)."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


def vm_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


class Flood:
    """Raw sockets that each sent a CONNECT with a random login and passcode."""

    def __init__(self, port: int, count: int) -> None:
        self.raws: list[RawStomp] = []
        rng = random.Random(12)
        for _ in range(count):
            raw = RawStomp(port)
            raw.send_raw(connect_bytes(f"u{rng.getrandbits(40):x}", f"p{rng.getrandbits(64):x}"))
            self.raws.append(raw)

    @property
    def socks(self) -> list[socket.socket]:
        return [raw.sock for raw in self.raws]

    def wait_first_answer(self, timeout: float) -> bool:
        """Wait until the broker answered one of them: its checks are under way."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            readable, _, _ = select.select(self.socks, [], [], 0.1)
            if readable:
                return True
        return False

    def close_some(self, every: int) -> None:
        """Close every `every`-th socket at once (sockets that give up mid-check)."""
        for raw in self.raws[::every]:
            raw.close()
        self.raws = [r for i, r in enumerate(self.raws) if i % every]

    def unanswered(self) -> int:
        return sum(1 for s in self.socks if not answered(s))

    def close(self) -> None:
        for raw in self.raws:
            raw.close()


@pytest.fixture
def flood_factory() -> Iterator[list[Flood]]:
    floods: list[Flood] = []
    yield floods
    for flood in floods:
        flood.close()


def test_valid_login_within_a_second_during_bad_connect_flood(
        auth_broker: BrokerProcess, clients: ClientPool, flood_factory: list[Flood]) -> None:
    """Hundreds of bad CONNECTs in flight (a third of them closing at once) delay a valid
    login by a couple of password checks at most: it gets CONNECTED within a second."""
    flood = Flood(auth_broker.port, FLOOD_SOCKETS)
    flood_factory.append(flood)
    assert flood.wait_first_answer(10.0), "no bad CONNECT was answered within 10s"
    flood.close_some(every=3)

    start = time.monotonic()
    client = clients(auth_broker.port, username=LOGIN, passcode=PASSCODE, timeout=10.0)
    elapsed = time.monotonic() - start
    still_waiting = flood.unanswered()

    assert elapsed <= LOGIN_DEADLINE, f"valid login took {elapsed:.2f}s during the flood"
    # The login really overtook the flood: bad CONNECTs were still waiting for a check
    # (at most MAX_PENDING_PER_PEER from one address wait; older ones got "server busy").
    assert still_waiting >= 5, (
        f"only {still_waiting} of {len(flood.raws)} bad CONNECTs were still pending")
    queue = f"/queue/{unique('flood')}"
    client.subscribe(queue)
    client.send(queue, "logged-in")
    assert client.listener.wait_messages(1)[0].body == "logged-in"


def test_bad_logins_are_refused_with_error(auth_broker: BrokerProcess,
                                           flood_factory: list[Flood]) -> None:
    """Every bad CONNECT of a small flood ends with an ERROR (authentication failed, or
    server busy when dropped from a full queue) and a closed socket, never CONNECTED."""
    flood = Flood(auth_broker.port, 20)
    flood_factory.append(flood)
    for raw in flood.raws:
        closed, frames = raw.wait_closed(30.0)
        assert closed and frames, f"bad CONNECT: closed={closed} {format_frames(frames)}"
        assert [f.command for f in frames] == ["ERROR"], format_frames(frames)
        assert frames[0].headers.get("message") in ("authentication failed", "server busy")


def test_check_of_a_closed_socket_never_runs(auth_broker: BrokerProcess) -> None:
    """Sockets that send a bad CONNECT and close at once, while other checks are ahead of
    them, are never hashed: the broker reports them dropped unrun, and the sockets that
    stayed all get their ERROR."""
    socks = [socket.create_connection((HOST, auth_broker.port), timeout=30) for _ in range(31)]
    first, doomed, kept = socks[0], socks[1:21], socks[21:]
    payloads = [connect_bytes("first", "x")]
    payloads += [connect_bytes(f"doomed{i}", "x") for i in range(len(doomed))]
    payloads += [connect_bytes(f"kept{i}", "x") for i in range(len(kept))]
    for sock, payload in zip(socks, payloads, strict=True):  # all within a millisecond
        sock.sendall(payload)
    for sock in doomed:
        sock.close()
    try:
        for sock in [first, *kept]:
            assert _peek(sock).startswith(b"ERROR\n"), "a bad CONNECT got no ERROR"
    finally:
        for sock in [first, *kept]:
            sock.close()
    # The newer, kept sockets go first (newest first): the closed ones were still waiting.
    try:
        poll(lambda: dropped_unrun(auth_broker), lambda n: n >= len(doomed) - 2,
             timeout=CLOSE_DEADLINE,
             what=f"{len(doomed) - 2} of {len(doomed)} closed sockets' checks reported "
                  "dropped unrun")
    except AssertionError as e:
        raise AssertionError(f"{e}\n{auth_broker.log_tail()}") from None


def dropped_unrun(broker: BrokerProcess) -> int:
    """Sum of the broker's "login checks: ... N dropped unrun" summary lines."""
    return sum(int(m.group(1)) for m in re.finditer(r"login checks: \d+ run, (\d+) dropped unrun",
                                                    broker.log_text()))


def test_pipelined_frames_behind_pending_connect_do_not_grow_rss(
        auth_broker: BrokerProcess, flood_factory: list[Flood]) -> None:
    """Clients that write frames as fast as they can behind a CONNECT whose check is queued
    (behind a flood) cost the broker no memory: what follows the CONNECT stays unparsed
    bytes, and past the handshake allowance the client gets ERROR and is closed."""
    flood = Flood(auth_broker.port, 60)  # keeps the checking thread busy for a while
    flood_factory.append(flood)
    hwm_before = vm_kib(auth_broker.pid, "VmHWM")
    body = b"x" * 65536
    frame = (f"SEND\ndestination:/queue/{unique('pipe')}\ncontent-length:{len(body)}\n\n"
             .encode() + body + b"\x00")
    pushers = []
    for i in range(4):
        sock = socket.create_connection((HOST, auth_broker.port), timeout=5)
        sock.sendall(connect_bytes(LOGIN, "wrong") + frame[:8192])
        if i % 2:
            # Let the broker take CONNECT alone first (a pause, not a synchronisation: either
            # order is legal), so these pushers' frames arrive behind a pending check.
            select.select([sock], [], [], 0.3)
        sock.setblocking(False)
        pushers.append(sock)
    pushed = 0
    deadline = time.monotonic() + 3.0
    live = list(pushers)
    while live and time.monotonic() < deadline and pushed < 400 * 2**20:
        _, writable, _ = select.select([], live, [], 0.2)
        for sock in writable:
            try:
                pushed += sock.send(frame)
            except OSError:  # the broker refused and closed it: as it should
                live.remove(sock)
    rss_growth = vm_kib(auth_broker.pid, "VmHWM") - hwm_before
    for sock in pushers:
        sock.setblocking(True)
        sock.settimeout(30.0)
        answer = _peek(sock)
        assert answer.startswith(b"ERROR\n"), f"pending CONNECT answered {answer[:200]!r}"
        sock.close()
    assert rss_growth < 32 * 1024, (
        f"broker peak RSS grew {rss_growth} KiB while clients pushed {pushed >> 20} MiB "
        "behind pending CONNECTs")
    assert_broker_serves_with_login(auth_broker.port)


def _peek(sock: socket.socket) -> bytes:
    """What the broker wrote first (waits for it up to the socket's timeout)."""
    try:
        return sock.recv(65536, socket.MSG_PEEK)
    except OSError:
        return b""


def assert_broker_serves_with_login(port: int) -> None:
    assert_broker_serves(port, username=LOGIN, passcode=PASSCODE, timeout=30.0)


def test_frames_pipelined_behind_connect_are_processed_after_login(
        auth_broker: BrokerProcess, flood_factory: list[Flood]) -> None:
    """CONNECT, SUBSCRIBE and SENDs written at once, while the login waits behind other
    checks: after CONNECTED every frame is processed, in order, decoded as STOMP 1.2
    (the escaped colon in a header proves the negotiated version was used)."""
    flood = Flood(auth_broker.port, 30)
    flood_factory.append(flood)
    queue = f"/queue/{unique('piped')}"
    with RawStomp(auth_broker.port, timeout=30.0) as raw:
        data = connect_bytes(LOGIN, PASSCODE)
        data += f"SUBSCRIBE\ndestination:{queue}\nid:s1\nack:auto\nreceipt:sub\n\n\x00".encode()
        for i in range(5):
            data += (f"SEND\ndestination:{queue}\nx-tag:a\\cb{i}\nreceipt:r{i}\n\n"
                     f"body-{i}\x00").encode()
        raw.send_raw(data)
        frames = []
        while len(frames) < 1 + 1 + 5 + 5:
            frame = raw.read_frame(timeout=30.0)
            assert frame is not None, f"stopped after {format_frames(frames)}"
            frames.append(frame)
    assert frames[0].command == "CONNECTED", format_frames(frames)
    assert frames[0].headers.get("version") == "1.2"
    assert not [f for f in frames if f.command == "ERROR"], format_frames(frames)
    receipts = {f.headers["receipt-id"] for f in frames if f.command == "RECEIPT"}
    assert receipts == {"sub", *(f"r{i}" for i in range(5))}
    messages = [f for f in frames if f.command == "MESSAGE"]
    assert [m.body for m in messages] == [f"body-{i}".encode() for i in range(5)]
    assert [m.headers.get("x-tag") for m in messages] == \
        [f"a\\cb{i}" for i in range(5)]  # re-escaped on the way out: the value was a:b<i>


# -- handshake bytes, timeouts, socket caps (no users file needed) -------------------------

HANDSHAKE_BYTES = 4096
FRAME_TIMEOUT = 2.0
CONNECT_TIMEOUT = 2.0
MAX_UNAUTHENTICATED = 4


@pytest.fixture(scope="module")
def limits_broker(module_factory: BrokerFactory) -> BrokerProcess:
    return module_factory.start(name="preauth-limits", env={
        "AMQLITE_MAX_HANDSHAKE_BYTES": str(HANDSHAKE_BYTES),
        "AMQLITE_FRAME_TIMEOUT": str(FRAME_TIMEOUT),
        "AMQLITE_CONNECT_TIMEOUT": str(CONNECT_TIMEOUT),
    })


def test_partial_frame_before_connect_over_handshake_limit(limits_broker: BrokerProcess) -> None:
    """A CONNECT that keeps growing past the handshake allowance (far below max_frame_size)
    gets ERROR and close, without waiting for its end."""
    with RawStomp(limits_broker.port) as raw:
        raw.send_raw(b"CONNECT\naccept-version:1.2\nx-pad:" + b"p" * (HANDSHAKE_BYTES + 100))
        assert_error_then_closed(raw, "oversized handshake", "too much data before CONNECTED")
    assert_broker_serves(limits_broker.port)


def test_connect_within_handshake_limit_is_accepted(limits_broker: BrokerProcess) -> None:
    """The allowance rejects only what exceeds it: a 3 KiB CONNECT is fine."""
    with RawStomp(limits_broker.port) as raw:
        raw.connect(extra={"x-pad": "p" * (HANDSHAKE_BYTES - 1000)})


def test_big_frame_pipelined_behind_connect_without_login_check(
        limits_broker: BrokerProcess) -> None:
    """Without a users file CONNECT is answered at once, so nothing waits behind it: a
    frame twice the handshake allowance written together with CONNECT is processed."""
    queue = f"/queue/{unique('nocheck')}"
    body = b"b" * (2 * HANDSHAKE_BYTES)
    with RawStomp(limits_broker.port) as raw:
        raw.send_raw(connect_bytes("", "")
                     + f"SUBSCRIBE\ndestination:{queue}\nid:s\nack:auto\n\n\x00".encode()
                     + f"SEND\ndestination:{queue}\ncontent-length:{len(body)}\n\n".encode()
                     + body + b"\x00")
        frames = [raw.read_frame(), raw.read_frame()]
    assert [f.command if f else None for f in frames] == ["CONNECTED", "MESSAGE"], \
        format_frames(f for f in frames if f)
    assert frames[1] is not None and frames[1].body == body


def test_socket_without_connect_closed_after_connect_timeout(
        limits_broker: BrokerProcess) -> None:
    """A socket that never completes CONNECT is closed with an ERROR after connect_timeout."""
    with RawStomp(limits_broker.port) as raw:
        start = time.monotonic()
        raw.send_raw(b"CONN")
        assert_error_then_closed(raw, "idle pre-CONNECT socket", "handshake timeout",
                                 timeout=CONNECT_TIMEOUT + CLOSE_DEADLINE)
        elapsed = time.monotonic() - start
    assert CONNECT_TIMEOUT * 0.9 <= elapsed <= CONNECT_TIMEOUT + CLOSE_DEADLINE, elapsed


def test_trickling_connected_client_closed_after_frame_timeout(
        limits_broker: BrokerProcess) -> None:
    """Heart-beat 0,0 and a byte every 0.3 s: the frame never completes in frame_timeout,
    so the client is closed with an ERROR, within the bound."""
    frame = f"SEND\ndestination:/queue/{unique('trickle')}\n\nnever finished".encode()
    with RawStomp(limits_broker.port) as raw:
        raw.connect(heart_beat="0,0")
        start = time.monotonic()
        give_up = start + FRAME_TIMEOUT + 3.0
        for i in range(len(frame) * 10):  # far longer than the bound
            if time.monotonic() > give_up or not raw.send_raw(
                    frame[i % len(frame):i % len(frame) + 1]):
                break
            # Pace the trickle by waiting for the broker's answer (ERROR or close).
            readable, _, _ = select.select([raw.sock], [], [], 0.3)
            if readable:
                break
        assert_error_then_closed(raw, "trickler", "frame timeout")
        elapsed = time.monotonic() - start
    assert FRAME_TIMEOUT <= elapsed <= FRAME_TIMEOUT + 3.0, f"closed after {elapsed:.2f}s"


def test_idle_connected_client_is_not_a_trickler(limits_broker: BrokerProcess,
                                                 clients: ClientPool) -> None:
    """Silence between frames is not a slow frame: a connected client with heart-beat 0,0
    that sends nothing for longer than frame_timeout stays connected."""
    client = clients(limits_broker.port)
    assert client.listener.holds_for(lambda: not client.listener.disconnected,
                                     FRAME_TIMEOUT * 2), "idle client was dropped"
    queue = f"/queue/{unique('idle')}"
    client.subscribe(queue)
    client.send(queue, "after-silence")
    assert client.listener.wait_messages(1)[0].body == "after-silence"


def test_unauthenticated_sockets_are_capped(broker_factory: BrokerFactory,
                                            clients: ClientPool) -> None:
    """With max_unauthenticated=4, ten sockets that never log in leave only the four newest
    open (the older get ERROR "server busy"), while clients that connect keep coming in
    beyond that number."""
    node = broker_factory.start(name="unauth-cap", env={
        "AMQLITE_MAX_CONNECTIONS": "20",
        "AMQLITE_MAX_UNAUTHENTICATED": str(MAX_UNAUTHENTICATED),
    })
    idle = [RawStomp(node.port) for _ in range(10)]
    try:
        for raw in idle[:-MAX_UNAUTHENTICATED]:
            assert_error_then_closed(raw, "oldest unauthenticated socket", "server busy")
        for raw in idle[-MAX_UNAUTHENTICATED:]:
            assert not answered(raw.sock), "one of the newest idle sockets was closed"
        connected = [clients(node.port) for _ in range(MAX_UNAUTHENTICATED + 2)]
        queue = f"/queue/{unique('cap')}"
        connected[-1].subscribe(queue)
        connected[0].send(queue, "past-the-cap")
        assert connected[-1].listener.wait_messages(1)[0].body == "past-the-cap"
    finally:
        for raw in idle:
            raw.close()
