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
from amqlite.broker import destinations, selective, send, temporary, wildcard_queues
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
from store.write_buffer import WriteBuffer

if TYPE_CHECKING:
    from collections.abc import Callable

    from amqlite.settings import Settings
    from store.api import DestinationRow, Recovery, StoredMessage
    from store.group_commit import GroupCommitter

log = logging.getLogger("amqlite.broker")


class Broker:
    """All destinations of one master. Frames arrive via ``handle``."""

    def __init__(
        self,
        settings: Settings,
        committer: GroupCommitter | None,
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
                      "dead_lettered": 0, "dropped": 0}
        #: Byte budgets and the producers held back for them (``memory``).
        self.memory = MemoryBudget(settings.max_memory, settings.max_destination_memory)
        #: Per-destination totals since this node became master, for the management
        #: metrics (one dict increment per message; read only when scraped).
        self.enqueued: defaultdict[str, int] = defaultdict(int)
        self.dequeued: defaultdict[str, int] = defaultdict(int)
        self.dead_lettered: defaultdict[str, int] = defaultdict(int)
        #: The users file's [[authorization]] entries; None when there are none (then
        #: every authenticated login may do everything, and frames pay no check).
        self.authz: Policy | None = None
        #: Destinations used since this node became master (topics leave no row unless
        #: durable): using one of these again is not creating it. Kept only with authz.
        self.known_destinations: set[str] = set()
        #: CONNECT is authenticated (a users file): a connection's login is proven, so a
        #: durable subscription belongs to it. Without, a login header proves nothing.
        self.authenticated = bool(settings.users_file)
        for d in recovery.destinations:
            self.destination_rows[d.name] = d.id
            if d.kind == "queue":
                self.queues[d.name] = Source(self, d.name, d.id, stored=True)
        names = {d.id: d.name for d in recovery.destinations}
        for s in recovery.subscriptions:
            topic = names.get(s.destination_id, f"/topic/unknown-{s.destination_id}")
            destinations.add_durable(self, DurableSource(
                self, topic, s.id, s.client_id, s.name, topic, s.owner,
                selective.stored_selector(s.selector, s.name)))
        #: Scheduled delivery's one timer: it looks for due and future scheduled
        #: messages in the store as soon as the loop runs (``amqlite.broker.scheduler``).
        self.scheduler = Scheduler(self)
        self.scheduler.start()

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
        if (destination not in self.destination_rows and destination not in self.queues
                and destination not in self.topics
                and not policy.may_create(login, destination, permission)):
            log.info("denied: login %r may not create %s", login, destination)
            raise BrokerError(f"permission denied: login {login!r} has no admin permission on "
                              f"{destination}, needed to create it")
        self.known_destinations.add(destination)

    # -- destinations and messages ------------------------------------------------
    def queue(self, name: str) -> Source:
        """The queue ``name``, made in memory if new (its row comes with its first write)."""
        q = self.queues.get(name)
        if q is None:
            if is_temporary(name):  # gone with its connection: what comes is dropped
                return temporary.gone_queue(self, name)
            q = Source(self, name, self.destination_rows.get(name), stored=True)
            q.store_has_more = False  # new: nothing stored yet
            self.queues[name] = q
            if self.queue_patterns:
                wildcard_queues.queue_created(self, name)
        return q

    def queue_left(self, q: Source) -> None:
        """A consumer left ``q``: a queue with no store row and nothing in it, on its way
        into it or waiting for room in it leaves memory (issue 23: SUBSCRIBE/UNSUBSCRIBE
        on ever new names must not grow the broker). ``queue`` makes it again on its next
        use, as new. Its totals go with it, as with a deleted queue (a metrics counter
        that starts again at 0, which Prometheus reads as a reset), and with
        ``[[authorization]]`` using it again is creating it again. A queue with a row
        stays, whatever the store holds: the row is ``gc_inactive_destinations``' to
        delete (``inactive``), and the listing, the operator API and paging go by it."""
        name = q.name
        if (q.consumers or q.heap or q.pending_inserts or q.paging or q.store_has_more
                or q.blocked_producers or q.store_id is not None
                or name in self.destination_rows or self.queues.get(name) is not q
                or is_temporary(name)):
            return
        del self.queues[name]
        for totals in (self.enqueued, self.dequeued, self.dead_lettered):
            totals.pop(name, None)
        self.known_destinations.discard(name)

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

    def expire(self, source: Source, message: Message) -> None:
        self.stats["expired"] += 1
        if message.persistent and source.stored:
            self.writes.stage().acks.append(source.ref(message))

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
