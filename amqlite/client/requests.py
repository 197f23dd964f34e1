"""Request bookkeeping: sends waiting for their RECEIPT, other requests (ACK, SUBSCRIBE,
COMMIT, ...) waiting for theirs, and open transactions, with what happens to each of them
when the connection is replayed, interrupted or shut down.

No I/O of its own: the client hands it the connection to replay on."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from amqlite.client.connection import Connection
from amqlite.client.errors import TransactionOutcomeUnknownError, TransactionRolledBackError
from amqlite.client.messages import Message, SendResult, Subscription
from amqlite.codec import Frame

__all__ = ["Control", "PendingSend", "RequestBook", "Transaction"]


@dataclass(eq=False, slots=True)
class PendingSend:
    """A SEND not yet settled: kept until its RECEIPT so it can be written again."""

    receipt: str | None
    frame: Frame
    future: asyncio.Future[SendResult]
    result: SendResult
    persistent: bool
    size: int  # bytes counted against maxCacheSize (tracked non-persistent sends), else 0
    written_gen: int = 0  # generation it was last written on; 0: never written

    @property
    def needs_receipt(self) -> bool:
        return self.receipt is not None

    @property
    def ever_written(self) -> bool:
        """Written on some connection (generations count from 1)."""
        return self.written_gen > 0


@dataclass(eq=False, slots=True)
class Control:
    """A request other than SEND whose RECEIPT somebody waits for."""

    kind: str  # ack, nack, subscribe, unsubscribe, commit, abort, disconnect
    frame: Frame
    future: asyncio.Future[bool]
    replay: bool = False  # written again after a reconnect (durable removal)
    message: Message | None = None
    subscription: Subscription | None = None
    transaction: Transaction | None = None


@dataclass(eq=False, slots=True)
class Transaction:
    """An open transaction, its frames kept in order for a replay after a reconnect."""

    id: str
    frames: list[Frame] = field(default_factory=list)  # SEND/ACK/NACK frames, in order
    has_acks: bool = False
    broken: bool = False
    end: Control | None = None  # the COMMIT/ABORT in flight
    end_written: bool = False


class RequestBook:
    """Every request of one client that still waits for the broker."""

    def __init__(self) -> None:
        self.sends: dict[str, PendingSend] = {}  # by receipt (or a local key), seq order
        #: Bytes of tracked non-persistent sends (trackMessages, bounded by maxCacheSize).
        self.tracked_bytes = 0
        self.controls: dict[str, Control] = {}
        self.txs: dict[str, Transaction] = {}

    # -- sends ------------------------------------------------------------------------

    def forget_send(self, key: str) -> PendingSend | None:
        """Drop the send under ``key``; return it (None if it was not there)."""
        pending = self.sends.pop(key, None)
        if pending is not None and not pending.persistent and pending.needs_receipt:
            self.tracked_bytes -= pending.size
        return pending

    def evict_tracked(self, max_cache_size: int) -> None:
        """trackMessages: keep at most maxCacheSize bytes of non-persistent sends."""
        if self.tracked_bytes <= max_cache_size:
            return
        for key, pending in list(self.sends.items()):
            if self.tracked_bytes <= max_cache_size:
                break
            if not pending.persistent and pending.ever_written:
                self.forget_send(key)

    # -- transactions -----------------------------------------------------------------

    def transaction(self, tx_id: str) -> Transaction:
        try:
            return self.txs[tx_id]
        except KeyError:
            raise ValueError(f"no open transaction {tx_id!r}") from None

    @staticmethod
    def write_tx_end(conn: Connection, tx: Transaction) -> None:
        assert tx.end is not None
        try:
            conn.write(tx.end.frame)
            tx.end_written = True
        except ConnectionError:
            pass

    # -- connection events ------------------------------------------------------------

    def replay(self, conn: Connection) -> None:
        """On a new connection: controls that must be retried (durable removal) and the
        open transactions (BEGIN, their frames, a pending COMMIT/ABORT). A lost connection
        raises ConnectionError out of here."""
        for control in list(self.controls.values()):
            if control.replay and control.transaction is None:
                conn.write(control.frame)
        for tx in list(self.txs.values()):
            if tx.broken:
                continue
            conn.write(Frame("BEGIN", {"transaction": tx.id}))
            for frame in tx.frames:
                conn.write(frame)
            if tx.end is not None:
                self.write_tx_end(conn, tx)

    def interrupted(self, text: str, unconfirmed: Callable[[Message, str], None]) -> None:
        """The connection is gone: an unreplayable request is answered (acks reported
        to ``unconfirmed``), a transaction holding acks is broken."""
        for receipt, control in list(self.controls.items()):
            if control.transaction is not None:
                continue  # settled with its transaction below
            if control.replay:
                continue
            del self.controls[receipt]
            if control.message is not None:
                unconfirmed(control.message, f"connection lost before its RECEIPT ({text})")
            if not control.future.done():
                control.future.set_result(False)
        for tx in list(self.txs.values()):
            if not tx.has_acks:
                continue
            tx.broken = True
            if tx.end is not None:
                self.controls.pop(tx.end.frame.headers["receipt"], None)
                self.txs.pop(tx.id, None)
                if tx.end.kind == "abort":
                    tx.end.future.set_result(True)  # the broker dropped it anyway
                elif tx.end_written:
                    tx.end.future.set_exception(TransactionOutcomeUnknownError(
                        f"transaction {tx.id}: connection lost after COMMIT, before its "
                        "RECEIPT; it held acks so it cannot be replayed"))
                else:
                    tx.end.future.set_exception(TransactionRolledBackError(
                        f"transaction {tx.id} was rolled back: connection lost ({text})"))
        for tx in self.txs.values():
            tx.end_written = False

    def fail_all(self, exc: BaseException) -> None:
        """The client is closed for good: every waiting send and request ends (an ack
        with False, the rest with ``exc``)."""
        for pending in self.sends.values():
            if not pending.future.done():
                pending.future.set_exception(exc)
                pending.future.exception()
        self.sends.clear()
        for control in self.controls.values():
            if not control.future.done():
                if control.message is not None:
                    control.future.set_result(False)
                else:
                    control.future.set_exception(exc)
                    control.future.exception()
        self.controls.clear()
