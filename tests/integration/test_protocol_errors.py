"""Protocol robustness: malformed frames, limits, heart-beats, receipts, connection caps, auth.

Bad input is written on raw sockets (stomp.py cannot produce it). The rule under test is
always the same: ERROR frame, closed connection, and a broker that keeps serving others.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from amqlite.server import ERROR_LINGER
from tests.helpers.broker_proc import (
    CLOSE_DEADLINE,
    BrokerFactory,
    BrokerProcess,
    Client,
    ClientPool,
    ConnectRefused,
    RawStomp,
    assert_broker_serves,
    assert_error_then_closed,
    format_frames,
    open_client,
    password_hash,
    unique,
)
from tests.helpers.poll import poll

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

MAX_FRAME_SIZE = 8192
MAX_HEADER_COUNT = 16
MAX_HEADER_LENGTH = 256
#: The server wants a client beat every second (when the client offers to beat at all).
SERVER_HEARTBEAT = "0,1000"


@pytest.fixture(scope="module")
def broker(module_factory: BrokerFactory) -> BrokerProcess:
    """A broker with small limits, so each violation is cheap to produce."""
    return module_factory.start(name="limits", env={
        "AMQLITE_MAX_FRAME_SIZE": str(MAX_FRAME_SIZE),
        "AMQLITE_MAX_HEADER_COUNT": str(MAX_HEADER_COUNT),
        "AMQLITE_MAX_HEADER_LENGTH": str(MAX_HEADER_LENGTH),
        "AMQLITE_HEARTBEAT": SERVER_HEARTBEAT,
    })


def send_frame_bytes(destination: str, headers: dict[str, str], body: bytes) -> bytes:
    """A SEND with content-length, built by hand so any limit can be exceeded."""
    head = "SEND\n" + f"destination:{destination}\n" + "".join(
        f"{k}:{v}\n" for k, v in headers.items())
    return head.encode() + f"content-length:{len(body)}\n\n".encode() + body + b"\x00"


MALFORMED = {
    "garbage-command": (True, b"GARBAGE\nfoo:bar\n\nbody\x00"),
    "bad-content-length": (True, b"SEND\ndestination:/queue/x\ncontent-length:abc\n\nhello\x00"),
    "negative-content-length": (True,
                                b"SEND\ndestination:/queue/x\ncontent-length:-5\n\nhello\x00"),
    "header-line-without-colon": (True, b"SEND\ndestination:/queue/x\nno-colon-here\n\nhi\x00"),
    "garbage-before-connect": (False, b"\x16\x03\x01\xff NOT STOMP\n\n\x00"),
}


@pytest.mark.parametrize(("connect_first", "frame"), MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_frame_gets_error_and_close(broker: BrokerProcess, connect_first: bool,
                                              frame: bytes) -> None:
    """A frame the codec cannot parse ends that connection, and only that one."""
    with RawStomp(broker.port) as raw:
        if connect_first:
            raw.connect()
        raw.send_raw(frame)
        assert_error_then_closed(raw, "malformed frame", None)  # the cause varies by case
    assert_broker_serves(broker.port)


def test_frame_within_limits_is_accepted(broker: BrokerProcess, clients: ClientPool) -> None:
    """The limits reject only what exceeds them: a large-but-legal frame goes through."""
    queue = f"/queue/{unique('big')}"
    consumer = clients(broker.port)
    consumer.subscribe(queue)
    body = "x" * (MAX_FRAME_SIZE // 2)
    headers = {f"h{i}": "v" * 50 for i in range(MAX_HEADER_COUNT // 2)}
    clients(broker.port).send(queue, body, headers)
    [msg] = consumer.listener.wait_messages(1)
    assert msg.body == body


def test_frame_over_max_frame_size_gets_error_and_close(broker: BrokerProcess) -> None:
    """A frame over max_frame_size must not be buffered without bound: ERROR, close."""
    with RawStomp(broker.port) as raw:
        raw.connect()
        raw.send_raw(send_frame_bytes("/queue/big", {}, b"x" * (MAX_FRAME_SIZE + 4000)))
        assert_error_then_closed(raw, "oversized frame", "frame too large")
    assert_broker_serves(broker.port)


def test_too_many_headers_gets_error_and_close(broker: BrokerProcess) -> None:
    """More headers than max_header_count is an attack, not a message: ERROR, close."""
    headers = {f"x-h{i}": "v" for i in range(MAX_HEADER_COUNT + 4)}
    with RawStomp(broker.port) as raw:
        raw.connect()
        raw.send_raw(send_frame_bytes("/queue/many", headers, b"hi"))
        assert_error_then_closed(raw, "too many headers", "too many headers")
    assert_broker_serves(broker.port)


def test_header_too_long_gets_error_and_close(broker: BrokerProcess) -> None:
    """A header line over max_header_length: ERROR, close."""
    with RawStomp(broker.port) as raw:
        raw.connect()
        raw.send_raw(send_frame_bytes("/queue/long", {"x-long": "v" * (MAX_HEADER_LENGTH * 4)},
                                      b"hi"))
        assert_error_then_closed(raw, "header too long", "header too long")
    assert_broker_serves(broker.port)


#: A frame the codec refuses, and what a client goes on writing behind it: more than the
#: broker reads at once, so bytes are still unread when its ERROR goes out.
BAD_LENGTH = b"SEND\ndestination:/queue/x\ncontent-length:abc\n\nhello\x00"
STILL_SENDING = 4 * 2**20


def test_error_then_fin_while_the_client_is_still_sending(broker: BrokerProcess) -> None:
    """The ERROR is followed by the broker's FIN, not a reset, though the client had sent
    more than the broker read: what it sends on is read and dropped (a lingering close),
    so a client whose system drops unread data on a reset (Windows) still gets its ERROR."""
    with RawStomp(broker.port) as raw:
        raw.connect()
        sent: list[bool] = []
        sender = threading.Thread(
            target=lambda: sent.append(raw.send_raw(BAD_LENGTH + b"x" * STILL_SENDING)))
        sender.start()
        assert_error_then_closed(raw, "bad content-length", "invalid content-length")
        assert not raw.reset, "the broker reset the connection after its ERROR"
        sender.join(CLOSE_DEADLINE)
        assert sent == [True], "the broker stopped reading before the client was done"
    assert_broker_serves(broker.port)


def test_a_lingering_socket_is_dropped_after_error_linger(broker: BrokerProcess) -> None:
    """A client that neither stops writing nor closes after its ERROR does not keep the
    socket: the broker drops it ERROR_LINGER after the ERROR (then the client's writes
    fail), not at once."""
    with RawStomp(broker.port) as raw:
        raw.connect()
        raw.send_raw(BAD_LENGTH)
        assert_error_then_closed(raw, "bad content-length", "invalid content-length")
        _, took = poll(lambda: not raw.send_raw(b"x" * 1024),
                       timeout=ERROR_LINGER + CLOSE_DEADLINE,
                       what="the broker to drop the socket it lingered on")
        assert took > ERROR_LINGER / 2, f"dropped {took:.2f}s after the ERROR, no lingering"
    assert_broker_serves(broker.port)


def test_silent_client_disconnected_after_missed_heartbeats(broker: BrokerProcess) -> None:
    """A client that promised a beat every second and then goes silent is dropped after
    about twice the interval: dead clients must not hold resources."""
    with RawStomp(broker.port) as raw:
        connected = raw.connect(heart_beat="1000,0")
        assert connected.headers.get("heart-beat", "").replace(" ", "") == SERVER_HEARTBEAT
        start = time.monotonic()
        closed, frames = raw.wait_closed(6.0)
        elapsed = time.monotonic() - start
    assert closed, f"silent client still connected after 6s ({format_frames(frames)})"
    assert 1.0 <= elapsed <= 3.5, f"dropped after {elapsed:.2f}s, expected about 2s"


def test_heartbeating_client_stays_connected(broker: BrokerProcess, clients: ClientPool) -> None:
    """stomp.py beating every second is kept well past the silent client's cut-off."""
    client = clients(broker.port, heartbeats=(1000, 0))
    assert client.listener.holds_for(lambda: not client.listener.disconnected, 4.5), \
        "broker dropped a client that kept beating"
    queue = f"/queue/{unique('hb')}"
    client.subscribe(queue)
    client.send(queue, "after-beats")
    assert client.listener.wait_messages(1)[0].body == "after-beats"


def test_receipts_for_subscribe_and_disconnect(broker: BrokerProcess) -> None:
    """Any frame with `receipt` is confirmed; DISCONNECT's receipt comes before the close."""
    with RawStomp(broker.port) as raw:
        raw.connect()
        raw.send_frame("SUBSCRIBE", {"destination": f"/queue/{unique('r')}", "id": "s1",
                                     "ack": "auto", "receipt": "sub-receipt"})
        assert raw.expect("RECEIPT", "SUBSCRIBE").headers.get("receipt-id") == "sub-receipt"
        raw.send_frame("DISCONNECT", {"receipt": "bye-receipt"})
        assert raw.expect("RECEIPT", "DISCONNECT").headers.get("receipt-id") == "bye-receipt"
        closed, rest = raw.wait_closed(CLOSE_DEADLINE)
        assert closed and not rest, f"after DISCONNECT: closed={closed} {format_frames(rest)}"


def open_with_retry(port: int, timeout: float) -> Client:
    """Connect, retrying while the broker may still count a just-closed socket."""
    def attempt() -> Client | ConnectRefused:
        try:
            return open_client(port)
        except ConnectRefused as refused:
            return refused
    client, _ = poll(attempt, lambda got: isinstance(got, Client), timeout=timeout,
                     what=f"a connection slot on port {port}", interval=0.05)
    return client  # type: ignore[return-value]


def test_connection_over_max_connections_gets_error(broker_factory: BrokerFactory,
                                                    clients: ClientPool) -> None:
    """With max_connections=3 the 4th client gets ERROR and a closed socket; once a slot
    frees up, a new client gets in."""
    node = broker_factory.start(name="maxconn", env={"AMQLITE_MAX_CONNECTIONS": "3"})
    held = [open_with_retry(node.port, 3) for _ in range(3)]
    clients.clients.extend(held)

    with RawStomp(node.port) as raw:
        frame = raw.read_frame(timeout=1.0)  # a broker may refuse before CONNECT
        frames = [frame] if frame else []
        if not raw.closed:
            raw.send_frame("CONNECT", {"accept-version": "1.2", "host": "localhost"})
            closed, more = raw.wait_closed(CLOSE_DEADLINE)
            frames += more
        else:
            closed = True
    assert [f.command for f in frames][:1] == ["ERROR"], format_frames(frames)
    assert "CONNECTED" not in [f.command for f in frames], format_frames(frames)
    assert closed, "4th connection left open"

    held[0].close()
    late = open_with_retry(node.port, 5)
    clients.clients.append(late)
    queue = f"/queue/{unique('slot')}"
    late.subscribe(queue)
    late.send(queue, "got-a-slot")
    assert late.listener.wait_messages(1)[0].body == "got-a-slot"


@pytest.fixture(scope="module")
def auth_broker(module_factory: BrokerFactory, tmp_path_factory: pytest.TempPathFactory,
                ) -> BrokerProcess:
    """A broker requiring login alice / s3cret from a TOML users file."""
    users: Path = tmp_path_factory.mktemp("auth") / "users.toml"
    users.write_text(f'[users]\nalice = "{password_hash("s3cret")}"\n')
    return module_factory.start(name="auth", env={"AMQLITE_USERS_FILE": str(users)})


def test_auth_wrong_passcode_gets_error_and_close(auth_broker: BrokerProcess) -> None:
    """A known login with the wrong passcode is refused with ERROR and the socket closed."""
    with RawStomp(auth_broker.port) as raw:
        raw.send_frame("CONNECT", {"accept-version": "1.2", "host": "localhost",
                                   "login": "alice", "passcode": "wrong"})
        assert_error_then_closed(raw, "wrong passcode", None)


def test_auth_missing_credentials_refused(auth_broker: BrokerProcess,
                                          clients: ClientPool) -> None:
    """No credentials, a login without passcode, or an unknown login: all refused."""
    with pytest.raises(ConnectRefused):
        clients(auth_broker.port)
    with pytest.raises(ConnectRefused):
        clients(auth_broker.port, username="alice")
    with pytest.raises(ConnectRefused):
        clients(auth_broker.port, username="mallory", passcode="s3cret")


def test_auth_right_passcode_connects(auth_broker: BrokerProcess, clients: ClientPool) -> None:
    """The users file's hash (from `amqlite passwd`) admits the right passcode."""
    client = clients(auth_broker.port, username="alice", passcode="s3cret")
    queue = f"/queue/{unique('authed')}"
    client.subscribe(queue)
    client.send(queue, "welcome")
    assert client.listener.wait_messages(1)[0].body == "welcome"
