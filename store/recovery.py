"""Activation reads: what a new master recovers, the pages of messages it then
reads, the background integrity check, and the activation row's end.

Dequeue and FOR UPDATE SKIP LOCKED (docs/design.md): a Postgres-backed queue would
use SKIP LOCKED where the backend has it. We deliberately do not. SKIP LOCKED is for many
competing consumers; here one fenced master reads, on the same thread that
writes, and pages with an id cursor. The only rows another transaction could
lock are those of a deposed master's last transaction; skipping them would
move the cursor past them and lose them until the next activation, while a
plain READ COMMITTED SELECT returns their committed state without waiting.
FOR UPDATE would also dirty every page it reads.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from sqlalchemy import func, select, text, update
from sqlalchemy.exc import SQLAlchemyError

from lockers.connections.errors import one_line
from store import schema
from store.api import (
    DestinationRow,
    Fenced,
    Integrity,
    PageFilter,
    Recovery,
    StoredMessage,
    StoreError,
    SubscriptionRow,
)
from store.fencing import FencedStore
from store.statements import deliverable, now_ms

#: The store's log lines keep the logger name they always had (``store.sql``),
#: whichever of its modules writes them.
log = logging.getLogger("store.sql")

#: The integrity check counts every row: allow it 10 minutes (0 = no limit).
INTEGRITY_STATEMENT_TIMEOUT_MS = 600_000


class Recovering(FencedStore):
    """``SqlStore``'s reads for an activation: ``recover``, the message pages,
    ``check_integrity`` and ``end_activation``."""

    # -- activation --------------------------------------------------------
    def recover(self, epoch: int) -> Recovery:
        d, s, m = schema.destinations, schema.subscriptions, schema.messages
        with self._tx("recover", write=False) as conn:
            current = self._current_epoch(conn)
            if current is None or current[0] != epoch:
                raise Fenced(f"{self.description}: group {self.group!r} is not at epoch {epoch}")
            dests = [
                DestinationRow(r.id, r.name, r.kind, r.depth)
                for r in conn.execute(
                    select(d.c.id, d.c.name, d.c.kind, d.c.depth)
                    .where(d.c.grp == self.group)
                    .order_by(d.c.id)
                )
            ]
            subs = [
                SubscriptionRow(r.id, r.client_id, r.name, r.destination_id, r.selector, r.pending,
                                r.owner)
                for r in conn.execute(
                    select(s.c.id, s.c.client_id, s.c.name, s.c.destination_id, s.c.selector,
                           s.c.pending, s.c.owner)
                    .where(s.c.grp == self.group)
                    .order_by(s.c.id)
                )
            ]
            c = schema.counters
            counts = {
                int(r[0]): tuple(int(v) for v in r[1:])
                for r in conn.execute(
                    select(c.c.destination_id, *(c.c[k] for k in schema.COUNTER_KINDS))
                    .where(c.c.grp == self.group)
                )
            }
            # Newest id by the primary key index (one descent, O(log n)).
            top = conn.scalar(
                select(m.c.id).where(m.c.grp == self.group).order_by(m.c.id.desc()).limit(1)
            )
        # max_msg_id is the highest id ever committed: acking the newest
        # message must not hand its id out again (the dedup rows refer to it).
        next_msg = max(top or 0, current[1]) + 1
        return Recovery(
            epoch=epoch,
            destinations=dests,
            subscriptions=subs,
            next_message_id=next_msg,
            # A counters row may outlive a destination row its batch did not create
            # (refused by the store): its id is never handed out again.
            next_destination_id=max((*(x.id for x in dests), *counts), default=0) + 1,
            next_subscription_id=max((x.id for x in subs), default=0) + 1,
            counters=counts,
        )

    def check_integrity(self, epoch: int) -> Integrity:
        g, m, a = schema.groups, schema.messages, schema.activations
        if self._engine is None:
            raise StoreError(f"{self.description}: store is not open")
        try:
            with self._engine.connect() as conn:
                if not self._sqlite:
                    # One snapshot for the counters and the count: commits of
                    # the running master must not fall in between.
                    conn.execution_options(isolation_level="REPEATABLE READ")
                with conn.begin():
                    if not self._sqlite:
                        conn.execute(
                            text(f"SET LOCAL statement_timeout = {INTEGRITY_STATEMENT_TIMEOUT_MS}")
                        )
                    counters = conn.execute(
                        select(g.c.msg_count, g.c.max_msg_id).where(g.c.grp == self.group)
                    ).one()
                    actual = conn.execute(
                        select(func.count(), func.max(m.c.id)).where(m.c.grp == self.group)
                    ).one()
                    activation_count = conn.scalar(
                        select(a.c.expected_count).where(a.c.grp == self.group, a.c.epoch == epoch)
                    )
        except SQLAlchemyError as e:
            raise StoreError(f"{self.description}: integrity check failed: {one_line(e)}") from e
        result = Integrity(
            expected_count=int(counters.msg_count),
            expected_max_id=int(counters.max_msg_id),
            actual_count=int(actual[0]),
            actual_max_id=int(actual[1] or 0),
        )
        if activation_count is not None:
            # The activation row holds the counters as of activation; the
            # running master has changed them since by exactly
            # (msg_count - expected_count), so shift the count back.
            at_activation = result.actual_count - (result.expected_count - activation_count)
            # Through the fence like every write: a deposed master's late check
            # must not overwrite its successor's view.
            if not self._update_activation(epoch, "integrity record",
                                           actual_count=at_activation,
                                           actual_max_id=result.actual_max_id,
                                           mismatch=result.mismatch):
                log.warning("%s: group %r is no longer at epoch %d: integrity result not "
                            "recorded", self.description, self.group, epoch)
        if result.mismatch:
            log.error(
                "%s: group %r integrity MISMATCH at epoch %d: counters say %d rows (max id %d), "
                "store holds %d rows (max id %d)", self.description, self.group, epoch,
                result.expected_count, result.expected_max_id, result.actual_count,
                result.actual_max_id,
            )
        return result

    def end_activation(self, epoch: int) -> None:
        self._update_activation(epoch, "end_activation", ended_at=now_ms())

    def _update_activation(self, epoch: int, what: str, **values: Any) -> bool:
        """Set ``values`` on the activation row of ``epoch``, through the fence;
        False (nothing written) when the group has moved on to another epoch."""
        a = schema.activations
        try:
            with self._tx(what) as conn:
                self._fence(conn, epoch)
                conn.execute(
                    update(a).where(a.c.grp == self.group, a.c.epoch == epoch).values(**values)
                )
        except Fenced:
            return False
        return True

    # -- paging ------------------------------------------------------------
    @staticmethod
    def _stored(rows: Any) -> list[StoredMessage]:
        loads = json.loads
        return [
            StoredMessage(
                r[0], r[1], r[2], loads(r[3]), bytes(r[4]), r[5], r[6], r[7], r[8], r[9], r[10],
                r[11],
            )
            for r in rows
        ]

    def load_page(self, destination_id: int, after_id: int, limit: int) -> list[StoredMessage]:
        params = {"g": self.group, "d": destination_id, "after": after_id, "n": limit}
        with self._tx("load_page", write=False) as conn:
            return self._stored(conn.execute(self._st.page, params))

    def load_page_matching(
        self, destination_id: int, after_id: int, limit: int, terms: PageFilter
    ) -> list[StoredMessage]:
        params = {"g": self.group, "d": destination_id, "after": after_id, "n": limit}
        with self._tx("load_page_matching", write=False) as conn:
            return self._stored(conn.execute(self._st.filtered_page(terms), params))

    def load_subscription_page(
        self, subscription_id: int, after_id: int, limit: int
    ) -> list[StoredMessage]:
        params = {"g": self.group, "s": subscription_id, "after": after_id, "n": limit}
        with self._tx("load_subscription_page", write=False) as conn:
            return self._stored(conn.execute(self._st.sub_page, params))

    def queue_members(self, destination_id: int) -> list[tuple[int, int]]:
        """(id, body bytes) of a queue's deliverable messages by id, bodies unread: what a
        bounded queue (``amqlite.policy``) counts at activation. As long as the queue, which
        its policy bounds."""
        m = schema.messages
        query = (select(m.c.id, func.length(m.c.body))
                 .where(m.c.grp == self.group, m.c.destination_id == destination_id,
                        deliverable()).order_by(m.c.id))
        with self._tx("queue_members", write=False) as conn:
            return [(int(r[0]), int(r[1] or 0)) for r in conn.execute(query)]
