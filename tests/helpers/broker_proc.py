"""Harness for end-to-end tests: real `amqlite start` processes and real STOMP clients.

Every broker runs in its own session with its own log file so a test can SIGKILL,
SIGTERM or SIGSTOP exactly that process and so a failing test can show what the
brokers said. Clients are stomp.py connections whose listener collects frames into
thread-safe structures; tests wait on a Condition with a deadline, never on a sleep.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import stomp
from stomp.utils import Frame

from tests.helpers.poll import poll
from tests.helpers.servers import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
HOST = "127.0.0.1"
#: How long a broker may take to import, open its store and listen.
START_TIMEOUT = 30.0
#: Default deadline for a frame exchange with a healthy local broker.
WAIT = 10.0
#: Lines of each broker log shown when a test fails.
LOG_TAIL_LINES = 120
#: Name under which the collecting listener is registered on stomp.py connections.
LISTENER = "collector"


def cli_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This environment minus stray AMQLITE_* settings (a developer's shell must not
    change what a test runs), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMQLITE_")}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def amqlite_command() -> list[str]:
    """How to run the CLI: `python -m cli` if the package is runnable, else the console script.

    The console script sits next to the venv's interpreter (do not resolve symlinks: the
    venv's bin directory is what matters).
    """
    if (REPO_ROOT / "cli" / "__main__.py").exists():
        return [sys.executable, "-m", "cli"]
    script = Path(sys.executable).parent / "amqlite"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from cli.main import main; sys.exit(main())"]


def unique(prefix: str) -> str:
    """A name no other test (or earlier run against the same store) uses."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


class BrokerProcess:
    """One `amqlite start` process: start, observe, signal, read its log."""

    def __init__(
        self,
        *,
        data_dir: Path,
        log_path: Path,
        name: str,
        group: str = "default",
        port: int | None = None,
        env: Mapping[str, str] | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.data_dir = data_dir
        self.log_path = log_path
        self.name = name
        self.group = group
        self.port = port if port is not None else free_port()
        self.env = dict(env or {})
        self.extra_args = list(extra_args)
        self.proc: subprocess.Popen[bytes] | None = None

    def __repr__(self) -> str:
        state = "running" if self.alive else f"exited({self.returncode})"
        return f"<BrokerProcess {self.name} port={self.port} {state}>"

    @property
    def argv(self) -> list[str]:
        return [
            *amqlite_command(),
            "start",
            "--group", self.group,
            "--data-dir", str(self.data_dir),
            "--bind", f"{HOST}:{self.port}",
            "--name", self.name,
            *self.extra_args,
        ]

    def _environ(self) -> dict[str, str]:
        return cli_env(self.env)

    def start(self) -> BrokerProcess:
        """Spawn the process (again, after it stopped: same data dir, same port)."""
        if self.alive:
            raise RuntimeError(f"{self} is already running")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            stamp = time.strftime("%H:%M:%S")
            log.write(f"=== harness: start {self.name} on port {self.port} at {stamp}: "
                      f"{' '.join(self.argv)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self._environ(),
                cwd=REPO_ROOT,
                start_new_session=True,
            )
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None, "broker never started"
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def is_serving(self) -> bool:
        """True when the STOMP port accepts TCP connections (only a master listens)."""
        try:
            with socket.create_connection((HOST, self.port), timeout=0.25):
                return True
        except OSError:
            return False

    def wait_serving(self, timeout: float = START_TIMEOUT) -> float:
        """Poll until the port accepts; return the seconds it took. Fail fast if it died."""
        return poll(self.is_serving, timeout=timeout,
                    what=f"{self.name} serving on port {self.port}",
                    give_up=lambda: not self.alive, context=self.log_tail)[1]

    def wait_log(self, pattern: str, timeout: float = START_TIMEOUT, since: int = 0) -> None:
        """Poll the log (after ``since``, a length of its text) until the regex ``pattern``
        appears (a log line has no event to wait on); fails with the log tail at the
        deadline, or at once if the process exits."""
        poll(lambda: re.search(pattern, self.log_text()[since:]), timeout=timeout,
             what=f"{self.name} logs {pattern!r}", interval=0.05,
             give_up=lambda: not self.alive, context=self.log_tail)

    def wait_exit(self, timeout: float) -> int:
        """Wait for the process to end on its own; return its exit code."""
        assert self.proc is not None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self} still running after {timeout}s\n"
                                 f"{self.log_tail()}") from None

    def send_signal(self, sig: int) -> None:
        """Send a signal without waiting (e.g. SIGTERM while timing the slave's takeover)."""
        if self.alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        """SIGKILL, as a crash: nothing is flushed or released by the broker itself."""
        if self.alive:
            self.send_signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(10)

    def terminate(self, timeout: float = 15.0) -> int:
        """SIGTERM (graceful stop) and wait; a broker that ignores it fails the test."""
        self.send_signal(signal.SIGCONT)  # a paused broker cannot handle SIGTERM
        self.send_signal(signal.SIGTERM)
        assert self.proc is not None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"{self} ignored SIGTERM for {timeout}s\n"
                                 f"{self.log_tail()}") from None

    def pause(self) -> None:
        self.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.send_signal(signal.SIGCONT)

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        text = self.log_text().splitlines()[-lines:]
        return f"--- last {len(text)} log lines of {self.name} ({self.log_path}) ---\n" + "\n".join(
            text)


#: Factories with processes that may still run; the failure hook dumps their logs.
ACTIVE_FACTORIES: list[BrokerFactory] = []


class BrokerFactory:
    """Creates brokers under one temporary directory and kills every one of them at close()."""

    def __init__(self, base_dir: Path) -> None:
        self.base_dir = base_dir
        self.brokers: list[BrokerProcess] = []
        self._counter = 0
        ACTIVE_FACTORIES.append(self)

    def data_dir(self, label: str = "data") -> Path:
        path = self.base_dir / label
        path.mkdir(parents=True, exist_ok=True)
        return path

    def new(
        self,
        *,
        data_dir: Path | None = None,
        name: str | None = None,
        group: str = "default",
        port: int | None = None,
        env: Mapping[str, str] | None = None,
        extra_args: Sequence[str] = (),
    ) -> BrokerProcess:
        """A broker object, not yet started (so several can be started together)."""
        self._counter += 1
        name = name or f"broker{self._counter}"
        broker = BrokerProcess(
            data_dir=data_dir or self.data_dir(f"data-{name}"),
            log_path=self.base_dir / f"{name}-{self._counter}.log",
            name=name,
            group=group,
            port=port,
            env=env,
            extra_args=extra_args,
        )
        self.brokers.append(broker)
        return broker

    def start(self, *, wait: bool = True, **kwargs: object) -> BrokerProcess:
        """Start one broker (by default waiting until it serves, i.e. it is master)."""
        broker = self.new(**kwargs).start()  # type: ignore[arg-type]
        if wait:
            broker.wait_serving()
        return broker

    def close(self) -> None:
        for broker in self.brokers:
            with contextlib.suppress(Exception):
                broker.kill()
        if self in ACTIVE_FACTORIES:
            ACTIVE_FACTORIES.remove(self)

    def dump_logs(self) -> str:
        return "\n".join(b.log_tail() for b in self.brokers if b.proc is not None)


@atexit.register
def _kill_leftovers() -> None:
    """Last resort if the run ends without fixture teardown (e.g. an internal error)."""
    for factory in list(ACTIVE_FACTORIES):
        factory.close()


def wait_one_serving(brokers: Iterable[BrokerProcess], timeout: float = START_TIMEOUT,
                     ) -> tuple[BrokerProcess, float]:
    """Poll until one of `brokers` serves; return it and the seconds it took."""
    brokers = list(brokers)
    return poll(lambda: next((b for b in brokers if b.is_serving()), None), timeout=timeout,
                what=f"one of {[b.name for b in brokers]} serving", interval=0.01,
                give_up=lambda: not any(b.alive for b in brokers),
                context=lambda: "\n".join(b.log_tail() for b in brokers))


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


#: Slaves of a pair poll the lock this often in tests (the default 0.5 s is also fine;
#: the tests measure the broker, not the poll period).
PAIR_LOCK_POLL = "0.1"


def start_pair(factory: BrokerFactory, names: tuple[str, str] = ("node-a", "node-b"),
               env: Mapping[str, str] | None = None,
               store_args: list[str] | None = None,
               extra_args: Sequence[str] = ()) -> tuple[BrokerProcess, BrokerProcess]:
    """Two brokers of one group, started together: on ONE data dir (embedded SQLite +
    file lock), or with ``store_args`` (``--store``/``--locker`` of a shared server,
    see ``broker_fixtures.store_args``); returns (master, slave). ``extra_args`` go to
    both (a ``--config``)."""
    env = {"AMQLITE_LOCK_POLL_INTERVAL": PAIR_LOCK_POLL, **(env or {})}
    if store_args:
        args = [*store_args, *extra_args]
        first = factory.new(name=names[0], env=env, extra_args=args).start()
        second = factory.new(name=names[1], env=env, extra_args=args).start()
    else:
        shared = factory.data_dir("shared")
        first = factory.new(data_dir=shared, name=names[0], env=env,
                            extra_args=extra_args).start()
        second = factory.new(data_dir=shared, name=names[1], env=env,
                             extra_args=extra_args).start()
    master, _ = wait_one_serving([first, second])
    return master, (second if master is first else first)


def never_serves(broker: BrokerProcess, duration: float) -> bool:
    """True if `broker` stays alive and keeps its port closed for `duration` seconds."""
    deadline = time.monotonic() + duration
    while time.monotonic() < deadline:
        if broker.is_serving() or not broker.alive:
            return False
        time.sleep(0.05)
    return True


# --------------------------------------------------------------------------- stomp.py


#: A stomp.py connection of any STOMP version.
StompConnection = stomp.Connection10 | stomp.Connection11 | stomp.Connection12
#: stomp.py's connection class per STOMP version.
CONNECTIONS: dict[str, type[StompConnection]] = {
    "1.0": stomp.Connection10, "1.1": stomp.Connection11, "1.2": stomp.Connection12}


class Collector(stomp.ConnectionListener):
    """Collects what a connection receives; waits use one Condition, never sleeps."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
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
) -> Client:
    """Connect stomp.py (STOMP 1.2 unless ``version`` says otherwise) and wait for
    CONNECTED; raise ConnectRefused on ERROR.

    The wait uses our own Condition with a deadline: stomp.py's wait=True has none.
    """
    beats = {} if version == "1.0" else {"heartbeats": heartbeats}  # 1.0 has no heart-beats
    conn = CONNECTIONS[version]([(HOST, port)], reconnect_attempts_max=1, timeout=5, **beats)
    listener = Collector()
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
    """Makes clients for a test and disconnects all of them at teardown."""

    def __init__(self) -> None:
        self.clients: list[Client] = []

    def __call__(self, port: int, **kwargs: object) -> Client:
        try:
            client = open_client(port, **kwargs)  # type: ignore[arg-type]
        except ConnectRefused as e:
            self.clients.append(e.client)
            raise
        self.clients.append(client)
        return client

    def close(self) -> None:
        for client in self.clients:
            client.close()


def password_hash(password: str) -> str:
    """The users-file hash exactly as an operator makes it: `amqlite passwd`."""
    out = subprocess.run([*amqlite_command(), "passwd", "--password", password], check=True,
                         capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)
    return out.stdout.strip().splitlines()[-1]


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


# --------------------------------------------------------------------------- raw sockets


@dataclass
class RawFrame:
    command: str
    headers: dict[str, str]
    body: bytes


class RawStomp:
    """A bare TCP socket speaking STOMP by hand, for input no well-behaved client produces."""

    def __init__(self, port: int, timeout: float = WAIT) -> None:
        self.sock = socket.create_connection((HOST, port), timeout=timeout)
        self.buf = b""
        self.closed = False

    def __enter__(self) -> RawStomp:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    def send_raw(self, data: bytes) -> bool:
        """Write bytes; False if the broker already closed the connection."""
        try:
            self.sock.sendall(data)
            return True
        except OSError:
            return False

    def send_frame(self, command: str, headers: Mapping[str, str] | None = None,
                   body: bytes = b"") -> bool:
        head = command + "\n" + "".join(f"{k}:{v}\n" for k, v in (headers or {}).items())
        return self.send_raw(head.encode() + b"\n" + body + b"\x00")

    def connect(self, heart_beat: str = "0,0", extra: Mapping[str, str] | None = None,
                ) -> RawFrame:
        """CONNECT and return the CONNECTED frame (fails the test on anything else)."""
        self.send_frame("CONNECT", {"accept-version": "1.2", "host": "localhost",
                                    "heart-beat": heart_beat, **(extra or {})})
        return self.expect("CONNECTED", "CONNECT")

    def expect(self, command: str, what: str = "", timeout: float = WAIT) -> RawFrame:
        """The next frame, which must be a ``command`` (the answer to ``what``); fails the
        test on any other frame, a close or silence."""
        frame = self.read_frame(timeout)
        assert frame is not None and frame.command == command, (
            f"{what or 'expected ' + command}: answered {frame} (closed={self.closed})")
        return frame

    def _fill(self, deadline: float) -> bool:
        """Read more bytes before the deadline; False on EOF/reset (sets closed) or timeout."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        self.sock.settimeout(remaining)
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            return False
        except OSError:
            self.closed = True
            return False
        if not data:
            self.closed = True
            return False
        self.buf += data
        return True

    def read_frame(self, timeout: float = WAIT) -> RawFrame | None:
        """The next frame (heart-beat EOLs skipped); None if closed or nothing came in time."""
        deadline = time.monotonic() + timeout
        while True:
            self.buf = self.buf.lstrip(b"\r\n")
            frame = self._parse()
            if frame is not None:
                return frame
            if self.closed or not self._fill(deadline):
                return None

    def _parse(self) -> RawFrame | None:
        end = self.buf.find(b"\n\n")
        alt = self.buf.find(b"\r\n\r\n")
        if end < 0 and alt < 0:
            return None
        if end < 0 or (0 <= alt < end):
            head, body_start = self.buf[:alt].decode(errors="replace"), alt + 4
        else:
            head, body_start = self.buf[:end].decode(errors="replace"), end + 2
        lines = head.replace("\r\n", "\n").split("\n")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            key, _, value = line.partition(":")
            headers.setdefault(key, value)
        if "content-length" in headers:
            stop = body_start + int(headers["content-length"])
            if len(self.buf) < stop + 1:
                return None
        else:
            stop = self.buf.find(b"\x00", body_start)
            if stop < 0:
                return None
        frame = RawFrame(lines[0], headers, self.buf[body_start:stop])
        self.buf = self.buf[stop + 1:]
        return frame

    def wait_closed(self, timeout: float) -> tuple[bool, list[RawFrame]]:
        """Read until the broker closes the socket; return (closed, frames read meanwhile)."""
        deadline = time.monotonic() + timeout
        frames: list[RawFrame] = []
        while not self.closed:
            frame = self.read_frame(max(0.0, deadline - time.monotonic()))
            if frame is not None:
                frames.append(frame)
            elif not self.closed:
                return False, frames
        return True, frames


def format_frames(frames: Iterable[RawFrame]) -> str:
    return "; ".join(f"{f.command} {f.headers} {f.body[:200]!r}" for f in frames)


#: How long the broker may take to answer bad input with ERROR and close.
CLOSE_DEADLINE = 5.0


def assert_error_then_closed(raw: RawStomp, what: str, message: str | None,
                             timeout: float = CLOSE_DEADLINE, *,
                             receipt: str | None = None) -> RawFrame:
    """The broker answers with one ERROR (and nothing else) and closes the socket; returns
    the ERROR.

    With ``message``, its ``message`` header is that text, so a test of one limit cannot
    pass on another limit's ERROR. ``None`` only where the cause varies by case (a
    parametrized set of malformed frames) and any ERROR is the point. With ``receipt``,
    the ERROR names it in ``receipt-id`` (the frame that was refused asked for it)."""
    closed, frames = raw.wait_closed(timeout)
    assert frames, f"{what}: no ERROR frame before close (closed={closed})"
    assert [f.command for f in frames] == ["ERROR"], f"{what}: got {format_frames(frames)}"
    if message is not None:
        assert frames[0].headers.get("message") == message, f"{what}: {format_frames(frames)}"
    assert closed, f"{what}: connection still open {timeout}s after the ERROR"
    if receipt is not None:
        assert frames[0].headers.get("receipt-id") == receipt, \
            f"{what}: ERROR without receipt-id {receipt}: {format_frames(frames)}"
    return frames[0]
