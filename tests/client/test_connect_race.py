"""Issue 22: connect attempts of the failover client that never wait on a broker that hangs
while another could serve. Against the loopback STOMP server (tests/client/stomp_server),
a listener that never accepts, and a proxy that can go silent or hold connections back; the
race itself with stub connections; the deadline and ranking rules as functions."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from typing import Any, cast

import pytest

from amqlite.client import AsyncClient, ConnectionFailedError
from amqlite.client import attempts as attempts_module
from amqlite.client.attempts import ConnectRace, Failure
from amqlite.client.connection import Connection
from amqlite.client.reconnect import ATTEMPT_DEADLINE_S, attempt_timeout_s, preference
from amqlite.client.uri import TcpURI, parse_broker_url, parse_tcp_uri
from tests.client.blackhole import TcpProxy
from tests.client.stomp_server import StompTestServer
from tests.client.test_transport import failover, started
from tests.helpers.client import RecordingListener, async_test, poll_until, within
from tests.helpers.servers import free_port

HOST = "127.0.0.1"
#: Back-off of these tests (ms): after a drop, passes are at most 2 x MAX_DELAY_MS apart.
MAX_DELAY_MS = 100
#: Scheduling slack on shared cores (s), on top of what a bound allows.
SLACK = 0.5
#: The frozen server promises heart-beats every this many ms and sends none: the client
#: gives up on it after twice that.
SILENT_BEAT_MS = 100
#: A shorter connectionTimeout than ATTEMPT_DEADLINE_S (ms): it wins.
SHORT_CONNECT_MS = 300
#: The back-off of the "wins during the pause" tests (ms): far longer than they may take.
LONG_PAUSE_MS = 5000


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port whose kernel completes TCP handshakes but whose owner never accepts: what a
    frozen broker, or one across a partition, looks like to a connect attempt."""
    sock = socket.socket()
    sock.bind((HOST, 0))
    sock.listen(16)
    try:
        yield sock.getsockname()[1]
    finally:
        sock.close()


# --- rules ----------------------------------------------------------------------------------


def test_attempt_deadline_is_the_shorter_one_inside_failover_only() -> None:
    default = parse_tcp_uri("tcp://a:1")
    short = parse_tcp_uri(f"tcp://a:1?connectionTimeout={SHORT_CONNECT_MS}")
    assert attempt_timeout_s(default, "failover") == ATTEMPT_DEADLINE_S
    assert attempt_timeout_s(default, "discovery") == ATTEMPT_DEADLINE_S
    assert attempt_timeout_s(short, "failover") == SHORT_CONNECT_MS / 1000
    # plain tcp:// is one broker and no failover: ActiveMQ's connectionTimeout, 30 s
    assert attempt_timeout_s(default, "tcp") == 30.0
    assert ATTEMPT_DEADLINE_S < 3.0, "shorter than the default lock lease's takeover"


def test_preference_puts_priority_uris_first_then_the_pass_order() -> None:
    url = parse_broker_url("failover:(tcp://a:1,tcp://b:2,tcp://c:3)"
                           "?priorityBackup=true&priorityURIs=tcp://c:3")
    a, b, c = url.uris
    assert preference([b, a, c], url.options, list(url.uris)) == {c: 0, b: 1, a: 2}
    plain = parse_broker_url("failover:(tcp://a:1,tcp://b:2,tcp://c:3)")
    assert preference([b, a, c], plain.options, list(plain.uris)) == {b: 0, a: 1, c: 2}


# --- the race with stub connections ------------------------------------------------------------


class StubConnection:
    def __init__(self, uri: TcpURI) -> None:
        self.uri = uri
        self.closed_as: bool | None = None  # graceful?

    def close(self, *, graceful: bool = False) -> None:
        self.closed_as = graceful


@async_test
async def test_of_connections_made_together_the_best_ranked_wins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(attempts_module, "ATTEMPT_HEAD_START_S", 0.01)
    loop = asyncio.get_running_loop()
    a, b, c, d = (parse_tcp_uri(f"tcp://h:{port}") for port in (1, 2, 3, 4))
    gates: dict[TcpURI, asyncio.Future[Any]] = {u: loop.create_future() for u in (a, b, c, d)}
    cancelled: list[TcpURI] = []

    async def opener(uri: TcpURI) -> Connection:
        try:
            return cast(Connection, await gates[uri])
        except asyncio.CancelledError:
            cancelled.append(uri)
            raise

    race = ConnectRace(opener, asyncio.Event())
    rank = {a: 0, b: 1, c: 2, d: 3}
    pass_one = asyncio.ensure_future(race.run_pass([a, b, c], rank))
    await poll_until(lambda: race.running == [a, b, c], "all three attempts started")
    gates[c].set_exception(ConnectionRefusedError("refused"))
    outcome = await within(pass_one)
    assert isinstance(outcome, list) and [f.uri for f in outcome] == [c]
    assert isinstance(outcome[0], Failure)
    assert race.running == [a, b], "the attempts still running go on after the pass"
    # the next pass lists b and d only: a's attempt is dropped, b's is not started again
    pass_two = asyncio.ensure_future(race.run_pass([b, d], rank))
    await poll_until(lambda: race.running == [b, d], "b carried, d started, a dropped")
    assert cancelled == [a]
    made = {u: StubConnection(u) for u in (b, d)}
    gates[d].set_result(made[d])
    gates[b].set_result(made[b])
    winner = await within(pass_two)
    assert winner is made[b], "b ranks before d"
    assert made[d].closed_as is True, "the other connection is closed with DISCONNECT"
    assert made[b].closed_as is None
    assert race.running == []


# --- against servers ----------------------------------------------------------------------------


@async_test
async def test_frozen_broker_does_not_hold_back_the_one_taking_over() -> None:
    """Connected through a proxy that goes silent (a frozen broker): the heart-beat drops
    it, the other URI refuses (a slave), the attempts to the frozen one hang. Once the
    other one listens, the client is there within one back-off gap, not after the
    hanging attempt's deadline."""
    frozen = await started(heartbeat=(SILENT_BEAT_MS, 0))
    successor = StompTestServer(port=free_port())  # not listening yet: refuses
    with TcpProxy(frozen.port, "frozen") as proxy:
        listener = RecordingListener()
        url = failover(f"tcp://{HOST}:{proxy.port}", successor.uri, initialReconnectDelay=20,
                       maxReconnectDelay=MAX_DELAY_MS)
        client = AsyncClient(f"{url}&nested.heartBeat=0,{SILENT_BEAT_MS}", listener=listener)
        await client.connect()
        proxy.blackhole()  # before the first missing heart-beat is noticed
        await listener.wait_count("interrupted", 1)
        await poll_until(lambda: proxy.accepted_dark >= 1, "an attempt to the frozen broker")
        await successor.start()
        serving = time.monotonic()
        await listener.wait_count("resumed", 2, timeout=ATTEMPT_DEADLINE_S * 2)
        took = time.monotonic() - serving
        assert client.connected_uri is not None
        assert client.connected_uri.port == successor.port
        assert took < 2 * MAX_DELAY_MS / 1000 + SLACK, took
        assert took < ATTEMPT_DEADLINE_S
        await client.send("/queue/q", "after")
        await client.disconnect()
    await frozen.stop()
    await successor.stop()


@async_test
async def test_each_attempt_of_a_failover_pass_has_its_own_deadline(silent_port: int) -> None:
    client = AsyncClient(f"failover:(tcp://{HOST}:{silent_port})?startupMaxReconnectAttempts=1")
    started_at = time.monotonic()
    with pytest.raises(ConnectionFailedError,
                       match=rf"no CONNECTED from .* within {ATTEMPT_DEADLINE_S:g}s"):
        await within(client.connect(), ATTEMPT_DEADLINE_S + SLACK * 4)
    took = time.monotonic() - started_at
    assert ATTEMPT_DEADLINE_S - 0.05 <= took < ATTEMPT_DEADLINE_S + SLACK, took


@async_test
async def test_a_shorter_connection_timeout_bounds_the_attempt(silent_port: int) -> None:
    client = AsyncClient(f"failover:(tcp://{HOST}:{silent_port}?connectionTimeout="
                         f"{SHORT_CONNECT_MS})?startupMaxReconnectAttempts=1")
    started_at = time.monotonic()
    with pytest.raises(ConnectionFailedError, match=r"within 0\.3s"):
        await within(client.connect(), ATTEMPT_DEADLINE_S)
    assert time.monotonic() - started_at < SHORT_CONNECT_MS / 1000 + SLACK


async def _slow_then_released(server: StompTestServer, query: dict[str, object]) -> float:
    """[a refusing URI, a proxy holding connections to ``server``]: the pass ends at the
    refusal with the slow attempt running; release it; return how long connect() then
    took, after checking the client is on the slow broker."""
    refusing = f"tcp://{HOST}:{free_port()}"
    with TcpProxy(server.port, "slow") as proxy:
        proxy.hold()
        client = AsyncClient(failover(refusing, f"tcp://{HOST}:{proxy.port}", **query))
        connecting = asyncio.ensure_future(client.connect())
        await poll_until(lambda: proxy.accepted >= 1, "the attempt to the slow broker")
        released = time.monotonic()
        proxy.release()
        await within(connecting, LONG_PAUSE_MS / 1000)
        took = time.monotonic() - released
        assert client.connected_uri is not None
        assert client.connected_uri.port == proxy.port
        await client.disconnect()
    return took


@async_test
async def test_an_attempt_still_running_after_its_pass_wins_during_the_pause() -> None:
    server = await started()
    took = await _slow_then_released(server, {"initialReconnectDelay": LONG_PAUSE_MS})
    assert took < SLACK, f"waited {took:.2f}s: the pause held the ready connection back"
    await server.stop()


@async_test
async def test_giving_up_waits_for_the_attempts_still_running() -> None:
    server = await started()
    await _slow_then_released(server, {"startupMaxReconnectAttempts": 1})
    await server.stop()
