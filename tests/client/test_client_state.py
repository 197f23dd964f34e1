"""The client's one state (``ClientState``) against a real STOMP server on loopback: it
follows the connection from NEW through CONNECTING, CONNECTED and RECONNECTING to CLOSED
or FAILED, and ``connected``/``closed`` are read from it."""

from __future__ import annotations

import asyncio

import pytest

from amqlite.client import AsyncClient, ClientState, ConnectionFailedError
from tests.client.stomp_server import StompTestServer
from tests.helpers.client import RecordingListener, async_test, poll_until, within
from tests.helpers.servers import free_port


@async_test
async def test_state_follows_connect_outage_reconnect_and_disconnect() -> None:
    server = StompTestServer(free_port())  # not listening yet: startup attempts go on
    listener = RecordingListener()
    client = AsyncClient(
        f"failover:({server.uri})?randomize=false&initialReconnectDelay=10"
        "&maxReconnectDelay=50",
        listener=listener,
    )
    assert client.state is ClientState.NEW
    assert not client.connected and not client.closed
    connecting = asyncio.create_task(client.connect())
    await poll_until(lambda: client._policy.failures >= 1, "a failed startup pass")
    assert client.state is ClientState.CONNECTING and not client.connected
    await server.start()
    await within(connecting)
    assert client.state is ClientState.CONNECTED and client.connected

    await server.stop()
    await listener.wait_count("interrupted", 1)
    assert client.state is ClientState.RECONNECTING
    assert not client.connected and not client.closed

    await server.start()
    await listener.wait_count("resumed", 2)
    assert client.state is ClientState.CONNECTED and client.connected

    await client.disconnect()
    assert client.state is ClientState.CLOSED
    assert client.closed and not client.connected
    await server.stop()


@async_test
async def test_state_is_failed_when_startup_attempts_run_out() -> None:
    client = AsyncClient(
        f"failover:(tcp://127.0.0.1:{free_port()})?startupMaxReconnectAttempts=1"
    )
    with pytest.raises(ConnectionFailedError):
        await client.connect()
    assert client.state is ClientState.FAILED
    assert client.closed and not client.connected
    assert isinstance(client.failure, ConnectionFailedError)
