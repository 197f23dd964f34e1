"""Helpers for the cluster tests: the real CLI as a subprocess, a producer that finds the
master through a discovery: URI and follows it across failovers, and raw SQL."""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import psycopg
from stomp.exception import StompException

from amqlite.client.discovery import DiscoveryError, resolve
from tests.helpers.broker_proc import (
    REPO_ROOT,
    Client,
    amqlite_command,
    cli_env,
    open_client,
)

#: One CLI call: importing, reading a registry, at most waiting for a broker to stop.
CLI_TIMEOUT = 60.0
#: A producer gives up on one RECEIPT after this long and reconnects (s): a healthy
#: local broker answers in milliseconds; a dead or deposed one never does.
RECEIPT_WAIT = 3.0
#: How fast the producer sends (s between messages): a steady stream, like the classic
#: `producer --sleep`, without flooding a two-core machine.
SEND_INTERVAL = 0.02


def amqlite(*args: str, env: Mapping[str, str] | None = None,
            timeout: float = CLI_TIMEOUT,
            wrapper: Sequence[str] = ()) -> subprocess.CompletedProcess[str]:
    """Run the real ``amqlite`` CLI in a process of its own (behind ``wrapper``, a
    command that ends by running its arguments, such as ``unshare ... sh -c``)."""
    return subprocess.run([*wrapper, *amqlite_command(), *args], capture_output=True, text=True,
                          env=cli_env(env), cwd=REPO_ROOT, timeout=timeout, check=False)


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, (f"{result.args} exited {result.returncode}\n"
                                    f"stdout: {result.stdout}\nstderr: {result.stderr}")
    return result.stdout


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    """The command failed with exactly one line on stderr, no traceback."""
    assert result.returncode != 0, f"{result.args} succeeded: {result.stdout}"
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("amqlite: error: "), result.stderr
    return lines[0]


def cluster_json(*args: str, env: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    return json.loads(ok(amqlite("cluster-list", "--json", *args, env=env)))


def port_of(uri: str) -> int:
    return int(uri.rsplit(":", 1)[1])


def sql(url: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    """Raw SQL on a PostgreSQL store, behind the brokers' backs."""
    with psycopg.connect(url, autocommit=True) as conn:
        return list(conn.execute(query, params).fetchall())


class Producer(threading.Thread):
    """Sends numbered persistent messages with a producer identity, one RECEIPT at a
    time; when the broker stops answering it resolves ``discovery_uri`` again, connects
    to the first broker that accepts and re-sends the unconfirmed message (the broker's
    dedup drops it if it was stored after all)."""

    def __init__(self, discovery_uri: str, queue: str, producer_id: str) -> None:
        super().__init__(name="test-producer", daemon=True)
        self.uri, self.queue, self.producer_id = discovery_uri, queue, producer_id
        self.cond = threading.Condition()
        self.receipted: list[tuple[int, int]] = []  # (seq, port of the broker that said so)
        self.connects: list[int] = []  # ports connected to, in order
        self.stopping = threading.Event()
        self.error: BaseException | None = None

    def _connect(self) -> Client | None:
        with contextlib.suppress(DiscoveryError):
            for uri in resolve(self.uri):
                try:
                    client = open_client(port_of(uri), timeout=2.0)
                except Exception:  # refused: a slave, or gone
                    continue
                with self.cond:
                    self.connects.append(client.port)
                return client
        return None

    def run(self) -> None:
        seq, client = 0, None
        try:
            while not self.stopping.is_set():
                if client is None:
                    client = self._connect()
                    if client is None:
                        self.stopping.wait(0.1)  # nobody serves yet: a takeover is under way
                        continue
                headers = {"persistent": "true", "amqlite.producerId": self.producer_id,
                           "amqlite.producerSeq": str(seq)}
                try:
                    client.send(self.queue, f"m{seq}", headers, timeout=RECEIPT_WAIT)
                except (AssertionError, StompException):  # no RECEIPT, or disconnected
                    client.close()
                    client = None
                    continue
                with self.cond:
                    self.receipted.append((seq, client.port))
                    self.cond.notify_all()
                seq += 1
                self.stopping.wait(SEND_INTERVAL)
        except BaseException as e:  # surfaced by finish()
            self.error = e
        finally:
            if client is not None:
                client.close()

    def wait_receipts_from(self, port: int, count: int, timeout: float) -> None:
        """Wait until ``count`` RECEIPTs came from the broker on ``port``."""
        def enough() -> bool:
            return sum(1 for _, p in self.receipted if p == port) >= count or not self.is_alive()
        with self.cond:
            self.cond.wait_for(enough, timeout)
            got = sum(1 for _, p in self.receipted if p == port)
        assert got >= count, (f"{got} of {count} receipts from port {port} within {timeout}s "
                              f"(connects {self.connects}, error {self.error!r})")

    def finish(self) -> list[int]:
        """Stop; the receipted sequence numbers."""
        self.stopping.set()
        self.join(30)
        assert not self.is_alive(), "producer did not stop"
        assert self.error is None, f"producer failed: {self.error!r}"
        with self.cond:
            return [s for s, _ in self.receipted]


def drain_bodies(port: int, queue: str, expected: int, timeout: float = 60.0) -> list[str]:
    """Consume ``queue`` until at least ``expected`` messages came and it went quiet."""
    client = open_client(port)
    try:
        client.subscribe(queue)
        client.listener.wait_for(lambda: client.listener.count() >= expected, timeout)
        assert client.listener.wait_quiet(1.0, timeout), "queue never went quiet"
        return client.listener.bodies()
    finally:
        client.close()


def log_tails(paths: list[Path], lines: int = 60) -> str:
    out = []
    for p in paths:
        with contextlib.suppress(OSError):
            text = p.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {p} ---\n" + "\n".join(text))
    return "\n".join(out)
