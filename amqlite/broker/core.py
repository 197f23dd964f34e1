"""The broker: all destinations of one master, and the state frames act on.

The broker is single-threaded (the asyncio loop) and never touches the database
itself: every write is staged in a ``WriteBuffer`` (``store.write_buffer``) that
the group committer (a thread) commits in one fenced transaction per batch. The
rules that keep the promise (a RECEIPTed message is never lost nor stored twice)
live with the code they govern: ``send`` (visible only once committed),
``subscription`` (a delivery recorded before it is written), ``receipts`` (what a
RECEIPT waits for), ``source`` and ``memory`` (paging and byte budgets).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import defaultdict
from typing import TYPE_CHECKING

from amqlite.authz import Permission, Policy
from amqlite.broker import (
    destinations,
    limits,
    routing,
    selective,
    send,
    temporary,
    wildcard_queues,
)
from amqlite.broker.counters import Counters, Kind
from amqlite.broker.dispatch import HANDLERS
from amqlite.broker.memory import MemoryBudget
from amqlite.broker.message import Message
from amqlite.broker.scheduler import Scheduler
from amqlite.broker.session import Client, Session
from amqlite.broker.source import DurableSource, Source, TopicSubscriptionSource
from amqlite.broker.subscription import close_subscription
from amqlite.broker.wildcard_queues import QueuePattern
from amqlite.codec import Frame
from amqlite.validation import BrokerError, is_temporary
from amqlite.wildcard import WildcardIndex
from store.write_buffer import Committer, WriteBuffer

if TYPE_CHECKING:
    from collections.abc import Callable

    from amqlite.settings import Settings
    from store.api import DestinationRow, Recovery, Ref, StoredMessage

log = logging.getLogger("amqlite.broker")


class Broker:
    """All destinations of one master. Frames arrive via ``handle``."""

    def __init__(
        self,
        settings: Settings,
        committer: Committer | None,
        recovery: Recovery,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.settings = settings
        self.group = settings.group
        self.committer = committer
        self.loop = loop
        self.epoch = recovery.epoch
        self.writes: WriteBuffer[Client] = WriteBuffer(committer, loop)
        self.writes.on_destinations = lambda rows: destinations.destinations_committed(
            self, rows)
        self.paused = False
        self.ids = itertools.count(recovery.next_message_id)
        self.destination_ids = itertools.count(recovery.next_destination_id)
        self.subscription_ids = itertools.count(recovery.next_subscription_id)
        self.destination_rows: dict[str, int] = {}  # name -> store id
        #: The same rows by store id (the reaper's answers name ids), kept with them.
        self.destination_names: dict[int, str] = {}
        #: Destination rows staged and not yet committed by any batch: every
        #: write that needs one carries it (the store inserts it once), since
        #: the unit that first staged it may be refused by the store.
        self.unconfirmed_destinations: dict[str, DestinationRow] = {}
        self.queues: dict[str, Source] = {}
        self.topics: dict[str, list[TopicSubscriptionSource]] = {}
        self.durables: dict[tuple[str, str], DurableSource] = {}
        self.durables_by_topic: dict[str, list[DurableSource]] = {}
        #: Wildcard topic subscriptions (``amqlite.wildcard``): routing asks these for
        #: the patterns a concrete topic matches (empty: one length test per publish).
        self.topic_patterns: WildcardIndex[TopicSubscriptionSource] = WildcardIndex()
        self.durable_patterns: WildcardIndex[DurableSource] = WildcardIndex()
        self.queue_patterns: WildcardIndex[QueuePattern] = WildcardIndex()
        self.sessions: dict[Client, Session] = {}
        #: Temporary destinations, by name and by owning connection (``temporary``).
        self.temporary = temporary.Temporaries()
        self.clients_by_id: dict[str, Client] = {}
        self.stats = {"sent": 0, "delivered": 0, "acked": 0, "duplicates": 0, "expired": 0,
                      "dead_lettered": 0, "dropped": 0, "overflow_dropped": 0}
        #: Policies per destination (``amqlite.policy``): resolved once per name.
        self.policies = settings.destination_policies()
        #: Messages of bounded queues by id (``amqlite.broker.limits``): what an ack
        #: settles leaves its queue's ledger through it. Empty without bounded queues.
        self.bounded: dict[int, Source] = {}
        if self.policies.limits_queues:
            self.writes.on_flush = lambda batch: limits.forget_acked(self, batch)
        #: Byte budgets and the producers held back for them (``memory``).
        self.memory = MemoryBudget(settings.max_memory, settings.max_destination_memory)
        self.memory.reclaim = self.reclaim
        self.memory.redispatch = self._redispatch_soon
        self.memory.delivered_to = self._delivered_to
        self._redispatch_handle: asyncio.Handle | None = None
        #: Per-destination totals, kept in the store with the writes they count so a
        #: new master starts from them (``counters``); the three most read by name.
        self.counters = Counters(loop, self.destination_rows, self.writes.stage)
        self.writes.before_flush = self.counters.take
        self.enqueued = self.counters.totals[Kind.ENQUEUED]
        self.dequeued = self.counters.totals[Kind.DEQUEUED]
        self.dead_lettered = self.counters.totals[Kind.DEAD_LETTERED]
        #: Handed to a consumer (a redelivery counts again), for the console's rates
        #: (in memory only: a rate starts again at a takeover).
        self.delivered: defaultdict[str, int] = defaultdict(int)
        self.overflow_dropped = self.counters.totals[Kind.OVERFLOW_DROPPED]
        #: The users file's [[authorization]] entries; None when there are none (then
        #: every authenticated login may do everything, and frames pay no check).
        self.authz: Policy | None = None
        #: Destinations used since this node became master (topics leave no row unless
        #: durable): using one of these again is not creating it. Kept only with authz.
        self.known_destinations: set[str] = set()
        #: CONNECT is authenticated (a users file): a connection's login is proven, so a
        #: durable subscription belongs to it. Without, a login header proves nothing.
        self.authenticated = bool(settings.users_file)
        #: Stored queues not in memory since this node became master: made on first use
        #: (``queue``), paging what the store holds. Listing, metrics, the operator API and
        #: the inactive-queue GC go by their rows (``destination_rows``, the store's
        #: counters), the store's reaper deletes their expired rows without them; only a
        #: bounded queue is made at once (its ledger is counted before any SEND).
        self.dormant: set[str] = set()
        bounded = self.policies.limits_queues
        for d in recovery.destinations:
            self.destination_rows[d.name] = d.id
            self.destination_names[d.id] = d.name
            if d.kind != "queue":
                continue
            if bounded and self.policies.resolve(d.name).limited:
                self.queues[d.name] = self._new_queue(d.name, d.id)
            else:
                self.dormant.add(d.name)
        names = self.destination_names
        self.counters.load(names, recovery.counters)
        for s in recovery.subscriptions:
            topic = names.get(s.destination_id, f"/topic/unknown-{s.destination_id}")
            destinations.add_durable(self, DurableSource(
                self, topic, s.id, s.client_id, s.name, topic, s.owner,
                selective.stored_selector(s.selector, s.name)))
        #: Scheduled delivery's one timer: it looks for due and future scheduled
        #: messages in the store as soon as the loop runs (``amqlite.broker.scheduler``).
        self.scheduler = Scheduler(self)
        self.scheduler.start()

    def reclaim(self, want: int) -> int:
        """Give back up to ``want`` bytes of stored messages waiting in memory, from the
        fullest sources first (``Source.evict``): held bytes need the room."""
        sources: list[Source] = [*self.queues.values(), *self.durables.values()]
        sources.sort(key=lambda s: s.bytes, reverse=True)
        freed = 0
        for source in sources:
            if freed >= want or not source.bytes:
                break
            freed += source.evict(want - freed)
        if freed:
            log.debug("memory budget: %d bytes of stored messages given back to the store "
                      "for held bytes", freed)
        return freed

    def _redispatch_soon(self) -> None:
        """Held bytes were released with consumers left without credit for them: give
        those sources a dispatch a loop turn later (not inside the release)."""
        if self._redispatch_handle is None:
            self._redispatch_handle = self.loop.call_soon(self._redispatch)

    def _redispatch(self) -> None:
        self._redispatch_handle = None
        for source in self.memory.take_starved():
            routing.dispatch_logged(source)

    def _delivered_to(self, conn: Client) -> int:
        session = self.sessions.get(conn)
        return 0 if session is None else session.inflight_bytes

    # -- the memory budget's figures, as the metrics and tests read them ----------------
    @property
    def waiting_bytes(self) -> int:
        return self.memory.waiting_bytes

    @property
    def destination_budget(self) -> int:
        return self.memory.destination_budget

    @property
    def destination_resume(self) -> int:
        return self.memory.destination_resume

    # -- connections ------------------------------------------------------------
    def check_client_id(self, client_id: str | None, login: str | None) -> None:
        """Before CONNECTED: a client-id in use may only be taken over by the same login
        (else anyone could disconnect a client and take its durable subscriptions)."""
        if not client_id:
            return
        old = self.clients_by_id.get(client_id)
        if old is not None and not old.closed and old.login != login:
            log.warning("client-id %r: takeover by login %r refused (in use by another login)",
                        client_id, login)
            raise BrokerError(f"client-id {client_id!r} is in use by another login")

    def attach(self, conn: Client) -> None:
        """A client finished its CONNECT. A newer connection with the same
        client-id and login wins (link stealing): after a failover the old one is dead."""
        self.sessions[conn] = Session(conn)
        if conn.client_id:
            old = self.clients_by_id.get(conn.client_id)
            if old is not None and old is not conn:
                old.close_with_error("client-id taken over by a newer connection")
                self.detach(old)
            self.clients_by_id[conn.client_id] = conn

    def detach(self, conn: Client) -> None:
        session = self.sessions.pop(conn, None)
        if session is None:
            return
        if conn.client_id and self.clients_by_id.get(conn.client_id) is conn:
            del self.clients_by_id[conn.client_id]
        self.abort_all(session)
        for qp in list(session.wildcards.values()):
            wildcard_queues.close(self, qp)
        for sub in list(session.subscriptions.values()):
            close_subscription(self, session, sub)
        temporary.connection_closed(self, conn)  # after: what was in flight is back
        self.memory.forget(conn)

    def abort_all(self, session: Session) -> None:
        """A client that goes away aborts what it had not committed."""
        for tx in session.transactions.values():
            send.abort(self, session, tx, None, answered=False)
        session.transactions.clear()

    # -- frames -----------------------------------------------------------------
    def handle(self, conn: Client, frame: Frame) -> None:
        """Process one client frame (``dispatch.HANDLERS``). Raises BrokerError for a
        client mistake."""
        handler = HANDLERS.get(frame.command)
        if handler is None:
            raise BrokerError(f"unexpected frame {frame.command}")
        handler(self, self.sessions[conn], frame)

    def may_read(self, login: str | None, destination: str) -> bool:
        """May ``login`` read ``destination``? (A wildcard subscription's check, per
        concrete destination; the policy caches its decisions.)"""
        return self.authz is None or self.authz.allowed(login, destination, Permission.READ)

    def authorize(self, conn: Client, destination: str, permission: Permission) -> None:
        """BrokerError (nothing done) unless the connection's login may use ``destination``
        with ``permission``, and create it when the broker does not know it yet."""
        policy = self.authz
        if policy is None:
            return
        login = conn.login
        if not policy.allowed(login, destination, permission):
            log.info("denied: login %r may not %s %s", login, permission.value, destination)
            raise BrokerError(f"permission denied: login {login!r} has no {permission.value} "
                              f"permission on {destination}")
        if destination in self.known_destinations:
            return
        if not self.exists(destination) and not policy.may_create(login, destination,
                                                                   permission):
            log.info("denied: login %r may not create %s", login, destination)
            raise BrokerError(f"permission denied: login {login!r} has no admin permission on "
                              f"{destination}, needed to create it")
        self.known_destinations.add(destination)

    # -- destinations and messages ------------------------------------------------
    def exists(self, destination: str) -> bool:
        """Is ``destination`` there already (using it is not creating it)?"""
        return (destination in self.destination_rows or destination in self.queues
                or destination in self.topics)

    def queue(self, name: str) -> Source:
        """The queue ``name``, made in memory if new (its row comes with its first write)
        or stored and not in memory yet (``dormant``: it pages what the store holds)."""
        q = self.queues.get(name)
        if q is None:
            if is_temporary(name):  # gone with its connection: what comes is dropped
                return temporary.gone_queue(self, name)
            q = self._new_queue(name, self.destination_rows.get(name))
            if name in self.dormant:
                self.dormant.discard(name)  # its stored messages page in with a consumer
            else:
                q.store_has_more = False  # new, or left memory empty: nothing stored
            self.queues[name] = q
            if self.queue_patterns:
                wildcard_queues.queue_created(self, name)
        return q

    def _new_queue(self, name: str, store_id: int | None) -> Source:
        q = Source(self, name, store_id, stored=True)
        policy = self.policies.resolve(name)
        if policy.limited:
            q.ledger = limits.Ledger(policy)
        return q

    def queue_left(self, q: Source) -> None:
        """A consumer left ``q``: a queue with nothing in it, on its way into it, in the
        store past what memory holds or waiting for room in it leaves memory (issue 23:
        SUBSCRIBE/UNSUBSCRIBE, or SENDs drained, on ever new names must not grow the
        broker). ``queue`` makes it again on its next use, as new: whatever is stored for
        it later comes through ``queue``. A store row stays, with its id in
        ``destination_rows`` and its totals (``counters``, which the store keeps too):
        the row is ``gc_inactive_destinations``' to delete (``inactive``), and the
        listing, the operator API and paging go by it. A queue with no row takes its
        totals along, as a deleted queue does (a metrics counter that starts again at
        0, which Prometheus reads as a reset), and with ``[[authorization]]`` using it
        again is creating it again."""
        name = q.name
        if (q.consumers or q.heap or q.pending_inserts or q.paging or q.store_has_more
                or q.blocked_producers or self.queues.get(name) is not q
                or is_temporary(name)):
            return
        del self.queues[name]
        if name in self.destination_rows:
            # Its totals mirror its store row's counters (and may wait to be written
            # with the next batch): they stay, as the row does. Deliveries are counted
            # in memory only, for the console's rates.
            self.delivered.pop(name, None)
            return
        self.forget_totals(name)
        self.known_destinations.discard(name)

    def forget_totals(self, name: str) -> None:
        """A destination left: its per-destination totals go with it."""
        self.delivered.pop(name, None)
        self.counters.forget(name)

    def topic_left(self, name: str) -> None:
        """The last non-durable subscriber of topic ``name`` left: the topic leaves memory
        unless a durable subscription or a row keeps it (see ``queue_left``)."""
        if self.topics.get(name) == []:
            del self.topics[name]
        if (name not in self.topics and name not in self.destination_rows
                and not self.durables_by_topic.get(name)):
            self.known_destinations.discard(name)

    def number(self, m: Message) -> Message:
        """Give a checked message (``checked_send``) its store id and message-id."""
        m.id = mid = next(self.ids)
        m.message_id = f"ID:{self.group}:{mid}"
        return m

    def reaped(self, by_destination: dict[int, list[Ref]]) -> None:
        """The store's reaper deleted these expired rows (and counted them): what of
        them waits in memory goes without being counted again."""
        names = self.destination_names
        self.counters.reaped(names, by_destination)
        if self.bounded:  # out of the bounded queues' ledgers too
            for refs in by_destination.values():
                limits.forget_refs(self, refs)
        by_sub = {d.store_id: d for d in self.durables.values()}
        for did, refs in by_destination.items():
            gone: dict[Source, dict[int, Ref]] = {}
            for sid, mid in refs:
                source = (self.queues.get(names.get(did, "")) if sid is None
                          else by_sub.get(sid))
                if source is not None:
                    gone.setdefault(source, {})[mid] = (sid, mid)
            for source, mine in gone.items():
                source.drop(_among(set(mine)))
                # In flight: its ACK (or its expiry once released) must not count again.
                for mid in source.inflight_ids() & set(mine):
                    self.counters.gone.add(mine[mid])

    def expire(self, source: Source, message: Message) -> None:
        self.stats["expired"] += 1
        if message.persistent and source.stored:
            ref = source.ref(message)
            self.writes.stage().acks.append(ref)
            if self.counters.gone and self.counters.settle_gone((ref,)):
                return  # the store's reaper counted it
        self.counters.add(source.name, Kind.EXPIRED)

    def load_page(self, source: Source, limit: int) -> None:
        """Page up to ``limit`` stored messages past ``source.cursor`` into ``source``."""
        assert self.committer is not None and source.store_id is not None
        fn: Callable[[int, int, int], list[StoredMessage]]
        if isinstance(source, DurableSource):
            fn = self.committer.store.load_subscription_page
        else:
            fn = self.committer.store.load_page
        future = asyncio.ensure_future(self.committer.call(fn, source.store_id, source.cursor,
                                                           limit))

        def loaded(f: asyncio.Future[list[StoredMessage]]) -> None:
            if f.cancelled() or f.exception() is not None:
                source.paging = False
                log.error("paging %s failed: %s", source.name,
                          None if f.cancelled() else f.exception())
                return
            source.page_loaded(f.result(), limit)

        future.add_done_callback(loaded)

    # -- flow of the whole broker --------------------------------------------------------
    def pause(self) -> None:
        """Stop dispatching and committing (the lock is in doubt)."""
        self.paused = True
        self.writes.held = True

    def resume(self) -> None:
        self.paused = False
        self.writes.release()
        self.dispatch_all()
        self.scheduler.check_now()  # what fell due while paused (an activation's start too)

    def dispatch_all(self) -> None:
        for q in list(self.queues.values()):  # a consumer that goes may take its queue
            q.dispatch()
        for d in self.durables.values():
            d.dispatch()
        for sources in list(self.topics.values()):
            for s in list(sources):
                s.dispatch()

    def connection_writable(self, conn: Client) -> None:
        session = self.sessions.get(conn)
        if session is None:
            return
        for sub in list(session.all_subscriptions()):
            sub.source.dispatch()


def _among(ids: set[int]) -> Callable[[Message], bool]:
    """A ``Source.drop`` predicate: the messages with these ids."""
    return lambda m: m.id in ids
