"""Issue 5, "How it is shown": one test per failover option against real ``amqlite start``
processes with a real store and locker (the embedded SQLite store and its file lock; two
processes on one --data-dir are a master/slave pair, separate data dirs are independent
masters). updateClusterClients is shown in test_cluster_update.py.

Each test shows the behaviour the option names, through the client's public API and a
RecordingListener. The back-off tests also need *when* the client tried a port that did not
listen: nothing outside the client can see a refused connect, so they read the client's own
"connect to ... failed" debug records (``AttemptLog``), stamped with time.monotonic() as
they are emitted.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from amqlite.client import (
    AsyncClient,
    ClientClosedError,
    ConnectionFailedError,
    SendTimeoutError,
)
from tests.helpers.broker_proc import (
    BrokerFactory,
    BrokerProcess,
    unique,
    wait_one_serving,
)
from tests.helpers.client import RecordingListener, async_test, poll_until, within

pytestmark = pytest.mark.integration

HOST = "127.0.0.1"
#: Slaves poll the file lock this often (default 0.5 s): these tests time the client.
BROKER_ENV = {"AMQLITE_LOCK_POLL_INTERVAL": "0.1"}
#: Short back-off for tests that are not about the back-off, so failovers take ms.
FAST = "initialReconnectDelay=50&maxReconnectDelay=250"
#: A timer never fires early; a measured gap can only come out shorter than scheduled by
#: how much later the previous refused connect was logged than the next one (ms).
EARLY_SLACK_MS = 20.0
#: A gap may come out longer by scheduling delay on shared cores: this much, or
#: LATE_FRACTION of the gap when that is more (ms).
LATE_SLACK_MS = 60.0
LATE_FRACTION = 0.2
#: The attempt that succeeds also does the STOMP handshake with a broker that has just
#: started listening: it may end this much later than scheduled on top of the slack (ms).
HANDSHAKE_ALLOWANCE_MS = 500.0
#: Clients per order/spread check: one client on the first broker could be luck.
CLIENTS = 6
#: The failover ``timeout`` of the timeout tests (ms) and how late its error may come.
SEND_TIMEOUT_MS = 600
SEND_TIMEOUT_LATE_S = 0.4
#: Deadline for a failover between real brokers (a slave takes over in ~0.2 s here).
FAILOVER_WAIT = 20.0
#: What a consumer waits for a message that should be there / to show none is left.
RECEIVE_WAIT = 10.0
NOTHING_MORE = 0.5


# --- helpers -------------------------------------------------------------------------------


class AttemptLog(logging.Handler):
    """Records (monotonic time, port) of every failed connect attempt the client logs."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.failures: list[tuple[float, int]] = []

    def emit(self, record: logging.LogRecord) -> None:
        now = time.monotonic()
        if record.msg == "connect to %s failed: %s" and record.args:
            uri = record.args[0]  # type: ignore[index]
            self.failures.append((now, uri.port))  # type: ignore[union-attr]

    def times(self, port: int, since: float = 0.0) -> list[float]:
        """When connects to ``port`` failed, after ``since``."""
        return [t for t, p in self.failures if p == port and t >= since]


@pytest.fixture
def attempts() -> Iterator[AttemptLog]:
    """The client's failed connect attempts, recorded for the duration of one test."""
    logger = logging.getLogger("amqlite.client")
    handler = AttemptLog()
    previous = logger.level
    logger.setLevel(logging.DEBUG)
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)


class LoopStalls:
    """Measures how long this event loop could not run anything (GC, a descheduled
    process on busy shared cores): a ticker sleeps TICK_S and records how late it woke.
    A back-off gap may come out late by the stalls inside it; the client cannot be on
    time while its loop does not run, and that says nothing about its schedule."""

    TICK_S = 0.005
    #: Lateness under this is ordinary timer jitter, already covered by the slack (s).
    JITTER_S = 0.005

    def __init__(self) -> None:
        self._stalls: list[tuple[float, float]] = []  # (woke at, late by), both s
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> LoopStalls:
        self._task = asyncio.ensure_future(self._tick())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()

    async def _tick(self) -> None:
        while True:
            due = time.monotonic() + self.TICK_S
            await asyncio.sleep(self.TICK_S)
            late = time.monotonic() - due
            if late > self.JITTER_S:
                self._stalls.append((time.monotonic(), late))

    def between(self, start: float, end: float) -> float:
        """Seconds the loop was stalled in (start, end], as seen by the ticker."""
        return sum(late for woke, late in self._stalls if start < woke <= end + self.TICK_S)


def tcp(broker: BrokerProcess) -> str:
    return f"tcp://{HOST}:{broker.port}"


def failover(brokers: list[BrokerProcess], query: str) -> str:
    return f"failover:({','.join(tcp(b) for b in brokers)})?{query}"


def port_of(client: AsyncClient) -> int | None:
    return None if client.connected_uri is None else client.connected_uri.port


def independent(factory: BrokerFactory, name: str) -> BrokerProcess:
    """A master of its own group and data dir, serving."""
    broker = factory.new(name=name, group=f"group-{name}", env=BROKER_ENV).start()
    broker.wait_serving()
    return broker


def pair(factory: BrokerFactory) -> tuple[BrokerProcess, BrokerProcess]:
    """Master and slave on one data dir (file lock); the master is started first."""
    shared = factory.data_dir("shared")
    master = factory.new(data_dir=shared, name="node-a", env=BROKER_ENV).start()
    wait_one_serving([master])
    slave = factory.new(data_dir=shared, name="node-b", env=BROKER_ENV).start()
    return master, slave


def assert_gaps(times: list[float], expected_ms: list[float], what: str,
                stalls: LoopStalls) -> None:
    """Each gap between consecutive times matches its scheduled wait; past the end of
    ``expected_ms`` its last value repeats (the schedule has reached its cap). A gap may
    be late by the slack plus however long the loop was stalled inside it."""
    gaps = [(b - a) * 1000 for a, b in itertools.pairwise(times)]
    assert gaps, f"{what}: no gaps measured"
    print(f"\n{what}: gaps {[round(g) for g in gaps]} ms, scheduled {expected_ms}")
    for i, (start, end) in enumerate(itertools.pairwise(times)):
        gap = gaps[i]
        want = expected_ms[min(i, len(expected_ms) - 1)]
        stalled = stalls.between(start, end) * 1000
        low = want - EARLY_SLACK_MS
        high = want + max(LATE_SLACK_MS, LATE_FRACTION * want) + stalled
        assert low <= gap <= high, (
            f"{what}: gap {i} was {gap:.0f} ms, scheduled {want:.0f} ms "
            f"(allowed {low:.0f}..{high:.0f}, of which {stalled:.0f} ms loop stalls); "
            f"all gaps {[round(g) for g in gaps]}")


def assert_connected_on_schedule(last_refused: float, connected: float, scheduled_ms: float,
                                 what: str, stalls: LoopStalls) -> None:
    """The successful attempt came one scheduled gap after the last refused one: not
    earlier, and later only by the slack plus the handshake plus loop stalls."""
    gap = (connected - last_refused) * 1000
    low = scheduled_ms - EARLY_SLACK_MS
    high = (scheduled_ms + max(LATE_SLACK_MS, LATE_FRACTION * scheduled_ms)
            + HANDSHAKE_ALLOWANCE_MS + stalls.between(last_refused, connected) * 1000)
    assert low <= gap <= high, (
        f"{what}: connected {gap:.0f} ms after the last refused attempt, scheduled "
        f"{scheduled_ms:.0f} ms (allowed {low:.0f}..{high:.0f})")


async def drain_texts(url: str, queue: str) -> list[str]:
    """Every message left on ``queue`` (acked), in order, via a fresh client."""
    consumer = AsyncClient(url)
    await consumer.connect()
    sub = await consumer.subscribe(queue, ack="client-individual")
    texts: list[str] = []
    timeout = RECEIVE_WAIT
    while (message := await sub.receive(timeout)) is not None:
        texts.append(message.text)
        assert await consumer.ack(message)
        timeout = NOTHING_MORE
    await consumer.disconnect()
    return texts


async def sent_then_dropped(url: str, broker: BrokerProcess, queue: str
                            ) -> tuple[AsyncClient, RecordingListener]:
    """A client that sent "before" to ``queue`` and has seen its only broker
    SIGKILLed (one interruption reported)."""
    listener = RecordingListener()
    client = AsyncClient(url, listener=listener)
    await client.connect()
    await client.send(queue, "before")
    await asyncio.to_thread(broker.kill)
    await listener.wait_count("interrupted", 1)
    return client, listener


# --- initialReconnectDelay / maxReconnectDelay / useExponentialBackOff / exponent ------------


@pytest.mark.parametrize(
    ("query", "scheduled_ms"),
    [
        ("initialReconnectDelay=100&maxReconnectDelay=1600", [100, 200, 400, 800, 1600]),
        ("initialReconnectDelay=100&reconnectDelayExponent=3&maxReconnectDelay=2000",
         [100, 300, 900, 2000]),
        ("initialReconnectDelay=250&useExponentialBackOff=false", [250, 250, 250, 250]),
    ],
    ids=["exponential", "exponent-3", "constant"],
)
def test_startup_backoff_follows_the_schedule_until_the_broker_listens(
    broker_factory: BrokerFactory, attempts: AttemptLog, query: str, scheduled_ms: list[float],
) -> None:
    """Before the first connection ActiveMQ waits d0, d1, d2, ... between passes (each
    ``reconnectDelayExponent`` times the last, capped at ``maxReconnectDelay``; constant
    without exponential back-off). The broker's port does not listen until the schedule
    has been seen; then the client connects at its next scheduled attempt."""
    broker = broker_factory.new(name="late", env=BROKER_ENV)  # not started: port refuses
    url = failover([broker], query)

    @async_test
    async def scenario() -> None:
        client = AsyncClient(url)
        async with LoopStalls() as stalls:
            called = time.monotonic()
            connecting = asyncio.ensure_future(client.connect())
            needed = len(scheduled_ms) + 1  # attempts whose gaps cover the explicit schedule
            await poll_until(lambda: len(attempts.times(broker.port)) >= needed,
                             f"{needed} refused attempts", timeout=sum(scheduled_ms) / 1000 + 5)
            assert not connecting.done()
            await asyncio.to_thread(broker.start)
            await within(connecting, FAILOVER_WAIT + 2 * scheduled_ms[-1] / 1000)
            connected = time.monotonic()
        assert port_of(client) == broker.port
        tried = attempts.times(broker.port)
        assert tried[0] - called <= EARLY_SLACK_MS / 1000 + LATE_SLACK_MS / 1000, \
            "the first attempt must not wait"
        assert_gaps(tried, scheduled_ms, "startup back-off", stalls)
        next_gap = scheduled_ms[min(len(tried) - 1, len(scheduled_ms) - 1)]
        assert_connected_on_schedule(tried[-1], connected, next_gap, "startup back-off", stalls)
        await client.send(f"/queue/{unique('late')}", "connected")
        await client.disconnect()

    scenario()


def test_backoff_after_a_drop_waits_before_and_after_each_pass(
    broker_factory: BrokerFactory, attempts: AttemptLog,
) -> None:
    """After an established connection drops ActiveMQ waits the delay before a pass and
    again after a failed one, then grows it: gaps d0, d0+d1, d1+d2, ... from the drop, here
    100, 300, 600, 1200, then 1600 (2 x maxReconnectDelay). The broker is SIGKILLed and
    restarted on the same port; the client is back at its next scheduled attempt."""
    broker = independent(broker_factory, "dropped")
    url = failover([broker], "initialReconnectDelay=100&maxReconnectDelay=800")
    scheduled_ms = [100, 300, 600, 1200, 1600]
    queue = f"/queue/{unique('drop')}"

    @async_test
    async def scenario() -> None:
        async with LoopStalls() as stalls:
            client, listener = await sent_then_dropped(url, broker, queue)
            dropped = client.interruptions[0].started
            await poll_until(
                lambda: len(attempts.times(broker.port, dropped)) >= len(scheduled_ms),
                "the scheduled refused attempts", timeout=sum(scheduled_ms) / 1000 + 5)
            await asyncio.to_thread(broker.start)
            await listener.wait_count("resumed", 2, timeout=FAILOVER_WAIT)
        resumed = client.interruptions[0].ended
        assert resumed is not None and port_of(client) == broker.port
        tried = attempts.times(broker.port, dropped)
        assert_gaps([dropped, *tried], scheduled_ms, "reconnect back-off", stalls)
        next_gap = scheduled_ms[min(len(tried), len(scheduled_ms) - 1)]
        assert_connected_on_schedule(tried[-1], resumed, next_gap, "reconnect back-off", stalls)
        await client.send(queue, "after")
        await client.disconnect()
        assert await drain_texts(tcp(broker), queue) == ["before", "after"]

    scenario()


# --- startupMaxReconnectAttempts / maxReconnectAttempts --------------------------------------


def test_startup_max_reconnect_attempts_gives_up_after_n_passes(
    broker_factory: BrokerFactory, attempts: AttemptLog,
) -> None:
    """A client that only knows the slave of a live pair (a slave does not listen) makes
    exactly startupMaxReconnectAttempts passes, 100 then 200 ms apart, and then connect()
    fails with ConnectionFailedError; the client is unusable afterwards."""
    _, slave = pair(broker_factory)
    assert not slave.is_serving()
    url = failover([slave], "startupMaxReconnectAttempts=3&initialReconnectDelay=100")

    @async_test
    async def scenario() -> None:
        client = AsyncClient(url)
        async with LoopStalls() as stalls:
            with pytest.raises(ConnectionFailedError, match=r"after 3 attempt\(s\)"):
                await within(client.connect())
        tried = attempts.times(slave.port)
        assert len(tried) == 3, f"expected 3 attempts, made {len(tried)}"
        assert_gaps(tried, [100, 200], "startup attempts", stalls)
        with pytest.raises(ClientClosedError):
            await client.send("/queue/never", "x")

    scenario()


@pytest.mark.parametrize("limit", [0, 2])
def test_max_reconnect_attempts_gives_up_after_n_attempts_once_connected(
    broker_factory: BrokerFactory, attempts: AttemptLog, limit: int,
) -> None:
    """Once connected, maxReconnectAttempts (not startupMaxReconnectAttempts=1) counts the
    passes after a drop: 0 reports the loss at once without trying, N gives up after N
    passes. The listener hears ConnectionFailedError and sends fail with ClientClosedError."""
    broker = independent(broker_factory, "limited")
    url = failover([broker], f"maxReconnectAttempts={limit}&startupMaxReconnectAttempts=1"
                             "&initialReconnectDelay=100")

    @async_test
    async def scenario() -> None:
        listener = RecordingListener()
        client = AsyncClient(url, listener=listener)
        await client.connect()
        async with LoopStalls() as stalls:
            await asyncio.to_thread(broker.kill)
            await listener.wait_for(
                lambda: any(isinstance(e, ConnectionFailedError) for e in listener.exceptions()),
                "ConnectionFailedError", timeout=FAILOVER_WAIT)
        dropped = client.interruptions[0].started
        tried = attempts.times(broker.port, dropped)
        assert len(tried) == limit, f"expected {limit} attempts after the drop, made {tried}"
        failure = next(e for e in listener.exceptions() if isinstance(e, ConnectionFailedError))
        expected = "reconnect is disabled" if limit == 0 else f"after {limit} attempt(s)"
        assert expected in str(failure)
        if limit:
            assert_gaps([dropped, *tried], [100, 300], "reconnect attempts", stalls)
        with pytest.raises(ClientClosedError):
            await client.send("/queue/never", "x")

    scenario()


# --- randomize -------------------------------------------------------------------------------


def test_randomize_false_always_picks_the_first_listed_live_broker(
    broker_factory: BrokerFactory,
) -> None:
    """Three independent masters A, B, C listed in that order. With randomize=false every
    client is on A; after A dies, on B; after B dies, on C. With randomize (default, seeded
    so the test is deterministic) the same clients spread over more than one broker."""
    a, b, c = (independent(broker_factory, n) for n in ("a", "b", "c"))
    ordered_url = failover([a, b, c], f"randomize=false&{FAST}")
    shuffled_url = failover([a, b, c], FAST)

    @async_test
    async def scenario() -> None:
        listeners = [RecordingListener() for _ in range(CLIENTS)]
        ordered = [AsyncClient(ordered_url, listener=lst) for lst in listeners]
        shuffled = [AsyncClient(shuffled_url, rng=random.Random(seed))
                    for seed in range(CLIENTS)]
        await asyncio.gather(*(cl.connect() for cl in ordered + shuffled))
        assert [port_of(cl) for cl in ordered] == [a.port] * CLIENTS
        spread = {port_of(cl) for cl in shuffled}
        assert len(spread) > 1, f"randomize=true put all {CLIENTS} clients on {spread}"
        for resumes, dead, expected in ((2, a, b), (3, b, c)):
            await asyncio.to_thread(dead.kill)
            for lst in listeners:
                await lst.wait_count("resumed", resumes, timeout=FAILOVER_WAIT)
            assert [port_of(cl) for cl in ordered] == [expected.port] * CLIENTS, (
                f"after {dead.name} died: {[port_of(cl) for cl in ordered]}")
        for cl in ordered + shuffled:
            await cl.disconnect()

    scenario()


# --- timeout ---------------------------------------------------------------------------------


def test_timeout_fails_a_send_while_no_broker_is_up_and_the_next_succeeds(
    broker_factory: BrokerFactory,
) -> None:
    """timeout=600: with the only broker down, a send fails with SendTimeoutError after
    ~600 ms (never written, so withdrawn), the client stays alive and reconnects when the
    broker is back, and the next send succeeds. The store has exactly the two sends that
    succeeded."""
    broker = independent(broker_factory, "timeout")
    url = failover([broker], f"timeout={SEND_TIMEOUT_MS}&{FAST}")
    queue = f"/queue/{unique('timeout')}"

    @async_test
    async def scenario() -> None:
        client, listener = await sent_then_dropped(url, broker, queue)
        started = time.monotonic()
        with pytest.raises(SendTimeoutError) as failed:
            await within(client.send(queue, "while-down"))
        elapsed = time.monotonic() - started
        assert SEND_TIMEOUT_MS / 1000 <= elapsed <= SEND_TIMEOUT_MS / 1000 + SEND_TIMEOUT_LATE_S
        assert failed.value.written is False
        assert not client.closed and client.pending_sends == 0
        assert not any(isinstance(e, ConnectionFailedError) for e in listener.exceptions())
        broker.start()
        await listener.wait_count("resumed", 2, timeout=FAILOVER_WAIT)
        result = await client.send(queue, "after")
        assert result.receipt is not None
        await client.disconnect()
        assert await drain_texts(tcp(broker), queue) == ["before", "after"]

    scenario()


def test_timeout_on_a_stalled_broker_keeps_the_written_send_and_the_connection(
    broker_factory: BrokerFactory,
) -> None:
    """timeout=600 against a SIGSTOPped broker: the send was written, so after ~600 ms it
    fails with written=True, yet the connection is not touched and the send stays queued.
    Once the broker runs again its RECEIPT comes in on the same connection, the next send
    succeeds, and each message is stored exactly once."""
    broker = independent(broker_factory, "stalled")
    url = failover([broker], f"timeout={SEND_TIMEOUT_MS}&{FAST}")
    queue = f"/queue/{unique('stalled')}"

    @async_test
    async def scenario() -> None:
        listener = RecordingListener()
        client = AsyncClient(url, listener=listener)
        await client.connect()
        await client.send(queue, "before")
        broker.pause()
        try:
            started = time.monotonic()
            with pytest.raises(SendTimeoutError) as failed:
                await within(client.send(queue, "while-stalled"))
            elapsed = time.monotonic() - started
        finally:
            broker.resume()
        assert SEND_TIMEOUT_MS / 1000 <= elapsed <= SEND_TIMEOUT_MS / 1000 + SEND_TIMEOUT_LATE_S
        assert failed.value.written is True
        await poll_until(lambda: client.pending_sends == 0, "the late RECEIPT")
        await client.send(queue, "after")
        assert listener.count("interrupted") == 0, "the timeout must not drop the connection"
        await client.disconnect()
        assert await drain_texts(tcp(broker), queue) == ["before", "while-stalled", "after"]

    scenario()


# --- priorityBackup --------------------------------------------------------------------------


def test_priority_backup_returns_to_the_preferred_broker(
    broker_factory: BrokerFactory,
) -> None:
    """Masters of two groups, A (listed first: the priority broker) and B. Stop A: the
    clients move to B. Start A again: the priorityBackup client goes back to A by itself,
    while an otherwise identical client without priorityBackup stays on B."""
    a = independent(broker_factory, "preferred")
    b = independent(broker_factory, "fallback")
    queue = f"/queue/{unique('priority')}"

    @async_test
    async def scenario() -> None:
        prio_events, plain_events = RecordingListener(), RecordingListener()
        prio = AsyncClient(failover([a, b], f"randomize=false&priorityBackup=true&{FAST}"),
                           listener=prio_events)
        plain = AsyncClient(failover([a, b], f"randomize=false&{FAST}"), listener=plain_events)
        await asyncio.gather(prio.connect(), plain.connect())
        assert port_of(prio) == port_of(plain) == a.port
        await asyncio.to_thread(a.terminate)
        await prio_events.wait_count("resumed", 2, timeout=FAILOVER_WAIT)
        await plain_events.wait_count("resumed", 2, timeout=FAILOVER_WAIT)
        assert port_of(prio) == port_of(plain) == b.port
        a.start()
        await prio_events.wait_count("resumed", 3, timeout=FAILOVER_WAIT)
        assert port_of(prio) == a.port
        assert port_of(plain) == b.port and plain_events.count("resumed") == 2
        await prio.send(queue, "back-on-a")
        for client in (prio, plain):
            await client.disconnect()
        assert await drain_texts(tcp(a), queue) == ["back-on-a"]
        assert await drain_texts(tcp(b), queue) == []

    scenario()


# --- updateURIsURL ---------------------------------------------------------------------------


def test_update_uris_url_leads_the_client_to_a_broker_it_was_not_configured_with(
    broker_factory: BrokerFactory, tmp_path: Path,
) -> None:
    """The client is configured with the master of a pair only; after it connected, the
    file named by updateURIsURL is changed to list the slave. When the master is killed the
    client reaches the slave (now master) and nothing is lost; a client without the file
    keeps retrying the dead master."""
    master, slave = pair(broker_factory)
    uris_file = tmp_path / "broker-uris.txt"
    uris_file.write_text("")
    with_file = failover([master], f"updateURIsURL=file://{uris_file}&randomize=false&{FAST}")
    without_file = failover([master], f"randomize=false&{FAST}")
    queue = f"/queue/{unique('uris-file')}"

    @async_test
    async def scenario() -> None:
        events, control_events = RecordingListener(), RecordingListener()
        client = AsyncClient(with_file, listener=events)
        control = AsyncClient(without_file, listener=control_events)
        await asyncio.gather(client.connect(), control.connect())
        await client.send(queue, "before")
        uris_file.write_text(f"{tcp(slave)}\n")  # re-read before every reconnect pass
        await asyncio.to_thread(master.kill)
        await within(client.send(queue, "after"), FAILOVER_WAIT)
        assert port_of(client) == slave.port
        assert events.count("resumed") == 2
        await control_events.wait_count("interrupted", 1)
        assert not control.connected and control_events.count("resumed") == 1
        for c in (client, control):
            await c.disconnect()
        assert await drain_texts(tcp(slave), queue) == ["before", "after"]

    scenario()
