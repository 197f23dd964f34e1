"""The failover transport against a real STOMP server on loopback (tests/client/stomp_server):
reconnect, back-off timing, timeout, re-send with the same identity, re-subscribe, acks,
listener callbacks, updateURIsURL, cluster URI headers, standby connections."""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path

import pytest

from amqlite.client import (
    AckNotConfirmedError,
    AsyncClient,
    BrokerRefusedError,
    ClientClosedError,
    ConnectionFailedError,
    Message,
    SendTimeoutError,
    Subscription,
    TransactionRolledBackError,
    stomp_destination,
)
from tests.client.stomp_server import StompTestServer
from tests.helpers.client import RecordingListener, async_test, poll_until, within
from tests.helpers.servers import free_port

#: Timer slack allowed below a computed back-off (event-loop timers may fire a hair early
#: relative to time.monotonic()).
SLACK = 0.005


def failover(*servers: StompTestServer | str, **options: object) -> str:
    uris = ",".join(s if isinstance(s, str) else s.uri for s in servers)
    query = "&".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}"
                     for k, v in {"randomize": False, **options}.items())
    return f"failover:({uris})?{query}"


async def started(**kwargs: object) -> StompTestServer:
    return await StompTestServer(**kwargs).start()  # type: ignore[arg-type]


async def one_delivered(
    body: bytes,
) -> tuple[StompTestServer, RecordingListener, AsyncClient, Subscription, Message | None]:
    """A connected client with a client-individual subscription that got ``body``."""
    server = await started()
    listener = RecordingListener()
    client = AsyncClient(failover(server), listener=listener)
    await client.connect()
    sub = await client.subscribe("queue://q", ack="client-individual")
    server.publish("/queue/q", body)
    return server, listener, client, sub, await within(sub.receive())


def identity(frame) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    return (frame.headers["amqlite.producerId"], frame.headers["amqlite.producerSeq"])


# --- sending -----------------------------------------------------------------------------


@async_test
async def test_persistent_send_carries_identity_and_returns_on_receipt() -> None:
    server = await started()
    async with AsyncClient(failover(server), producer_id="p1") as client:
        first = await client.send("queue://q", "hello")
        second = await client.send("/queue/q", b"\x00bin", persistent=False)
        third = await client.send("queue://q", "again")
    # only persistent sends are numbered, densely: a hole would mean a lost message
    assert (first.producer_id, first.seq, third.seq) == ("p1", 1, 2)
    assert second.receipt is None
    frame = server.stored[0]
    assert frame.headers["destination"] == "/queue/q"
    assert frame.headers["persistent"] == "true"
    assert identity(frame) == ("p1", "1")
    assert frame.headers["receipt"] == first.receipt
    nonpersistent = server.sends[1]
    assert nonpersistent.headers["persistent"] == "false"
    assert "receipt" not in nonpersistent.headers  # async send unless trackMessages
    assert nonpersistent.body == b"\x00bin"
    assert "amqlite.producerSeq" not in nonpersistent.headers
    await server.stop()


@async_test
async def test_unreceipted_send_is_resent_with_same_identity_and_deduplicated() -> None:
    server = await started()
    listener = RecordingListener()
    client = AsyncClient(failover(server), listener=listener)
    await client.connect()
    server.withhold_receipts = True  # the broker committed but died before the RECEIPT
    sending = asyncio.create_task(client.send("queue://q", "once"))
    await server.wait_for(lambda: len(server.stored) == 1, "the SEND")
    assert not sending.done()
    server.withhold_receipts = False
    server.kill_connections()
    result = await within(sending)
    assert [identity(f) for f in server.sends] == [identity(server.stored[0])] * 2
    assert server.dedup_hits == 1 and len(server.stored) == 1
    assert result.seq == int(server.stored[0].headers["amqlite.producerSeq"])
    assert client.resent == 1
    assert listener.names() == ["resumed", "interrupted", "resumed"]
    await client.disconnect()
    await server.stop()


@async_test
async def test_sends_wait_while_disconnected_and_go_out_in_order_after_reconnect() -> None:
    server = await started()
    listener = RecordingListener()
    client = AsyncClient(failover(server, initialReconnectDelay=20, maxReconnectDelay=50),
                         listener=listener)
    await client.connect()
    await server.stop()
    await listener.wait_count("interrupted", 1)
    sends = [asyncio.create_task(client.send("queue://q", f"m{i}")) for i in range(3)]
    await poll_until(lambda: client.pending_sends == 3, "3 queued sends")
    assert not any(s.done() for s in sends)
    await server.start()
    results = await within(asyncio.gather(*sends))
    assert [r.seq for r in results] == [1, 2, 3]
    assert [f.body for f in server.stored] == [b"m0", b"m1", b"m2"]
    await client.disconnect()
    await server.stop()


@async_test
async def test_timeout_fails_a_send_without_a_connection_and_client_lives_on() -> None:
    server = await started()
    listener = RecordingListener()
    client = AsyncClient(failover(server, timeout=200, initialReconnectDelay=20,
                                  maxReconnectDelay=50), listener=listener)
    await client.connect()
    await server.stop()
    await listener.wait_count("interrupted", 1)
    start = time.monotonic()
    with pytest.raises(SendTimeoutError) as info:
        await client.send("queue://q", "lost")
    assert time.monotonic() - start >= 0.2 - SLACK
    assert info.value.written is False
    assert client.pending_sends == 0  # withdrawn: it will never be sent
    await server.start()
    await listener.wait_count("resumed", 2)
    await client.send("queue://q", "after")
    assert [f.body for f in server.stored] == [b"after"]
    await client.disconnect()
    await server.stop()


@async_test
async def test_timeout_on_a_live_connection_keeps_the_connection_and_the_message() -> None:
    server = await started()
    client = AsyncClient(failover(server, timeout=200))
    await client.connect()
    server.withhold_receipts = True
    with pytest.raises(SendTimeoutError) as info:
        await client.send("queue://q", "slow")
    assert info.value.written is True
    assert client.connected and len(server.live) == 1  # the connection was not touched
    assert client.pending_sends == 1  # still re-sent after a reconnect, same identity
    server.withhold_receipts = False
    server.kill_connections()
    await poll_until(lambda: client.pending_sends == 0, "the re-send's RECEIPT")
    assert len(server.stored) == 1 and server.dedup_hits == 1
    assert identity(server.sends[1]) == (client.producer_id, str(info.value.identity[1]))
    await client.disconnect()
    await server.stop()


@async_test
async def test_broker_error_for_a_send_fails_it_and_is_not_retried() -> None:
    server = await started()
    server.reject_destination = "/queue/bad"
    listener = RecordingListener()
    client = AsyncClient(failover(server), listener=listener)
    await client.connect()
    with pytest.raises(BrokerRefusedError, match="destination refused"):
        await client.send("queue://bad", "x")
    await listener.wait_count("resumed", 2)  # the broker closed; the client reconnected
    await client.send("queue://ok", "y")
    frames = [f for c in server.conns for f in c.frames if f.command == "SEND"]
    assert [f.headers["destination"] for f in frames] == ["/queue/bad", "/queue/ok"]
    await client.disconnect()
    await server.stop()


@async_test
async def test_track_messages_replays_nonpersistent_sends_only_when_asked() -> None:
    for track, expected in ((True, 2), (False, 1)):
        server = srv = await started()
        client = AsyncClient(failover(server, trackMessages=track))
        await client.connect()
        server.withhold_receipts = True
        await client.send("queue://q", "np", persistent=False)  # returns once written
        await server.wait_for(lambda s=srv: len(s.sends) == 1, "the non-persistent SEND")
        server.withhold_receipts = False
        server.kill_connections()
        await client.send("queue://q", "marker")  # after the reconnect and any replay
        np_frames = [f for f in server.sends if f.body == b"np"]
        assert len(np_frames) == expected, f"trackMessages={track}"
        await client.disconnect()
        await server.stop()


# --- subscriptions and acks ----------------------------------------------------------------


@async_test
async def test_subscriptions_are_resent_after_reconnect_durable_by_name() -> None:
    server = await started()
    listener = RecordingListener()
    client = AsyncClient(failover(server), client_id="app-1", listener=listener)
    await client.connect()
    queue_sub = await client.subscribe("queue://q", ack="client-individual", prefetch=5)
    durable = await client.subscribe("topic://t", durable_name="d1")
    before = {sid: {k: v for k, v in h.items() if k != "receipt"}
              for sid, h in server.live[0].subs.items()}
    server.kill_connections()
    await listener.wait_count("resumed", 2)
    await server.wait_for(lambda: len(server.live) == 1 and len(server.live[0].subs) == 2,
                          "both subscriptions on the new connection")
    conn = server.live[0]
    after = {sid: {k: v for k, v in h.items() if k != "receipt"} for sid, h in conn.subs.items()}
    assert after == before
    assert after[durable.id]["activemq.subscriptionName"] == "d1"
    assert after[queue_sub.id]["activemq.prefetchSize"] == "5"
    assert conn.connect is not None and conn.connect.headers["client-id"] == "app-1"
    server.publish("/queue/q", b"after-failover")
    message = await within(queue_sub.receive())
    assert message is not None and message.body == b"after-failover"
    await client.disconnect()
    await server.stop()


@async_test
async def test_ack_after_failover_is_reported_and_message_redelivered() -> None:
    server, listener, client, sub, first = await one_delivered(b"work")
    assert first is not None and not first.redelivered
    server.kill_connections()
    await listener.wait_count("resumed", 2)
    assert await client.ack(first) is False
    assert client.unconfirmed_acks == [first]
    [reported] = [e for e in listener.exceptions() if isinstance(e, AckNotConfirmedError)]
    assert reported.message is first
    again = await within(sub.receive())
    assert again is not None and again.redelivered
    assert again.message_id == first.message_id
    assert await client.ack(again) is True
    assert [a.headers["id"] for a in server.acks] == [again.ack_id]
    await client.disconnect()
    await server.stop()


@async_test
async def test_ack_in_flight_when_the_connection_drops_is_reported() -> None:
    server, listener, client, _sub, message = await one_delivered(b"work")
    assert message is not None
    server.withhold_ack_receipts = True
    acking = asyncio.create_task(client.ack(message))
    await server.wait_for(lambda: len(server.acks) == 1, "the ACK")
    server.kill_connections()
    assert await within(acking) is False
    assert client.unconfirmed_acks == [message]
    [reported] = listener.exceptions()
    assert isinstance(reported, AckNotConfirmedError) and "RECEIPT" in reported.reason
    await client.disconnect()
    await server.stop()


@async_test
async def test_queued_client_ack_messages_are_dropped_at_an_interruption() -> None:
    server = await started()
    listener = RecordingListener()
    client = AsyncClient(failover(server), listener=listener)
    await client.connect()
    sub = await client.subscribe("queue://q", ack="client")
    for i in range(3):
        server.publish("/queue/q", f"m{i}".encode())
    await poll_until(lambda: sub.delivered == 3, "3 deliveries")
    server.kill_connections()
    await listener.wait_count("resumed", 2)
    # the broker redelivers all three; the stale copies never reach the application
    bodies = [(await within(sub.receive())) for _ in range(3)]
    assert [(m.body, m.redelivered) for m in bodies if m] == [
        (b"m0", True), (b"m1", True), (b"m2", True)]
    assert sub.dropped_at_interruption == 3
    await client.disconnect()
    await server.stop()


# --- listener ------------------------------------------------------------------------------


@async_test
async def test_listener_hears_command_interrupted_resumed() -> None:
    server = await started()
    listener = RecordingListener()
    client = AsyncClient(failover(server), listener=listener)
    await client.connect()
    await client.send("queue://q", "x")
    assert listener.commands()[:2] == ["CONNECTED", "RECEIPT"]
    await server.stop()
    await listener.wait_count("interrupted", 1)
    await server.start()
    await listener.wait_count("resumed", 2)
    assert listener.names() == ["resumed", "interrupted", "resumed"]
    assert listener.commands().count("CONNECTED") == 2
    assert len(client.interruptions) == 1 and client.interruptions[0].ended is not None
    await client.disconnect()
    await server.stop()


# --- back-off, attempts --------------------------------------------------------------------


@async_test
async def test_startup_backoff_timing_and_attempt_limit() -> None:
    server = await started()
    server.accept_and_close = True  # every pass fails at the handshake
    listener = RecordingListener()
    client = AsyncClient(failover(server, initialReconnectDelay=50, maxReconnectDelay=200,
                                  startupMaxReconnectAttempts=5), listener=listener)
    with pytest.raises(ConnectionFailedError, match="after 5 attempt"):
        await client.connect()
    times = server.accept_times
    assert len(times) == 5
    gaps = [b - a for a, b in itertools.pairwise(times)]
    for gap, expected in zip(gaps, [0.05, 0.1, 0.2, 0.2], strict=True):
        assert expected - SLACK <= gap < expected + 1.0, (gaps, expected)
    assert isinstance(listener.exceptions()[-1], ConnectionFailedError)
    await server.stop()


@async_test
async def test_reconnect_backoff_sleeps_before_and_after_each_pass() -> None:
    server = await started()
    listener = RecordingListener()
    client = AsyncClient(failover(server, initialReconnectDelay=50, maxReconnectDelay=200,
                                  maxReconnectAttempts=4), listener=listener)
    await client.connect()
    server.accept_and_close = True
    accepted = len(server.accept_times)
    lost_at = time.monotonic()
    server.kill_connections()
    await listener.wait_for(lambda: bool(listener.exceptions()), "giving up")
    assert isinstance(listener.exceptions()[0], ConnectionFailedError)
    times = [lost_at, *server.accept_times[accepted:]]
    assert len(times) == 5  # 4 passes after the drop, then maxReconnectAttempts gives up
    gaps = [b - a for a, b in itertools.pairwise(times)]
    # ActiveMQ: wait d before a pass, and d again after a failed one before doubling
    for gap, expected in zip(gaps, [0.05, 0.05 + 0.1, 0.1 + 0.2, 0.2 + 0.2], strict=True):
        assert expected - SLACK <= gap < expected + 1.0, (gaps, expected)
    with pytest.raises(ClientClosedError):
        await client.send("queue://q", "too late")
    await server.stop()


@async_test
async def test_max_reconnect_attempts_zero_reports_and_never_reconnects() -> None:
    server = await started()
    listener = RecordingListener()
    client = AsyncClient(failover(server, maxReconnectAttempts=0), listener=listener)
    await client.connect()
    server.kill_connections()
    await listener.wait_for(lambda: bool(listener.exceptions()), "the failure")
    assert "reconnect is disabled" in str(listener.exceptions()[0])
    assert len(server.accept_times) == 1
    assert listener.names() == ["resumed", "interrupted", "exception"]
    await server.stop()


@async_test
async def test_connect_refused_by_error_frame_names_the_reason() -> None:
    server = await started()
    server.refuse_connect = "server busy"
    client = AsyncClient(failover(server, startupMaxReconnectAttempts=2))
    with pytest.raises(ConnectionFailedError, match="server busy"):
        await client.connect()
    assert len(server.accept_times) == 2  # a transient refusal is retried
    await server.stop()


@async_test
async def test_refused_login_is_not_retried() -> None:
    """Issue 15: as ActiveMQ's failover transport with a SecurityException."""
    server = await started()
    server.refuse_connect = "authentication failed"
    client = AsyncClient(failover(server, startupMaxReconnectAttempts=5))
    with pytest.raises(ConnectionFailedError, match="authentication failed"):
        await client.connect()
    assert len(server.accept_times) == 1
    await server.stop()


@async_test
async def test_plain_tcp_url_tries_once() -> None:
    dead = f"tcp://127.0.0.1:{free_port()}"
    with pytest.raises(ConnectionFailedError, match="after 1 attempt"):
        await AsyncClient(dead).connect()


@async_test
async def test_randomize_false_connects_to_the_first_live_uri_in_order() -> None:
    first, second = await started(), await started()
    dead = f"tcp://127.0.0.1:{free_port()}"
    async with AsyncClient(failover(dead, second, first)) as client:
        assert client.connected_uri is not None
        assert client.connected_uri.port == second.port
    assert not first.accept_times
    await first.stop()
    await second.stop()


@async_test
async def test_silent_broker_is_detected_by_heartbeat() -> None:
    # The server promises a heart-beat every 100 ms but never sends one: a dead peer.
    server = await started(heartbeat=(100, 0))
    listener = RecordingListener()
    client = AsyncClient(failover(server) + "&nested.heartBeat=0,100", listener=listener)
    start = time.monotonic()
    await client.connect()
    await listener.wait_count("interrupted", 1, timeout=5)
    assert time.monotonic() - start >= 0.2 - SLACK  # 2x grace of the 100 ms interval
    assert "heart-beat" in client.interruptions[0].reason
    await client.disconnect()
    await server.stop()


# --- URI updates ---------------------------------------------------------------------------


@async_test
async def test_update_uris_url_file_is_reread_on_reconnect(tmp_path: Path) -> None:
    failing = await started()
    failing.accept_and_close = True
    good = await started()
    uris_file = tmp_path / "uris.txt"
    uris_file.write_text("")
    client = AsyncClient(failover(failing, updateURIsURL=str(uris_file),
                                  initialReconnectDelay=20, useExponentialBackOff=False))
    connecting = asyncio.create_task(client.connect())
    await failing.wait_for(lambda: len(failing.accept_times) >= 2, "two failed passes")
    assert not connecting.done()
    uris_file.write_text(f"{good.uri}\n")
    await within(connecting)
    assert client.connected_uri is not None and client.connected_uri.port == good.port
    await client.disconnect()
    await failing.stop()
    await good.stop()


@async_test
async def test_cluster_uris_header_adds_uris_and_rebalance_moves_the_client() -> None:
    a, b = await started(), await started()
    a.connected_headers = {"amqlite.clusterURIs": f"{b.uri},{a.uri}", "amqlite.rebalance": "true"}
    listener = RecordingListener()
    client = AsyncClient(failover(a), listener=listener)
    await client.connect()
    await listener.wait_count("resumed", 2)
    assert client.connected_uri is not None and client.connected_uri.port == b.port
    assert [u.port for u in client.known_uris] == [b.port, a.port]
    await a.wait_for(lambda: any(f.command == "DISCONNECT" for f in a.conns[0].frames),
                     "a graceful DISCONNECT from the rebalanced client")
    await client.send("queue://q", "on b")
    assert [f.body for f in b.stored] == [b"on b"]
    await client.disconnect()
    for server in (a, b):
        await server.stop()


@async_test
async def test_cluster_header_ignored_or_not_followed_when_disabled() -> None:
    a, b = await started(), await started()
    a.connected_headers = {"amqlite.clusterURIs": b.uri, "amqlite.rebalance": "true"}
    ignoring = AsyncClient(failover(a, updateURIsSupported=False))
    await ignoring.connect()
    assert [u.port for u in ignoring.known_uris] == [a.port]
    staying = AsyncClient(failover(a, reconnectSupported=False))
    await staying.connect()
    assert [u.port for u in staying.known_uris] == [b.port, a.port]  # learnt, not followed
    await staying.send("queue://q", "x")
    await ignoring.send("queue://q", "y")
    assert not b.accept_times
    assert staying.connected_uri is not None and staying.connected_uri.port == a.port
    for client in (ignoring, staying):
        await client.disconnect()
    for server in (a, b):
        await server.stop()


# --- standby connections -------------------------------------------------------------------


@async_test
async def test_backup_standby_takes_over_without_reconnect_delay() -> None:
    a, b = await started(), await started()
    listener = RecordingListener()
    # A reconnect pass would first wait 5 s; the warm standby must make that irrelevant.
    client = AsyncClient(failover(a, b, backup=True, initialReconnectDelay=5000),
                         client_id="c-backup", listener=listener)
    await client.connect()
    await b.wait_for(lambda: len(b.live) == 1, "the standby connection")
    assert b.live[0].connect is not None
    assert b.live[0].connect.headers["client-id"] == "c-backup"
    sub = await client.subscribe("queue://q")
    assert not b.live[0].subs
    start = time.monotonic()
    await a.stop()
    await b.wait_for(lambda: bool(b.live[0].subs), "SUBSCRIBE on the standby", timeout=3)
    assert time.monotonic() - start < 2.0
    assert len(b.accept_times) == 1  # the standby itself, no new connection
    b.publish("/queue/q", b"via standby")
    message = await within(sub.receive())
    assert message is not None and message.body == b"via standby"
    await client.disconnect()
    await b.stop()


@async_test
async def test_priority_backup_moves_back_to_the_priority_broker() -> None:
    priority, other = await started(), await started()
    await priority.stop()  # down at startup: the client lands on the other broker
    listener = RecordingListener()
    client = AsyncClient(failover(priority, other, priorityBackup=True,
                                  initialReconnectDelay=20, maxReconnectDelay=100),
                         listener=listener)
    await client.connect()
    assert client.connected_uri is not None and client.connected_uri.port == other.port
    await client.subscribe("queue://q")
    await priority.start()
    await listener.wait_count("resumed", 2)
    assert client.connected_uri is not None and client.connected_uri.port == priority.port
    await priority.wait_for(lambda: len(priority.live) == 1 and bool(priority.live[0].subs),
                            "the subscription on the priority broker")
    await other.wait_for(lambda: not other.live, "the old connection closed")
    await client.disconnect()
    for server in (priority, other):
        await server.stop()


# --- transactions, discovery ---------------------------------------------------------------


@async_test
async def test_transaction_of_sends_is_replayed_after_failover() -> None:
    server = await started()
    listener = RecordingListener()
    client = AsyncClient(failover(server), listener=listener)
    await client.connect()
    tx = await client.begin()
    await client.send("queue://q", "t1", transaction=tx)
    await client.send("queue://q", "t2", transaction=tx)
    await server.wait_for(lambda: len(server.live[0].transactions.get(tx, [])) == 2, "tx sends")
    server.kill_connections()
    await listener.wait_count("resumed", 2)
    await client.commit(tx)
    assert [f.body for f in server.stored] == [b"t1", b"t2"]
    await client.disconnect()
    await server.stop()


@async_test
async def test_transaction_with_acks_is_rolled_back_by_failover() -> None:
    server, listener, client, _sub, message = await one_delivered(b"m")
    assert message is not None
    tx = await client.begin()
    await client.ack(message, transaction=tx)
    await client.send("queue://out", "derived", transaction=tx)
    server.kill_connections()
    await listener.wait_count("resumed", 2)
    with pytest.raises(TransactionRolledBackError):
        await client.commit(tx)
    assert not server.stored
    await client.disconnect()
    await server.stop()


@async_test
async def test_discovery_uses_the_resolver_hook() -> None:
    server = await started()
    asked: list[str] = []

    def resolve(agent: str) -> list[str]:
        asked.append(agent)
        return [server.uri]

    async with AsyncClient("discovery:(test:group-a)?randomize=false", resolver=resolve) as c:
        assert c.connected_uri is not None and c.connected_uri.port == server.port
    assert asked == ["test:group-a"]
    with pytest.raises(ConnectionFailedError, match="no discovery resolver"):
        await AsyncClient("discovery:(nobody:x)").connect()
    await server.stop()


@async_test
async def test_discovery_defaults_to_the_registry_resolver(tmp_path: Path) -> None:
    # No resolver registered: amqlite.client.discovery reads the (empty) registry of a store.
    store = tmp_path / "amqlite.db"
    client = AsyncClient(f"discovery:(sqlite:///{store})?group=none&startupMaxReconnectAttempts=1")
    with pytest.raises(ConnectionFailedError) as info:
        await client.connect()
    assert "after 1 attempt" in str(info.value)
    assert "found no broker" in str(info.value)  # the registry was asked, and is empty


def test_destinations() -> None:
    assert stomp_destination("queue://a.b") == "/queue/a.b"
    assert stomp_destination("topic://t") == "/topic/t"
    assert stomp_destination("/queue/x") == "/queue/x"
    for bad in ("x", "queue://", "/temp-queue/x", "/queue/"):
        with pytest.raises(ValueError, match="destination"):
            stomp_destination(bad)


@async_test
async def test_disconnect_while_connecting_ends_connect() -> None:
    dead = f"tcp://127.0.0.1:{free_port()}"
    client = AsyncClient(failover(dead, initialReconnectDelay=20))
    connecting = asyncio.create_task(client.connect())
    await poll_until(lambda: client._policy.failures >= 1, "a failed pass")
    await client.disconnect()
    with pytest.raises(ClientClosedError):
        await within(connecting)
