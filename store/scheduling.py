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
                             r.deliver_at, r.schedule) for r in rows]

    def cancel_scheduled(self, epoch: int, message_id: int) -> bool:
        """Only a scheduled row: an ordinary message with that id is left alone."""
        with self._tx("cancel_scheduled") as conn:
            self._fence(conn, epoch)
            gone = conn.scalars(self._st.delete_scheduled,
                                {"g": self.group, "ids": [message_id]}).all()
            if gone:
                conn.execute(self._st.count_fix, {"g": self.group, "delta": -len(gone)})
        return bool(gone)
