"""Real STOMP clients for end-to-end tests: stomp.py connections whose listener collects
frames into thread-safe structures; tests wait on a Condition with a deadline, never on
a sleep. Also the load producer the failover tests run against a broker."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import stomp
from stomp.utils import Frame

from tests.helpers.broker_process import HOST, WAIT, unique

#: Name under which the collecting listener is registered on stomp.py connections.
LISTENER = "collector"

#: A stomp.py connection of any STOMP version.
StompConnection = stomp.Connection10 | stomp.Connection11 | stomp.Connection12
#: stomp.py's connection class per STOMP version.
CONNECTIONS: dict[str, type[StompConnection]] = {
    "1.0": stomp.Connection10, "1.1": stomp.Connection11, "1.2": stomp.Connection12}


class Collector(stomp.ConnectionListener):
    """Collects what a connection receives; waits use one Condition, never sleeps.

    ``cond``: a Condition shared with other clients' collectors (``ClientPool``), so that
    a wait on one of them for what several received (``a.count() + b.count() == n``)
    wakes on each of their events, not only on its own client's (it slept out its
    whole timeout when the last message went to the other client)."""

    def __init__(self, cond: threading.Condition | None = None) -> None:
        self.cond = cond or threading.Condition()
        self.messages: list[Frame] = []
        self.receipts: set[str] = set()
        self.errors: list[Frame] = []
        self.connected: Frame | None = None
        self.disconnected = False
        self.last_activity = time.monotonic()

    # stomp.py callbacks run on the receiver thread: record and notify, nothing else.
    def on_connected(self, frame: Frame) -> None:
        with self.cond:
            self.connected = frame
            self.cond.notify_all()

    def on_message(self, frame: Frame) -> None:
        with self.cond:
            self.messages.append(frame)
            self.last_activity = time.monotonic()
            self.cond.notify_all()

    def on_receipt(self, frame: Frame) -> None:
        with self.cond:
            self.receipts.add(frame.headers.get("receipt-id", ""))
            self.cond.notify_all()

    def on_error(self, frame: Frame) -> None:
        with self.cond:
            self.errors.append(frame)
            self.cond.notify_all()

    def on_disconnected(self) -> None:
        with self.cond:
            self.disconnected = True
            self.cond.notify_all()

    # waiting
    def wait_for(self, predicate: Callable[[], bool], timeout: float = WAIT) -> bool:
        """Wait until predicate() (evaluated under the lock) holds; False on timeout."""
        with self.cond:
            return self.cond.wait_for(predicate, timeout)

    def holds_for(self, predicate: Callable[[], bool], duration: float) -> bool:
        """True if predicate() stays true for `duration` seconds (checked on every event)."""
        deadline = time.monotonic() + duration
        with self.cond:
            while True:
                if not predicate():
                    return False
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return True
                self.cond.wait(remaining)

    def wait_quiet(self, quiet: float, timeout: float) -> bool:
        """Wait until no MESSAGE arrived for `quiet` seconds; False if traffic outlasts timeout."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                now = time.monotonic()
                idle_until = self.last_activity + quiet
                if now >= idle_until:
                    return True
                if now >= deadline:
                    return False
                self.cond.wait(min(idle_until, deadline) - now)

    def wait_messages(self, count: int, timeout: float = WAIT) -> list[Frame]:
        """Wait for at least `count` messages; fail with what did arrive."""
        ok = self.wait_for(lambda: len(self.messages) >= count or self.disconnected, timeout)
        got = self.snapshot()
        assert ok and len(got) >= count, (  # bodies cut short: some are 256 KiB
            f"expected {count} messages, got {len(got)}: "
            f"{[(m.body or '')[:60] for m in got[:20]]} "
            f"(disconnected={self.disconnected}, errors={self.error_texts()})")
        return got

    # reading
    def snapshot(self) -> list[Frame]:
        with self.cond:
            return list(self.messages)

    def bodies(self) -> list[str]:
        return [m.body for m in self.snapshot()]

    def count(self) -> int:
        with self.cond:
            return len(self.messages)

    def error_texts(self) -> list[str]:
        with self.cond:
            return [f"{e.headers.get('message', '')} {e.body or ''}".strip() for e in self.errors]


@dataclass
class Client:
    """A connected stomp.py connection and its collector."""

    conn: StompConnection
    listener: Collector
    port: int
    subscriptions: list[str] = field(default_factory=list)

    def send(self, dest: str, body: str, headers: Mapping[str, str] | None = None,
             timeout: float = WAIT) -> str:
        return send_with_receipt(self.conn, dest, body, headers, timeout)

    def subscribe(self, dest: str, ack: str = "auto", headers: Mapping[str, str] | None = None,
                  sub_id: str | None = None, timeout: float = WAIT) -> str:
        """SUBSCRIBE and wait for its RECEIPT, so later sends are certain to be seen."""
        sub_id = sub_id or unique("sub")
        receipt = unique("r-sub")
        self.conn.subscribe(dest, id=sub_id, ack=ack, headers={**(headers or {}),
                                                               "receipt": receipt})
        wait_receipt(self.listener, receipt, timeout, f"SUBSCRIBE {dest}")
        self.subscriptions.append(sub_id)
        return sub_id

    def unsubscribe(self, sub_id: str, headers: Mapping[str, str] | None = None,
                    timeout: float = WAIT) -> None:
        receipt = unique("r-unsub")
        self.conn.unsubscribe(sub_id, headers={**(headers or {}), "receipt": receipt})
        wait_receipt(self.listener, receipt, timeout, f"UNSUBSCRIBE {sub_id}")

    def ack(self, frame: Frame, transaction: str | None = None, timeout: float = WAIT) -> None:
        """ACK a MESSAGE (its STOMP 1.2 `ack` header) and wait for the broker's RECEIPT."""
        receipt = unique("r-ack")
        self.conn.ack(ack_id(frame), transaction=transaction, receipt=receipt)
        wait_receipt(self.listener, receipt, timeout, f"ACK {frame.body!r}")

    def nack(self, frame: Frame, timeout: float = WAIT) -> None:
        receipt = unique("r-nack")
        self.conn.nack(ack_id(frame), receipt=receipt)
        wait_receipt(self.listener, receipt, timeout, f"NACK {frame.body!r}")

    def tx(self, command: str, transaction: str, timeout: float = WAIT) -> None:
        """BEGIN/COMMIT/ABORT with a RECEIPT."""
        receipt = unique(f"r-{command}")
        getattr(self.conn, command)(transaction, headers={"receipt": receipt})
        wait_receipt(self.listener, receipt, timeout, f"{command.upper()} {transaction}")

    def close(self, timeout: float = 3.0) -> None:
        """DISCONNECT and wait for the broker to let go; then close the socket regardless
        (stomp.py's own stop() would wait forever on a broker that never answers)."""
        with contextlib.suppress(Exception):
            if self.conn.is_connected():
                self.conn.disconnect()
                self.listener.wait_for(lambda: self.listener.disconnected, timeout)
        with contextlib.suppress(Exception):
            self.conn.transport.disconnect_socket()


def ack_id(frame: Frame) -> str:
    """STOMP 1.2: a MESSAGE needing acknowledgement carries an `ack` header to send back."""
    assert "ack" in frame.headers, f"MESSAGE without STOMP 1.2 'ack' header: {frame.headers}"
    return frame.headers["ack"]


def wait_receipt(listener: Collector, receipt: str, timeout: float, what: str) -> None:
    ok = listener.wait_for(lambda: receipt in listener.receipts or listener.disconnected,
                           timeout)
    with listener.cond:
        got = receipt in listener.receipts
    assert ok and got, (f"no RECEIPT for {what} within {timeout}s "
                        f"(disconnected={listener.disconnected}, "
                        f"errors={listener.error_texts()})")


def send_with_receipt(conn: stomp.Connection12, dest: str, body: str,
                      headers: Mapping[str, str] | None = None, timeout: float = WAIT) -> str:
    """SEND and wait until the broker confirms it with a RECEIPT; return the receipt id."""
    listener = conn.get_listener(LISTENER)
    assert isinstance(listener, Collector), "connection was not made by open_client()"
    receipt = unique("r-send")
    conn.send(dest, body, headers={**(headers or {}), "receipt": receipt})
    wait_receipt(listener, receipt, timeout, f"SEND {body!r} to {dest}")
    return receipt


def send_many(client: Client, dest: str, bodies: Sequence[str],
              headers: Mapping[str, str] | None = None, timeout: float = 30.0) -> None:
    """Pipelined SENDs, then wait for every RECEIPT (one at a time would only measure
    round trips); fails naming how many receipts are missing."""
    receipts = []
    for body in bodies:
        receipt = unique("r-send")
        client.conn.send(dest, body, headers={**(headers or {}), "receipt": receipt})
        receipts.append(receipt)
    wait_receipts(client.listener, receipts, timeout, f"SENDs to {dest}")


def wait_receipts(listener: Collector, receipts: Sequence[str], timeout: float,
                  what: str) -> None:
    """Wait for every one of ``receipts`` (frames sent pipelined); fails naming how many
    are missing."""
    listener.wait_for(lambda: listener.receipts.issuperset(receipts) or listener.disconnected,
                      timeout)
    with listener.cond:
        missing = [r for r in receipts if r not in listener.receipts]
    assert not missing, (f"{len(missing)} of {len(receipts)} {what} got no RECEIPT "
                         f"(disconnected={listener.disconnected}, "
                         f"errors={listener.error_texts()})")


class ConnectRefused(AssertionError):
    """The broker answered CONNECT with an ERROR frame."""

    def __init__(self, message: str, client: Client) -> None:
        super().__init__(message)
        self.client = client


def open_client(
    port: int,
    *,
    heartbeats: tuple[int, int] = (0, 0),
    headers: Mapping[str, str] | None = None,
    username: str | None = None,
    passcode: str | None = None,
    timeout: float = WAIT,
    version: str = "1.2",
    cond: threading.Condition | None = None,
) -> Client:
    """Connect stomp.py (STOMP 1.2 unless ``version`` says otherwise) and wait for
    CONNECTED; raise ConnectRefused on ERROR. ``cond``: the listener's (``Collector``).

    The wait uses our own Condition with a deadline: stomp.py's wait=True has none.
    """
    beats = {} if version == "1.0" else {"heartbeats": heartbeats}  # 1.0 has no heart-beats
    conn = CONNECTIONS[version]([(HOST, port)], reconnect_attempts_max=1, timeout=5, **beats)
    listener = Collector(cond)
    conn.set_listener(LISTENER, listener)
    client = Client(conn, listener, port)
    conn.connect(username=username, passcode=passcode, wait=False, headers=dict(headers or {}))
    listener.wait_for(lambda: listener.connected is not None or bool(listener.errors)
                      or listener.disconnected, timeout)
    if listener.connected is None:
        reason = listener.error_texts()
        client.close()
        if reason:
            raise ConnectRefused(f"CONNECT refused: {reason}", client)
        raise AssertionError(f"no CONNECTED from port {port} within {timeout}s "
                             f"(disconnected={listener.disconnected})")
    return client


class ClientPool:
    """Makes clients for a test and disconnects all of them at teardown. Their listeners
    share one Condition (``Collector``): a test may wait on any of them for all of them."""

    def __init__(self) -> None:
        self.clients: list[Client] = []
        self.cond = threading.Condition()

    def __call__(self, port: int, **kwargs: object) -> Client:
        try:
            client = open_client(port, cond=self.cond, **kwargs)  # type: ignore[arg-type]
        except ConnectRefused as e:
            self.clients.append(e.client)
            raise
        self.clients.append(client)
        return client

    def close(self) -> None:
        for client in self.clients:
            client.close()


def assert_broker_serves(port: int, **client_options: Any) -> None:
    """A fresh client can still send and receive: the broker survived whatever came before.
    ``client_options`` go to ``open_client`` (a login, a longer connect timeout)."""
    client = open_client(port, **client_options)
    try:
        queue = f"/queue/{unique('alive')}"
        client.subscribe(queue)
        client.send(queue, "still-alive")
        assert client.listener.wait_messages(1)[0].body == "still-alive"
    finally:
        client.close()


class LoadProducer(threading.Thread):
    """Sends unique persistent messages as fast as its window of unreceipted SENDs allows,
    until told to stop or its connection dies (then ``error`` stays None: that is what
    the failover tests do to it)."""

    WINDOW = 16

    def __init__(self, client: Client, queue: str, tag: str,
                 stop: threading.Event | None = None) -> None:
        super().__init__(name=f"load-{tag}", daemon=True)
        self.client, self.queue, self.tag = client, queue, tag
        self.stop = stop if stop is not None else threading.Event()
        self.sent: list[str] = []  # every body we tried to send (may be stored, or not)
        self.by_receipt: dict[str, str] = {}
        self.error: BaseException | None = None

    def outstanding(self) -> int:
        return len(self.by_receipt) - len(self.client.listener.receipts)

    def run(self) -> None:
        listener = self.client.listener
        try:
            for seq in range(10_000_000):
                listener.wait_for(lambda: self.stop.is_set() or listener.disconnected
                                  or self.outstanding() < self.WINDOW, timeout=1.0)
                if self.stop.is_set() or listener.disconnected:
                    return
                if self.outstanding() >= self.WINDOW:
                    continue
                body, receipt = f"{self.tag}-{seq:07d}", f"{self.tag}-r{seq}"
                self.sent.append(body)
                with listener.cond:
                    self.by_receipt[receipt] = body
                self.client.conn.send(self.queue, body,
                                      headers={"persistent": "true", "receipt": receipt})
        except Exception as e:  # the connection died under us: that is the point
            if not (listener.disconnected or self.stop.is_set()):
                self.error = e

    def finish(self) -> None:
        """Stop sending and wait for the thread."""
        self.stop.set()
        with self.client.listener.cond:
            self.client.listener.cond.notify_all()
        self.join(10)

    def confirmed(self) -> set[str]:
        with self.client.listener.cond:
            return {self.by_receipt[r] for r in self.client.listener.receipts
                    if r in self.by_receipt}
