"""The canary: well-behaved stomp.py clients that must not notice the fuzzer.

One STOMP 1.2 producer sends persistent messages with a unique body and a receipt on
every SEND, alternately to a canary queue and a canary topic. Consumers of STOMP 1.0
(ack client), 1.1 and 1.2 (ack client-individual) compete on the queue and each also
subscribes to the topic. The fuzzer sends hostile frames to the same destinations, so
whatever the broker relays from them reaches these consumers. At the end every receipted
queue message arrived exactly once over all consumers, every receipted topic message
exactly once at each consumer, and no canary connection saw an ERROR, a forged frame or
a disconnect.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field

import stomp
from stomp.utils import Frame

from tests.helpers.broker_proc import CONNECTIONS, HOST

#: How long the canary producer waits for the RECEIPTs of one window of SENDs. A healthy
#: broker answers in milliseconds; the margin is for a loaded 2-core CI machine.
RECEIPT_TIMEOUT = 30.0
#: SENDs in flight before the producer waits for their RECEIPTs (pipelining, as real
#: producers with async sends do, without letting the canary dominate the broker's CPU).
WINDOW = 8
#: Pause between windows: the canary checks, it does not load the broker (unpaced it
#: takes most of the broker's CPU and starves the fuzzer); 8 per 20 ms is <= 400 msg/s.
PACE = 0.02
#: How long the consumers may take, after the producer stopped, to receive everything.
DRAIN_TIMEOUT = 30.0
#: How often the drain re-checks that everything arrived.
DRAIN_CHECK = 0.1
CONNECT_TIMEOUT = 15.0
#: Frames each canary listener remembers for its problem reports.
RECENT_FRAMES = 4
QUEUE_PREFIX = b"canary-q-"
TOPIC_PREFIX = b"canary-t-"
#: Prefix of the canary's own receipt ids: any other receipt-id is a forged frame.
RECEIPT_PREFIX = "k-"


def _lost_and_doubled(who: str, sent: set[bytes], counts: Counter[bytes]) -> list[str]:
    """The problems of ``who``: receipted bodies ``sent`` that never arrived, and bodies that
    arrived more than once."""
    problems = []
    lost = sorted(sent - counts.keys())
    if lost:
        problems.append(f"{who}: {len(lost)} of {len(sent)} receipted messages never arrived, "
                        f"e.g. {lost[:5]}")
    doubled = sorted(b for b, c in counts.items() if c > 1)
    if doubled:
        problems.append(f"{who}: {len(doubled)} messages arrived more than once, "
                        f"e.g. {doubled[:5]}")
    return problems


class CanaryListener(stomp.ConnectionListener):
    """Records what one canary connection receives; ACKs queue messages as they come."""

    def __init__(self, name: str, version: str, destinations: tuple[str, str],
                 cond: threading.Condition) -> None:
        self.name = name
        self.version = version
        self.destinations = destinations
        self.conn: stomp.Connection | None = None
        #: Shared by all canary listeners: the drain waits on messages reaching any of them.
        self.cond = cond
        self.connected = False
        self.disconnected = False
        self.queue_bodies: list[bytes] = []
        self.topic_bodies: list[bytes] = []
        self.receipts: set[str] = set()
        self.problems: list[str] = []
        #: The last frames received, shown with a problem: they are what led to it.
        self.recent: deque[str] = deque(maxlen=RECENT_FRAMES)
        #: message-id and ack id -> the queue MESSAGE ACKed: explains an ACK the broker refuses.
        self.acked: dict[str, str] = {}

    def on_connected(self, frame: Frame) -> None:
        with self.cond:
            self.connected = True
            self.cond.notify_all()

    def on_message(self, frame: Frame) -> None:
        dest = frame.headers.get("destination")
        body = frame.body if isinstance(frame.body, bytes) else str(frame.body).encode()
        with self.cond:
            self.recent.append(f"MESSAGE {frame.headers} {body[:100]!r}")
            if dest == self.destinations[0]:
                self.queue_bodies.append(body)
            elif dest == self.destinations[1]:
                self.topic_bodies.append(body)
            else:
                self.problems.append(f"MESSAGE for a destination it never subscribed to "
                                     f"(a forged frame?): {frame.headers}")
            self.cond.notify_all()
        if dest == self.destinations[0]:
            with self.cond:
                seen = f"{frame.headers} {body[:100]!r}"
                self.acked[frame.headers.get("message-id", "")] = seen
                self.acked[frame.headers.get("ack", "")] = seen
            self._ack(frame)

    def _ack(self, frame: Frame) -> None:
        """Acknowledge by the means the negotiated version offers (outside the lock)."""
        h = frame.headers
        try:
            if self.version == "1.2":
                self.conn.ack(h["ack"])  # type: ignore[union-attr]
            elif self.version == "1.1":
                self.conn.ack(h["message-id"], h["subscription"])  # type: ignore[union-attr]
            else:
                self.conn.ack(h["message-id"])  # type: ignore[union-attr]
        except Exception as exc:  # a missing header or a broken socket: the canary broke
            with self.cond:
                self.problems.append(f"could not ACK {frame.headers}: {exc!r}")

    def on_receipt(self, frame: Frame) -> None:
        rid = frame.headers.get("receipt-id", "")
        with self.cond:
            if not rid.startswith(RECEIPT_PREFIX):
                self.problems.append(f"RECEIPT it never asked for (forged?): {frame.headers}; "
                                     f"the frames before: {list(self.recent)}")
            self.receipts.add(rid)
            self.cond.notify_all()

    def on_error(self, frame: Frame) -> None:
        with self.cond:
            quoted = re.findall(r"'([^']*)'", frame.headers.get("message", ""))
            named = [self.acked[k] for k in quoted if k in self.acked]
            self.problems.append(f"ERROR {frame.headers} {frame.body!r}; the frames before: "
                                 f"{list(self.recent)}; the MESSAGE it names: {named}")
            self.cond.notify_all()

    def on_disconnected(self) -> None:
        with self.cond:
            self.disconnected = True
            self.cond.notify_all()

    def on_heartbeat_timeout(self) -> None:
        with self.cond:
            self.problems.append("heart-beat timeout")


def open_canary(port: int, version: str, name: str, destinations: tuple[str, str],
                cond: threading.Condition) -> tuple[stomp.Connection, CanaryListener]:
    cls = CONNECTIONS[version]
    conn = cls([(HOST, port)], auto_decode=False, reconnect_attempts_max=1, timeout=5)
    listener = CanaryListener(name, version, destinations, cond)
    listener.conn = conn
    conn.set_listener("canary", listener)
    if version == "1.0":
        conn.connect(wait=False)
    else:
        conn.connect(wait=False, headers={"host": "localhost"})
    with listener.cond:
        ok = listener.cond.wait_for(
            lambda: listener.connected or listener.disconnected or bool(listener.problems),
            CONNECT_TIMEOUT)
    assert ok and listener.connected, (f"canary {name} (STOMP {version}) got no CONNECTED: "
                                       f"{listener.problems}")
    return conn, listener


@dataclass
class Canary:
    """The producer thread and the consumers; check() lists what went wrong."""

    port: int
    queue: str
    topic: str
    stop: threading.Event = field(default_factory=threading.Event)
    consumers: list[tuple[stomp.Connection, CanaryListener]] = field(default_factory=list)
    producer: tuple[stomp.Connection, CanaryListener] | None = None
    receipted: dict[bytes, bytes] = field(default_factory=dict)  # body -> prefix
    problems: list[str] = field(default_factory=list)
    thread: threading.Thread | None = None
    cond: threading.Condition = field(default_factory=threading.Condition)

    def start(self) -> None:
        dests = (self.queue, self.topic)
        for version in ("1.0", "1.1", "1.2"):
            conn, listener = open_canary(self.port, version, f"consumer-{version}", dests,
                                         self.cond)
            self.consumers.append((conn, listener))
            sub_id = f"cq-{version}"
            ack = "client" if version == "1.0" else "client-individual"
            # Subscribe with a receipt so the producer starts only once every subscription
            # is in place (a topic message sent before would rightly reach nobody).
            conn.subscribe(self.queue, id=sub_id, ack=ack, headers={"receipt": f"k-{sub_id}"})
            conn.subscribe(self.topic, id=f"ct-{version}", ack="auto",
                           headers={"receipt": f"k-ct-{version}"})
            for rid in (f"k-{sub_id}", f"k-ct-{version}"):
                assert self._wait_receipt(listener, rid, CONNECT_TIMEOUT), (
                    f"canary {listener.name}: no RECEIPT for SUBSCRIBE ({listener.problems})")
        self.producer = open_canary(self.port, "1.2", "producer", dests, self.cond)
        self.thread = threading.Thread(target=self._produce, daemon=True, name="canary")
        self.thread.start()

    @staticmethod
    def _wait_receipt(listener: CanaryListener, rid: str, timeout: float) -> bool:
        with listener.cond:
            return listener.cond.wait_for(
                lambda: rid in listener.receipts or listener.disconnected, timeout) and (
                rid in listener.receipts)

    def _produce(self) -> None:
        assert self.producer is not None
        conn, listener = self.producer
        n = 0
        while not self.stop.wait(PACE):
            window: list[tuple[str, bytes, bytes]] = []
            for _ in range(WINDOW):
                n += 1
                prefix = QUEUE_PREFIX if n % 2 else TOPIC_PREFIX
                dest = self.queue if n % 2 else self.topic
                body = prefix + b"%d" % n
                rid = f"{RECEIPT_PREFIX}{n}"
                try:
                    conn.send(dest, body, headers={"persistent": "true", "receipt": rid})
                except Exception as exc:
                    self.problems.append(f"canary producer could not SEND: {exc!r}")
                    return
                window.append((rid, body, prefix))
            deadline = time.monotonic() + RECEIPT_TIMEOUT
            for rid, body, prefix in window:
                if not self._wait_receipt(listener, rid, max(0.0, deadline - time.monotonic())):
                    self.problems.append(
                        f"canary producer: no RECEIPT for {body!r} within {RECEIPT_TIMEOUT}s "
                        f"(disconnected={listener.disconnected}, {listener.problems})")
                    return
                self.receipted[body] = prefix

    def finish(self) -> None:
        """Stop producing and wait (with a deadline) until the consumers got everything."""
        self.stop.set()
        if self.thread is not None:
            self.thread.join(RECEIPT_TIMEOUT + 5)
        queue_sent, topic_sent = self._sent(QUEUE_PREFIX), self._sent(TOPIC_PREFIX)

        def drained() -> bool:
            return all(lis.disconnected or topic_sent <= set(lis.topic_bodies)
                       for _c, lis in self.consumers) and queue_sent <= self._queue_received()

        # Every canary MESSAGE notifies: evaluate the (linear) predicate at most every
        # DRAIN_CHECK seconds, not on each of thousands of wake-ups.
        deadline = time.monotonic() + DRAIN_TIMEOUT
        checked = 0.0
        with self.cond:
            while True:
                now = time.monotonic()
                if now - checked >= DRAIN_CHECK:
                    checked = now
                    if drained():
                        return
                if now >= deadline:
                    return
                self.cond.wait(min(DRAIN_CHECK, deadline - now))

    def _sent(self, prefix: bytes) -> set[bytes]:
        """The receipted bodies sent to the queue (QUEUE_PREFIX) or the topic."""
        return {b for b, p in self.receipted.items() if p == prefix}

    def _queue_received(self) -> set[bytes]:
        got: set[bytes] = set()
        for _conn, listener in self.consumers:
            got.update(b for b in listener.queue_bodies if b.startswith(QUEUE_PREFIX))
        return got

    def check(self) -> list[str]:
        """Everything that went wrong for the canary (empty: it never noticed the fuzzer)."""
        problems = list(self.problems)
        queue_sent, topic_sent = self._sent(QUEUE_PREFIX), self._sent(TOPIC_PREFIX)
        if not queue_sent or not topic_sent:
            problems.append(f"the canary producer got no RECEIPT at all "
                            f"(queue {len(queue_sent)}, topic {len(topic_sent)})")
        queue_counts: Counter[bytes] = Counter()
        listeners = [lis for _c, lis in self.consumers]
        if self.producer is not None:
            listeners.append(self.producer[1])
        for listener in listeners:
            with listener.cond:
                problems += [f"canary {listener.name}: {p}" for p in listener.problems]
                if listener.disconnected:
                    problems.append(f"canary {listener.name} (STOMP {listener.version}) was "
                                    "disconnected")
                queue_counts.update(b for b in listener.queue_bodies
                                    if b.startswith(QUEUE_PREFIX))
                if listener.name == "producer":
                    continue
                problems += _lost_and_doubled(
                    f"canary {listener.name}, topic", topic_sent,
                    Counter(b for b in listener.topic_bodies if b.startswith(TOPIC_PREFIX)))
        return problems + _lost_and_doubled("canary queue, over all consumers", queue_sent,
                                            queue_counts)

    def summary(self) -> str:
        per = ", ".join(f"{lis.name}: {len(lis.queue_bodies)} queue/{len(lis.topic_bodies)} "
                        f"topic" for _c, lis in self.consumers)
        return f"canary: {len(self.receipted)} receipted SENDs; {per}"

    def close(self) -> None:
        self.stop.set()
        everyone = list(self.consumers) + ([self.producer] if self.producer else [])
        for conn, _listener in everyone:
            with contextlib.suppress(Exception):
                conn.transport.disconnect_socket()
