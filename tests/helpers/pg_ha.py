"""Helpers for the PostgreSQL HA tests: a 3-node group on one PostgreSQL store and lock,
"exactly one master" checks (ports and pg_locks), a producer that survives failovers by
re-sending with the same identity, a draining consumer, and SQL checks of the store.

Everything waits by polling with a deadline; nothing sleeps to synchronise.
"""

from __future__ import annotations

import collections
import contextlib
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import stomp.exception
from stomp.utils import Frame

from amqlite.validation import MAX_PREFETCH
from tests.helpers.broker_proc import (
    BrokerFactory,
    BrokerProcess,
    Client,
    ack_id,
    open_client,
    unique,
)
from tests.helpers.servers import PostgresServer

#: Short keepalive so a lost lock is noticed in half a second (default 1 s).
LOCK_KEEPALIVE = "0.5"
#: How long one poll of "who serves" may wait before it counts as a failed takeover.
TAKEOVER_TIMEOUT = 30.0
#: "Exactly one master" must hold this long, not just at one instant.
STABLE_WINDOW = 1.0
#: A producer that gets no RECEIPT for this long gives up the connection and fails over.
PRODUCER_STALL = 3.0
#: CONNECT deadline of the producer (a paused broker's kernel still accepts TCP).
PRODUCER_CONNECT_TIMEOUT = 2.0
#: Pause between two new messages of one producer (about 100 messages/s each): enough
#: traffic that every failover hits messages in flight, little enough for 2 shared cores.
PRODUCER_INTERVAL = 0.01
#: Outstanding (unreceipted) messages per producer.
PRODUCER_WINDOW = 8


def new_since(broker: BrokerProcess, mark: int) -> str:
    """What the broker logged after `mark` (a length of its log text)."""
    return broker.log_text()[mark:]


def wait_log(broker: BrokerProcess, text: str, mark: int = 0,
             timeout: float = TAKEOVER_TIMEOUT) -> None:
    """Poll the broker's log (after `mark`) for `text`; fail with the log tail."""
    broker.wait_log(re.escape(text), timeout, since=mark)


@dataclass
class PgGroup:
    """Brokers of one group sharing one PostgreSQL database as store and locker."""

    factory: BrokerFactory
    server: PostgresServer
    url: str
    group: str = field(default_factory=lambda: unique("ha"))
    brokers: list[BrokerProcess] = field(default_factory=list)
    #: AMQLITE_LOCK_KEEPALIVE of every node.
    keepalive: str = LOCK_KEEPALIVE
    #: More AMQLITE_* settings for every node.
    env: dict[str, str] = field(default_factory=dict)
    #: time.monotonic() when wait_one_master last saw its master serving alone.
    first_seen: float = 0.0

    @property
    def dbname(self) -> str:
        return self.url.rsplit("/", 1)[1]

    def start(self, count: int = 3) -> BrokerProcess:
        """Start `count` nodes at once (--rejoin); return the master once it is the only one."""
        env = {"AMQLITE_LOCK_KEEPALIVE": self.keepalive, "AMQLITE_LOCK_POLL_INTERVAL": "0.1",
               **self.env}
        for i in range(1, count + 1):
            self.brokers.append(self.factory.new(
                name=f"n{i}", group=self.group, env=env,
                extra_args=["--store", self.url, "--locker", self.url, "--rejoin"]))
        for b in self.brokers:
            b.start()
        master, _ = self.wait_one_master(timeout=60)
        return master

    # -- SQL ---------------------------------------------------------------------------
    def sql(self, query: str) -> str:
        return self.server.psql(query, self.dbname)

    def rows(self, query: str) -> list[list[str]]:
        out = self.sql(query)
        return [line.split("|") for line in out.splitlines() if line]

    def scalar(self, query: str) -> str:
        return self.sql(query).strip()

    def lock_holders(self) -> list[str]:
        """application_name of every session holding the group's advisory lock."""
        return [r[0] for r in self.rows(
            "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
            " WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1"
            f" AND a.application_name LIKE 'amqlite-lock:{self.group}:%'")]

    def lock_name(self, broker: BrokerProcess) -> str:
        return f"amqlite-lock:{self.group}:{broker.name}"

    def lock_backend_pid(self, broker: BrokerProcess) -> int:
        """The server pid of the session holding the lock for `broker` (must be one)."""
        pids = self.rows(
            "SELECT a.pid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
            " WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1"
            f" AND a.application_name = '{self.lock_name(broker)}'")
        assert len(pids) == 1, f"expected one lock session of {broker.name}, found {pids}"
        return int(pids[0][0])

    def epoch(self) -> int:
        return int(self.scalar(f"SELECT epoch FROM amq_groups WHERE grp = '{self.group}'"))

    def activations(self) -> list[tuple[int, str, int, bool, bool]]:
        """(epoch, node, activated_at ms, ended gracefully, integrity mismatch) per activation."""
        return [(int(e), n, int(t), ended == "t", mismatch == "t") for e, n, t, ended, mismatch
                in self.rows("SELECT epoch, node, activated_at, ended_at IS NOT NULL,"
                             " coalesce(mismatch, false) FROM amq_activations"
                             f" WHERE grp = '{self.group}' ORDER BY epoch")]

    def stored_keys(self) -> list[str]:
        """dedup_key of every message row of the group (one per stored message)."""
        return [r[0] for r in self.rows(
            f"SELECT coalesce(dedup_key, '') FROM amq_messages WHERE grp = '{self.group}'")]

    # -- who is master -----------------------------------------------------------------
    def serving(self, brokers: Sequence[BrokerProcess] | None = None) -> list[BrokerProcess]:
        return [b for b in (self.brokers if brokers is None else brokers) if b.is_serving()]

    def wait_one_master(self, timeout: float = TAKEOVER_TIMEOUT, stable: float = STABLE_WINDOW,
                        brokers: Sequence[BrokerProcess] | None = None,
                        ) -> tuple[BrokerProcess, float]:
        """Poll until exactly one broker serves and pg_locks shows exactly its lock session,
        and both stay so for `stable` seconds. Return it and the seconds until it was first
        seen serving alone (the takeover time when called right after a failure)."""
        start = time.monotonic()
        deadline = start + timeout
        last = ""
        while time.monotonic() < deadline:
            up = self.serving(brokers)
            if len(up) != 1:
                last = f"serving: {[b.name for b in up]}"
                time.sleep(0.02)
                continue
            self.first_seen = time.monotonic()
            seen = self.first_seen - start
            master = up[0]
            holders = self.lock_holders()
            if holders != [self.lock_name(master)]:
                last = f"{master.name} serves but lock holders are {holders}"
                time.sleep(0.02)
                continue
            if self._stays(master, stable, brokers) and \
                    self.lock_holders() == [self.lock_name(master)]:
                return master, seen
            last = f"{master.name} served alone but not for {stable}s"
        raise AssertionError(f"not exactly one master within {timeout}s ({last})\n"
                             f"sessions:\n{self.sessions()}\n"
                             + "\n".join(b.log_tail(40) for b in self.brokers))

    def sessions(self) -> str:
        """The group database's amqlite sessions and who blocks whom: why nobody activates."""
        with contextlib.suppress(Exception):
            return self.sql(
                "SELECT pid, application_name, state, wait_event, now() - xact_start,"
                " pg_blocking_pids(pid), left(query, 80) FROM pg_stat_activity"
                " WHERE application_name LIKE 'amqlite%' AND datname = current_database()")
        return "(PostgreSQL not reachable)"

    def _stays(self, master: BrokerProcess, duration: float,
               brokers: Sequence[BrokerProcess] | None) -> bool:
        end = time.monotonic() + duration
        while time.monotonic() < end:
            if self.serving(brokers) != [master] or not master.alive:
                return False
            time.sleep(0.05)
        return True

    # -- store checks ------------------------------------------------------------------
    def assert_store_consistent(self, expected_keys: set[str], master: BrokerProcess) -> None:
        """The store holds every expected message exactly once, and nothing shows a write
        from a stale epoch: fenced counters agree with the rows, no message is in flight
        under a future or unknown epoch, activations are in order and the last is ours."""
        keys = self.stored_keys()
        dupes = [k for k, n in collections.Counter(keys).items() if n > 1]
        assert not dupes, f"{len(dupes)} producer identities stored twice: {dupes[:10]}"
        missing = expected_keys - set(keys)
        assert not missing, f"{len(missing)} receipted messages not stored: {sorted(missing)[:10]}"
        extra = set(keys) - expected_keys
        assert not extra, f"{len(extra)} stored messages nobody sent: {sorted(extra)[:10]}"
        dedup = int(self.scalar(f"SELECT count(*) FROM amq_dedup WHERE grp = '{self.group}'"))
        assert dedup == len(expected_keys), f"amq_dedup has {dedup} rows for {len(keys)} keys"

        epoch = self.epoch()
        stale = self.rows(
            f"SELECT id, inflight_epoch FROM amq_messages WHERE grp = '{self.group}'"
            f" AND inflight_epoch IS NOT NULL AND inflight_epoch > {epoch}")
        assert not stale, f"messages in flight under an epoch above {epoch}: {stale[:10]}"
        count, max_id, rows, top = self.rows(
            "SELECT g.msg_count, g.max_msg_id, count(m.id), coalesce(max(m.id), 0)"
            " FROM amq_groups g LEFT JOIN amq_messages m ON m.grp = g.grp"
            f" WHERE g.grp = '{self.group}' GROUP BY g.msg_count, g.max_msg_id")[0]
        assert int(count) == int(rows) and int(max_id) >= int(top), (
            f"fenced counters say {count} rows (max id {max_id}), the table holds {rows} "
            f"(max id {top}): something wrote around the fence")

        # Master E allocates ids above amq_activations.expected_max_id(E) (everything committed
        # before its claim) and stores only SENDs it received after activated_at(E). A row
        # above that id but enqueued before that time was committed by an older epoch after
        # E's claim: a stale write that got past the fence.
        unknown = self.scalar("SELECT count(*) FROM amq_activations WHERE expected_max_id IS NULL"
                              f" AND grp = '{self.group}'")
        assert unknown == "0", f"{unknown} activations did not record the store's max id"
        late = self.rows(
            "SELECT a.epoch, m.id, m.enqueued_at, a.activated_at FROM amq_activations a"
            " JOIN amq_messages m ON m.grp = a.grp AND m.id > a.expected_max_id"
            f" AND m.enqueued_at < a.activated_at WHERE a.grp = '{self.group}'")
        assert not late, f"rows committed by an older epoch after a newer claim: {late[:10]}"

        acts = self.activations()
        epochs = [a[0] for a in acts]
        assert epochs == sorted(set(epochs)) and epochs[-1] == epoch, (
            f"activations out of order or not ending at epoch {epoch}: {acts}")
        times = [a[2] for a in acts]
        assert times == sorted(times), f"activation times not increasing with epoch: {acts}"
        assert acts[-1][1] == master.name, f"last activation by {acts[-1][1]}, not {master.name}"
        bad = [a for a in acts if a[4]]
        assert not bad, f"activations that reported an integrity mismatch: {bad}"


# --------------------------------------------------------------------------- producer


class Producer(threading.Thread):
    """Sends persistent messages with receipts to whichever broker serves. After a lost or
    stalled connection it reconnects and re-sends every unreceipted message with the SAME
    amqlite.producerId/producerSeq, so the broker's dedup must drop the copies."""

    def __init__(self, ports: Callable[[], list[int]], destination: str,
                 producer_id: str | None = None, extra_headers: dict[str, str] | None = None,
                 ) -> None:
        super().__init__(name=f"producer-{destination}", daemon=True)
        self.ports = ports
        self.destination = destination
        self.producer_id = producer_id or unique("p")
        self.extra_headers = dict(extra_headers or {})
        self.stopping = threading.Event()
        self.cond = threading.Condition()
        self.sent: set[int] = set()
        self.receipted: set[int] = set()
        self.resent = 0
        self.connects = 0
        self.failure: BaseException | None = None
        self._client: Client | None = None
        self._gen = 0

    def key(self, seq: int) -> str:
        return f"{self.producer_id}:{seq}"

    def keys(self) -> set[str]:
        with self.cond:
            return {self.key(s) for s in self.receipted}

    def receipted_seqs(self) -> list[int]:
        with self.cond:
            return sorted(self.receipted)

    def receipt_count(self) -> int:
        with self.cond:
            return len(self.receipted)

    def wait_receipts(self, count: int, timeout: float = TAKEOVER_TIMEOUT) -> None:
        """Wait until at least `count` messages in total are receipted."""
        with self.cond:
            ok = self.cond.wait_for(lambda: len(self.receipted) >= count or
                                    self.failure is not None, timeout)
            got = len(self.receipted)
        assert ok and self.failure is None, (
            f"{self.producer_id}: {got} of {count} receipts within {timeout}s "
            f"(failure={self.failure!r})")

    def finish(self, timeout: float = 60.0) -> set[str]:
        """Stop sending new messages, wait until every sent one is receipted; return keys."""
        self.stopping.set()
        self.join(timeout)
        assert not self.is_alive(), (
            f"{self.producer_id}: {len(self.sent - self.receipted)} messages still "
            f"unreceipted after {timeout}s")
        assert self.failure is None, f"{self.producer_id} failed: {self.failure!r}"
        assert self.sent == self.receipted
        return self.keys()

    # -- the thread ----------------------------------------------------------------------
    def run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # reported by finish()/wait_receipts()
            with self.cond:
                self.failure = exc
                self.cond.notify_all()
        finally:
            if self._client is not None:
                self._drop(self._client)

    def _connect(self) -> Client | None:
        for port in self.ports():
            try:
                client = open_client(port, timeout=PRODUCER_CONNECT_TIMEOUT)
            except Exception:  # refused, no CONNECTED in time, ERROR: try the next one
                continue
            self.connects += 1
            return client
        return None

    @staticmethod
    def _drop(client: Client) -> None:
        """Close without DISCONNECT: the broker may be dead or paused."""
        with contextlib.suppress(Exception):
            client.conn.transport.disconnect_socket()

    def _send(self, client: Client, seq: int, inflight: dict[str, int]) -> None:
        receipt = f"r-{self.producer_id}-{seq}-{self._gen}"
        inflight[receipt] = seq
        client.conn.send(self.destination, f"{self.producer_id}:{seq}", headers={
            **self.extra_headers, "receipt": receipt, "persistent": "true",
            "amqlite.producerId": self.producer_id, "amqlite.producerSeq": str(seq)})

    def _loop(self) -> None:
        seq = 0
        inflight: dict[str, int] = {}  # receipt id -> seq, on the current connection
        next_new = time.monotonic()
        progress = time.monotonic()
        while True:
            with self.cond:
                pending = self.sent - self.receipted
            if self.stopping.is_set() and not pending:
                return
            client = self._client
            if client is None:
                client = self._client = self._connect()
                if client is None:
                    self.stopping.wait(0.05)  # nobody serves yet: poll again
                    continue
                self._gen += 1
                inflight.clear()
                progress = time.monotonic()
                try:
                    for s in sorted(pending):
                        self._send(client, s, inflight)
                        self.resent += 1
                except (stomp.exception.StompException, OSError):
                    self._drop(client)
                    self._client = None
                    continue
            listener = client.listener
            try:
                now = time.monotonic()
                if not self.stopping.is_set() and len(inflight) < PRODUCER_WINDOW \
                        and now >= next_new:
                    seq += 1
                    with self.cond:
                        self.sent.add(seq)
                    self._send(client, seq, inflight)
                    next_new = now + PRODUCER_INTERVAL
            except (stomp.exception.StompException, OSError):
                pass  # the connection is gone: noticed below
            wait = max(0.0, min(next_new - time.monotonic(), 0.2))
            listener.wait_for(lambda lst=listener: bool(lst.receipts.intersection(inflight))
                              or lst.disconnected or bool(lst.errors), wait)
            with listener.cond:
                done = [r for r in inflight if r in listener.receipts]
                broken = listener.disconnected or bool(listener.errors)
            if done:
                progress = time.monotonic()
                with self.cond:
                    for r in done:
                        self.receipted.add(inflight.pop(r))
                    self.cond.notify_all()
            stalled = bool(inflight) and time.monotonic() - progress > PRODUCER_STALL
            if broken or stalled or not client.conn.is_connected():
                self._drop(client)
                self._client = None


def resend_receipted(port: int, destination: str, producers: Sequence[Producer],
                     count: int = 5) -> None:
    """Re-send each producer's last `count` receipted messages with the same identity, as a
    producer that lost those RECEIPTs in a failover would: the broker must confirm them and
    store nothing (its dedup window outlives the master that stored the originals)."""
    client = open_client(port)
    try:
        for p in producers:
            for seq in p.receipted_seqs()[-count:]:
                client.send(destination, p.key(seq), headers={
                    "persistent": "true", "amqlite.producerId": p.producer_id,
                    "amqlite.producerSeq": str(seq)})
    finally:
        client.close()


# --------------------------------------------------------------------------- consumer


def drain_queue(port: int, destination: str, expected: int, quiet: float = 1.0,
                timeout: float = 60.0) -> list[Frame]:
    """Consume the queue with client-individual acks until `expected` messages came and then
    nothing for `quiet` seconds; ack every one (the last with a receipt) and return them."""
    client = open_client(port)
    try:
        client.subscribe(destination, ack="client-individual",
                         headers={"activemq.prefetchSize": str(min(max(expected, 1) * 2,
                                                                   MAX_PREFETCH))})
        listener = client.listener
        listener.wait_for(lambda: listener.count() >= expected or listener.disconnected, timeout)
        assert listener.wait_quiet(quiet, timeout), "the queue never went quiet"
        frames = listener.snapshot()
        assert not listener.disconnected, f"consumer disconnected: {listener.error_texts()}"
        for frame in frames[:-1]:
            client.conn.ack(ack_id(frame))
        if frames:
            client.ack(frames[-1], timeout=30)  # acks commit in order: all of them are durable
        return frames
    finally:
        client.close()


def assert_delivered_once(frames: Sequence[Frame], expected_keys: set[str]) -> None:
    """Every receipted message delivered; none twice; none flagged redelivered."""
    bodies = [f.body for f in frames]
    dupes = [b for b, n in collections.Counter(bodies).items() if n > 1]
    assert not dupes, f"{len(dupes)} messages delivered twice: {dupes[:10]}"
    missing = expected_keys - set(bodies)
    assert not missing, f"{len(missing)} receipted messages never delivered: {sorted(missing)[:10]}"
    extra = set(bodies) - expected_keys
    assert not extra, f"delivered messages nobody sent: {sorted(extra)[:10]}"
    redelivered = [f.body for f in frames if f.headers.get("redelivered") == "true"]
    assert not redelivered, f"first deliveries flagged redelivered: {redelivered[:10]}"
