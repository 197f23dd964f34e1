"""The operator API: purge, move, retry, delete, remove a durable subscription, close a
connection, send, list and cancel scheduled messages. The management API (and through it
the CLI and the console) calls these and touches nothing else of the broker.

Every change is staged in the broker's write buffer and committed by the group committer
in a fenced transaction, exactly like a client's ACK or SEND: a deposed master's
operation fails with the rest of its batch and changes nothing. The broker's memory is
changed in the same loop iteration the write is staged, so no consumer is handed a
message the operator just removed. ``send`` goes through the clients' own SEND path
(``send.send``, ``receipts``), so an operator's message is numbered, checked, stored and
routed as a client's is.

In-flight messages (delivered to a consumer, not yet acknowledged) are left alone by
purge, move and retry: their consumer may be processing them, and its ACK or NACK will
settle them. The answer counts them (``in_flight_kept``), and deleting one such message
is a conflict. Messages whose SEND is still committing are not there yet either.

A failure is an ``OperationError`` whose ``kind`` says what went wrong, not how a
caller reports it (the management API maps kinds to HTTP statuses).
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypedDict

from amqlite.broker import destinations, routing
from amqlite.broker import send as send_path
from amqlite.broker.counters import Kind
from amqlite.broker.message import Message, checked_send, now_ms
from amqlite.broker.session import Client, Session
from amqlite.codec import Frame
from amqlite.validation import BrokerError, check_destination, is_temporary
from amqlite.wire import ORIGINAL_DESTINATION
from store.api import DeletedDestination, NewMessage, StoreError

if TYPE_CHECKING:
    from amqlite.broker.core import Broker
    from amqlite.broker.source import Source

#: Message ids acknowledged per batch by a purge: one batch a little larger than a
#: busy loop's own, so a purge of millions never holds the store lock for long.
PURGE_CHUNK = 5000
#: Messages copied per batch by a move or retry: they carry their bodies (up to
#: max_frame_size each), so fewer than a purge.
MOVE_CHUNK = 500
#: The receipt an operator's SEND asks for: its only way to learn the outcome.
OPERATOR_RECEIPT = "operator-send"
#: Scheduled messages listed at most by default (a console table's page).
SCHEDULED_PAGE = 50
#: Why a write failed without the store refusing its data: the node is demoting.
DEPOSED = "the store refused the write: this node is no longer master"


class ErrorKind(enum.Enum):
    """What kind of failure an ``OperationError`` is (the caller picks its answer)."""

    NOT_FOUND = "not found"  # no such destination, message, subscription, connection
    CONFLICT = "conflict"  # exists, but its state forbids it (consumers, in flight)
    BAD_REQUEST = "bad request"  # malformed or inapplicable arguments
    UNAVAILABLE = "unavailable"  # paused or deposed: try again (on the master)


class OperationError(Exception):
    """An operation that cannot be done; nothing of it was applied unless the message
    says what was (a delete's purge stays done when the final delete fails)."""

    def __init__(self, kind: ErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind


# -- answers: JSON-ready dicts, the management API returns them as they are --------------
class Purged(TypedDict):
    destination: str
    purged: int
    in_flight_kept: int


class DestinationDeleted(TypedDict):
    destination: str
    deleted: int  # always 1
    purged: int  # by the chunked purge first
    messages: int  # all removed, non-persistent ones in memory included
    subscriptions: int  # a topic's durable subscriptions removed with it


class MessageDeleted(TypedDict):
    destination: str
    deleted: int  # always 1
    id: int


class Moved(TypedDict):
    source: str
    moved: int
    in_flight_kept: int
    not_found: int
    target: str


class Retried(TypedDict):
    source: str
    moved: int
    in_flight_kept: int
    not_found: int
    targets: dict[str, int]  # original destination -> messages moved there
    skipped_no_original: int


class ConnectionClosed(TypedDict):
    closed: int  # always 1
    address: str


class DurableRemoved(TypedDict):
    removed: int  # always 1
    client_id: str
    name: str
    topic: str


class Sent(TypedDict):
    destination: str
    id: int
    message_id: str
    persistent: bool


class ScheduledList(TypedDict):
    scheduled: list[dict[str, Any]]  # ``StoreReads.scheduled``'s rows, earliest due first
    total: int  # scheduled messages (of the destination, when one was asked for)


class ScheduledCancelled(TypedDict):
    cancelled: int  # always 1
    id: int
    message_id: str
    destination: str


# -- what the operations need from their surroundings ----------------------------------
class StoreReads(Protocol):
    """Blocking reads of the store on a handle of its own (``amqlite.management.reads.
    StoreReader``): browsing must not queue behind the group committer."""

    def message(self, message_id: int) -> dict[str, Any] | None: ...

    def message_ids(self, destination_id: int, after_id: int, limit: int) -> list[int]: ...

    def full_rows(self, ids: list[int]) -> list[dict[str, Any]]: ...

    def scheduled(self, destination_id: int | None,
                  limit: int) -> tuple[list[dict[str, Any]], int]: ...


class Connection(Client, Protocol):
    """A client connection an operator may close: known by its address."""

    peer: str


def _no_connections() -> Iterable[Connection]:
    return ()


@dataclass
class _Tally:
    """What a move or retry did, chunk after chunk."""

    moved: int = 0
    skipped: int = 0  # retry: no usable original-destination
    kept: int = 0  # in flight
    missing: int = 0  # gone, or not a message of the source
    targets: dict[str, int] = field(default_factory=dict)


@dataclass
class Operations:
    """The verbs, on one broker. ``reader`` reads what a purge or move walks through;
    ``connections`` lists the STOMP server's sockets (those still logging in too)."""

    broker: Broker
    reader: StoreReads
    connections: Callable[[], Iterable[Connection]] = _no_connections

    # -- helpers -----------------------------------------------------------------------
    async def _commit(self, stored: Callable[[bool], None] | None = None) -> None:
        """Stage a commit point and wait for it: the changes staged before are durable
        (or the store refused them, which means the node is demoting). ``stored`` is
        called with the outcome first."""
        fut: asyncio.Future[bool] = self.broker.loop.create_future()

        def done(ok: bool) -> None:
            if stored is not None:
                stored(ok)
            if not fut.done():
                fut.set_result(ok)

        self.broker.writes.stage(done)
        if not await fut:
            raise OperationError(ErrorKind.UNAVAILABLE, DEPOSED)

    def _check_serving(self) -> None:
        if self.broker.paused:
            raise OperationError(ErrorKind.UNAVAILABLE,
                                 "the broker is paused (its lock is in doubt); try again")

    @staticmethod
    def _kind(name: str) -> str:
        """The destination's kind ("queue" or "topic"); BAD_REQUEST when malformed, or
        temporary (it belongs to its connection and is never stored)."""
        try:
            if is_temporary(name):
                raise BrokerError(f"{name[:60]!r} is a temporary destination: it belongs "
                                  "to its connection")
            return check_destination(name)
        except BrokerError as e:
            raise OperationError(ErrorKind.BAD_REQUEST, str(e)) from None

    def _queue(self, name: str) -> Source:
        """A known queue, or NOT_FOUND (BAD_REQUEST when the name is not a queue's)."""
        if self._kind(name) != "queue":
            raise OperationError(ErrorKind.BAD_REQUEST,
                                 f"{name} is a topic: this action is for queues")
        q = self.broker.queues.get(name)
        if self.broker.destination_rows.get(name) is None:
            if q is not None and len(q):
                return q  # memory-only messages, never stored
            raise OperationError(ErrorKind.NOT_FOUND, f"no destination {name}")
        # A stored queue nobody used lately is out of memory (Broker.queue_left): back.
        return q if q is not None else self.broker.queue(name)

    # -- purge -----------------------------------------------------------------------------
    async def purge(self, name: str) -> Purged:
        """Acknowledge every waiting message of queue ``name``, in chunks."""
        self._check_serving()
        q = self._queue(name)
        did = self.broker.destination_rows.get(name)
        purged = 0
        # What waits in memory goes at once (persistent ones are acked with the first chunk).
        in_memory = q.drop(lambda m: True)
        acks = [(None, m.id) for m in in_memory if m.persistent]
        purged += len(in_memory) - len(acks)  # memory-only: nothing to write
        count = self.broker.counters.add
        count(name, Kind.PURGED, purged)
        seen = {m.id for m in in_memory if m.persistent}
        after = 0
        while True:
            ids = [] if did is None else await asyncio.to_thread(
                self.reader.message_ids, did, after, PURGE_CHUNK)
            inflight = q.inflight_ids()
            chosen = [i for i in ids if i not in inflight and i not in seen]
            acks.extend((None, i) for i in chosen)
            if chosen:
                chosen_set = set(chosen)

                def paged_in(m: Message, c: set[int] = chosen_set) -> bool:
                    return m.id in c

                q.drop(paged_in)  # paged in while we read
            if acks:
                self.broker.writes.stage().acks.extend(acks)
                count(name, Kind.PURGED, len(acks))  # committed with the acks
                await self._commit()
                purged += len(acks)
                acks = []
            if len(ids) < PURGE_CHUNK:
                break
            after = ids[-1]
        kept = len(q.inflight_ids())
        q.dispatch()
        return {"destination": name, "purged": purged, "in_flight_kept": kept}

    # -- delete a destination --------------------------------------------------------------
    async def delete_destination(self, name: str) -> DestinationDeleted:
        """Remove a queue or a topic for good: from memory, and from the store in one
        fenced transaction (its row, its messages, a topic's durable subscriptions), so
        that a new master does not load it again. A CONFLICT while it has consumers,
        like a client's removal in ActiveMQ (AbstractRegion.removeDestination: "Destination
        still has an active subscription") and RabbitMQ's queue.delete with if-unused: an
        operator closes them first rather than leave consumers subscribed to nothing
        (which ActiveMQ's JMX removal does). A queue's waiting messages are purged in
        chunks first (``purge``), so the one transaction that removes the rest holds the
        store lock briefly whatever the backlog."""
        self._check_serving()
        broker = self.broker
        purged = 0
        if self._kind(name) == "queue":
            # Known in memory only (a subscriber came and went) is still listed: deletable.
            q = broker.queues.get(name)
            stored = broker.destination_rows.get(name) is not None
            if q is None and not stored:
                raise OperationError(ErrorKind.NOT_FOUND, f"no destination {name}")
            self._refuse_consumers(name)
            if stored or (q is not None and len(q)):
                purged = (await self.purge(name))["purged"]
        elif (broker.destination_rows.get(name) is None and name not in broker.topics
              and not broker.durables_by_topic.get(name)):
            raise OperationError(ErrorKind.NOT_FOUND, f"no destination {name}")
        # purge awaited its commits: check again what may have changed meanwhile.
        return await self._remove(name, purged)

    async def delete_idle(self, name: str) -> DestinationDeleted:
        """Remove a queue the inactive-destination GC (``amqlite.broker.inactive``) found
        empty in memory and in the store, as ``delete_destination`` removes one, minus
        the purge: there is nothing to purge."""
        if self._kind(name) != "queue":
            raise OperationError(ErrorKind.BAD_REQUEST, f"{name} is not a queue")
        return await self._remove(name, 0)

    async def _remove(self, name: str, purged: int) -> DestinationDeleted:
        """``delete_destination`` once purged: out of memory, then the store's delete."""
        broker = self.broker
        self._check_serving()
        self._refuse_consumers(name, purged)
        gone = destinations.forget_destination(broker, name)
        removed = DeletedDestination(existed=False)
        try:
            if gone.store_id is not None and broker.committer is not None:
                async with broker.scheduler.lock:  # no copy made for it meanwhile
                    removed = await broker.committer.call(
                        broker.committer.store.delete_destination, broker.epoch,
                        gone.store_id)
        except StoreError as e:
            raise OperationError(ErrorKind.UNAVAILABLE,
                                 f"the store refused to delete {name} ({e}); "
                                 f"{purged} messages were purged before") from None
        finally:
            destinations.settle_forgotten(broker, gone)
        return {"destination": name, "deleted": 1, "purged": purged,
                "messages": purged + removed.messages + gone.memory_only,
                "subscriptions": removed.subscriptions}

    def _refuse_consumers(self, name: str, purged: int = 0) -> None:
        broker = self.broker
        q = broker.queues.get(name)
        n = (len(q.consumers) if q is not None else 0) + len(broker.topics.get(name, [])) \
            + sum(len(d.consumers) for d in broker.durables_by_topic.get(name, []))
        if n:
            done = f" ({purged} messages were purged before it subscribed)" if purged else ""
            raise OperationError(ErrorKind.CONFLICT,
                                 f"{name} has {n} consumers; close them first{done}")

    # -- delete one message ----------------------------------------------------------------
    async def delete_message(self, message_id: int,
                             check: Callable[[str], None] | None = None) -> MessageDeleted:
        """Acknowledge one waiting queue message. ``check`` (the caller's permission
        check) is called with its destination before anything changes: the one read
        serves both."""
        self._check_serving()
        row = await asyncio.to_thread(self.reader.message, message_id)
        if row is None:
            raise OperationError(ErrorKind.NOT_FOUND, f"no message {message_id}")
        if check is not None:
            check(row["destination"])
        if row.get("deliver_at"):
            raise OperationError(ErrorKind.CONFLICT,
                                 f"message {message_id} is scheduled: cancel it instead")
        if row["kind"] != "queue":
            raise OperationError(ErrorKind.CONFLICT,
                                 f"message {message_id} belongs to topic "
                                 f"{row['destination']}: remove the durable subscription")
        q = self.broker.queue(row["destination"])
        if message_id in q.inflight_ids():
            raise OperationError(ErrorKind.CONFLICT,
                                 f"message {message_id} is in flight to a consumer; its "
                                 "ACK or NACK settles it")
        q.drop(lambda m: m.id == message_id)
        self.broker.writes.stage().acks.append((None, message_id))
        self.broker.counters.add(row["destination"], Kind.PURGED)  # removed by an operator
        await self._commit()
        return {"destination": row["destination"], "deleted": 1, "id": message_id}

    # -- move and retry --------------------------------------------------------------------
    async def move(self, source: str, target: str,
                   ids: Sequence[int] | None = None) -> Moved:
        """Copy messages of queue ``source`` to queue ``target`` with new ids and remove
        them from ``source``, in one fenced batch per chunk. ``ids`` None: every waiting
        message."""
        self._check_serving()
        q = self._queue(source)
        if self._kind(target) != "queue":
            raise OperationError(ErrorKind.BAD_REQUEST, f"cannot move to {target}: only to a queue")
        if target == source:
            raise OperationError(ErrorKind.BAD_REQUEST, "source and target are the same queue")
        tally = await self._move(q, source, target, ids)
        return {"source": source, "moved": tally.moved, "in_flight_kept": tally.kept,
                "not_found": tally.missing, "target": target}

    async def retry(self, source: str, ids: Sequence[int] | None = None) -> Retried:
        """``move`` each dead letter of ``source`` to its original-destination (the
        header is removed); one without a queue to go back to is skipped and counted."""
        self._check_serving()
        q = self._queue(source)
        tally = await self._move(q, source, None, ids)
        return {"source": source, "moved": tally.moved, "in_flight_kept": tally.kept,
                "not_found": tally.missing, "targets": tally.targets,
                "skipped_no_original": tally.skipped}

    async def _move(self, q: Source, source: str, target: str | None,
                    ids: Sequence[int] | None) -> _Tally:
        """Chunk after chunk; ``target`` None: a retry."""
        did = self.broker.destination_rows.get(source)
        tally = _Tally()
        after = 0
        pending_ids = list(ids) if ids is not None else None
        while True:
            if pending_ids is not None:
                chunk_ids, pending_ids = pending_ids[:MOVE_CHUNK], pending_ids[MOVE_CHUNK:]
            elif did is not None:
                chunk_ids = await asyncio.to_thread(self.reader.message_ids, did, after,
                                                    MOVE_CHUNK)
            else:
                chunk_ids = []
            if not chunk_ids:
                break
            rows = await asyncio.to_thread(self.reader.full_rows, chunk_ids)
            tally.missing += len(set(chunk_ids) - {r["id"] for r in rows})
            moved = tally.moved
            copies = self._stage_moves(q, source, did, rows, target, tally)
            if tally.moved > moved:
                await self._commit_moves(copies)
            if ids is None:
                if len(chunk_ids) < MOVE_CHUNK:
                    break
                after = chunk_ids[-1]
        q.dispatch()
        return tally

    def _stage_moves(self, q: Source, source: str, did: int | None,
                     rows: list[dict[str, Any]], target: str | None,
                     tally: _Tally) -> list[Message]:
        """Stage one chunk's copies and acks; the copies, to route once committed."""
        broker = self.broker
        inflight = q.inflight_ids()
        batch = broker.writes.stage()
        copies: list[Message] = []
        for r in rows:
            if r["destination_id"] != did:
                tally.missing += 1  # not a message of this queue
                continue
            if r["inflight"] or r["id"] in inflight:
                tally.kept += 1
                continue
            headers = dict(r["headers"])
            dest = target
            if target is None:
                dest = headers.pop(ORIGINAL_DESTINATION, None)
                try:
                    if (dest is None or is_temporary(dest) or check_destination(dest) != "queue"
                            or dest == source):
                        raise BrokerError("not a queue")
                except BrokerError:
                    tally.skipped += 1
                    continue
            assert dest is not None
            copy = Message(next(broker.ids), dest, r["message_id"], headers, r["body"],
                           r["priority"], r["expires_at"], True, enqueued_at=now_ms())
            batch.inserts.append(NewMessage(
                id=copy.id, destination_id=destinations.destination_id(broker, dest, batch),
                message_id=copy.message_id, headers=headers, body=copy.body,
                priority=copy.priority, expires_at=copy.expires_at,
                enqueued_at=copy.enqueued_at))
            batch.acks.append((None, r["id"]))
            broker.counters.add(source, Kind.MOVED)
            broker.counters.add(dest, Kind.ENQUEUED)
            broker.queue(dest).pending_inserts += 1  # no hand-over may overtake it
            copies.append(copy)
            tally.targets[dest] = tally.targets.get(dest, 0) + 1
            tally.moved += 1
        gone = {r["id"] for r in rows}
        q.drop(lambda m: m.id in gone and m.id not in inflight)
        return copies

    async def _commit_moves(self, copies: list[Message]) -> None:
        broker = self.broker

        def stored(ok: bool) -> None:
            for copy in copies:
                broker.queue(copy.destination).pending_inserts -= 1
                if ok:
                    routing.route_committed(broker, copy, [])

        await self._commit(stored)

    # -- connections and durable subscriptions ---------------------------------------------
    def close_connection(self, address: str, who: str | None) -> ConnectionClosed:
        """ERROR and close the connection from ``address``; as any disconnect, what it
        had not acknowledged is redelivered. ``who``: the administrator's login, named in
        the ERROR's body (None without logins: the message header says it all)."""
        conn = next((c for c in self.connections() if c.peer == address), None)
        if conn is None:
            raise OperationError(ErrorKind.NOT_FOUND, f"no connection from {address}")
        conn.close_with_error("connection closed by an administrator",
                              f"login {who}" if who else "")
        return {"closed": 1, "address": conn.peer}

    async def remove_durable(self, client_id: str, name: str,
                             check: Callable[[str], None] | None = None) -> DurableRemoved:
        """Remove a durable subscription with what it was owed, whichever login owns it.
        ``check`` (the caller's permission check) gets its topic before anything else."""
        durable = self.broker.durables.get((client_id, name))
        if durable is not None and check is not None:
            check(durable.topic)
        self._check_serving()
        durable = self.broker.durables.get((client_id, name))
        if durable is None:
            raise OperationError(ErrorKind.NOT_FOUND,
                                 f"no durable subscription {name!r} of client {client_id!r}")
        if durable.consumers:
            raise OperationError(ErrorKind.CONFLICT,
                                 f"durable subscription {name!r} of {client_id!r} is active: "
                                 "close its connection first")
        destinations.remove_durable(self.broker, durable)
        await self._commit()
        return {"removed": 1, "client_id": client_id, "name": name, "topic": durable.topic}

    # -- scheduled messages (amqlite.broker.scheduler) ------------------------------------
    async def scheduled(self, destination: str | None = None,
                        limit: int = SCHEDULED_PAGE) -> ScheduledList:
        """The scheduled messages, earliest due first (of ``destination`` only, if given:
        NOT_FOUND when it has no store row, so none)."""
        did = None
        if destination is not None:
            self._kind(destination)
            did = self.broker.destination_rows.get(destination)
            if did is None:
                raise OperationError(ErrorKind.NOT_FOUND, f"no destination {destination}")
        rows, total = await asyncio.to_thread(self.reader.scheduled, did, limit)
        return {"scheduled": rows, "total": total}

    async def cancel_scheduled(self, message_id: int,
                               check: Callable[[str], None] | None = None
                               ) -> ScheduledCancelled:
        """Remove a scheduled message before its next copy, in a fenced transaction that
        waits for a copy being made (``Scheduler.cancel``). ``check`` (the caller's
        permission check) gets its destination before anything changes."""
        self._check_serving()
        row = await asyncio.to_thread(self.reader.message, message_id)
        if row is None or not row.get("deliver_at"):
            raise OperationError(ErrorKind.NOT_FOUND, f"no scheduled message {message_id}")
        if check is not None:
            check(row["destination"])
        try:
            removed = await self.broker.scheduler.cancel(message_id)
        except StoreError as e:
            raise OperationError(ErrorKind.UNAVAILABLE, f"{DEPOSED} ({e})") from None
        if not removed:
            raise OperationError(ErrorKind.NOT_FOUND, f"scheduled message {message_id} is "
                                 "no longer scheduled (its last copy was delivered)")
        return {"cancelled": 1, "id": message_id, "message_id": row["message_id"],
                "destination": row["destination"]}

    # -- send ------------------------------------------------------------------------------
    async def send(self, destination: str, body: bytes,
                   headers: Mapping[str, str] | None = None,
                   persistent: bool = True) -> Sent:
        """SEND one message as a client would (checked like a SEND frame, numbered,
        stored, routed); returns once it is durable (a persistent one) or routed.
        ``persistent`` decides, not a ``persistent`` header: absent, as most clients
        send it, or ``false`` as a client says it."""
        self._check_serving()
        self._kind(destination)  # a temporary one is a connection's, never an operator's
        fields = {k: v for k, v in (headers or {}).items() if k != "persistent"}
        fields["destination"] = destination
        if not persistent:
            fields["persistent"] = "false"
        frame = Frame("SEND", fields, body)
        self._check_limits(frame)
        try:
            message = checked_send(frame)
        except BrokerError as e:
            raise OperationError(ErrorKind.BAD_REQUEST, str(e)) from None
        outcome: asyncio.Future[None] = self.broker.loop.create_future()
        client = _OperatorClient(outcome)
        session = Session(client)
        try:
            try:
                send_path.send(self.broker, session, [message], OPERATOR_RECEIPT)
            except BrokerError as e:  # a policy refused it (a full queue: reject-publish)
                raise OperationError(ErrorKind.CONFLICT, str(e)) from None
            # Idle once the write's outcome is in: by the next loop step the RECEIPT
            # or the ERROR has come, or neither (the store failed: the node demotes).
            session.when_idle(lambda: self.broker.loop.call_soon(_unanswered, outcome))
            await outcome
        finally:
            self.broker.memory.forget(client)  # a flow-control pause means nothing here
        return {"destination": destination, "id": message.id,
                "message_id": message.message_id, "persistent": message.persistent}

    def _check_limits(self, frame: Frame) -> None:
        """The limits a client's frame meets on the wire (``amqlite.codec.Limits``)."""
        s = self.broker.settings
        lines = [f"{k}:{v}" for k, v in frame.headers.items()]
        size = len(frame.body) + sum(len(line) + 1 for line in lines)
        if size > s.max_frame_size:
            raise OperationError(ErrorKind.BAD_REQUEST,
                                 f"a message of {size} bytes: at most {s.max_frame_size}")
        if len(lines) > s.max_header_count:
            raise OperationError(ErrorKind.BAD_REQUEST,
                                 f"{len(lines)} headers: at most {s.max_header_count}")
        longest = max(lines, key=len)
        if len(longest) > s.max_header_length:
            raise OperationError(ErrorKind.BAD_REQUEST,
                                 f"a header of {len(longest)} characters: at most "
                                 f"{s.max_header_length}")


def _unanswered(outcome: asyncio.Future[None]) -> None:
    if not outcome.done():
        outcome.set_exception(OperationError(ErrorKind.UNAVAILABLE, DEPOSED))


class _OperatorClient:
    """The broker's client seam (``Client``) for one operator SEND: its RECEIPT or its
    ERROR (the store refused the message's data) settles ``outcome``. It subscribes to
    nothing, so no MESSAGE is ever written to it."""

    version = "1.2"

    def __init__(self, outcome: asyncio.Future[None]) -> None:
        self.client_id: str | None = None
        self.login: str | None = None
        self.closed = False
        self.outcome = outcome

    def write_frame(self, frame: Frame) -> None:
        pass

    def write_message(self, head: str, body: bytes) -> None:
        pass

    def write_receipt(self, receipt: str) -> None:
        if not self.outcome.done():
            self.outcome.set_result(None)

    def can_write(self) -> bool:
        return True

    def close_with_error(self, message: str, detail: str = "",
                         receipt: str | None = None) -> None:
        self.closed = True
        if not self.outcome.done():
            self.outcome.set_exception(OperationError(
                ErrorKind.BAD_REQUEST, f"{message}: {detail}" if detail else message))

    def close(self) -> None:
        self.closed = True

    def pause_reading(self, reason: str) -> None:
        pass

    def resume_reading(self, reason: str) -> None:
        pass
