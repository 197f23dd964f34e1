"""Takeover time after SIGKILL of the master, as a producer sees it.

Starts two (or ``--nodes``) brokers of one group, keeps one producer sending
persistent messages with receipts, SIGKILLs the master ``--rounds`` times and
measures, per round, the time from the kill to the first RECEIPT from the new
master (the client reconnects to whichever node serves, polling every 10 ms).
The killed node is restarted as a slave before the next round. Optionally
preloads ``--backlog`` messages so takeover with a deep queue can be compared.

    python bench/takeover.py                      # embedded: SQLite + file lock
    python bench/takeover.py --pg                 # throwaway PostgreSQL store + advisory lock
    python bench/takeover.py --pg --backlog 1000000

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from amqlite.codec import HEARTBEAT, Frame, FrameParser, encode_frame  # noqa: E402
from amqlite.wire import STOMP_1_2  # noqa: E402
from bench.procs import port_open  # noqa: E402
from tests.helpers.servers import PostgresServer, free_port  # noqa: E402

#: How often the client retries the nodes while none serves (ActiveMQ's
#: failover transport starts at initialReconnectDelay=10 ms).
RECONNECT_POLL = 0.01
START_TIMEOUT = 60.0
ROUND_TIMEOUT = 30.0


class RawClient:
    """A blocking STOMP client on a raw socket: the least overhead we can measure with."""

    def __init__(self, port: int, timeout: float = 5.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.parser = FrameParser()
        self.frames: list[Frame] = []
        self.sock.sendall(encode_frame(Frame("CONNECT", {"accept-version": STOMP_1_2,
                                                         "host": "/"}), STOMP_1_2))
        reply = self.read()
        if reply.command != "CONNECTED":
            raise ConnectionError(f"CONNECT refused: {reply.headers}")
        self.parser.version = STOMP_1_2

    def read(self) -> Frame:
        while not self.frames:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("closed by broker")
            self.frames.extend(f for f in self.parser.feed(data) if f is not HEARTBEAT)
        return self.frames.pop(0)

    def send_with_receipt(self, destination: str, body: bytes, receipt: str) -> None:
        headers = {"destination": destination, "persistent": "true", "receipt": receipt}
        self.sock.sendall(encode_frame(Frame("SEND", headers, body), STOMP_1_2))
        while True:
            f = self.read()
            if f.command == "RECEIPT" and f.headers.get("receipt-id") == receipt:
                return
            if f.command == "ERROR":
                raise ConnectionError(f"ERROR: {f.headers.get('message')}")

    def close(self) -> None:
        self.sock.close()


class Node:
    def __init__(self, name: str, args: list[str], env: dict[str, str], logdir: Path) -> None:
        self.name = name
        self.port = free_port()
        self.args = args
        self.env = env
        self.log = logdir / f"{name}.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.log_offset = self.log.stat().st_size if self.log.exists() else 0
        cmd = [sys.executable, "-m", "cli", "start", "--name", self.name,
               "--bind", f"127.0.0.1:{self.port}", *self.args]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                         env=self.env, cwd=ROOT, start_new_session=True)

    def wait_standing_by(self, timeout: float) -> None:
        """Until this (re)started node waits for the lock or serves: a round that
        kills the master before the others stand by would measure start-up time."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.log.read_bytes()[self.log_offset:]
            if b"waiting for the lock" in text:
                return
            time.sleep(RECONNECT_POLL)
        raise TimeoutError(f"{self.name} did not come up as slave")

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()


def wait_master(nodes: list[Node], timeout: float) -> Node:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for n in nodes:
            if n.proc and n.proc.poll() is None and port_open(n.port):
                return n
        time.sleep(RECONNECT_POLL)
    raise TimeoutError("no master came up")


def connect_any(nodes: list[Node], deadline: float) -> RawClient:
    while time.monotonic() < deadline:
        for n in nodes:
            try:
                return RawClient(n.port)
            except OSError:
                continue
        time.sleep(RECONNECT_POLL)
    raise TimeoutError("no node accepted a connection")


def preload(port: int, count: int, body: bytes) -> None:
    """Fill the queue with pipelined SENDs (one receipt at the end)."""
    c = RawClient(port, timeout=120)
    chunk = 2000
    sent = 0
    while sent < count:
        n = min(chunk, count - sent)
        data = b"".join(
            encode_frame(Frame("SEND", {"destination": "/queue/backlog"}, body), STOMP_1_2)
            for _ in range(n)
        )
        c.sock.sendall(data)
        sent += n
        c.send_with_receipt("/queue/backlog", body, f"pre-{sent}")
    c.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--pg", action="store_true", help="PostgreSQL store and advisory lock")
    ap.add_argument("--pg-url", help="use this PostgreSQL instead of a throwaway one")
    ap.add_argument("--backlog", type=int, default=0, help="messages waiting in the store")
    ap.add_argument("--body-size", type=int, default=1024)
    ap.add_argument("--verbose", action="store_true", help="log each kill to stderr")
    opts = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="amqlite-bench-"))
    pg: PostgresServer | None = None
    env = dict(os.environ, AMQLITE_LOG_LEVEL="INFO")
    group = "bench"
    url: str | None = None
    if opts.pg or opts.pg_url:
        url = opts.pg_url
        if url is None:
            pg = PostgresServer()
            pg.init()
            pg.start()
            url = pg.create_database()
        args = ["--group", group, "--store", url, "--locker", url]
        config = {"store": "postgresql", "locker": "postgresql advisory lock"}
    else:
        args = ["--group", group, "--data-dir", str(tmp / "data")]
        config = {"store": "sqlite", "locker": "file"}
    nodes = [Node(f"n{i}", args, env, tmp) for i in range(opts.nodes)]
    body = b"x" * opts.body_size
    takeovers: list[float] = []
    try:
        for n in nodes:
            n.start()
        master = wait_master(nodes, START_TIMEOUT)
        if opts.backlog:
            t = time.monotonic()
            preload(master.port, opts.backlog, body)
            config["preload_s"] = round(time.monotonic() - t, 1)
        client = connect_any(nodes, time.monotonic() + 10)
        seq = 0
        for _ in range(opts.rounds):
            for _ in range(20):  # steady state before the kill
                seq += 1
                client.send_with_receipt("/queue/takeover", body, str(seq))
            master = wait_master(nodes, START_TIMEOUT)
            for n in nodes:
                n.wait_standing_by(START_TIMEOUT)
            killed_at = time.monotonic()
            master.kill()
            if opts.verbose:
                print(f"{time.strftime('%H:%M:%S')}.{int(time.time() * 1000) % 1000:03d} "
                      f"killed {master.name}", file=sys.stderr)
            deadline = killed_at + ROUND_TIMEOUT
            while True:
                seq += 1
                try:
                    client.send_with_receipt("/queue/takeover", body, str(seq))
                    break
                except OSError:
                    client.close()
                    client = connect_any([n for n in nodes if n is not master], deadline)
            takeovers.append((time.monotonic() - killed_at) * 1000)
            master.start()  # back as slave for the next round
        client.close()
        if pg is not None and url is not None:
            config["messages_in_store_at_end"] = int(pg.psql(
                "SELECT count(*) FROM amq_messages", url.rsplit("/", 1)[1]))
    finally:
        for n in nodes:
            n.stop()
        if pg is not None:
            pg.cleanup()
    result = {
        "bench": "takeover",
        "config": {**config, "nodes": opts.nodes, "rounds": opts.rounds,
                   "backlog": opts.backlog, "body_size": opts.body_size},
        "takeover_ms": [round(t, 1) for t in takeovers],
        "p50_ms": round(statistics.median(takeovers), 1),
        "max_ms": round(max(takeovers), 1),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
