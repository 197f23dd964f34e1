"""Operator actions: purge, move, retry dead letters, delete, close, unsubscribe.

Every change is staged in the broker's write buffer and committed by the group committer
in a fenced transaction, exactly like a client's ACK or SEND: a deposed master's action
fails with the rest of its batch and changes nothing. The broker's memory is changed in
the same loop iteration the write is staged, so no consumer is handed a message the
operator just removed.

In-flight messages (delivered to a consumer, not yet acknowledged) are left alone by
purge, move and retry: their consumer may be processing them, and its ACK or NACK will
settle them. The answer counts them (``in_flight_kept``), and deleting one such message
is refused with 409. Messages whose SEND is still committing are not there yet either.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from amqlite.broker import Message, now_ms
from amqlite.management.reads import StoreReader
from amqlite.validation import BrokerError, check_destination
from store.api import DeletedDestination, NewMessage, StoreError

if TYPE_CHECKING:
    from amqlite.broker import Broker, Source

log = logging.getLogger("amqlite.management")

#: Message ids acknowledged per batch by a purge: one batch a little larger than a
#: busy loop's own, so a purge of millions never holds the store lock for long.
PURGE_CHUNK = 5000
#: Messages copied per batch by a move or retry: they carry their bodies (up to
#: max_frame_size each), so fewer than a purge.
MOVE_CHUNK = 500
#: Header naming where a dead letter came from (amqlite.broker.acks.redeliver_or_dead_letter).
ORIGINAL_DESTINATION = "original-destination"


class ActionError(Exception):
    """An action that cannot be done; ``status`` is the HTTP status to answer with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Actions:
    broker: Broker
    reader: StoreReader

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
            raise ActionError(503, "the store refused the write: this node is no longer "
                                   "master")

    def _check_serving(self) -> None:
        if self.broker.paused:
            raise ActionError(503, "the broker is paused (its lock is in doubt); try again")

    @staticmethod
    def _kind(name: str) -> str:
        """The destination's kind ("queue" or "topic"); 400 when it is malformed."""
        try:
            return check_destination(name)
        except BrokerError as e:
            raise ActionError(400, str(e)) from None

    def queue(self, name: str) -> Source:
        """A known queue, or 404 (400 when the name is not a queue's)."""
        if self._kind(name) != "queue":
            raise ActionError(400, f"{name} is a topic: this action is for queues")
        q = self.broker.queues.get(name)
        if q is None or self.broker.destination_rows.get(name) is None:
            if q is not None and len(q):
                return q  # memory-only messages, never stored
            raise ActionError(404, f"no destination {name}")
        return q

    # -- purge -----------------------------------------------------------------------------
    async def purge(self, name: str) -> dict[str, Any]:
        self._check_serving()
        q = self.queue(name)
        did = self.broker.destination_rows.get(name)
        purged = 0
        # What waits in memory goes at once (persistent ones are acked with the first chunk).
        in_memory = q.drop(lambda m: True)
        acks = [(None, m.id) for m in in_memory if m.persistent]
        purged += len(in_memory) - len(acks)  # memory-only: nothing to write
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
                q.drop(lambda m, c=chosen_set: m.id in c)  # paged in while we read
            if acks:
                self.broker.writes.stage().acks.extend(acks)
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
    async def delete_destination(self, name: str) -> dict[str, Any]:
        """Remove a queue or a topic for good: from memory, and from the store in one
        fenced transaction (its row, its messages, a topic's durable subscriptions), so
        that a new master does not load it again. Refused (409) while it has consumers,
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
                raise ActionError(404, f"no destination {name}")
            self._refuse_consumers(name)
            if stored or (q is not None and len(q)):
                purged = (await self.purge(name))["purged"]
        elif (broker.destination_rows.get(name) is None and name not in broker.topics
              and not broker.durables_by_topic.get(name)):
            raise ActionError(404, f"no destination {name}")
        # purge awaited its commits: check again what may have changed meanwhile.
        self._check_serving()
        self._refuse_consumers(name, purged)
        gone = broker.forget_destination(name)
        removed = DeletedDestination(existed=False)
        try:
            if gone.store_id is not None and broker.committer is not None:
                removed = await broker.committer.call(
                    broker.committer.store.delete_destination, broker.epoch, gone.store_id)
        except StoreError as e:
            raise ActionError(503, f"the store refused to delete {name} ({e}); "
                                   f"{purged} messages were purged before") from None
        finally:
            broker.settle_forgotten(gone)
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
            raise ActionError(409, f"{name} has {n} consumers; close them first{done}")

    # -- delete one message ----------------------------------------------------------------
    async def delete_message(self, message_id: int,
                             require: Callable[[str], None] | None = None) -> dict[str, Any]:
        """``require`` (the API's per-destination check) is called with the message's
        destination before anything changes: the one read serves both."""
        self._check_serving()
        row = await asyncio.to_thread(self.reader.message, message_id)
        if row is None:
            raise ActionError(404, f"no message {message_id}")
        if require is not None:
            require(row["destination"])
        if row["kind"] != "queue":
            raise ActionError(409, f"message {message_id} belongs to topic "
                                   f"{row['destination']}: remove the durable subscription")
        q = self.broker.queue(row["destination"])
        if message_id in q.inflight_ids():
            raise ActionError(409, f"message {message_id} is in flight to a consumer; its "
                                   "ACK or NACK settles it")
        q.drop(lambda m: m.id == message_id)
        self.broker.writes.stage().acks.append((None, message_id))
        await self._commit()
        return {"destination": row["destination"], "deleted": 1, "id": message_id}

    # -- move and retry --------------------------------------------------------------------
    async def move(self, source: str, target: str | None, ids: list[int] | None,
                   retry: bool = False) -> dict[str, Any]:
        """Copy messages to ``target`` (or, with ``retry``, to each one's
        original-destination) with new ids, and remove them from ``source``, in one
        fenced batch per chunk. ``ids`` None: every waiting message."""
        self._check_serving()
        q = self.queue(source)
        if target is not None:
            if self._kind(target) != "queue":
                raise ActionError(400, f"cannot move to {target}: only to a queue")
            if target == source:
                raise ActionError(400, "source and target are the same queue")
        did = self.broker.destination_rows.get(source)
        moved, skipped, kept, missing = 0, 0, 0, 0
        targets: dict[str, int] = {}
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
            missing += len(set(chunk_ids) - {r["id"] for r in rows})
            inflight = q.inflight_ids()
            result = self._stage_moves(q, source, did, rows, inflight, target, retry, targets)
            moved += result[0]
            skipped += result[1]
            kept += result[2]
            missing += result[3]
            if result[0]:
                await self._commit_moves(result[4])
            if ids is None:
                if len(chunk_ids) < MOVE_CHUNK:
                    break
                after = chunk_ids[-1]
        q.dispatch()
        out: dict[str, Any] = {"source": source, "moved": moved, "in_flight_kept": kept,
                               "not_found": missing}
        if retry:
            out["targets"] = targets
            out["skipped_no_original"] = skipped
        else:
            out["target"] = target
        return out

    def _stage_moves(self, q: Source, source: str, did: int | None, rows: list[dict[str, Any]],
                     inflight: set[int], target: str | None, retry: bool,
                     targets: dict[str, int]) -> tuple[int, int, int, int, list[Message]]:
        broker = self.broker
        batch = broker.writes.stage()
        copies: list[Message] = []
        moved = skipped = kept = missing = 0
        for r in rows:
            if r["destination_id"] != did:
                missing += 1  # not a message of this queue
                continue
            if r["inflight"] or r["id"] in inflight:
                kept += 1
                continue
            headers = dict(r["headers"])
            dest = target
            if retry:
                dest = headers.pop(ORIGINAL_DESTINATION, None)
                try:
                    if dest is None or check_destination(dest) != "queue" or dest == source:
                        raise BrokerError("not a queue")
                except BrokerError:
                    skipped += 1
                    continue
            assert dest is not None
            copy = Message(next(broker.ids), dest, r["message_id"], headers, r["body"],
                           r["priority"], r["expires_at"], True, enqueued_at=now_ms())
            batch.inserts.append(NewMessage(
                id=copy.id, destination_id=broker.destination_id(dest),
                message_id=copy.message_id, headers=headers, body=copy.body,
                priority=copy.priority, expires_at=copy.expires_at,
                enqueued_at=copy.enqueued_at))
            batch.acks.append((None, r["id"]))
            broker.queue(dest).pending_inserts += 1  # no hand-over may overtake it
            copies.append(copy)
            targets[dest] = targets.get(dest, 0) + 1
            moved += 1
        gone = {r["id"] for r in rows}
        q.drop(lambda m: m.id in gone and m.id not in inflight)
        return moved, skipped, kept, missing, copies

    async def _commit_moves(self, copies: list[Message]) -> None:
        broker = self.broker

        def stored(ok: bool) -> None:
            for copy in copies:
                broker.queue(copy.destination).pending_inserts -= 1
                if ok:
                    broker.route_committed(copy)

        await self._commit(stored)

    # -- connections and durable subscriptions ---------------------------------------------
    def close_connection(self, conn: Any, who: str) -> dict[str, Any]:
        conn.close_with_error("connection closed by an administrator", f"closed by {who}")
        return {"closed": 1, "address": conn.peer}

    async def remove_durable(self, client_id: str, name: str) -> dict[str, Any]:
        self._check_serving()
        durable = self.broker.durables.get((client_id, name))
        if durable is None:
            raise ActionError(404, f"no durable subscription {name!r} of client {client_id!r}")
        if durable.consumers:
            raise ActionError(409, f"durable subscription {name!r} of {client_id!r} is active: "
                                   "close its connection first")
        self.broker.remove_durable(durable)
        await self._commit()
        return {"removed": 1, "client_id": client_id, "name": name, "topic": durable.topic}
