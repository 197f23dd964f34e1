"""STOMP over WebSocket against real broker processes, with aiohttp's WebSocket client
and stomp.py's WSConnection (issue 24): subprotocol choice, frames per message, text and
binary, heart-beats, limits and pre-login budgets, Origin/Host refusals, logins,
authorization, flow control, wss://, and the published URLs."""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import stomp

from amqlite.websocket import LINGER_SECONDS, OPCODE_BINARY, OPCODE_CLOSE, OPCODE_TEXT
from amqlite.wire import CLUSTER_UPDATE_RECEIPT, CLUSTER_URIS_HEADER
from amqlite.wsframes import Kind
from tests.helpers.broker_proc import (
    HOST,
    WAIT,
    BrokerFactory,
    BrokerProcess,
    ClientPool,
    RawStomp,
    password_hash,
    unique,
)
from tests.helpers.cluster import amqlite, cluster_json, ok
from tests.helpers.mgmt import Api
from tests.helpers.poll import poll
from tests.helpers.servers import free_port
from tests.helpers.tls import make_pki
from tests.helpers.ws import (
    RawWs,
    connect_frame,
    frame_bytes,
    refused_status,
    upgrade_request,
    ws_open,
    ws_url,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

LOGIN, PASSCODE = "alice", "alice-ws-Secret"
READER, READER_PASS = "carol", "carol-ws-Secret"
#: Small enough to exceed cheaply; big enough for every frame a test sends on purpose.
MAX_FRAME = 16 * 1024
HEARTBEAT_MS = 300
MIB = 1024 * 1024
#: How long a paused producer must stay blocked to count as held back (a negative).
FLOW_HOLD = 2.0


def users_toml(path: Path) -> Path:
    path.write_text(f"""
[users]
{LOGIN} = "{password_hash(PASSCODE)}"
{READER} = "{password_hash(READER_PASS)}"

[groups]
apps = ["{LOGIN}"]
readers = ["{READER}"]

[[authorization]]
destination = "/queue/ws.>"
read = ["apps", "readers"]
write = ["apps"]
admin = ["apps"]
auto_create = true
""")
    return path


def start_ws(factory: BrokerFactory, name: str, *, env: dict[str, str] | None = None,
             extra: list[str] | None = None, **kwargs: object) -> BrokerProcess:
    """A serving broker with a WebSocket listener (its port in ``broker.ws_port``)."""
    ws_port, http = free_port(), free_port()
    b = factory.start(name=name, env=env or {}, extra_args=[
        "--ws-bind", f"{HOST}:{ws_port}", "--http-bind", f"{HOST}:{http}", *(extra or [])],
        **kwargs)
    b.ws_port = ws_port  # type: ignore[attr-defined]
    b.http = f"http://{HOST}:{http}"  # type: ignore[attr-defined]
    return b


@pytest.fixture(scope="module")
def broker(module_factory: BrokerFactory, tmp_path_factory: pytest.TempPathFactory,
           ) -> BrokerProcess:
    """Logins and authorization on, small frames, fast heart-beats."""
    users = users_toml(tmp_path_factory.mktemp("wsusers") / "users.toml")
    return start_ws(module_factory, "wsb", env={
        "AMQLITE_USERS_FILE": str(users), "AMQLITE_MAX_FRAME_SIZE": str(MAX_FRAME),
        "AMQLITE_HEARTBEAT": f"{HEARTBEAT_MS},{HEARTBEAT_MS}"})


def url(b: BrokerProcess) -> str:
    return ws_url(b.ws_port)  # type: ignore[attr-defined]


def run(coro: object) -> object:
    return asyncio.run(coro)  # type: ignore[arg-type]


async def logged_in(b: BrokerProcess, protocols: tuple[str, ...] = ("v12.stomp",),
                    login: str = LOGIN, passcode: str = PASSCODE):  # type: ignore[no-untyped-def]
    client = await ws_open(url(b), protocols=protocols)
    await client.send(connect_frame(login, passcode))
    connected = await client.frame("CONNECTED")
    return client, connected


# --------------------------------------------------------------------------- subprotocols

@pytest.mark.parametrize(("offered", "chosen", "version"), [
    (("v10.stomp", "v12.stomp", "v11.stomp"), "v12.stomp", "1.2"),  # the best, not the first
    (("v11.stomp", "v10.stomp"), "v11.stomp", "1.1"),  # caps CONNECT's 1.2
    (("v10.stomp",), "v10.stomp", "1.0"),
    (("mqtt", "v11.stomp"), "v11.stomp", "1.1"),  # unknown ones skipped
    ((), None, "1.2"),  # none offered: no header, CONNECT's accept-version decides
    (("mqtt",), None, "1.2"),  # never one the client did not offer
])
def test_subprotocol_is_the_best_offered(broker: BrokerProcess, offered: tuple[str, ...],
                                         chosen: str | None, version: str) -> None:
    async def go() -> None:
        client, connected = await logged_in(broker, offered)
        assert client.protocol == chosen
        assert connected.headers["version"] == version
        await client.close()
    run(go())


# ----------------------------------------------------------------- frames per message

def test_several_frames_per_message_text_and_binary(broker: BrokerProcess) -> None:
    """One text message carrying SUBSCRIBE and three SENDs; one binary message with a
    body that is no UTF-8, which comes back in a binary message; a frame split over two
    messages; every receipt and message arrives."""
    q = f"/queue/ws.{unique('multi')}"

    async def go() -> None:
        client, _ = await logged_in(broker)
        batch = frame_bytes("SUBSCRIBE", {"id": "1", "destination": q, "receipt": "s"}) + b"".join(
            frame_bytes("SEND", {"destination": q, "receipt": f"r{i}", "persistent": "true"},
                        f"text {i}".encode()) for i in range(3))
        await client.send(batch)
        binary = b"\xff\xfe\x00\x80 not utf-8"
        await client.send(frame_bytes("SEND", {"destination": q, "receipt": "rb",
                                               "content-length": str(len(binary))}, binary),
                          binary=True)
        split = frame_bytes("SEND", {"destination": q, "receipt": "rs"}, b"split in two")
        await client.send(split[:20])
        await client.send(split[20:])
        assert await client.until(lambda: {f.headers.get("receipt-id") for f in client.frames
                                           if f.command == "RECEIPT"} >= {
            "s", "r0", "r1", "r2", "rb", "rs"})
        assert await client.until(lambda: len([f for f in client.frames
                                               if f.command == "MESSAGE"]) == 5)
        bodies = [f.body for f in client.frames if f.command == "MESSAGE"]
        assert bodies == [b"text 0", b"text 1", b"text 2", binary, b"split in two"]
        assert aiohttp.WSMsgType.BINARY in client.kinds  # the non-UTF-8 MESSAGE
        assert aiohttp.WSMsgType.TEXT in client.kinds  # the rest, as the client speaks
        await client.close()
    run(go())


# ------------------------------------------------------------------------ heart-beats

def test_eol_messages_are_heartbeats(broker: BrokerProcess) -> None:
    """EOL-only messages keep a connection that promised heart-beats open past twice
    the interval; the broker's own arrive as EOL-only messages; silence closes it."""
    async def go() -> None:
        client = await ws_open(url(broker), protocols=("v12.stomp",))
        beat = f"{HEARTBEAT_MS},{HEARTBEAT_MS}"
        await client.send(connect_frame(LOGIN, PASSCODE, heartbeat=beat))
        connected = await client.frame("CONNECTED")
        assert connected.headers["heart-beat"] == beat
        loop = asyncio.get_running_loop()
        end = loop.time() + 6 * HEARTBEAT_MS / 1000
        while loop.time() < end:
            await client.send(b"\n")
            await client.pump(HEARTBEAT_MS / 3000)
        assert not client.closed, "closed although the client sent heart-beats"
        assert client.heartbeats >= 2, "the broker sent no EOL heart-beats"
        assert await client.wait_closed(20 * HEARTBEAT_MS / 1000), "silence was not noticed"
        assert any(f.command == "ERROR" and "heart-beat" in f.headers.get("message", "")
                   for f in client.frames)
        await client.close()
    run(go())


# --------------------------------------------------------------------- limits, logins

def test_frame_over_the_limit_is_an_error(broker: BrokerProcess) -> None:
    async def go() -> None:
        client, _ = await logged_in(broker)
        big = frame_bytes("SEND", {"destination": "/queue/ws.big"}, b"x" * (2 * MAX_FRAME))
        await client.send(big, binary=True)
        error = await client.frame("ERROR")
        assert "too large" in error.headers["message"] or "size" in error.headers["message"]
        assert await client.wait_closed()
        await client.close()
    run(go())


#: A frame the codec refuses, and what a client goes on sending behind it (binary frames
#: of 64 KiB): more than the broker reads at once, so bytes are unread at its ERROR.
BAD_LENGTH = b"SEND\ndestination:/queue/ws.x\ncontent-length:abc\n\nhello\x00"
STILL_SENDING = [b"x" * 65536] * 64


def raw_logged_in(b: BrokerProcess) -> RawWs:
    raw = RawWs(b.ws_port)  # type: ignore[attr-defined]
    raw.send(OPCODE_TEXT, connect_frame(LOGIN, PASSCODE))
    assert b"CONNECTED" in b"".join(i.payload for i in raw.read_until(Kind.DATA))
    return raw


def test_error_then_the_closing_handshake_while_the_client_is_still_sending(
        broker: BrokerProcess) -> None:
    """After an ERROR the broker sends its close frame and reads (and drops) what the
    client still sends until the client's own close frame (RFC 6455's closing
    handshake); then its FIN, not a reset that could destroy the ERROR unread."""
    raw = raw_logged_in(broker)
    try:
        sent: list[bool] = []
        sender = threading.Thread(target=lambda: sent.append(all(
            raw.send(OPCODE_BINARY, data) for data in [BAD_LENGTH, *STILL_SENDING])))
        sender.start()
        items = raw.read_until(Kind.CLOSE)
        assert b"ERROR\nmessage:invalid content-length" in b"".join(i.payload for i in items)
        assert items[-1].kind is Kind.CLOSE and items[-1].code == 1000, items[-1:]
        sender.join(WAIT)
        assert sent == [True], "the broker stopped reading before the client's close frame"
        assert not raw.ended, "the broker closed the socket before the client's close frame"
        raw.send(OPCODE_CLOSE, (1000).to_bytes(2, "big"))
        raw.read_until(Kind.CLOSE)  # nothing more comes: the end of the stream
        assert raw.ended and not raw.reset, "the socket ended in a reset, not a FIN"
    finally:
        raw.close()


def test_a_client_without_its_close_frame_is_dropped_after_the_linger(
        broker: BrokerProcess) -> None:
    """A client that never answers the close frame does not keep the socket: the broker
    drops it LINGER_SECONDS after the ERROR (then the client's writes fail), not at once."""
    raw = raw_logged_in(broker)
    try:
        raw.send(OPCODE_BINARY, BAD_LENGTH)
        assert raw.read_until(Kind.CLOSE)[-1].kind is Kind.CLOSE
        _, took = poll(lambda: not raw.send(OPCODE_BINARY, b"x" * 1024),
                       timeout=LINGER_SECONDS + WAIT, what="the broker to drop the socket")
        assert took > LINGER_SECONDS / 2, f"dropped {took:.2f}s after the close frame"
    finally:
        raw.close()


def test_refused_login_and_authorization(broker: BrokerProcess) -> None:
    async def go() -> None:
        client = await ws_open(url(broker))
        await client.send(connect_frame(LOGIN, "wrong"))
        error = await client.frame("ERROR")
        assert error.headers["message"] == "authentication failed"
        assert await client.wait_closed()
        await client.close()
        reader, _ = await logged_in(broker, login=READER, passcode=READER_PASS)
        await reader.send(frame_bytes("SEND", {"destination": "/queue/ws.nowrite",
                                               "receipt": "w"}, b"x"))
        refusal = await reader.frame("ERROR")
        assert refusal.headers.get("receipt-id") == "w"
        assert "not authorized" in refusal.headers["message"] or \
            "denied" in refusal.headers["message"]
        await reader.close()
    run(go())


def test_origin_host_and_path_refused_before_stomp(broker: BrokerProcess) -> None:
    """A foreign page's Origin gets 403 (cross-site WebSocket hijacking), a Host that
    names another site 421 (DNS rebinding), another path 404; the console's own origin
    and clients that send no Origin (not browsers) pass."""
    async def go() -> None:
        assert await refused_status(url(broker), headers={"Origin": "http://evil.example"}) == 403
        assert await refused_status(url(broker), headers={"Origin": "null"}) == 403
        port = broker.ws_port  # type: ignore[attr-defined]
        assert await refused_status(url(broker), headers={"Host": f"evil.example:{port}"}) == 421
        assert await refused_status(f"ws://{HOST}:{port}/other") == 404
        console = broker.http  # type: ignore[attr-defined]
        for origin in (console, console.replace(HOST, "localhost")):
            client = await ws_open(url(broker), headers={"Origin": origin})
            await client.close()
        client = await ws_open(url(broker))  # no Origin at all
        await client.close()
    run(go())
    assert "403 pages of origin 'http://evil.example'" in broker.log_text()


def raw_answer(port: int, request: bytes) -> bytes:
    """What the listener answers a raw HTTP request, up to its close."""
    with socket.create_connection((HOST, port), timeout=WAIT) as sock:
        sock.sendall(request)
        out = b""
        while chunk := sock.recv(4096):
            out += chunk
    return out


def test_bad_upgrade_requests_get_one_http_error(broker: BrokerProcess) -> None:
    """No upgrade: 400; an upgrade request past max_handshake_bytes: 431; garbage: 400.
    An HTTP answer and a close, no STOMP and no traceback in the log."""
    port = broker.ws_port  # type: ignore[attr-defined]
    host = f"Host: {HOST}:{port}\r\n".encode()
    assert raw_answer(port, b"GET /ws HTTP/1.1\r\n" + host + b"\r\n").startswith(
        b"HTTP/1.1 400")
    assert raw_answer(port, b"NOT HTTP\r\n\r\n").startswith(b"HTTP/1.1 400")
    big = b"GET /ws HTTP/1.1\r\n" + host + b"X-Pad: " + b"p" * 70_000 + b"\r\n\r\n"
    assert raw_answer(port, big).startswith(b"HTTP/1.1 431")
    assert "Traceback" not in broker.log_text()


#: An upgrade request far past max_handshake_bytes, still being sent long after the
#: broker refused it: many socket buffers' worth on loopback.
HUGE_REQUEST = 4 * 1024 * 1024


def test_oversized_upgrade_still_arriving_gets_its_431_not_a_reset(
        broker: BrokerProcess) -> None:
    """The broker refuses after max_handshake_bytes but the client goes on sending; its
    431 must still be read. A socket closed with unread bytes sends a reset, which makes
    the client's send or read fail before it sees the answer (the flaky form of the test
    above, under load): the broker shuts its side and drops what still comes."""
    port = broker.ws_port  # type: ignore[attr-defined]
    request = (b"GET /ws HTTP/1.1\r\n" + f"Host: {HOST}:{port}\r\n".encode()
               + b"X-Pad: " + b"p" * HUGE_REQUEST + b"\r\n\r\n")
    assert raw_answer(port, request).startswith(b"HTTP/1.1 431")


#: An upgrade request past h11's own 16 KiB, within max_handshake_bytes (64 KiB): a
#: browser's cookies can make one that long.
LONG_REQUEST_PAD = 40 * 1024


def test_long_upgrade_request_within_the_limit_arriving_piecemeal_is_upgraded(
        broker: BrokerProcess) -> None:
    """Sent in 1 KiB pieces, so the broker reads it in several parts: wsproto's h11
    refuses an incomplete head past 16 KiB with 400 "Bad HTTP message", so fed piece by
    piece such a request was refused or upgraded depending on how its bytes arrived. The
    broker hands wsproto the head once it is complete: 101."""
    port = broker.ws_port  # type: ignore[attr-defined]
    request = upgrade_request(port, extra=f"Cookie: pad={'c' * LONG_REQUEST_PAD}\r\n")
    with socket.create_connection((HOST, port), timeout=WAIT) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for start in range(0, len(request), 1024):
            sock.sendall(request[start:start + 1024])
        answer = b""
        while b"\r\n\r\n" not in answer and (chunk := sock.recv(4096)):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 101"), answer[:200]


def test_stomp_py_ws_connection(broker: BrokerProcess) -> None:
    """stomp.py's WSConnection (websocket-client): CONNECT with a login, SUBSCRIBE,
    persistent SEND with a receipt, the message back."""
    q = f"/queue/ws.{unique('stomppy')}"
    got: list[str] = []
    receipts: list[str] = []
    done = threading.Event()

    class Listener(stomp.ConnectionListener):
        def on_message(self, frame: stomp.utils.Frame) -> None:
            got.append(frame.body)
            done.set()

        def on_receipt(self, frame: stomp.utils.Frame) -> None:
            receipts.append(frame.headers["receipt-id"])

    conn = stomp.WSConnection([(HOST, broker.ws_port)], ws_path="/ws")  # type: ignore[attr-defined]
    conn.set_listener("l", Listener())
    conn.connect(LOGIN, PASSCODE, wait=True)
    try:
        conn.subscribe(q, id=1, ack="client-individual")
        conn.send(q, "hello from stomp.py", receipt="sp1", headers={"persistent": "true"})
        assert done.wait(WAIT), "no MESSAGE"
        poll(lambda: "sp1" in receipts, timeout=WAIT, what="the RECEIPT")
        assert got == ["hello from stomp.py"]
    finally:
        conn.disconnect()


# -------------------------------------------------------------- pre-login budgets

def test_sockets_count_from_accept_and_time_out(broker_factory: BrokerFactory) -> None:
    """max_connections counts WebSocket sockets from TCP accept (before the upgrade),
    connect_timeout closes one that never upgrades and one that never CONNECTs,
    max_unauthenticated closes the oldest, max_handshake_bytes bounds a CONNECT."""
    b = start_ws(broker_factory, "wslimits", env={
        "AMQLITE_MAX_CONNECTIONS": "3", "AMQLITE_MAX_UNAUTHENTICATED": "3",
        "AMQLITE_CONNECT_TIMEOUT": "1.5"})
    port = b.ws_port  # type: ignore[attr-defined]

    async def go() -> None:
        silent = socket.create_connection((HOST, port))  # never says a word
        first = await ws_open(url(b))
        second = await ws_open(url(b))  # three sockets: the limit
        try:
            extra = await ws_open(url(b))
        except (aiohttp.ClientError, TimeoutError):
            pass  # closed before the upgrade: what max_connections does
        else:
            await extra.close()
            raise AssertionError("a fourth socket was upgraded past max_connections=3")
        # the silent socket and both WebSockets are past connect_timeout soon
        assert await first.wait_closed(5)
        assert any(f.command == "ERROR" and f.headers["message"] in (
            "handshake timeout", "server busy") for f in first.frames)
        assert await second.wait_closed(5)
        silent.settimeout(5)
        assert silent.recv(1) == b"", "a socket that never upgraded was kept"
        silent.close()
        # a CONNECT that never ends is cut at max_handshake_bytes (64 KiB)
        third = await ws_open(url(b))
        await third.send(b"CONNECT\naccept-version:1.2\ncontent-length:100000\n\n"
                         + b"p" * 70_000, binary=True)
        error = await third.frame("ERROR")
        assert error.headers["message"] == "too much data before CONNECTED"
        await first.close()
        await second.close()
        await third.close()
    run(go())


def test_oldest_unauthenticated_websocket_goes(broker_factory: BrokerFactory) -> None:
    # connect_timeout far away: on a loaded machine the oldest must go for the cap alone
    b = start_ws(broker_factory, "wsunauth", env={"AMQLITE_MAX_UNAUTHENTICATED": "2",
                                                  "AMQLITE_CONNECT_TIMEOUT": "60"})

    async def go() -> None:
        first, second = await ws_open(url(b)), await ws_open(url(b))
        third = await ws_open(url(b))
        error = await first.frame("ERROR")
        assert error.headers["message"] == "server busy", first.frames
        assert await first.wait_closed()
        await third.send(connect_frame())
        await third.frame("CONNECTED")
        await second.send(connect_frame())  # the younger one stayed
        await second.frame("CONNECTED")
        for c in (first, second, third):
            await c.close()
    run(go())


# ------------------------------------------------------------------- flow control

def test_paused_producer_is_not_read(broker_factory: BrokerFactory, clients: ClientPool,
                                     ) -> None:
    """Non-persistent SENDs over a WebSocket, spread over queues, fill the broker's
    memory budget: the broker stops reading the socket, so stomp.py's sends block
    (32 MiB cannot all sit in loopback socket buffers); consumers drain the queues, the
    producer resumes and every message arrives once."""
    budget, body_size, total = 4 * MIB, 64 * 1024, 32 * MIB
    b = start_ws(broker_factory, "wsflow", env={
        "AMQLITE_MAX_MEMORY": str(budget), "AMQLITE_MAX_DESTINATION_MEMORY": str(budget // 2)})
    queues = [f"/queue/{unique(f'flow{i}')}" for i in range(4)]
    count = total // body_size
    conn = stomp.WSConnection([(HOST, b.ws_port)], ws_path="/ws")  # type: ignore[attr-defined]
    conn.connect(wait=True)
    sent = [0]

    def produce() -> None:
        for i in range(count):
            conn.send(queues[i % len(queues)], f"{i:06d}" + "x" * (body_size - 6),
                      headers={"persistent": "false"})
            sent[0] += 1

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    try:
        b.wait_log("memory budget reached", 60)
        producer.join(FLOW_HOLD)
        assert producer.is_alive(), "the producer was never held back"
        assert sent[0] < count
        consumers = []
        for q in queues:
            consumer = clients(b.port)
            consumer.subscribe(q)
            consumers.append(consumer)
        got = []
        for i, consumer in enumerate(consumers):
            expected = len(range(i, count, len(queues)))
            got += consumer.listener.wait_messages(expected, 60)
        producer.join(60)
        assert not producer.is_alive()
        assert sorted(int(m.body[:6]) for m in got) == list(range(count))
    finally:
        conn.disconnect()


# ------------------------------------------------------------------------------ wss

def test_wss_with_the_tls_settings(broker_factory: BrokerFactory, tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    wss_port = free_port()
    broker_factory.start(name="wss", extra_args=[
        "--wss-bind", f"{HOST}:{wss_port}", "--ssl-cert", str(pki.server_cert),
        "--ssl-key", str(pki.server_key)])
    context = ssl.create_default_context(cafile=str(pki.ca))

    async def go() -> None:
        client = await ws_open(ws_url(wss_port, "wss"), protocols=("v11.stomp", "v12.stomp"),
                               ssl_context=context)
        assert client.protocol == "v12.stomp"
        await client.send(connect_frame())
        connected = await client.frame("CONNECTED")
        assert connected.headers["version"] == "1.2"
        await client.close()
        assert await refused_status(ws_url(wss_port, "wss"), ssl_context=context,
                                    headers={"Origin": "https://evil.example"}) == 403
    run(go())


# ------------------------------------------------------------------ published URLs

def test_websocket_urls_are_published(broker_factory: BrokerFactory) -> None:
    """Two nodes of one group: a page connected to the first gets the second's ws:// URL
    pushed when it joins (a cluster-update RECEIPT); the registry (cluster-list),
    /api/v1/group and a new WebSocket client's CONNECTED name both ws:// URLs, this
    node's first; a TCP client's CONNECTED keeps the tcp:// URIs."""
    shared = broker_factory.data_dir("shared")
    env = {"AMQLITE_LOCK_POLL_INTERVAL": "0.1", "AMQLITE_UPDATE_CLUSTER_CLIENTS": "true"}
    nodes = []
    for name in ("wsa", "wsb"):
        ws_port, http = free_port(), free_port()
        n = broker_factory.new(data_dir=shared, name=name, env=env, extra_args=[
            "--ws-bind", f"{HOST}:{ws_port}", "--http-bind", f"{HOST}:{http}"])
        n.ws_port, n.http = ws_port, f"http://{HOST}:{http}"  # type: ignore[attr-defined]
        nodes.append(n)
    master, slave = nodes
    master.start().wait_serving()
    own = ws_url(master.ws_port)  # type: ignore[attr-defined]
    urls = {own, ws_url(slave.ws_port)}  # type: ignore[attr-defined]

    def cluster_update(client: Any) -> bool:
        return any(f.command == "RECEIPT" and f.headers.get("receipt-id")
                   == CLUSTER_UPDATE_RECEIPT and set(
                       f.headers.get(CLUSTER_URIS_HEADER, "").split(",")) == urls
                   for f in client.frames)

    async def page_told() -> None:
        client = await ws_open(url(master))
        await client.send(connect_frame())
        connected = await client.frame("CONNECTED")
        assert connected.headers.get(CLUSTER_URIS_HEADER) == own
        slave.start()  # joins as slave: the master pushes its URL
        assert await client.until(lambda: cluster_update(client), 3 * WAIT), client.frames
        await client.close()
    run(page_told())
    store = f"sqlite:///{shared / 'amqlite.db'}"

    def listed() -> dict[str, Any] | None:
        views = cluster_json("--store", store)
        members = views[0]["members"] if views else []
        if {u for m in members for u in m.get("websocket", [])} == urls:
            return views[0]
        return None
    view, _ = poll(listed, timeout=WAIT, what="both ws URLs in the registry")
    assert view["websocket"] == [own]
    assert all(u.startswith("tcp://") for m in view["members"] for u in m["services"])
    assert own in ok(amqlite("cluster-list", "--store", store))
    status, group, _ = Api(master.http).call("GET", "/api/v1/group")  # type: ignore[attr-defined]
    assert status == 200
    assert {u for n in group["nodes"] for u in n["websocket"]} == urls

    async def header() -> str:
        client = await ws_open(url(master))
        await client.send(connect_frame())
        connected = await client.frame("CONNECTED")
        await client.close()
        return connected.headers.get(CLUSTER_URIS_HEADER, "")
    ws_header = str(run(header())).split(",")
    assert set(ws_header) == urls and ws_header[0] == own  # this node first
    with RawStomp(master.port) as tcp:
        tcp_header = tcp.connect().headers.get(CLUSTER_URIS_HEADER, "").split(",")
    assert tcp_header[0] == f"tcp://{HOST}:{master.port}"
    assert len(tcp_header) == 2 and all(u.startswith("tcp://") for u in tcp_header)
