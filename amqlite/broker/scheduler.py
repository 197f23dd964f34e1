"""Scheduled delivery, the broker's side: ActiveMQ's ``AMQ_SCHEDULED_*`` SENDs are stored
with a due time and made deliverable when it comes (the headers' rules are
``amqlite.broker.schedule``'s).

A scheduled message is a column, not a timer in memory: its SEND stores it
(``send.scheduled_row``: ``amq_messages.deliver_at`` and its plan) through the group
commit, fenced, before the RECEIPT, and paging never returns it. One timer per node
(``Scheduler``) wakes for the earliest due time: at activation it asks the store for it
(``Store.next_scheduled``: one index probe, whatever the number of scheduled messages),
and a SEND that stores an earlier one re-arms it. When it fires, the due rows are read
and each occurrence is made deliverable in one fenced batch: a copy is inserted (to the
queue; to a topic's durable subscriptions, whose pending rows come with it) and the row
moves on to its next occurrence or goes (``Batch.schedule_steps``). The copy is routed
once that batch committed, like a SEND's message; a topic's non-durable subscribers get
it if they are subscribed then. So a takeover delivers each occurrence once: either the
batch committed (the copy is an ordinary stored message the new master pages in) or it
did not (the row is still due, and the new master makes it), late by at most the
takeover.

What the copies carry (ActiveMQ's ``SchedulerBroker.scheduledJob``): the message's
headers without ``AMQ_SCHEDULED_*`` and with ``scheduledJobId`` (the scheduled
message's message-id; a SEND that carries it is not scheduled again), persistent, a
time to live counted from the copy (``Plan.ttl_ms``), and a message-id of their own when
the schedule makes more than one copy (one copy keeps the SEND's message-id).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from amqlite.broker import redelivery, routing, send
from amqlite.broker.counters import Kind
from amqlite.broker.message import Message, now_ms
from amqlite.broker.schedule import JOB_ID_HEADER, Plan, ScheduleError, next_occurrence
from amqlite.validation import destination_kind
from store.api import ScheduledRow, ScheduleStep, StoreError, StoreRejected

if TYPE_CHECKING:
    from amqlite.broker.core import Broker
    from amqlite.broker.source import DurableSource
    from store.api import Batch

log = logging.getLogger("amqlite.broker")

#: Scheduled messages made deliverable per batch: each carries its body (up to
#: max_frame_size), so a page like the broker's store cursor (ActiveMQ pages 200), not a
#: purge's chunk.
FIRE_BATCH = 200
#: After a round the store refused (or a bug), the next try (s): the housekeeping
#: interval's default, so a row that cannot be delivered does not spin the loop.
RETRY_DELAY = 5.0
#: While the broker is paused (its lock in doubt, writes held) the timer looks again
#: this soon (s): the default lock poll interval, about how soon a pause resolves.
PAUSED_DELAY = 0.5


class RoundFailed(Exception):
    """The batch of a round was not committed, and the node is not demoting."""


@dataclasses.dataclass(slots=True)
class _Copy:
    """One occurrence staged: the copy, and where it goes once committed."""

    message: Message
    queue: bool
    durables: list[DurableSource]  # a topic's durable subscriptions owed it (stored)


class Scheduler:
    """The one timer of a master for its scheduled messages (module docstring)."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        #: Held by a firing round and by a cancel, so a cancel never races a copy that
        #: is being made (it waits for that round's commit, then finds the row moved on
        #: or gone).
        self.lock = asyncio.Lock()
        self._timer: asyncio.TimerHandle | None = None
        self._armed_for: int | None = None  # the due time (ms) the timer is set for
        self._round: asyncio.Task[None] | None = None
        #: The earliest due time a SEND stored while a round ran (it re-arms after).
        self._stored_meanwhile: int | None = None
        self.stopped = False
        #: Copies made since this node became master (for tests and the log).
        self.fired = 0

    # -- the timer ------------------------------------------------------------------------
    def start(self) -> None:
        """At activation: find the due and future scheduled messages in the store."""
        if self.broker.committer is not None and not self.stopped:
            self.broker.loop.call_soon(self._wake)

    def stop(self) -> None:
        """No more rounds (the node is no longer master)."""
        self.stopped = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def stored(self, due: int) -> None:
        """A scheduled message due at ``due`` (ms) committed: wake for it if it is the
        earliest."""
        if self.stopped:
            return
        if self._round is not None:
            m = self._stored_meanwhile
            self._stored_meanwhile = due if m is None else min(m, due)
        elif self._armed_for is None or due < self._armed_for:
            self._arm(due)

    def check_now(self) -> None:
        """Look for due messages at once, whatever the timer waits for (the clock moved;
        tests with a clock of their own); after the round that runs, if one does."""
        if self.stopped:
            return
        if self._round is not None:
            self.stored(now_ms())  # the round re-arms for it when it ends
            return
        if self._timer is not None:
            self._timer.cancel()
        self._wake()

    @property
    def armed_for(self) -> int | None:
        """The due time the timer is set for (ms), if any."""
        return self._armed_for

    def _arm(self, due: int) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._armed_for = due
        delay = max(0, due - now_ms()) / 1000
        self._timer = self.broker.loop.call_later(delay, self._wake)

    def _wake(self) -> None:
        self._timer, self._armed_for = None, None
        if self._round is None and not self.stopped:
            self._round = self.broker.loop.create_task(self._run())

    async def _run(self) -> None:
        """One round: every due occurrence made deliverable, then the timer set for the
        next due time."""
        next_due: int | None = None
        try:
            async with self.lock:
                next_due = await self._fire_due()
        except (StoreRejected, RoundFailed) as e:
            log.error("scheduled delivery: %s; trying again in %g s", e, RETRY_DELAY)
            next_due = now_ms() + int(RETRY_DELAY * 1000)
        except StoreError as e:  # the store failed or the committer closed: not master
            log.info("scheduled delivery stops: %s", e)
            self.stop()
        except Exception:
            log.exception("scheduled delivery failed; trying again in %g s", RETRY_DELAY)
            next_due = now_ms() + int(RETRY_DELAY * 1000)
        finally:
            self._round = None
        meanwhile, self._stored_meanwhile = self._stored_meanwhile, None
        due = [d for d in (next_due, meanwhile) if d is not None]
        if due and not self.stopped:
            self._arm(min(due))

    async def _fire_due(self) -> int | None:
        """Make what is due deliverable, a batch at a time; the next due time after."""
        broker = self.broker
        committer = broker.committer
        assert committer is not None
        store = committer.store
        while True:
            if broker.paused:
                return now_ms() + int(PAUSED_DELAY * 1000)
            now = now_ms()
            rows = await committer.call(store.due_scheduled, now, FIRE_BATCH)
            if rows:
                await self._fire(rows, now)
            if len(rows) < FIRE_BATCH:
                return await committer.call(store.next_scheduled)

    # -- one batch of occurrences -----------------------------------------------------------
    async def _fire(self, rows: list[ScheduledRow], now: int) -> None:
        """Stage each row's copy and step in one batch; route the copies (and the due
        redeliveries) in the callback of its commit (``_route``)."""
        broker = self.broker
        batch = broker.writes.stage()
        copies: list[_Copy] = []
        back: list[ScheduledRow] = []  # delayed redeliveries due (amqlite.broker.redelivery)
        for row in rows:
            if redelivery.is_redelivery(row.schedule):
                if row.destination is None:  # its queue was deleted meanwhile
                    batch.schedule_steps.append(ScheduleStep(row.id))
                else:
                    batch.redeliveries.append(row.id)
                    back.append(row)
                continue
            step, copy = self._occurrence(row, now)
            batch.schedule_steps.append(step)
            if copy is not None:
                copies.append(self._stage(copy, batch))
        ok = await self._commit(lambda ok: self._route(copies, back, ok))
        if not ok:
            if broker.writes.failed:
                raise StoreError("the store failed: this node is no longer master")
            raise RoundFailed("the store refused a batch of scheduled messages")
        self.fired += len(copies)

    def _route(self, copies: list[_Copy], back: list[ScheduledRow], ok: bool) -> None:
        """The round's batch committed (``ok``) or not: route what it made deliverable.
        In the commit's own callback, as a SEND's messages are, never a loop turn later:
        a page read after the commit (a consumer that SUBSCRIBEs meanwhile: every source
        of a new master pages) resolves after this callback (the group committer resolves
        in store order), so it finds the copy in memory (``Source.cursor``, ``ahead``)
        or leaves it to the pager, and the copy is never in memory twice
        (tests/broker/test_paged_while_committing.py)."""
        broker = self.broker
        for row in back if ok else ():
            try:
                redelivery.due(broker, row)
            except Exception:  # stored and deliverable: a restart delivers it at worst
                log.exception("redelivering message %s failed", row.message_id)
        for c in copies:
            m = c.message
            if c.queue:
                broker.queue(m.destination).pending_inserts -= 1
            if not ok:
                continue
            try:
                if c.queue or c.durables:
                    routing.route_committed(broker, m, c.durables)
                else:
                    routing.publish_memory(broker, m)
            except Exception:  # stored: a restart delivers it at worst
                log.exception("routing scheduled message %s failed", m.message_id)

    async def _commit(self, committed: Callable[[bool], None]) -> bool:
        """A commit point after what is staged: True once it committed. ``committed``
        runs with the outcome in the commit's callback (``_route``)."""
        fut: asyncio.Future[bool] = self.broker.loop.create_future()

        def done(ok: bool) -> None:
            try:
                committed(ok)
            finally:
                if not fut.done():
                    fut.set_result(ok)

        self.broker.writes.stage(done)
        return await fut

    def _occurrence(self, row: ScheduledRow, now: int) -> tuple[ScheduleStep, Message | None]:
        """The row's step (its next occurrence, or none) and the copy due now."""
        plan: Plan | None
        try:
            plan = Plan.from_json(row.schedule)
        except ScheduleError as e:
            log.error("scheduled message %s: %s; delivered once, not again", row.message_id, e)
            plan = None
        if row.destination is None:  # its destination was deleted: nobody to give it to
            log.warning("scheduled message %s: its destination is gone; dropped",
                        row.message_id)
            return ScheduleStep(row.id), None
        fired = (plan.fired if plan is not None else 0) + 1
        step = ScheduleStep(row.id)
        if plan is not None:
            due = next_occurrence(plan.schedule, row.deliver_at, fired, now)
            if due is not None:
                step = ScheduleStep(row.id, due, dataclasses.replace(plan, fired=fired).to_json())
        return step, self._copy(row, plan, now)

    def _copy(self, row: ScheduledRow, plan: Plan | None, now: int) -> Message:
        assert row.destination is not None
        broker = self.broker
        copy_id = next(broker.ids)
        once = plan is None or (plan.schedule.cron is None and plan.schedule.repeat == 0)
        message_id = row.message_id if once else f"ID:{broker.group}:{copy_id}"
        headers = dict(row.headers)
        headers[JOB_ID_HEADER] = row.message_id
        ttl = plan.ttl_ms if plan is not None else 0
        expires = now + ttl if ttl else 0
        if ttl and "expires" in headers:
            headers["expires"] = str(expires)
        return Message(copy_id, row.destination, message_id, headers, row.body, row.priority,
                       expires, True, enqueued_at=now)

    def _stage(self, m: Message, batch: Batch) -> _Copy:
        """A queue's copy is stored (no hand-over may overtake it while it commits); a
        topic's for its durable subscriptions, if any wants it."""
        broker = self.broker
        broker.counters.add(m.destination, Kind.ENQUEUED)  # with the copy's insert
        if destination_kind(m.destination) == "queue":
            batch.inserts.append(send.new_row(broker, m, batch))
            broker.queue(m.destination).pending_inserts += 1
            return _Copy(m, True, [])
        durables = [d for d in routing.durables_for(broker, m.destination) or ()
                    if routing.wants(d, m)]
        if durables:
            batch.inserts.append(send.new_row(broker, m, batch, durables))
        return _Copy(m, False, durables)

    # -- the operator API's ---------------------------------------------------------------
    async def cancel(self, message_id: int) -> bool:
        """Remove one scheduled message (fenced, after any round making its copy); False
        when there is no such scheduled message (any more)."""
        committer = self.broker.committer
        if committer is None:
            return False
        async with self.lock:
            return await committer.call(committer.store.cancel_scheduled, self.broker.epoch,
                                        message_id)
