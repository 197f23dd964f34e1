"""``AsyncClient``: the coroutine API (send, subscribe, ack, transactions, disconnect) and
what the broker's frames and the connection's events mean for the requests waiting on
them. Connections and failover are its base class's (``failover.FailoverSupervisor``)."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import logging
import random
import ssl
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from amqlite.client.connection import Connection
from amqlite.client.discovery import Resolver, find_resolver
from amqlite.client.errors import (
    AckNotConfirmedError,
    BrokerRefusedError,
    ClientClosedError,
    ClientError,
    ConnectionFailedError,
    FailoverTimeoutError,
    SendTimeoutError,
    TransactionRolledBackError,
)
from amqlite.client.failover import ClientState, FailoverSupervisor
from amqlite.client.messages import (
    PRODUCER_ID_HEADER,
    PRODUCER_SEQ_HEADER,
    Message,
    SendResult,
    Subscription,
    stomp_destination,
)
from amqlite.client.requests import Control, PendingSend, RequestBook, Transaction
from amqlite.client.uri import BrokerURL, parse_broker_url
from amqlite.codec import Frame, ProtocolError, encode_frame
from amqlite.tls import ClientTls
from amqlite.wire import ACK_AUTO, ACK_MODES, STOMP_1_2

__all__ = ["DISCONNECT_TIMEOUT_S", "AsyncClient"]

log = logging.getLogger(__name__)

#: How long ``disconnect()`` waits for the broker's RECEIPT of DISCONNECT (it comes after
#: the broker finished the commits in flight, so this is a flush, not a formality).
DISCONNECT_TIMEOUT_S = 5.0


class AsyncClient(FailoverSupervisor):
    """A STOMP client with failover; all methods are coroutines on one event loop.

    ``broker_url``: see :mod:`amqlite.client.uri`. ``client_id`` is sent in CONNECT
    (needed for durable subscriptions; the broker lets a newer connection with the same
    client-id replace an older one, which is what a reconnect needs). ``producer_id``
    defaults to a fresh uuid; a fixed one must come with a ``first_seq`` above anything it
    sent before, or the broker's dedup window drops the new messages as duplicates.
    ``resolver`` overrides the registered discovery resolver for ``discovery:`` URLs.
    ``tls`` (``amqlite.tls.ClientTls`` or an ``ssl.SSLContext``) is used for ``ssl://``
    URIs: CA file, client certificate, hostname check (on by default); without it the
    system trust store is used.
    """

    def __init__(
        self,
        broker_url: str | BrokerURL,
        *,
        login: str | None = None,
        passcode: str | None = None,
        client_id: str | None = None,
        producer_id: str | None = None,
        first_seq: int = 1,
        listener: object | None = None,
        resolver: Resolver | None = None,
        connect_headers: Mapping[str, str] | None = None,
        rng: random.Random | None = None,
        tls: ClientTls | ssl.SSLContext | None = None,
    ) -> None:
        headers = dict(connect_headers or {})
        if client_id:
            headers["client-id"] = client_id
        super().__init__(
            parse_broker_url(broker_url) if isinstance(broker_url, str) else broker_url,
            login=login, passcode=passcode, connect_headers=headers, resolver=resolver,
            rng=rng, tls=tls,
        )
        self.client_id = client_id
        self.producer_id = producer_id or uuid.uuid4().hex
        if first_seq < 1:
            raise ValueError(f"first_seq must be >= 1, got {first_seq}")
        self.listener = listener
        self._seq = itertools.count(first_seq)
        #: Numbers for non-persistent sends: local only, never sent to the broker.
        self._local_seq = itertools.count(1)
        self._ids = itertools.count(1)
        self._requests = RequestBook()
        self._subs: dict[str, Subscription] = {}
        self._user_tasks: set[asyncio.Task[Any]] = set()
        #: Messages whose ACK/NACK was not confirmed (they may come again, redelivered).
        self.unconfirmed_acks: list[Message] = []
        #: SEND frames written again after a reconnect (same identity).
        self.resent = 0

    # -- public state ----------------------------------------------------------------

    @property
    def pending_sends(self) -> int:
        """Sends still waiting for their RECEIPT (or for a connection)."""
        return len(self._requests.sends)

    async def connect(self) -> None:
        """Connect (trying per ``startupMaxReconnectAttempts``) and start failing over.

        Raises ConnectionFailedError when the startup attempts are exhausted.
        """
        if self.closed:
            raise ClientClosedError("client is closed")
        if self.state is not ClientState.NEW:
            raise ClientError("connect() was already called")
        if self.url.kind == "discovery" and self.resolver is None:
            assert self.url.discovery is not None
            if find_resolver(self.url.discovery) is None:
                raise ConnectionFailedError(
                    f"{self.url.text}: no discovery resolver registered for "
                    f"{self.url.discovery!r} (amqlite.client.register_discovery_resolver)"
                )
        await self._start()

    async def disconnect(self, timeout: float = DISCONNECT_TIMEOUT_S) -> None:
        """DISCONNECT with a RECEIPT (a flush), then close everything. Idempotent."""
        if self.closed:
            return
        conn = self._live
        self.state = ClientState.CLOSING
        self._closing.set()
        if conn is not None:
            receipt = self._next_id("d")
            future = asyncio.get_running_loop().create_future()
            frame = Frame("DISCONNECT", {"receipt": receipt})
            self._requests.controls[receipt] = Control("disconnect", frame, future)
            with contextlib.suppress(ConnectionError, ProtocolError):
                conn.write(frame)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(timeout):
                        await asyncio.wait([future, conn.lost], return_when="FIRST_COMPLETED")
        self._shutdown(ClientClosedError("client disconnected"))
        await self._stop()

    async def __aenter__(self) -> AsyncClient:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.disconnect()

    # -- sending ---------------------------------------------------------------------

    async def send(
        self,
        destination: str,
        body: bytes | str = b"",
        headers: Mapping[str, str] | None = None,
        *,
        persistent: bool = True,
        transaction: str | None = None,
        content_type: str | None = None,
    ) -> SendResult:
        """Send one message; for a persistent one, return once the broker committed it.

        Non-persistent sends return once written (ActiveMQ's async send). In a
        transaction, the send is recorded and confirmed by ``commit()``.
        """
        self._check_open()
        dest = stomp_destination(destination)
        # Only persistent sends are numbered: the store keeps a trace of every
        # numbered send, so the audit can tell a hole in the sequence from a
        # message that was never meant to be stored.
        seq = next(self._seq) if persistent else next(self._local_seq)
        frame_headers = {"destination": dest, **dict(headers or {})}
        data = body.encode("utf-8") if isinstance(body, str) else bytes(body)
        if content_type is not None:
            frame_headers["content-type"] = content_type
        elif isinstance(body, str) and "content-type" not in frame_headers:
            frame_headers["content-type"] = "text/plain;charset=utf-8"
        frame_headers["persistent"] = "true" if persistent else "false"
        if persistent:
            frame_headers[PRODUCER_ID_HEADER] = self.producer_id
            frame_headers[PRODUCER_SEQ_HEADER] = str(seq)
        try:  # fail now, not at the replay after a reconnect
            encode_frame(Frame("SEND", frame_headers), STOMP_1_2)
        except ProtocolError as exc:
            raise ValueError(f"cannot send these headers: {exc}") from None
        if transaction is not None:
            return self._send_in_transaction(transaction, Frame("SEND", frame_headers, data), seq)
        wants_receipt = persistent or self.options.track_messages
        receipt = f"s-{seq}-{self._next_id('')}" if wants_receipt else None
        if receipt is not None:
            frame_headers["receipt"] = receipt
        frame = Frame("SEND", frame_headers, data)
        future: asyncio.Future[SendResult] = asyncio.get_running_loop().create_future()
        result = SendResult(self.producer_id, seq, dest, receipt)
        # Only tracked non-persistent sends count against maxCacheSize: size the rest 0.
        tracked = not persistent and receipt is not None
        size = len(data) + sum(len(k) + len(v) + 2 for k, v in frame_headers.items()) \
            if tracked else 0
        pending = PendingSend(receipt, frame, future, result, persistent, size)
        key = receipt or f"n-{seq}"
        self._requests.sends[key] = pending
        if tracked:
            self._requests.tracked_bytes += size
            self._requests.evict_tracked(self.options.max_cache_size)
        self._write_send(key, pending)
        timeout_s = self._timeout_s()
        try:
            async with asyncio.timeout(timeout_s):
                outcome = await asyncio.shield(future)
        except TimeoutError:
            if future.done() and not future.cancelled() and future.exception() is None:
                return future.result()
            if not pending.ever_written:
                self._requests.forget_send(key)
                raise SendTimeoutError(
                    f"send to {dest} failed: no broker connection within "
                    f"{self.options.timeout} ms (failover timeout); not sent",
                    result.identity, written=False,
                ) from None
            raise SendTimeoutError(
                f"send to {dest}: no RECEIPT within {self.options.timeout} ms (failover "
                f"timeout); it stays queued and is re-sent with identity "
                f"{self.producer_id}:{seq} after a reconnect",
                result.identity, written=True,
            ) from None
        except asyncio.CancelledError:
            if not pending.ever_written:
                self._requests.forget_send(key)
            raise
        conn = self._conn
        if conn is not None:
            await conn.drain()
        return outcome

    def _send_in_transaction(self, tx_id: str, frame: Frame, seq: int) -> SendResult:
        tx = self._requests.transaction(tx_id)
        frame.headers["transaction"] = tx_id
        tx.frames.append(frame)
        if not tx.broken:
            self._write_quietly(frame)
        return SendResult(self.producer_id, seq, frame.headers["destination"], None)

    def _write_send(self, key: str, pending: PendingSend) -> None:
        conn = self._live
        if conn is None:
            return  # written by _activate after the reconnect
        try:
            conn.write(pending.frame)
        except ConnectionError:
            return  # the supervisor is about to notice; _activate re-sends it
        except ProtocolError as exc:
            self._requests.forget_send(key)
            if not pending.future.done():
                pending.future.set_exception(ValueError(f"cannot send this frame: {exc}"))
            return
        if pending.ever_written:
            self.resent += 1
        pending.written_gen = self._generation
        if not pending.needs_receipt:
            self._requests.forget_send(key)
        if not pending.persistent and not pending.future.done():
            pending.future.set_result(pending.result)

    # -- subscriptions ---------------------------------------------------------------

    async def subscribe(
        self,
        destination: str,
        *,
        ack: str = ACK_AUTO,
        id: str | None = None,
        durable_name: str | None = None,
        prefetch: int | None = None,
        headers: Mapping[str, str] | None = None,
        callback: Callable[[Message], Any] | None = None,
    ) -> Subscription:
        """Subscribe and wait until the broker confirmed it (RECEIPT).

        ``durable_name`` makes a durable topic subscription (needs ``client_id``).
        ``callback`` receives every message on the event loop instead of the queue.
        """
        self._check_open()
        if ack not in ACK_MODES:
            *first, last = ACK_MODES
            raise ValueError(f"ack mode {ack!r}: use {', '.join(first)} or {last}")
        dest = stomp_destination(destination)
        sub_id = id or self._next_id("sub")
        if sub_id in self._subs:
            raise ValueError(f"subscription id {sub_id!r} is already in use")
        sub_headers = {"destination": dest, "id": sub_id, "ack": ack, **dict(headers or {})}
        if durable_name:
            if not self.client_id:
                raise ValueError("a durable subscription needs client_id")
            sub_headers["activemq.subscriptionName"] = durable_name
        if prefetch is not None:
            sub_headers["activemq.prefetchSize"] = str(prefetch)
        sub = Subscription(self, sub_id, dest, ack, sub_headers, callback)
        sub._active = asyncio.get_running_loop().create_future()
        self._subs[sub_id] = sub
        conn = self._live
        if conn is not None:
            self._write_subscribe(conn, sub)
        try:
            async with asyncio.timeout(self._timeout_s()):
                await asyncio.shield(sub._active)
        except TimeoutError:
            self._subs.pop(sub_id, None)
            sub._close()
            raise FailoverTimeoutError(
                f"subscribe to {dest}: not confirmed within {self.options.timeout} ms"
            ) from None
        except BaseException:
            self._subs.pop(sub_id, None)
            sub._close()
            raise
        return sub

    def _write_subscribe(self, conn: Connection, sub: Subscription) -> None:
        receipt = self._next_id("sub-r")
        frame = Frame("SUBSCRIBE", {**sub.headers, "receipt": receipt})
        future = asyncio.get_running_loop().create_future()
        self._requests.controls[receipt] = Control(
            "subscribe", frame, future, subscription=sub
        )
        try:
            conn.write(frame)
        except ConnectionError:
            self._requests.controls.pop(receipt, None)

    async def unsubscribe(self, subscription: Subscription, *, remove_durable: bool = False
                          ) -> None:
        """Stop a subscription; ``remove_durable`` also deletes the durable subscription
        on the broker (retried after a reconnect until confirmed)."""
        self._check_open()
        self._subs.pop(subscription.id, None)
        subscription._close()
        headers = {"id": subscription.id}
        if remove_durable and subscription.durable_name:
            headers["activemq.subscriptionName"] = subscription.durable_name
        replay = "activemq.subscriptionName" in headers
        conn = self._live
        if not replay and conn is None:
            return  # the next connection will simply not have it
        receipt = self._next_id("unsub")
        frame = Frame("UNSUBSCRIBE", {**headers, "receipt": receipt})
        control = Control(
            "unsubscribe", frame, asyncio.get_running_loop().create_future(), replay=replay,
        )
        self._requests.controls[receipt] = control
        if conn is not None:
            self._write_control(conn, control)
        async with asyncio.timeout(self._timeout_s()):
            await asyncio.shield(control.future)

    # -- acknowledgements ------------------------------------------------------------

    async def ack(self, message: Message, *, transaction: str | None = None) -> bool:
        """ACK and wait for the broker's confirmation. False: not confirmed (reported in
        ``unconfirmed_acks`` and to the listener); it may come again, flagged redelivered."""
        return await self._acknowledge("ACK", message, transaction)

    async def nack(self, message: Message, *, transaction: str | None = None) -> bool:
        """NACK (redeliver or dead-letter); False when not confirmed, as for ack()."""
        return await self._acknowledge("NACK", message, transaction)

    async def _acknowledge(self, command: str, message: Message, tx_id: str | None) -> bool:
        self._check_open()
        if message.subscription.ack == ACK_AUTO:
            raise ValueError(f"{message.subscription} uses ack=auto: nothing to acknowledge")
        conn = self._live
        if message.generation != self._generation or conn is None:
            self._unconfirmed(message, "the connection that delivered it is gone")
            return False
        headers = self._ack_headers(conn, message)
        if tx_id is not None:
            tx = self._requests.transaction(tx_id)
            headers["transaction"] = tx_id
            frame = Frame(command, headers)
            tx.frames.append(frame)
            tx.has_acks = True
            if not tx.broken:
                self._write_quietly(frame)
            return True
        receipt = self._next_id("ack")
        headers["receipt"] = receipt
        control = Control(
            command.lower(), Frame(command, headers), asyncio.get_running_loop().create_future(),
            message=message,
        )
        self._requests.controls[receipt] = control
        self._write_control(conn, control)
        return await asyncio.shield(control.future)

    @staticmethod
    def _ack_headers(conn: Connection, message: Message) -> dict[str, str]:
        if conn.protocol.version == STOMP_1_2:
            return {"id": message.ack_id}
        return {"message-id": message.message_id, "subscription": message.subscription.id}

    def _unconfirmed(self, message: Message, reason: str) -> None:
        self.unconfirmed_acks.append(message)
        self._notify("on_exception", AckNotConfirmedError(message, reason))

    # -- transactions ----------------------------------------------------------------

    async def begin(self, transaction: str | None = None) -> str:
        """Start a transaction; returns its id for send/ack/commit/abort."""
        self._check_open()
        tx_id = transaction or self._next_id("tx")
        if tx_id in self._requests.txs:
            raise ValueError(f"transaction {tx_id!r} is already open")
        self._requests.txs[tx_id] = Transaction(tx_id)
        self._write_quietly(Frame("BEGIN", {"transaction": tx_id}))
        return tx_id

    async def commit(self, transaction: str) -> None:
        """Commit and wait for the broker's RECEIPT. A transaction of sends only survives
        a failover (it is replayed with the same identities); one with acks raises
        TransactionRolledBackError (or ...OutcomeUnknownError) if its connection dropped."""
        await self._end_transaction("COMMIT", transaction)

    async def abort(self, transaction: str) -> None:
        """Roll back; after a failover there is nothing left to roll back on the broker."""
        await self._end_transaction("ABORT", transaction)

    async def _end_transaction(self, command: str, tx_id: str) -> None:
        self._check_open()
        tx = self._requests.transaction(tx_id)
        if tx.end is not None:
            raise ValueError(f"transaction {tx_id!r} is already ending")
        if tx.broken:
            del self._requests.txs[tx_id]
            if command == "ABORT":
                return
            raise TransactionRolledBackError(
                f"transaction {tx_id} was rolled back: its connection dropped and it held "
                "acks, which cannot be replayed"
            )
        receipt = self._next_id(command.lower())
        control = Control(
            command.lower(), Frame(command, {"transaction": tx_id, "receipt": receipt}),
            asyncio.get_running_loop().create_future(), replay=True,
            transaction=tx,
        )
        tx.end = control
        self._requests.controls[receipt] = control
        conn = self._live
        if conn is not None:
            self._requests.write_tx_end(conn, tx)
        try:
            async with asyncio.timeout(self._timeout_s()):
                await asyncio.shield(control.future)
        finally:
            if control.future.done():
                self._requests.txs.pop(tx_id, None)

    # -- helpers ---------------------------------------------------------------------

    def _check_open(self) -> None:
        if self.failure is not None:
            raise ClientClosedError(f"client failed: {self.failure}") from self.failure
        if self.closed:
            raise ClientClosedError("client is closed")
        if self.state is ClientState.NEW:
            raise ClientError("call connect() first")

    def _timeout_s(self) -> float | None:
        return self.options.timeout / 1000 if self.options.timeout > 0 else None

    def _next_id(self, prefix: str) -> str:
        return f"{prefix}-{next(self._ids)}" if prefix else str(next(self._ids))

    def _write_quietly(self, frame: Frame) -> None:
        """Write if connected; otherwise the reconnect restores it (transactions)."""
        conn = self._live
        if conn is not None:
            with contextlib.suppress(ConnectionError):
                conn.write(frame)

    def _write_control(self, conn: Connection, control: Control) -> None:
        with contextlib.suppress(ConnectionError):  # else settled by _interrupted
            conn.write(control.frame)

    def _call_user(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run an application callback on the loop without letting it hurt the transport."""
        try:
            result = fn(*args)
            if inspect.isawaitable(result):
                task = asyncio.ensure_future(result)
                self._user_tasks.add(task)
                task.add_done_callback(self._user_task_done)
        except Exception:
            log.exception("callback %r failed", fn)

    def _user_task_done(self, task: asyncio.Task[Any]) -> None:
        self._user_tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("callback task failed", exc_info=task.exception())

    def _notify(self, name: str, *args: Any) -> None:
        method = getattr(self.listener, name, None) if self.listener is not None else None
        if callable(method):
            self._call_user(method, *args)

    # -- frames from the broker ------------------------------------------------------

    def _on_frame(self, conn: Connection, frame: Frame) -> None:
        if conn is not self._conn:
            return  # a late frame of a connection we already left
        self._notify("on_command", frame)
        command = frame.command
        if command == "MESSAGE":
            sub = self._subs.get(frame.headers.get("subscription", ""))
            if sub is None:
                log.debug("MESSAGE for unknown subscription %r", frame.headers.get("subscription"))
            else:
                sub._deliver(Message(frame, sub, self._generation))
        elif command == "RECEIPT":
            self._on_receipt(frame.headers.get("receipt-id", ""))
        elif command == "ERROR":
            self._on_error(conn, frame)
        if command in ("MESSAGE", "RECEIPT"):
            self._cluster_update(frame)

    def _on_receipt(self, receipt: str) -> None:
        pending = self._requests.forget_send(receipt)
        if pending is not None:
            if not pending.future.done():
                pending.future.set_result(pending.result)
            return
        control = self._requests.controls.pop(receipt, None)
        if control is None:
            return
        if control.kind == "subscribe" and control.subscription is not None:
            active = control.subscription._active
            if active is not None and not active.done():
                active.set_result(None)
        if not control.future.done():
            control.future.set_result(True)

    def _on_error(self, conn: Connection, frame: Frame) -> None:
        """ERROR: the broker closes the connection after it. A request it names was
        refused (not retried); everything else is resent after the reconnect."""
        log.warning(
            "ERROR from %s: %s %s", conn.uri, frame.headers.get("message", ""),
            frame.body.decode("utf-8", "replace").strip()[:200],
        )
        receipt = frame.headers.get("receipt-id")
        if not receipt:
            return
        error = BrokerRefusedError(frame)
        pending = self._requests.forget_send(receipt)
        if pending is not None:
            if not pending.future.done():
                pending.future.set_exception(error)
            return
        control = self._requests.controls.pop(receipt, None)
        if control is None:
            return
        if control.kind == "subscribe" and control.subscription is not None:
            sub = control.subscription
            self._subs.pop(sub.id, None)
            sub._close()
            if sub._active is not None and not sub._active.done():
                sub._active.set_exception(error)
        if control.transaction is not None:
            self._requests.txs.pop(control.transaction.id, None)
        if control.message is not None:
            self._unconfirmed(control.message, str(error))
            if not control.future.done():
                control.future.set_result(False)
        elif not control.future.done():
            control.future.set_exception(error)

    # -- connection events (FailoverSupervisor) -------------------------------------

    def _restore(self, conn: Connection) -> None:
        for sub in list(self._subs.values()):
            self._write_subscribe(conn, sub)
        self._requests.replay(conn)

    def _resend(self) -> None:
        # Every send without RECEIPT, in sequence order: re-sends (same identity) first,
        # then what waited for this connection.
        for key, pending in list(self._requests.sends.items()):
            if pending.written_gen != self._generation:
                self._write_send(key, pending)

    def _settle_interrupted(self, generation: int, text: str) -> None:
        self._requests.interrupted(text, self._unconfirmed)
        for sub in self._subs.values():
            if sub.ack != ACK_AUTO:
                sub._drop_undelivered(generation)

    def _fail_pending(self, exc: BaseException) -> None:
        self._requests.fail_all(exc)
        for sub in self._subs.values():
            if sub._active is not None and not sub._active.done():
                sub._active.set_exception(exc)
                sub._active.exception()
            sub._close()
