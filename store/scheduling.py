"""Scheduled delivery in the store: the next due time, the due rows, a cancel.

A scheduled message is a row of ``amq_messages`` with ``deliver_at > 0`` (schema v3):
stored, fenced, before its SEND's RECEIPT like any message, but never paged. The master
asks here when the earliest one is due (one probe of the partial index
``ix_amq_messages_due``, so an activation costs the same whatever the number of
scheduled messages) and, when it is, for the due rows; it makes an occurrence
deliverable by inserting a copy and moving the row on (``Batch.schedule_steps``) in one
fenced batch (``store.batch_commit``).
"""

from __future__ import annotations

import json

from sqlalchemy import select

from store import schema
from store.api import ScheduledRow
from store.fencing import FencedStore


class Scheduling(FencedStore):
    """``SqlStore``'s ``next_scheduled``, ``due_scheduled`` and ``cancel_scheduled``."""

    def next_scheduled(self) -> int | None:
        with self._tx("next_scheduled", write=False) as conn:
            due = conn.scalar(self._st.next_due, {"g": self.group})
        return None if due is None else int(due)

    def due_scheduled(self, now_ms: int, limit: int) -> list[ScheduledRow]:
        params = {"g": self.group, "now": now_ms, "n": limit}
        with self._tx("due_scheduled", write=False) as conn:
            rows = conn.execute(self._st.due, params).all()
        return [ScheduledRow(r.id, r.destination_id, r.name, r.kind, r.message_id,
                             json.loads(r.headers), bytes(r.body), r.priority, r.enqueued_at,
                             r.deliver_at, r.schedule, r.delivery_count or 0,
                             r.expires_at or 0, r.producer_id, r.producer_seq) for r in rows]

    def cancel_scheduled(self, epoch: int, message_id: int) -> bool:
        """Only a scheduled row: an ordinary message with that id is left alone."""
        m = schema.messages
        with self._tx("cancel_scheduled") as conn:
            self._fence(conn, epoch)
            # A delayed redelivery (delivered before: delivery_count > 0) is still in its
            # queue's depth, unlike a scheduled SEND's row: it leaves the depth too.
            row = conn.execute(select(m.c.destination_id, m.c.delivery_count).where(
                m.c.grp == self.group, m.c.id == message_id)).first()
            gone = conn.scalars(self._st.delete_scheduled,
                                {"g": self.group, "ids": [message_id]}).all()
            if gone:
                conn.execute(self._st.count_fix, {"g": self.group, "delta": -len(gone)})
                if row is not None and row.delivery_count:
                    conn.execute(self._st.depth, [{"g": self.group, "i": row.destination_id,
                                                   "n": -1}])
        return bool(gone)
