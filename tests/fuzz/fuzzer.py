"""Drives the mutator's frames at a real broker over raw sockets, and watches the broker.

Each worker thread holds one connection at a time: CONNECT (any version), then batches of
pipelined cases written in random chunks, each batch closed by a probe (BEGIN + ABORT with
a receipt: ABORT waits for the session's pending writes, so its RECEIPT says every case
before it was handled). An ERROR closes the connection; the worker opens another. A batch
ending in a cut frame half-closes the socket and waits for the broker to hang up.

A transaction oracle thread ACKs a message in a transaction together with a hostile SEND:
if the transaction does not commit, the message must come back to a new subscriber.
A sink thread drains the fuzz queues.

What must never happen is recorded as a Finding: the broker exits, demotes, logs a
traceback; a client gets a traceback; a connection that is open stops answering; an
uncommitted transaction's ACK was applied.
"""

from __future__ import annotations

import contextlib
import re
import selectors
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from tests.fuzz.mutator import Case, ConnState, Mutator
from tests.helpers.broker_proc import HOST, BrokerProcess, RawFrame, RawStomp

#: How long an open connection may take to answer a probe before the broker is said to
#: have stranded it. Generous: a healthy broker answers in milliseconds, but the CI box
#: is 2 cores shared with other brokers and PostgreSQL.
PROBE_TIMEOUT = 20.0
#: How long to wait for CONNECTED (or ERROR) on a new fuzz connection (as for a probe).
CONNECT_TIMEOUT = 20.0
#: After a cut frame and our half-close, how long the broker may take to hang up.
HANGUP_TIMEOUT = 10.0
#: Cases pipelined per batch: enough to amortise the probe round trip, few enough that
#: an ERROR early in the batch does not waste many.
MAX_BATCH = 12
#: How often the monitor looks at the broker process, its port and its log.
MONITOR_INTERVAL = 0.2
#: Log lines that say the broker stopped being a healthy master.
FATAL_LOG_MARKERS = ("DEMOTED", "store write failed", "store writes stopped")
#: Batches each worker remembers, to show what was in flight when something broke.
RECENT_BATCHES = 3
_RECEIPT_ID_RE = re.compile(rb"receipt-id:(c\d+)\r?\n")
#: A MESSAGE frame's first line: at the start of what came back or after a frame's NUL
#: (heart-beat EOLs between), not the word in an ERROR's text.
_MESSAGE_START_RE = re.compile(rb"(?:^|\x00)[\r\n]*MESSAGE\n")


@dataclass
class Finding:
    what: str
    detail: str
    frames: list[str] = field(default_factory=list)

    def render(self) -> str:
        lines = [f"* {self.what}: {self.detail}"]
        lines += [f"    {f}" for f in self.frames[:40]]
        return "\n".join(lines)


@dataclass
class Stats:
    cases: int = 0
    connections: int = 0
    errors: int = 0
    batches: int = 0
    kinds: Counter[str] = field(default_factory=Counter)
    #: Transaction-oracle rounds: (committed, rejected and the ACK correctly undone).
    tx_committed: int = 0
    tx_rejected: int = 0


class Fuzzer:
    """Worker threads plus a monitor thread against one broker; run for a time budget."""

    def __init__(self, broker: BrokerProcess, *, seed: int, workers: int,
                 mutator_args: dict[str, object]) -> None:
        self.broker = broker
        self.seed = seed
        self.workers = workers
        self.mutator_args = mutator_args
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.stats = Stats()
        self.findings: list[Finding] = []
        self.fatal = threading.Event()
        self.recent: dict[int, list[list[Case]]] = {}
        self._log_offset = 0
        self._tracebacks: set[str] = set()
        canary_queue = str(mutator_args.get("canary_queue", "")).encode()
        #: A MESSAGE header line naming the canary queue: the fuzzer never subscribes
        #: there, so a fuzz connection receiving one is a message taken from the canary.
        self._canary_line = b"\ndestination:" + canary_queue + b"\n"

    # -- reporting ----------------------------------------------------------------------
    def add_finding(self, what: str, detail: str, frames: list[str] | None = None) -> None:
        with self.lock:
            self.findings.append(Finding(what, detail, frames or []))

    def in_flight(self) -> list[str]:
        """What every worker sent last: the suspects when the broker breaks."""
        with self.lock:
            out = []
            for w, batches in sorted(self.recent.items()):
                for i, batch in enumerate(batches):
                    out += [f"w{w} batch-{len(batches) - i}: {c.describe()}" for c in batch]
            return out

    def _count(self, cases: list[Case], got: bytes, complete: bool) -> None:
        """Count the cases the broker handled: all of them when the probe came back (or a
        cut batch ended without ERROR); else those up to the last one it answered, plus
        the one its ERROR was about."""
        errors = got.count(b"ERROR\n")
        handled = len(cases)
        if not complete and errors:
            answered = set(_RECEIPT_ID_RE.findall(got))
            last = max((i for i, c in enumerate(cases) if c.receipt in answered), default=-1)
            handled = min(len(cases), last + 2)
        with self.lock:
            self.stats.cases += handled
            self.stats.batches += 1
            self.stats.errors += errors
            self.stats.kinds.update(c.kind for c in cases[:handled])

    # -- run ----------------------------------------------------------------------------
    def run(self, seconds: float) -> None:
        threads = [threading.Thread(target=self._worker, args=(i,), daemon=True,
                                    name=f"fuzz-{i}") for i in range(self.workers)]
        monitor = threading.Thread(target=self._monitor, daemon=True, name="fuzz-monitor")
        monitor.start()
        sink = threading.Thread(target=self._sink, daemon=True, name="fuzz-sink")
        sink.start()
        threads.append(threading.Thread(target=self._tx_oracle, daemon=True, name="fuzz-tx"))
        for t in threads:
            t.start()
        self.stop.wait(seconds)
        self.stop.set()
        for t in threads:
            t.join(PROBE_TIMEOUT + 5)
        monitor.join(5)
        sink.join(5)
        self.check_broker()  # one last look after the workers stopped

    def _tx_oracle(self) -> None:
        """COMMIT is all-or-nothing: ACK a message in a transaction together with a hostile
        SEND; if the transaction does not commit (ERROR at the SEND or at COMMIT), the
        message must come back to a new subscriber."""
        mutator = Mutator(self.seed * 1000 + 999, **self.mutator_args)  # type: ignore[arg-type]
        base = self.mutator_args["fuzz_queues"][0]  # type: ignore[index]
        rounds = 0
        while not self.stop.is_set():
            rounds += 1
            queue = f"{base}-txo-{rounds}"
            try:
                self._tx_round(mutator, queue, rounds)
            except (OSError, AssertionError, ValueError):  # refused, reset, no CONNECTED
                self.stop.wait(0.05)  # the monitor decides whether the broker is gone
            except Exception as exc:  # a bug in this harness must not pass silently
                self.add_finding("fuzz harness error (transaction oracle)", repr(exc))
                return

    def _tx_round(self, mutator: Mutator, queue: str, n: int) -> None:
        body = b"oracle-%d" % n
        with RawStomp(self.broker.port, timeout=CONNECT_TIMEOUT) as raw:
            raw.connect()
            raw.send_frame("SUBSCRIBE", {"id": "o", "destination": queue,
                                         "ack": "client-individual"})
            raw.send_frame("SEND", {"destination": queue, "persistent": "true"}, body)
            message = read_until(raw, lambda f: f.command == "MESSAGE", self.stop)
            if message is None or message.command != "MESSAGE":
                return  # broker busy or gone: not this oracle's call
            hostile = mutator.pick((mutator._send_int, mutator._send_string))(ConnState())
            if hostile.terminal:
                return
            tx = b"otx-%d" % n
            data = (b"BEGIN\ntransaction:" + tx + b"\n\n\x00"
                    + b"ACK\nid:" + message.headers.get("ack", "").encode()
                    + b"\ntransaction:" + tx + b"\n\n\x00"
                    + hostile.data.replace(b"SEND\n", b"SEND\ntransaction:" + tx + b"\n", 1)
                    + b"COMMIT\ntransaction:" + tx + b"\nreceipt:done\n\n\x00")
            raw.send_raw(data)
            reply = read_until(raw, lambda f: f.command in ("RECEIPT", "ERROR")
                               and f.headers.get("receipt-id", "done") == "done", self.stop)
        if reply is not None and reply.command == "RECEIPT":
            with self.lock:
                self.stats.tx_committed += 1
            return
        if reply is None and self.stop.is_set():
            return
        # Not committed: the ACK in it must not have been applied.
        with RawStomp(self.broker.port, timeout=CONNECT_TIMEOUT) as raw:
            raw.connect()
            raw.send_frame("SUBSCRIBE", {"id": "o2", "destination": queue, "ack": "auto"})
            again = read_until(raw, lambda f: f.command == "MESSAGE", self.stop,
                               timeout=PROBE_TIMEOUT)
            cut_off = raw.closed  # closed by the broker (e.g. demoting): inconclusive
        if again is not None and again.body == body:
            with self.lock:
                self.stats.tx_rejected += 1
        elif again is None and not cut_off and not self.stop.is_set():
            self.add_finding(
                "COMMIT was not all-or-nothing",
                f"the transaction got {reply.command if reply else 'no answer'} "
                f"{reply.headers if reply else ''}, yet the message it ACKed never came back "
                f"to a new subscriber of {queue} within {PROBE_TIMEOUT}s",
                [hostile.describe()])

    def _sink(self) -> None:
        """Drain the fuzz queues (auto ack, discarding everything), so what the fuzzer
        stores does not pile up until a memory limit rightly stops reading from the fuzz
        producers, which would look like a stranded connection."""
        queues = self.mutator_args["fuzz_queues"]
        while not self.stop.is_set():
            try:
                with socket.create_connection((HOST, self.broker.port),
                                              timeout=CONNECT_TIMEOUT) as sock:
                    sock.sendall(b"CONNECT\naccept-version:1.2\nhost:localhost\n\n\x00" + b"".join(
                        b"SUBSCRIBE\nid:sink-%d\ndestination:%s\nack:auto\n\n\x00"
                        % (i, q.encode()) for i, q in enumerate(queues)))  # type: ignore[attr-defined]
                    sock.settimeout(0.5)
                    while not self.stop.is_set():
                        try:
                            if not sock.recv(262144):
                                break  # closed (e.g. a MESSAGE it could not encode)
                        except TimeoutError:
                            continue
            except OSError:
                pass
            self.stop.wait(0.05)

    def _monitor(self) -> None:
        last_port_check = 0.0
        while not self.stop.is_set():
            now = time.monotonic()
            check_port = now - last_port_check > 1.0
            if check_port:
                last_port_check = now
            if not self.check_broker(check_port):
                self.fatal.set()
                self.stop.set()
                return
            self.stop.wait(MONITOR_INTERVAL)

    def check_broker(self, check_port: bool = True) -> bool:
        """False (and a finding) if the broker exited, demoted or stopped serving; a
        traceback in its log is a finding too (one per distinct exception), but the broker
        may still serve, so fuzzing goes on and finds more."""
        if self.fatal.is_set():
            return False
        new = self._read_log()
        if "Traceback" in new or any(m in new for m in FATAL_LOG_MARKERS):
            lines = new.splitlines()
            for i, line in enumerate(lines):
                if "Traceback" in line:
                    self._traceback_finding(lines, i)
            for i, line in enumerate(lines):
                if any(m in line for m in FATAL_LOG_MARKERS):
                    self.add_finding("broker stopped being master", "\n".join(
                        quiet(lines[max(0, i - 3):i + 3])), self.in_flight())
                    return False
        if not self.broker.alive:
            self.add_finding("broker process exited", f"exit code {self.broker.returncode}",
                             self.in_flight())
            return False
        if check_port and not self.broker.is_serving():
            self.add_finding("broker stopped accepting connections", "", self.in_flight())
            return False
        return True

    def _read_log(self) -> str:
        """The complete log lines written since the last look (the log only grows)."""
        try:
            with open(self.broker.log_path, "rb") as f:
                f.seek(self._log_offset)
                data = f.read()
        except FileNotFoundError:
            return ""
        end = data.rfind(b"\n") + 1
        tb = data.rfind(b"Traceback", 0, end)
        if tb >= 0 and self.broker.alive:
            # a traceback is written in several pieces: wait until its exception line is in
            tail = data[tb:end].split(b"\n")[1:]
            if not any(line and not line.startswith((b" ", b"\t")) for line in tail):
                end = data.rfind(b"\n", 0, tb) + 1
        self._log_offset += end
        return data[:end].decode(errors="replace")

    def _traceback_finding(self, lines: list[str], at: int) -> None:
        """One finding per distinct exception (its last line, numbers masked)."""
        end = at + 1
        while end < len(lines) and (lines[end].startswith((" ", "\t")) or not lines[end]):
            end += 1
        exc_line = lines[end] if end < len(lines) else lines[-1]
        key = re.sub(r"\d+", "N", exc_line)
        with self.lock:
            if key in self._tracebacks:
                return
            self._tracebacks.add(key)
        self.add_finding("traceback in the broker log",
                         "\n".join(lines[max(0, at - 2):end + 1]), self.in_flight())

    # -- workers ------------------------------------------------------------------------
    def _worker(self, index: int) -> None:
        mutator = Mutator(self.seed * 1000 + index, **self.mutator_args)  # type: ignore[arg-type]
        while not self.stop.is_set():
            try:
                self._connection(index, mutator)
            except OSError:
                # refused or reset outside a batch: the monitor decides if the broker is gone
                self.stop.wait(0.05)

    def _remember(self, index: int, cases: list[Case]) -> None:
        with self.lock:
            batches = self.recent.setdefault(index, [])
            batches.append(cases)
            del batches[:-RECENT_BATCHES]

    def _connection(self, index: int, mutator: Mutator) -> None:
        sock = socket.create_connection((HOST, self.broker.port), timeout=CONNECT_TIMEOUT)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self.lock:
            self.stats.connections += 1
        try:
            if mutator.chance(0.03):  # a hostile CONNECT is its own case
                case = mutator.hostile_connect()
                self._remember(index, [case])
                got, _ = exchange(sock, [case.data], b"\x00", CONNECT_TIMEOUT, self.stop)
                self._check_reply(got, [case])
                self._count([case], got, True)
                return
            connect = mutator.connect()
            got, closed = exchange(sock, [connect], b"\n\n", CONNECT_TIMEOUT, self.stop)
            if not got.startswith(b"CONNECTED"):
                if not self.stop.is_set() and not closed and not got:
                    self.add_finding("no CONNECTED for a plain CONNECT",
                                     f"within {CONNECT_TIMEOUT}s", [repr(connect)])
                return
            st = ConnState(version=header(got, b"version") or "1.0")
            probe_no = 0
            while not self.stop.is_set():
                cases = mutator.batch(st, mutator.rng.randrange(1, MAX_BATCH + 1))
                self._remember(index, cases)
                data = mutator.join(cases)
                probe_no += 1
                probe = b"p%d" % probe_no
                terminal = cases[-1].terminal
                if not terminal:
                    data += (b"BEGIN\ntransaction:" + probe + b"\n\n\x00ABORT\ntransaction:"
                             + probe + b"\nreceipt:" + probe + b"\n\n\x00")
                marker = None if terminal else b"receipt-id:" + probe + b"\n"
                timeout = HANGUP_TIMEOUT if terminal else PROBE_TIMEOUT
                got, closed = exchange(sock, mutator.chunks(data), marker, timeout, self.stop,
                                       half_close=terminal)
                self._check_reply(got, cases)
                self._check_stolen(got, cases)
                self._count(cases, got, marker is None or marker in got)
                st.harvest(got)
                if closed or terminal:
                    return
                if marker is not None and marker not in got and not self.stop.is_set():
                    self.add_finding(
                        "an open connection stopped answering",
                        f"no RECEIPT for the probe after the batch within {PROBE_TIMEOUT}s "
                        f"(STOMP {st.version}); received: {got[-600:]!r}",
                        [c.describe() for c in cases])
                    return
        finally:
            with contextlib.suppress(OSError):
                sock.close()

    def _check_stolen(self, got: bytes, cases: list[Case]) -> None:
        """A fuzz connection got a MESSAGE of the canary queue: either the mutator
        subscribed there (a harness bug) or the broker misrouted it; either way the
        canary will miss it, and this names the frames that did it."""
        if self._canary_line not in got:
            return
        bodies = []
        for start in _MESSAGE_START_RE.finditer(got):
            head_end = got.find(b"\n\n", start.end() - 1)
            if head_end < 0:
                break
            if self._canary_line in got[start.end() - 1:head_end + 1]:
                end = got.find(b"\x00", head_end)
                bodies.append(got[head_end + 2:end if end >= 0 else head_end + 60][:60])
        if bodies:
            self.add_finding("a fuzz connection received canary queue messages",
                             f"{bodies[:5]} (the fuzzer never subscribes to the canary queue)",
                             [c.describe() for c in cases])

    def _check_reply(self, got: bytes, cases: list[Case]) -> None:
        if b"Traceback" in got:
            at = got.index(b"Traceback")
            self.add_finding("a traceback reached a client", repr(got[max(0, at - 300):at + 800]),
                             [c.describe() for c in cases])


def read_until(raw: RawStomp, wanted: Callable[[RawFrame], bool], stop: threading.Event,
               timeout: float = PROBE_TIMEOUT) -> RawFrame | None:
    """The first frame `wanted` accepts, or the ERROR/close that came first (None)."""
    deadline = time.monotonic() + timeout
    while not stop.is_set() and time.monotonic() < deadline:
        frame = raw.read_frame(min(0.5, max(0.0, deadline - time.monotonic())))
        if frame is None:
            if raw.closed:
                return None
            continue
        if wanted(frame) or frame.command == "ERROR":
            return frame
    return None


def header(frame_bytes: bytes, name: bytes) -> str | None:
    """A header of the first frame in `frame_bytes` (enough for CONNECTED's version)."""
    head = frame_bytes.split(b"\n\n", 1)[0]
    for line in head.split(b"\n")[1:]:
        key, _, value = line.partition(b":")
        if key == name:
            return value.decode(errors="replace")
    return None


def exchange(sock: socket.socket, chunks: list[bytes], marker: bytes | None, timeout: float,
             stop: threading.Event, *, half_close: bool = False) -> tuple[bytes, bool]:
    """Write the chunks while reading whatever comes back (so neither side blocks on a full
    buffer) until `marker` was received, the broker closed, or the deadline; with no marker,
    read until the broker closes. Returns (bytes received, closed by the broker)."""
    sock.setblocking(False)
    sel = selectors.DefaultSelector()
    received = bytearray()
    pending = list(chunks)
    offset = 0
    deadline = time.monotonic() + timeout
    closed = False
    scan_from = 0  # the marker cannot start before this offset
    sel.register(sock, selectors.EVENT_READ | (selectors.EVENT_WRITE if pending else 0))
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or (stop.is_set() and not pending):
                break
            for _key, events in sel.select(min(remaining, 0.5)):
                if events & selectors.EVENT_READ:
                    try:
                        data = sock.recv(262144)
                    except (BlockingIOError, InterruptedError):
                        data = None
                    except OSError:
                        data = b""
                    if data == b"":
                        closed = True
                    elif data:
                        received += data
                if events & selectors.EVENT_WRITE and pending:
                    try:
                        offset += sock.send(memoryview(pending[0])[offset:])
                    except (BlockingIOError, InterruptedError):
                        pass
                    except OSError:
                        closed = True
                    if pending and offset >= len(pending[0]):
                        pending.pop(0)
                        offset = 0
                    if not pending:
                        if half_close:
                            with contextlib.suppress(OSError):
                                sock.shutdown(socket.SHUT_WR)
                        sel.modify(sock, selectors.EVENT_READ)
            if closed:
                break
            if marker is not None and not pending:
                if received.find(marker, scan_from) >= 0:
                    break
                scan_from = max(0, len(received) - len(marker))
    finally:
        sel.close()
    return bytes(received), closed


def quiet(lines: list[str]) -> list[str]:
    """Log lines minus the broker's routine 'closing <peer>: <reason>' notes."""
    return [line for line in lines if "amqlite.server: closing" not in line]
