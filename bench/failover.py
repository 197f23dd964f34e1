"""W3 takeover under load: SIGKILL the master while W1 runs, as each producer sees it.

A shared-store group (amqlite: ``--nodes`` nodes on PostgreSQL with the
advisory-lock locker, or SQLite with the file lock; ActiveMQ: a JDBC
master/slave pair on PostgreSQL with its default database locker) serves W1:
``--producers`` producers send persistent messages and wait for each RECEIPT,
``--consumers`` consumers ack each message (client-individual). Every
``--warmup`` seconds the master is SIGKILLed; clients reconnect to whichever
node serves, polling every 10 ms (ActiveMQ's initialReconnectDelay), and
re-send the message that had no RECEIPT (amqlite dedups it by producer
identity; ActiveMQ sees a new connection, so a new producer). Reported:

* gap: per producer, last RECEIPT before the kill to first RECEIPT after (p50, max)
* lost: messages whose RECEIPT a producer got and no consumer ever received
* duplicated: messages stored twice (one producer sequence under two message-ids)
* redelivered: the same message delivered again (an ACK the dead master never stored)

``--backlog N`` puts N messages on another queue first (deep-store takeover).
RabbitMQ has no shared-store master/slave, so it has no W3.

    python bench/failover.py --broker amqlite                 # PostgreSQL, 3 nodes
    python bench/failover.py --broker amqlite --backlog 1000000
    python bench/failover.py --broker activemq                # JDBC master/slave

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from amqlite.codec import Frame  # noqa: E402
from amqlite.wire import (  # noqa: E402
    ACK_CLIENT_INDIVIDUAL,
    PRODUCER_ID_HEADER,
    PRODUCER_SEQ_HEADER,
)
from bench.load import CLOSED, Conn, asyncio_run, preload, subscribe  # noqa: E402
from bench.peers import (  # noqa: E402
    START_TIMEOUT,
    PeerProcess,
    PeerSet,
    jdbc_url,
    port_open,
)

QUEUE = "/queue/failover"
BACKLOG_QUEUE = "/queue/backlog"
#: ActiveMQ failover transport's initialReconnectDelay: 10 ms between tries.
RECONNECT_POLL = 0.01
#: A RECEIPT that takes longer than this means the connection is dead (a
#: half-open socket); the producer reconnects and re-sends.
RECEIPT_TIMEOUT = 30.0
#: A round whose producers have not all resumed by then failed.
ROUND_TIMEOUT = 120.0
#: How long consumers may take to receive everything after the producers stop.
DRAIN_TIMEOUT = 60.0


@dataclass
class Stats:
    """What all clients saw, shared by the coroutines of one run."""

    gaps: list[float] = field(default_factory=list)
    receipted: set[tuple[int, int]] = field(default_factory=set)
    deliveries: dict[tuple[int, int], list[str]] = field(
        default_factory=lambda: collections.defaultdict(list))
    resumed: set[int] = field(default_factory=set)
    first_receipt_after_kill: float | None = None
    killed_at: float = 0.0
    producer_errors: int = 0
    consumer_connects: int = 0
    consumers_subscribed: int = 0
    consumer_errors: list[str] = field(default_factory=list)
    #: (seconds since start, consumer, port, event, messages so far): read after a loss.
    consumer_events: list[tuple[float, int, int, str, int]] = field(default_factory=list)
    t0: float = field(default_factory=time.monotonic)

    def event(self, idx: int, port: int, what: str, n: int) -> None:
        self.consumer_events.append((round(time.monotonic() - self.t0, 3), idx, port, what, n))


async def connect_any(ports: list[int], deadline: float) -> Conn:
    """The first node that accepts a STOMP connection, polling like a failover client."""
    while time.monotonic() < deadline:
        for port in ports:
            try:
                return await Conn.open(port, timeout=5.0)
            except (OSError, ConnectionError, TimeoutError):
                continue
        await asyncio.sleep(RECONNECT_POLL)
    raise TimeoutError("no node accepted a connection")


async def producer(ports: list[int], idx: int, body: bytes, stop: asyncio.Event,
                   stats: Stats) -> None:
    conn = await connect_any(ports, time.monotonic() + START_TIMEOUT)
    seq = 0
    last_ok: float | None = None
    broken = False
    while not stop.is_set():
        seq += 1
        headers = {"destination": QUEUE, "persistent": "true", "receipt": str(seq),
                   PRODUCER_ID_HEADER: f"w3-{idx}", PRODUCER_SEQ_HEADER: str(seq),
                   "bench_pid": str(idx), "bench_seq": str(seq)}
        while True:
            try:
                conn.send(Frame("SEND", headers, body))
                f = await asyncio.wait_for(conn.frames.get(), RECEIPT_TIMEOUT)
                if f.command == "RECEIPT":
                    break
                raise ConnectionError(f"{f.command}: {f.headers.get('message', '')}")
            except (OSError, ConnectionError, TimeoutError):
                conn.close()
                broken = True
                stats.producer_errors += 1
                conn = await connect_any(ports, time.monotonic() + ROUND_TIMEOUT)
        now = time.monotonic()
        if broken and last_ok is not None:
            stats.gaps.append(now - last_ok)
            if now > stats.killed_at:
                # Not any RECEIPT after the kill: one already in the socket
                # buffer when the master died says nothing about the takeover.
                stats.resumed.add(idx)
                if stats.first_receipt_after_kill is None:
                    stats.first_receipt_after_kill = now
        broken = False
        last_ok = now
        stats.receipted.add((idx, seq))
    conn.close()


async def consumer(ports: list[int], stop: asyncio.Event, stats: Stats, idx: int = 0) -> None:
    received = 0
    while not stop.is_set():
        try:
            conn = await connect_any(ports, time.monotonic() + ROUND_TIMEOUT)
            stats.consumer_connects += 1
            port = conn.writer.get_extra_info("peername")[1]
            stats.event(idx, port, "connected", received)
        except TimeoutError as exc:
            stats.consumer_errors.append(repr(exc))
            continue
        try:
            await subscribe(conn, QUEUE, ACK_CLIENT_INDIVIDUAL)
        except (OSError, ConnectionError, TimeoutError) as exc:
            stats.consumer_errors.append(repr(exc))
            conn.close()
            continue
        stats.consumers_subscribed += 1
        try:
            while not stop.is_set():
                try:
                    f = await asyncio.wait_for(conn.frames.get(), 0.5)
                except TimeoutError:
                    continue
                if f is CLOSED or f.command == "ERROR":
                    stats.event(idx, port, f.command, received)
                    break
                if f.command != "MESSAGE":
                    continue
                received += 1
                key = (int(f.headers.get("bench_pid", -1)),
                       int(f.headers.get("bench_seq", -1)))
                stats.deliveries[key].append(f.headers.get("message-id", ""))
                conn.send(Frame("ACK", {"id": f.headers["ack"]}))
        except ConnectionError:  # the ACK found the connection gone: reconnect
            stats.event(idx, port, "ACK failed", received)
        finally:
            stats.consumers_subscribed -= 1
            conn.close()


def serving_node(nodes: list[PeerProcess]) -> PeerProcess:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        for n in nodes:
            if n.alive() and port_open(n.port):
                return n
        time.sleep(RECONNECT_POLL)
    raise TimeoutError("no master came up")


def sockets(ports: list[int]) -> list[str]:
    """TCP sockets to or from the nodes' ports, with their processes (``ss``)."""
    try:
        out = subprocess.run(["ss", "-tanpH"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return []
    wanted = tuple(f":{p} " for p in ports)
    return [" ".join(ln.split()) for ln in out.stdout.splitlines()
            if any(w in ln + " " for w in wanted)][:40]


def pct_ms(values: list[float], p: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return round(values[min(len(values) - 1, int(len(values) * p))] * 1000, 1)


async def run(opts: argparse.Namespace, nodes: list[PeerProcess]) -> dict:
    loop = asyncio.get_running_loop()
    ports = [n.port for n in nodes]
    body = b"x" * opts.body_size
    master = await loop.run_in_executor(None, serving_node, nodes)
    result: dict = {}
    if opts.backlog:
        t = time.monotonic()
        result["preloaded"] = await preload(master.port, opts.backlog, body, BACKLOG_QUEUE,
                                            deadline=t + opts.preload_timeout)
        result["preload_s"] = round(time.monotonic() - t, 1)
    stats = Stats(killed_at=float("inf"))
    stats.t0 = time.monotonic()
    stop_producers, stop_consumers = asyncio.Event(), asyncio.Event()
    consumers = [asyncio.ensure_future(consumer(ports, stop_consumers, stats, i))
                 for i in range(opts.consumers)]
    producers = [asyncio.ensure_future(producer(ports, i, body, stop_producers, stats))
                 for i in range(opts.producers)]
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    t_start = time.monotonic()
    rounds = []
    try:
        for _ in range(opts.rounds):
            await asyncio.sleep(opts.warmup)
            master = await loop.run_in_executor(None, serving_node, nodes)
            for n in nodes:
                if n is not master:
                    await loop.run_in_executor(None, n.wait_standing_by, START_TIMEOUT)
            gaps_before = len(stats.gaps)
            stats.resumed.clear()
            stats.first_receipt_after_kill = None
            stats.killed_at = time.monotonic()
            master.kill()
            deadline = stats.killed_at + ROUND_TIMEOUT
            while len(stats.resumed) < opts.producers and time.monotonic() < deadline:
                if any(p.done() for p in producers):
                    break
                await asyncio.sleep(0.01)
            first = stats.first_receipt_after_kill
            rounds.append({
                "killed": master.name,
                "killed_port": master.port,
                "killed_at_s": round(stats.killed_at - stats.t0, 3),
                "kill_to_first_receipt_ms": round((first - stats.killed_at) * 1000, 1)
                if first else None,
                "producers_resumed": len(stats.resumed),
                "gap_max_ms": pct_ms(stats.gaps[gaps_before:], 1.0),
            })
            stats.killed_at = float("inf")
            await asyncio.sleep(opts.settle)
            master.start()  # back as a slave for the next round
    finally:
        stop_producers.set()
        await asyncio.gather(*producers, return_exceptions=True)
    produce_s = time.monotonic() - t_start
    deadline = time.monotonic() + DRAIN_TIMEOUT
    while time.monotonic() < deadline and not stats.receipted <= stats.deliveries.keys():
        await asyncio.sleep(0.1)
    stop_consumers.set()
    await asyncio.gather(*consumers, return_exceptions=True)
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    lost = stats.receipted - stats.deliveries.keys()
    duplicated = sum(1 for ids in stats.deliveries.values() if len(set(ids)) > 1)
    redelivered = sum(len(ids) - len(set(ids)) for ids in stats.deliveries.values())
    gaps = stats.gaps
    if lost:
        # Enough to tell a broker that lost messages from one that still holds them.
        result["lost_sample"] = sorted(lost)[:10]
        result["consumers_subscribed_at_end"] = stats.consumers_subscribed
        result["consumer_connects"] = stats.consumer_connects
        result["consumer_errors"] = stats.consumer_errors[-5:]
        result["consumer_events"] = stats.consumer_events[-40:]
        result["ports"] = {n.name: n.port for n in nodes}
        result["sockets_at_end"] = sockets(ports)
    return {
        **result,
        "rounds": rounds,
        "gap_ms": {"p50": pct_ms(gaps, 0.5), "p99": pct_ms(gaps, 0.99),
                   "max": pct_ms(gaps, 1.0),
                   "mean": round(statistics.fmean(gaps) * 1000, 1) if gaps else None,
                   "samples": len(gaps)},
        "receipted": len(stats.receipted),
        "received": len(stats.deliveries),
        "lost": len(lost),
        "duplicated": duplicated,
        "redelivered": redelivered,
        "produce_msg_s": round(len(stats.receipted) / produce_s),
        "loadgen_cpu_pct": round(100 * cpu / produce_s, 1),
    }


def make_nodes(opts: argparse.Namespace, peers: PeerSet) -> tuple[list[PeerProcess], dict]:
    """Start the group: the first node becomes master, the others stand by."""
    if opts.broker == "activemq":
        pg = peers.postgres()
        jdbc = jdbc_url(pg, pg.create_database())
        nodes: list[PeerProcess] = [peers.activemq(f"amq{i}", jdbc=jdbc, start=False)
                                    for i in range(opts.nodes or 2)]
    else:
        url = peers.postgres().create_database() if opts.store == "postgres" else None
        nodes = [peers.amqlite(opts.store, f"n{i}", url=url, log_level="INFO", start=False)
                 for i in range(opts.nodes or 3)]
    nodes[0].start()
    serving_node(nodes)
    for n in nodes[1:]:
        n.start()
        n.wait_standing_by(START_TIMEOUT)
    return nodes, dict(nodes[0].config)


def store_rows(peers: PeerSet, sample: list[list[int]]) -> dict:
    """After a run that lost messages on amqlite/PostgreSQL: are they still in the
    store (a dispatch problem) or gone (a durability problem)?"""
    pg = peers.pg
    if pg is None or not sample:
        return {}
    dbs = pg.psql("SELECT datname FROM pg_database WHERE datname LIKE 'amqtest_%'").split()
    pairs = ",".join(f"('w3-{p}',{q})" for p, q in sample)
    out = {}
    for db in dbs:
        out[db] = pg.psql(
            "SELECT count(*) || ' rows, ' || count(inflight_epoch) || ' in flight; sample "
            f"found: ' || (SELECT count(*) FROM amq_messages WHERE (producer_id, producer_seq) "
            f"IN ({pairs})) FROM amq_messages", db)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--broker", choices=["amqlite", "activemq"], default="amqlite")
    ap.add_argument("--store", choices=["postgres", "sqlite"], default="postgres",
                    help="amqlite's store (ActiveMQ always uses JDBC on PostgreSQL)")
    ap.add_argument("--nodes", type=int, default=0, help="default: 3 amqlite, 2 ActiveMQ")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--warmup", type=float, default=5.0, help="seconds of W1 before a kill")
    ap.add_argument("--settle", type=float, default=2.0, help="seconds after producers resume")
    ap.add_argument("--producers", type=int, default=50)
    ap.add_argument("--consumers", type=int, default=4)
    ap.add_argument("--backlog", type=int, default=0, help="messages waiting on another queue")
    ap.add_argument("--preload-timeout", type=float, default=900.0)
    ap.add_argument("--body-size", type=int, default=1024)
    opts = ap.parse_args()
    with PeerSet() as peers:
        nodes, broker_config = make_nodes(opts, peers)
        result = asyncio_run(run(opts, nodes))
        if result.get("lost") and opts.broker == "amqlite":
            result["store_after_loss"] = store_rows(peers, result.get("lost_sample", []))
    print(json.dumps({"bench": "failover", "broker": broker_config,
                      "config": {**vars(opts), "nodes": len(nodes)}, **result}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
