"""updateClusterClients: the master hands connected clients the group's URIs, so a
client configured with the master alone still fails over to a slave it never knew."""

from __future__ import annotations

import asyncio

import pytest

from amqlite.client import AsyncClient
from tests.helpers.broker_proc import BrokerFactory, unique, wait_one_serving
from tests.helpers.client import RecordingListener, async_test

pytestmark = pytest.mark.integration

CLUSTER_URIS = "amqlite.clusterURIs"


def _advertised(listener: RecordingListener) -> list[str]:
    """Every cluster URI list the broker sent, newest last."""
    return [
        frame.headers[CLUSTER_URIS]  # type: ignore[attr-defined]
        for name, frame in listener.events
        if name == "command" and CLUSTER_URIS in frame.headers  # type: ignore[attr-defined]
    ]


def test_update_cluster_clients_hands_the_client_a_uri_it_was_not_configured_with(
    broker_factory: BrokerFactory,
) -> None:
    shared = broker_factory.data_dir("shared")
    env = {"AMQLITE_UPDATE_CLUSTER_CLIENTS": "true", "AMQLITE_LOCK_POLL_INTERVAL": "0.1"}
    first = broker_factory.new(data_dir=shared, name="node-a", env=env).start()
    master, _ = wait_one_serving([first])
    slave = broker_factory.new(data_dir=shared, name="node-b", env=env).start()
    slave_uri = f"tcp://127.0.0.1:{slave.port}"
    # Only the master: the slave's address must come from the broker.
    url = (f"failover:(tcp://127.0.0.1:{master.port})"
           "?initialReconnectDelay=50&maxReconnectDelay=500")
    queue = f"/queue/{unique('cluster')}"

    @async_test
    async def scenario() -> None:
        listener = RecordingListener()
        client = AsyncClient(url, listener=listener)
        await client.connect()
        await listener.wait_for(
            lambda: any(slave_uri in uris.split(",") for uris in _advertised(listener)),
            "the slave's URI pushed by the master", timeout=15)
        await client.send(queue, "before")
        await asyncio.to_thread(master.kill)
        result = await asyncio.wait_for(client.send(queue, "after"), 30)
        assert result is not None
        assert client.connected_uri is not None and client.connected_uri.port == slave.port
        sub = await client.subscribe(queue, ack="client-individual")
        bodies = []
        for _ in range(2):
            message = await sub.receive(10)
            assert message is not None
            bodies.append(message.text)
            assert await client.ack(message)
        assert bodies == ["before", "after"]
        await client.disconnect()

    scenario()
