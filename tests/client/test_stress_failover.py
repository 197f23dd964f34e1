"""Issue 5's classic stress test (HornetQ's "50 producer threads, kill the live server"):
50 producer threads and 4 consumers, each a blocking ``Client`` on ``failover:(3 URIs)`` of
a 3-broker group with a PostgreSQL store and advisory lock. The master is SIGKILLed 5 times
while messages are in flight; each time the test waits for the takeover, restarts the killed
node as a slave and lets every client reconnect before the next kill.

At the end: every message that got a RECEIPT was delivered; no producer identity was
stored twice (one message-id per identity, one amq_dedup row per identity, nothing left in
amq_messages); and a message is delivered again only after a delivery whose ack was not
confirmed (the client's ``unconfirmed_acks``), flagged ``redelivered``. Prints the counts
and the per-failover gap each producer saw (its ``interruptions``).
"""

from __future__ import annotations

import collections
import contextlib
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from amqlite.client import Client, Message
from tests.helpers.broker_proc import BrokerFactory, BrokerProcess, unique
from tests.helpers.pg_ha import PgGroup, wait_log
from tests.helpers.poll import poll as poll_until
from tests.helpers.servers import PostgresServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

PRODUCERS = 50
CONSUMERS = 4
KILLS = 5
#: The run is cut into KILLS + 1 phases; every producer sends PER_PHASE messages in each
#: and the master is killed in the middle of every phase but the first.
PHASES = KILLS + 1
PER_PHASE = 7
PER_PRODUCER = PHASES * PER_PHASE
TOTAL = PRODUCERS * PER_PRODUCER
#: Seconds between two sends of one producer: up to 500 messages/s offered in all while a
#: phase is open, enough that every kill finds sends without RECEIPT (0.3 s left ~1 in
#: flight at a kill), little enough for 2 shared cores.
PACE = 0.1
#: Messages a consumer may hold unacknowledged (they are redelivered after a kill).
PREFETCH = 10
#: A consumer acks a message once this many newer ones arrived (or the queue is idle for
#: RECEIVE_POLL), like one that processes with some lag: a kill always finds deliveries
#: whose ack has not been sent yet, so the redelivery path is exercised.
ACK_LAG = 4
#: Client back-off: retry fast, never wait more than 400 ms between passes.
CLIENT_QUERY = "initialReconnectDelay=20&maxReconnectDelay=400"
#: Deadlines (s): a takeover, every client back, one phase of traffic, the final drain.
TAKEOVER_TIMEOUT = 30.0
RECONNECT_TIMEOUT = 30.0
PHASE_TIMEOUT = 60.0
DRAIN_TIMEOUT = 60.0
#: How long a stopped thread may take to finish its current call.
JOIN_TIMEOUT = 5.0
#: The queue counts as drained after this long without a delivery.
QUIET = 1.0
#: How long a consumer's receive() waits before it checks whether to stop.
RECEIVE_POLL = 0.2
#: Poll interval of the controller's deadline loops.
POLL = 0.05
SLAVE_LOG_LINE = "waiting for the lock"


# --- bookkeeping shared by the threads -------------------------------------------------------


@dataclass(slots=True)
class Delivery:
    """One MESSAGE handed to a consumer, and whether its ack was confirmed."""

    consumer: int
    identity: tuple[str, int]
    body: str  # unique per send: catches a copy stored under another identity
    message_id: str
    redelivered: bool
    received: float
    message: Message
    confirmed: bool | None = None  # None until ack() returned


class Ledger:
    """Receipts and deliveries of the whole run, under one condition variable."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.receipted: set[tuple[str, int]] = set()
        self.deliveries: list[Delivery] = []
        self.delivered: set[tuple[str, int]] = set()
        self.last_delivery = time.monotonic()
        self.quota = 0  # messages each producer may have sent by now
        self.errors: list[str] = []

    def receipt(self, identity: tuple[str, int]) -> None:
        with self.cond:
            self.receipted.add(identity)
            self.cond.notify_all()

    def deliver(self, delivery: Delivery) -> None:
        with self.cond:
            self.deliveries.append(delivery)
            self.delivered.add(delivery.identity)
            self.last_delivery = delivery.received
            self.cond.notify_all()

    def error(self, text: str) -> None:
        with self.cond:
            self.errors.append(text)
            self.cond.notify_all()

    def raise_quota(self, quota: int) -> None:
        with self.cond:
            self.quota = min(quota, PER_PRODUCER)
            self.cond.notify_all()

    def wait_quota(self, count: int, stop: threading.Event) -> bool:
        """Block until a producer may send its ``count``-th message (False: stopping)."""
        with self.cond:
            self.cond.wait_for(lambda: self.quota >= count or stop.is_set())
            return not stop.is_set()

    def wait(self, predicate: Callable[[], bool], what: str, timeout: float) -> None:
        """Wait (on notifications, never a sleep) until ``predicate`` holds or a thread
        reported an error."""
        with self.cond:
            ok = self.cond.wait_for(lambda: predicate() or bool(self.errors), timeout)
            assert not self.errors, f"client thread failed: {self.errors[:3]}"
            assert ok, f"{what} not reached within {timeout}s"


class Producer(threading.Thread):
    """Sends PER_PRODUCER persistent messages at a steady pace, within the quota."""

    def __init__(self, index: int, url: str, queue: str, ledger: Ledger,
                 stop: threading.Event) -> None:
        super().__init__(name=f"producer-{index}", daemon=True)
        self.index = index
        self.queue = queue
        self.ledger = ledger
        self.stop = stop
        self.client = Client(url)
        self.sent = 0
        self.receipted = 0

    def run(self) -> None:
        next_at = time.monotonic() + PACE * self.index / PRODUCERS  # spread the starts
        try:
            for number in range(1, PER_PRODUCER + 1):
                if not self.ledger.wait_quota(number, self.stop):
                    return
                if self.stop.wait(max(0.0, next_at - time.monotonic())):  # pacing only
                    return
                next_at = max(next_at + PACE, time.monotonic())
                self.sent += 1
                result = self.client.send(self.queue, f"p{self.index}-m{number}")
                self.receipted += 1
                self.ledger.receipt(result.identity)
        except Exception as exc:
            self.ledger.error(f"{self.name}: {exc!r}")


class Consumer(threading.Thread):
    """Receives with client-individual acks and records every delivery and ack outcome."""

    def __init__(self, index: int, url: str, queue: str, ledger: Ledger,
                 stop: threading.Event) -> None:
        super().__init__(name=f"consumer-{index}", daemon=True)
        self.index = index
        self.ledger = ledger
        self.stop = stop
        self.client = Client(url)
        self.client.connect()
        self.sub = self.client.subscribe(queue, ack="client-individual", prefetch=PREFETCH)

        self.held: collections.deque[Delivery] = collections.deque()

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                message = self.sub.receive(RECEIVE_POLL)
                if message is None:
                    self.ack_held(0)
                    continue
                identity = message.identity
                if identity is None:
                    self.ledger.error(f"{self.name}: message without identity {message.headers}")
                    return
                delivery = Delivery(self.index, identity, message.text, message.message_id,
                                    message.redelivered, time.monotonic(), message)
                self.ledger.deliver(delivery)
                self.held.append(delivery)
                self.ack_held(ACK_LAG)
            self.ack_held(0)
        except Exception as exc:
            self.ledger.error(f"{self.name}: {exc!r}")

    def ack_held(self, keep: int) -> None:
        """Ack the oldest held deliveries until ``keep`` are left; record the outcome."""
        while len(self.held) > keep:
            delivery = self.held.popleft()
            delivery.confirmed = self.client.ack(delivery.message)


# --- the controller's waits ------------------------------------------------------------------


def poll(predicate: Callable[[], bool], what: str, timeout: float) -> None:
    """Poll state that has no event of its own (other threads' clients, SQL) to a deadline."""
    poll_until(predicate, timeout=timeout, what=what, interval=POLL)


def all_back(clients: list[Client], failovers: int) -> bool:
    """Every client saw ``failovers`` interruptions, each ended, and is connected."""
    return all(
        len(c.interruptions) >= failovers and c.interruptions[-1].ended is not None
        and c.connected for c in clients
    )


def kill_master(group: PgGroup, master: BrokerProcess, clients: list[Client],
                failovers: int) -> tuple[BrokerProcess, float]:
    """SIGKILL the master, wait for exactly one new master, restart the killed node as a
    slave and wait until every client reconnected. Returns the new master and the seconds
    until it served."""
    master.kill()
    new_master, took = group.wait_one_master(timeout=TAKEOVER_TIMEOUT)
    assert new_master is not master
    mark = len(master.log_text())
    master.start()
    wait_log(master, SLAVE_LOG_LINE, mark, timeout=TAKEOVER_TIMEOUT)
    poll(lambda: all_back(clients, failovers), f"all clients back after kill {failovers}",
         RECONNECT_TIMEOUT)
    return new_master, took


@pytest.fixture
def group(broker_factory: BrokerFactory, postgres_server: PostgresServer,
          pg_url: str) -> PgGroup:
    """Three nodes on this test's own PostgreSQL database (store and advisory lock)."""
    return PgGroup(broker_factory, postgres_server, pg_url)


@contextlib.contextmanager
def running(threads: list[threading.Thread], stop: threading.Event,
            clients: Callable[[], list[Client]]) -> Iterator[None]:
    """Start the threads; on the way out stop and join them and close every client."""
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join(JOIN_TIMEOUT)
        for client in clients():  # also ends a send still waiting for a broker
            with contextlib.suppress(Exception):
                client.close()
        for thread in threads:
            thread.join(JOIN_TIMEOUT)


# --- the test --------------------------------------------------------------------------------


def test_fifty_producers_survive_five_master_kills(group: PgGroup) -> None:
    """HornetQ's stress test on failover:(3 URIs) with 5 SIGKILLs (module docstring)."""
    started = time.monotonic()
    master = group.start(3)
    url = f"failover:({','.join(f'tcp://127.0.0.1:{b.port}' for b in group.brokers)})" \
          f"?{CLIENT_QUERY}"
    queue = f"/queue/{unique('stress')}"
    ledger = Ledger()
    stop = threading.Event()
    consumers: list[Consumer] = []
    producers: list[Producer] = []

    def every_client() -> list[Client]:
        return [t.client for t in (*producers, *consumers)]

    try:
        consumers.extend(Consumer(i, url, queue, ledger, stop) for i in range(CONSUMERS))
        producers.extend(Producer(i, url, queue, ledger, stop) for i in range(PRODUCERS))
        for p in producers:
            p.client.connect()
    except BaseException:
        for client in every_client():
            client.close()
        raise
    takeovers: list[float] = []
    #: At each kill: sends without RECEIPT, deliveries not acked yet, messages not sent yet.
    in_flight: list[tuple[int, int, int]] = []
    with running([*consumers, *producers], stop, every_client):
        # Kill k comes in the middle of phase k + 1, whose end is the producers' quota
        # until that takeover is complete: every kill finds the producers sending.
        ledger.raise_quota(2 * PER_PHASE)
        for kill in range(1, KILLS + 1):
            threshold = int((kill + 0.5) * PER_PHASE * PRODUCERS)
            ledger.wait(lambda t=threshold: len(ledger.receipted) >= t,
                        f"{threshold} receipts before kill {kill}", PHASE_TIMEOUT)
            in_flight.append((sum(p.sent - p.receipted for p in producers),
                              sum(len(c.held) for c in consumers),
                              TOTAL - len(ledger.receipted)))
            master, took = kill_master(group, master, every_client(), kill)
            takeovers.append(took)
            ledger.raise_quota((kill + 2) * PER_PHASE)
        ledger.wait(lambda: len(ledger.receipted) >= TOTAL, "every send receipted",
                    PHASE_TIMEOUT)
        # Drained: every stored message acked (so delivered), then no delivery for QUIET.
        poll(lambda: group.scalar("SELECT count(*) FROM amq_messages"
                                  f" WHERE grp = '{group.group}'") == "0",
             "an empty store (every message acked)", DRAIN_TIMEOUT)
        poll(lambda: time.monotonic() - ledger.last_delivery >= QUIET, "a quiet queue",
             DRAIN_TIMEOUT)
    assert not ledger.errors, ledger.errors
    assert all(unsent > 0 for _, _, unsent in in_flight), f"a kill after the run: {in_flight}"
    verify(group, producers, consumers, ledger, takeovers, time.monotonic() - started)
    print(f"  at each kill (unreceipted sends, unacked deliveries, unsent): {in_flight}")


def verify(group: PgGroup, producers: list[Producer], consumers: list[Consumer],
           ledger: Ledger, takeovers: list[float], runtime: float) -> None:
    """The promises of the issue, then the counts."""
    sent = sum(p.sent for p in producers)
    assert sent == TOTAL and sum(p.receipted for p in producers) == TOTAL
    assert len(ledger.receipted) == TOTAL, "a producer identity was receipted twice"

    # every receipted message delivered; nothing delivered that nobody sent
    missing = ledger.receipted - ledger.delivered
    assert not missing, f"{len(missing)} receipted messages never delivered: {sorted(missing)[:5]}"
    assert ledger.delivered <= ledger.receipted, "delivered a message nobody sent"

    # no identity stored twice: one dedup row each, one message-id each, nothing left over
    dedup = group.rows(f"SELECT producer_id, producer_seq FROM amq_dedup"
                       f" WHERE grp = '{group.group}'")
    dedup_keys = [(pid, int(seq)) for pid, seq in dedup]
    assert len(dedup_keys) == len(set(dedup_keys)) == TOTAL
    assert set(dedup_keys) == ledger.receipted
    by_identity: dict[tuple[str, int], list[Delivery]] = collections.defaultdict(list)
    for d in ledger.deliveries:
        by_identity[d.identity].append(d)
    stored_twice = {i: {d.message_id for d in ds} for i, ds in by_identity.items()
                    if len({d.message_id for d in ds}) > 1}
    assert not stored_twice, f"identities stored as several messages: {stored_twice}"
    by_body: dict[str, set[str]] = collections.defaultdict(set)
    for d in ledger.deliveries:
        by_body[d.body].add(d.message_id)
    copies = {b: ids for b, ids in by_body.items() if len(ids) > 1}
    assert not copies, f"sends stored as several messages: {list(copies.items())[:5]}"
    assert len(by_body) == TOTAL
    left = group.scalar(f"SELECT count(*) FROM amq_messages WHERE grp = '{group.group}'")
    assert left == "0", f"{left} messages still stored after the drain"

    # a second delivery only after an unconfirmed ack, and flagged redelivered
    assert all(d.confirmed is not None for d in ledger.deliveries), "an ack never returned"
    for identity, deliveries in by_identity.items():
        deliveries.sort(key=lambda d: d.received)
        confirmed_early = [d for d in deliveries[:-1] if d.confirmed]
        assert not confirmed_early, (
            f"{identity} delivered again after its ack was confirmed: {deliveries}")
        not_flagged = [d for d in deliveries[1:] if not d.redelivered]
        assert not not_flagged, f"{identity} delivered again without redelivered: {deliveries}"
    unconfirmed = [d for d in ledger.deliveries if not d.confirmed]
    reported = collections.Counter(id(m) for c in consumers for m in c.client.unconfirmed_acks)
    assert collections.Counter(id(d.message) for d in unconfirmed) == reported, (
        "the deliveries whose ack() returned False differ from the clients' unconfirmed_acks")

    # each producer saw each failover exactly once, and got back
    gaps_by_kill: list[list[float]] = [[] for _ in range(KILLS)]
    for p in producers:
        durations = [i.duration for i in p.client.interruptions]
        assert len(durations) == KILLS, f"{p.name} saw {len(durations)} interruptions"
        for kill, duration in enumerate(durations):
            assert duration is not None
            gaps_by_kill[kill].append(duration * 1000)
    gaps = [g for per_kill in gaps_by_kill for g in per_kill]

    duplicates = len(ledger.deliveries) - len(ledger.delivered)
    flagged = sum(d.redelivered for d in ledger.deliveries)
    committed_unconfirmed = sum(1 for ds in by_identity.values() if not ds[-1].confirmed)
    print(f"\nstress: {PRODUCERS} producers, {CONSUMERS} consumers, {KILLS} master SIGKILLs, "
          f"{runtime:.1f} s")
    print(f"  sent {sent}, receipted {len(ledger.receipted)}, re-sent after failover "
          f"{sum(p.client.resent for p in producers)}, stored once each {len(dedup_keys)}")
    print(f"  delivered {len(ledger.delivered)} distinct in {len(ledger.deliveries)} "
          f"deliveries: duplicate deliveries {duplicates}, flagged redelivered {flagged}, "
          f"unconfirmed acks {len(unconfirmed)} (acks committed but unconfirmed: "
          f"{committed_unconfirmed})")
    print(f"  takeover (s): {[round(t, 2) for t in takeovers]}")
    print(f"  producer failover gap (ms): median {statistics.median(gaps):.0f}, "
          f"max {max(gaps):.0f} over {len(gaps)} gaps; per failover (median/max): "
          + ", ".join(f"{statistics.median(g):.0f}/{max(g):.0f}" for g in gaps_by_kill))
