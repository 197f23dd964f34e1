"""Per-connection state: what the broker needs of a client, its session, its transactions.

Transactions are held in memory until COMMIT, bounded per connection and by the
broker's memory budget (``amqlite.broker.memory``); a connection
with too many frames or bytes waiting for commits is not read from until they land.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from amqlite.codec import Frame
from amqlite.validation import BrokerError

if TYPE_CHECKING:
    from amqlite.broker.message import Message
    from amqlite.broker.subscription import Subscription
    from amqlite.broker.wildcard_queues import QueuePattern

#: Frames of one connection waiting for a commit before we stop reading from
#: it: a producer that sends without receipts cannot pile up unbounded work.
MAX_PENDING_COMMITS = 2000
RESUME_PENDING_COMMITS = MAX_PENDING_COMMITS // 2
#: The same in bytes: persistent messages of one connection held in memory
#: until their commit (a pipelining producer of 1 MB messages would otherwise
#: be read faster than the store writes). 16 MiB keeps a group commit full.
MAX_PENDING_BYTES = 16 * 1024 * 1024
RESUME_PENDING_BYTES = MAX_PENDING_BYTES // 2
#: Frames per transaction: 10 000 is far past any batch a STOMP client commits
#: (ActiveMQ has no limit; RabbitMQ's channel buffers are bounded in bytes).
MAX_TRANSACTION_FRAMES = 10_000
#: Bytes (bodies and headers) per transaction: three maximum-size frames.
MAX_TRANSACTION_BYTES = 32 * 1024 * 1024
#: Open transactions per connection: clients use one at a time; a few to spare.
MAX_OPEN_TRANSACTIONS = 16


class Client(Protocol):
    """What the broker needs from a client connection (see ``amqlite.server``)."""

    client_id: str | None
    login: str | None
    closed: bool

    @property
    def version(self) -> str: ...

    def write_frame(self, frame: Frame) -> None: ...

    def write_receipt(self, receipt: str) -> None:
        """``write_frame`` of a RECEIPT, the frame every persistent SEND waits for."""

    def write_message(self, head: str, body: bytes) -> None:
        """``write_frame`` of a MESSAGE whose head the broker joined itself, escaped
        for this client's version (``Subscription._write_fast``)."""

    def can_write(self) -> bool: ...

    def close_with_error(self, message: str, detail: str = "",
                         receipt: str | None = None) -> None: ...

    def close(self) -> None: ...

    def pause_reading(self, reason: str) -> None:
        """Stop reading from this client until every reason is resumed (idempotent)."""

    def resume_reading(self, reason: str) -> None:
        """Drop ``reason``; a reason it was not paused for changes nothing."""


@dataclass
class Transaction:
    #: Its SENDs' messages, checked on arrival (``checked_send``), numbered at COMMIT.
    sends: list[Message] = field(default_factory=list)
    acks: list[tuple[str, Frame]] = field(default_factory=list)  # ("ACK"|"NACK", frame)
    size: int = 0  # bytes of bodies and headers held
    #: Deliveries its ACKs cover, by subscription: their prefetch slots are free (as in
    #: ActiveMQ) though the ACKs apply only at COMMIT; ABORT leaves them with the consumer.
    held: list[tuple[Subscription, list[str]]] = field(default_factory=list)

    def add(self, frame: Frame, name: str) -> int:
        """Check a frame (not yet in ``sends`` or ``acks``) against the transaction's
        limits: its size in bytes, which the caller adds to ``size`` once the memory
        budget took it (``MemoryBudget.hold_transaction``); BrokerError past them."""
        n = len(frame.body) + sum(len(k) + len(v) for k, v in frame.headers.items())
        if len(self.sends) + len(self.acks) >= MAX_TRANSACTION_FRAMES:
            raise BrokerError(f"transaction {name[:60]!r}: more than "
                              f"{MAX_TRANSACTION_FRAMES} frames")
        if self.size + n > MAX_TRANSACTION_BYTES:
            raise BrokerError(f"transaction {name[:60]!r}: more than "
                              f"{MAX_TRANSACTION_BYTES} bytes")
        return n


class Session:
    """Broker-side state of one connected client."""

    def __init__(self, conn: Client) -> None:
        self.conn = conn
        self.subscriptions: dict[str, Subscription] = {}
        self.by_key: dict[int, Subscription] = {}
        #: Wildcard queue SUBSCRIBEs by id; their per-queue subscriptions are in
        #: ``by_key`` and ``all_subscriptions``, not in ``subscriptions``.
        self.wildcards: dict[str, QueuePattern] = {}
        self.keys = itertools.count(1)
        self.transactions: dict[str, Transaction] = {}
        #: Bytes its open transactions hold (their ``size``), counted against the
        #: memory budget and the connection's share (``MemoryBudget.hold_transaction``).
        self.tx_bytes = 0
        self.pending_commits = 0
        self.pending_bytes = 0  # Message.size of persistent sends not yet committed
        #: Message bytes its subscriptions hold unacknowledged (their ``inflight_bytes``),
        #: against the connection's share of the memory budget.
        self.inflight_bytes = 0
        self.on_idle: list[Callable[[], object]] = []

    def all_subscriptions(self) -> Iterator[Subscription]:
        """Every subscription, a wildcard queue SUBSCRIBE's per-queue ones included."""
        yield from self.subscriptions.values()
        for qp in self.wildcards.values():
            yield from qp.children.values()

    def commit_started(self, size: int = 0) -> None:
        self.pending_commits += 1
        if self.pending_commits == MAX_PENDING_COMMITS:
            self.conn.pause_reading("commits")
        if size:
            self.pending_bytes += size
            if self.pending_bytes >= MAX_PENDING_BYTES:
                self.conn.pause_reading("commit-bytes")

    def commit_finished(self, size: int = 0) -> None:
        self.pending_commits -= 1
        if self.pending_commits == RESUME_PENDING_COMMITS:
            self.conn.resume_reading("commits")
        if size:
            self.pending_bytes -= size
            if self.pending_bytes <= RESUME_PENDING_BYTES:
                self.conn.resume_reading("commit-bytes")  # a no-op unless paused for them
        if self.pending_commits == 0 and self.on_idle:
            waiting, self.on_idle = self.on_idle, []
            for cb in waiting:
                cb()

    def when_idle(self, cb: Callable[[], object]) -> None:
        if self.pending_commits == 0:
            cb()
        else:
            self.on_idle.append(cb)
