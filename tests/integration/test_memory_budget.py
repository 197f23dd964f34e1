"""Memory is a budget in bytes (issue 12, class 6), against a real broker process.

Each test runs a broker with a small budget (``BUDGET`` broker-wide,
``DESTINATION_BUDGET`` per destination), pushes several times the budget of
large messages through the case it names, and asserts two things:

* the broker's peak RSS (``VmHWM`` of /proc/PID/status: the kernel's own
  high-water mark, so no sample can miss a spike) stays under its idle RSS plus
  the budget plus ``RSS_OVERHEAD``;
* nothing is lost: a flow-controlled producer resumes and every message
  arrives (except on a slow non-durable topic subscriber, which by design
  misses messages; the broker counts and logs that).
"""

from __future__ import annotations

import select
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.helpers.broker_proc import (
    BrokerFactory,
    BrokerProcess,
    ClientPool,
    RawStomp,
    send_many,
    unique,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

MIB = 1024 * 1024
BUDGET = 32 * MIB
DESTINATION_BUDGET = 8 * MIB
#: RSS a broker may add beyond its idle RSS and BUDGET: what the budget does not
#: count (each queue's MIN_IN_MEMORY floor, a frame per connection past the output
#: budget, the read buffer and the frame being parsed, one commit batch's copies in the
#: store driver) and allocator slack. Unacknowledged deliveries, persistent SENDs
#: awaiting commit and unsent frames are in the budget (issue 23). Measured on these
#: tests: at most ~30 MiB above idle + budget (see each test's message).
RSS_OVERHEAD = 48 * MIB
#: Large bodies make the budget bite with few frames (and little CPU).
BODY_SIZE = 256 * 1024
#: Heart-beats of the flow-controlled producer (ms): the broker drops a client
#: silent for twice this, so a pause of 4x would drop it if silence counted.
HEARTBEAT_MS = 500
#: Deadline for a test's traffic on a loaded 2-core machine.
TRAFFIC_TIMEOUT = 60.0


def proc_status(pid: int, field: str) -> int:
    """A /proc/PID/status memory field (kB) in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} in /proc/{pid}/status")


class RssBound:
    """The broker's idle RSS when created; ``check`` asserts the peak since start."""

    def __init__(self, broker: BrokerProcess, budget: int = BUDGET,
                 overhead: int = RSS_OVERHEAD) -> None:
        self.broker = broker
        self.budget = budget
        self.overhead = overhead
        self.idle = proc_status(broker.pid, "VmRSS")
        self.limit = self.idle + budget + overhead

    def check(self) -> None:
        peak = proc_status(self.broker.pid, "VmHWM")
        assert peak <= self.limit, (
            f"broker peak RSS {peak / MIB:.1f} MiB > idle {self.idle / MIB:.1f} MiB + budget "
            f"{self.budget / MIB:.0f} MiB + overhead {self.overhead / MIB:.0f} MiB")
        print(f"peak RSS {peak / MIB:.1f} MiB = idle {self.idle / MIB:.1f} + "
              f"{(peak - self.idle) / MIB:.1f} MiB (limit {self.limit / MIB:.1f})")


def start_broker(factory: BrokerFactory, extra_args: list[str] | None = None,
                 **env: str) -> BrokerProcess:
    return factory.start(env={"AMQLITE_MAX_MEMORY": str(BUDGET),
                              "AMQLITE_MAX_DESTINATION_MEMORY": str(DESTINATION_BUDGET), **env},
                         extra_args=extra_args or [])


@pytest.fixture
def broker(broker_factory: BrokerFactory) -> BrokerProcess:
    return start_broker(broker_factory)


def body(i: int) -> str:
    """A BODY_SIZE body that names its message (so losses and duplicates show)."""
    head = f"m-{i:06d}:"
    return head + "x" * (BODY_SIZE - len(head))


def ids_of(bodies: list[str]) -> list[int]:
    return sorted(int(b[2:8]) for b in bodies)


def bodies(frames: list) -> list[str]:
    return [f.body for f in frames]


class Producer(threading.Thread):
    """Sends in a thread: a flow-controlled producer blocks in its socket send."""

    def __init__(self, send: Callable[[int], None], count: int) -> None:
        super().__init__(daemon=True)
        self.send, self.count = send, count
        self.sent = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for i in range(self.count):
                self.send(i)
                self.sent += 1
        except BaseException as e:  # reported by finish()
            self.error = e

    def finish(self, timeout: float = TRAFFIC_TIMEOUT) -> None:
        self.join(timeout)
        assert not self.is_alive(), f"producer stuck after {self.sent}/{self.count} sends"
        assert self.error is None, f"producer failed: {self.error!r}"


@pytest.fixture
def raw_clients() -> Iterator[list[RawStomp]]:
    socks: list[RawStomp] = []
    try:
        yield socks
    finally:
        for s in socks:
            s.close()


# --------------------------------------------------------------------------- 1, 4: topics


def test_stalled_topic_subscriber_is_bounded_in_bytes(
        broker: BrokerProcess, clients: ClientPool, raw_clients: list[RawStomp]) -> None:
    """A non-durable topic subscriber that never reads misses messages past the
    destination budget; the producer is never slowed, a fast subscriber gets
    everything, and RSS stays bounded (it grew by GBs when counted in messages)."""
    rss = RssBound(broker)
    topic = f"/topic/{unique('stalled')}"
    stalled = RawStomp(broker.port)
    raw_clients.append(stalled)
    stalled.connect()
    stalled.send_frame("SUBSCRIBE", {"destination": topic, "id": "s", "receipt": "sub"})
    stalled.expect("RECEIPT", "SUBSCRIBE")
    fast = clients(broker.port)
    fast.subscribe(topic)
    producer = clients(broker.port)
    count = 4 * BUDGET // BODY_SIZE  # 4x the whole broker's budget
    # Paced by the fast subscriber (a window well under the destination budget):
    # it keeps up, so it misses nothing, while the stalled one falls behind.
    window = 8
    for start in range(0, count, window):
        send_many(producer, topic, [body(i) for i in range(start, start + window)],
                  {"persistent": "false"}, timeout=TRAFFIC_TIMEOUT)
        got = fast.listener.wait_messages(start + window, TRAFFIC_TIMEOUT)
    assert ids_of(bodies(got)) == list(range(count))
    rss.check()
    # the stalled one missed messages, and we said so
    broker.wait_log("slow subscriber", TRAFFIC_TIMEOUT)


# --------------------------------------------------------------------------- 3: persistent


def persistent_backlog_pages(broker: BrokerProcess, clients: ClientPool) -> None:
    rss = RssBound(broker)
    queue = f"/queue/{unique('backlog')}"
    producer = clients(broker.port)
    count = 3 * BUDGET // BODY_SIZE
    send_many(producer, queue, [body(i) for i in range(count)], timeout=TRAFFIC_TIMEOUT)
    rss.check()  # the backlog waits in the store, not in RAM
    consumer = clients(broker.port)
    consumer.subscribe(queue)
    got = consumer.listener.wait_messages(count, TRAFFIC_TIMEOUT)
    assert ids_of(bodies(got)) == list(range(count))
    rss.check()


def test_persistent_backlog_stays_in_the_store_sqlite(broker: BrokerProcess,
                                                      clients: ClientPool) -> None:
    """Persistent messages past the budget stay in the store (SQLite) and are paged
    in by bytes for a consumer: all arrive, RSS stays bounded."""
    persistent_backlog_pages(broker, clients)


def test_persistent_backlog_stays_in_the_store_postgres(
        broker_factory: BrokerFactory, clients: ClientPool, pg_url: str) -> None:
    """The same on PostgreSQL."""
    persistent_backlog_pages(start_broker(broker_factory, ["--store", pg_url]), clients)


# --------------------------------------------------------------------------- 2, 4: queues


def test_nonpersistent_producer_over_many_queues_is_flow_controlled(
        broker_factory: BrokerFactory, clients: ClientPool) -> None:
    """Non-persistent messages over many queues (each under its own budget, all
    together over the broker's) pause the producer; consumers drain the queues,
    the producer resumes and every message arrives once. While paused, its
    heart-beats wait unread in the broker's socket: it is not dropped for that."""
    broker = start_broker(broker_factory, AMQLITE_HEARTBEAT=f"{HEARTBEAT_MS},{HEARTBEAT_MS}")
    rss = RssBound(broker)
    queues = [f"/queue/{unique(f'np{i}')}" for i in range(6)]  # 6 x 8 MiB > 32 MiB
    count = 3 * BUDGET // BODY_SIZE
    sender = clients(broker.port, heartbeats=(HEARTBEAT_MS, HEARTBEAT_MS))
    producer = Producer(lambda i: sender.conn.send(
        queues[i % len(queues)], body(i), headers={"persistent": "false"}), count)
    producer.start()
    broker.wait_log("memory budget reached", TRAFFIC_TIMEOUT)
    rss.check()
    assert producer.is_alive(), "the producer was never held back"
    # paused for several heart-beat timeouts (a negative: it must hold for a while)
    assert sender.listener.holds_for(lambda: not sender.listener.disconnected,
                                     4 * HEARTBEAT_MS / 1000), "dropped while paused"
    consumers = []
    for q in queues:
        c = clients(broker.port)
        c.subscribe(q)
        consumers.append(c)
    producer.finish()
    got: list[str] = []
    for i, c in enumerate(consumers):
        expected = len(range(i, count, len(queues)))
        got += [m.body for m in c.listener.wait_messages(expected, TRAFFIC_TIMEOUT)]
    assert ids_of(got) == list(range(count))
    rss.check()


def test_producer_that_also_consumes_does_not_deadlock(
        broker: BrokerProcess, raw_clients: list[RawStomp]) -> None:
    """One connection sends non-persistent messages to a queue and consumes them
    (client-individual, an ACK as soon as each arrives, as an asynchronous client
    does): flow control stops reading its socket, yet the broker lets its
    subscription take what waits, resumes reading, gets its ACKs, and every
    message arrives. (stomp.py cannot be this client: it sends ACKs and SENDs
    under one lock, so its own ACK waits behind a blocked SEND.)"""
    rss = RssBound(broker)
    queue = f"/queue/{unique('self')}"
    me = RawStomp(broker.port)
    raw_clients.append(me)
    me.connect()
    me.send_frame("SUBSCRIBE", {"destination": queue, "id": "s", "ack": "client-individual",
                                "receipt": "sub"})
    count = 3 * BUDGET // BODY_SIZE
    me.sock.setblocking(False)
    got: list[str] = []
    acks: list[bytes] = []
    out = b""
    sent = 0
    deadline = time.monotonic() + TRAFFIC_TIMEOUT
    while len(got) < count:
        assert time.monotonic() < deadline, f"stuck: sent {sent}, received {len(got)}"
        if not out:
            if acks:
                out = acks.pop(0)
            elif sent < count:
                out = (f"SEND\ndestination:{queue}\npersistent:false\n\n{body(sent)}"
                       .encode() + b"\x00")
                sent += 1
        readable, writable, _ = select.select([me.sock], [me.sock] if out else [], [], 1.0)
        if readable:
            data = me.sock.recv(1 << 20)
            assert data, "the broker closed the connection"
            me.buf += data
            while (frame := me._parse()) is not None:
                if frame.command == "MESSAGE":
                    got.append(frame.body.decode())
                    acks.append(f"ACK\nid:{frame.headers['ack']}\n\n".encode() + b"\x00")
                else:
                    assert frame.command == "RECEIPT", frame
            me.buf = me.buf.lstrip(b"\r\n")
        if writable and out:
            out = out[me.sock.send(out):]
    assert ids_of(got) == list(range(count))
    rss.check()


def test_transaction_commit_over_budget_resumes(broker: BrokerProcess,
                                                clients: ClientPool) -> None:
    """A COMMIT that routes more than the destination budget pauses its producer
    after the commit; a consumer drains the queue, the producer's next frames are
    read again (its COMMIT and later RECEIPTs arrive) and nothing is lost."""
    queue = f"/queue/{unique('tx')}"
    producer = clients(broker.port)
    tx = unique("tx")
    producer.tx("begin", tx)
    half = 2 * DESTINATION_BUDGET // BODY_SIZE
    # One message less than half: a transaction holds at most half of max_memory
    # (CONNECTION_SHARE_DIVISOR), headers included.
    in_tx = half - 1
    for i in range(in_tx):
        producer.conn.send(queue, body(i), headers={"persistent": "false", "transaction": tx})
    producer.tx("commit", tx)  # routed now: the queue is over its budget
    later = Producer(lambda i: producer.send(queue, body(in_tx + i), {"persistent": "false"}),
                     2 * half - in_tx)
    later.start()
    consumer = clients(broker.port)
    consumer.subscribe(queue)
    later.finish()
    got = consumer.listener.wait_messages(2 * half, TRAFFIC_TIMEOUT)
    assert ids_of(bodies(got)) == list(range(2 * half))


# --------------------------------------------------------------------------- 5: prefetch


def test_huge_prefetch_is_bounded_in_bytes(broker: BrokerProcess, clients: ClientPool) -> None:
    """A subscription with a huge activemq.prefetchSize holds at most
    MAX_INFLIGHT_BYTES unacknowledged (its connection's share of the budget if less),
    so the backlog stays in the store; as it acknowledges, the rest arrives."""
    from amqlite.broker import MAX_INFLIGHT_BYTES
    from amqlite.broker.memory import DELIVERY_SHARE_DIVISOR
    from amqlite.validation import MAX_PREFETCH

    rss = RssBound(broker)
    queue = f"/queue/{unique('prefetch')}"
    producer = clients(broker.port)
    count = 3 * BUDGET // BODY_SIZE
    send_many(producer, queue, [body(i) for i in range(count)], timeout=TRAFFIC_TIMEOUT)
    consumer = clients(broker.port)
    consumer.subscribe(queue, ack="client-individual",
                       headers={"activemq.prefetchSize": str(MAX_PREFETCH)})
    # The subscription's limit, or its connection's share of the budget if smaller.
    window = min(MAX_INFLIGHT_BYTES, BUDGET // DELIVERY_SHARE_DIVISOR) // BODY_SIZE
    first = consumer.listener.wait_messages(window, TRAFFIC_TIMEOUT)
    # nothing more comes until it acknowledges (a negative: hold it for a while)
    assert consumer.listener.holds_for(lambda: len(consumer.listener.messages) <= window + 1,
                                       1.0), f"{consumer.listener.count()} in flight"
    rss.check()
    acked = 0
    deadline = time.monotonic() + TRAFFIC_TIMEOUT
    while acked < count:
        assert time.monotonic() < deadline, f"only {acked}/{count} acknowledged"
        got = consumer.listener.wait_messages(acked + 1, TRAFFIC_TIMEOUT)
        for frame in got[acked:]:
            consumer.conn.ack(frame.headers["ack"])
            acked += 1
    assert len(first) <= window + 1
    assert ids_of(consumer.listener.bodies()) == list(range(count))
    rss.check()
