"""Read-only store queries for the management API, on a store handle of its own.

The broker's store is driven by the group committer's thread; reading through it would
put operators' browsing between SENDs and their RECEIPTs. The management API opens a
second handle (its own connection pool, like the integrity check does) and runs these
blocking reads in a worker thread. Nothing here writes: every change goes through the
broker's write buffer (``amqlite.broker.operations``), fenced like any other commit.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import case, func, literal_column, select

from lockers.connections.errors import one_line
from store import StoreError, open_store, schema
from store.statements import deliverable

#: Bytes of a body shown when browsing; the whole body comes with one message.
BODY_PREVIEW_BYTES = 256
#: How long one read of all destinations' depths serves metrics and the API (s): a
#: scrape every second (Prometheus' shortest usual interval) costs at most one query.
DEPTH_CACHE_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class DestinationDepth:
    id: int
    name: str
    kind: str
    depth: int  # queue rows in the store, waiting or in flight
    #: A topic's: what its durable subscriptions are owed in the store, summed (a
    #: message owed to two counts twice), in flight or not.
    pending: int = 0


@dataclass(frozen=True, slots=True)
class DurableRow:
    id: int
    client_id: str
    name: str
    topic: str
    pending: int
    owner: str | None  # the login that created it (None: no authentication, or older)


class StoreReader:
    """Blocking reads; call from a thread (``asyncio.to_thread``)."""

    def __init__(self, store_url: str, group: str) -> None:
        self.group = group
        self._store = open_store(store_url, group)
        self._opened = False
        self._lock = threading.Lock()
        self._depths: dict[str, DestinationDepth] = {}
        self._depths_at = 0.0
        self._scheduled: dict[str, int] = {}
        self._scheduled_at = 0.0
        #: Of the scheduled rows, the delayed redeliveries per destination (read with them).
        self.delayed: dict[str, int] = {}

    def _engine(self) -> Any:
        with self._lock:
            if not self._opened:
                self._store.open()
                self._opened = True
        return self._store.engine  # type: ignore[attr-defined]

    def close(self) -> None:
        with self._lock:
            if self._opened:
                self._store.close()
                self._opened = False

    def _rows(self, query: Any) -> list[Any]:
        try:
            with self._engine().connect() as conn:
                return list(conn.execute(query))
        except StoreError:
            raise
        except Exception as e:  # SQLAlchemy's errors, one line for the API
            raise StoreError(f"store read failed: {one_line(e)}") from e

    # -- destinations and subscriptions ----------------------------------------------------
    def depths(self, max_age: float = DEPTH_CACHE_SECONDS) -> dict[str, DestinationDepth]:
        """Every destination's stored depth: one query, cached ``max_age`` seconds."""
        if time.monotonic() - self._depths_at < max_age:
            return self._depths
        d = schema.destinations
        rows = self._rows(select(d.c.id, d.c.name, d.c.kind, d.c.depth)
                          .where(d.c.grp == self.group))
        s = schema.subscriptions
        owed = {r.destination_id: int(r.pending) for r in self._rows(
            select(s.c.destination_id, func.sum(s.c.pending).label("pending"))
            .where(s.c.grp == self.group).group_by(s.c.destination_id))}
        self._depths = {r.name: DestinationDepth(r.id, r.name, r.kind, r.depth,
                                                 owed.get(r.id, 0)) for r in rows}
        self._depths_at = time.monotonic()
        return self._depths

    def invalidate(self) -> None:
        """Forget the cached depths: an action just changed them."""
        self._depths_at = 0.0
        self._scheduled_at = 0.0

    def durables(self) -> list[DurableRow]:
        s, d = schema.subscriptions, schema.destinations
        rows = self._rows(
            select(s.c.id, s.c.client_id, s.c.name, d.c.name.label("topic"), s.c.pending,
                   s.c.owner)
            .join(d, (d.c.grp == s.c.grp) & (d.c.id == s.c.destination_id))
            .where(s.c.grp == self.group).order_by(s.c.client_id, s.c.name))
        return [DurableRow(r.id, r.client_id, r.name, r.topic, r.pending, r.owner)
                for r in rows]

    # -- messages --------------------------------------------------------------------------
    def browse(self, destination_id: int, after_id: int, limit: int) -> list[dict[str, Any]]:
        """A page of a queue's messages by id, with a body preview; consumes nothing."""
        m = schema.messages
        rows = self._rows(
            select(m.c.id, m.c.message_id, m.c.priority, m.c.expires_at, m.c.enqueued_at,
                   m.c.delivery_count, m.c.inflight_epoch, m.c.headers,
                   func.length(m.c.body).label("size"),
                   func.substr(m.c.body, 1, BODY_PREVIEW_BYTES).label("preview"))
            .where(m.c.grp == self.group, m.c.destination_id == destination_id,
                   m.c.id > after_id, deliverable())
            .order_by(m.c.id).limit(limit))
        return [_message_json(r, _preview(r)) for r in rows]

    def message(self, message_id: int) -> dict[str, Any] | None:
        """One stored message, whole body, with its destination's name; None if gone."""
        m, d = schema.messages, schema.destinations
        rows = self._rows(
            select(m.c.id, m.c.message_id, m.c.priority, m.c.expires_at, m.c.enqueued_at,
                   m.c.delivery_count, m.c.inflight_epoch, m.c.headers, m.c.body,
                   m.c.producer_id, m.c.producer_seq, m.c.deliver_at,
                   func.length(m.c.body).label("size"), d.c.name.label("destination"),
                   d.c.kind.label("kind"), m.c.destination_id)
            .join(d, (d.c.grp == m.c.grp) & (d.c.id == m.c.destination_id))
            .where(m.c.grp == self.group, m.c.id == message_id))
        if not rows:
            return None
        r = rows[0]
        out = _message_json(r, bytes(r.body))
        out.update(destination=r.destination, kind=r.kind, destination_id=r.destination_id,
                   producer_id=r.producer_id, producer_seq=r.producer_seq,
                   deliver_at=r.deliver_at or None)  # set: scheduled, not deliverable yet
        out["raw_body"] = bytes(r.body)
        return out

    def message_ids(self, destination_id: int, after_id: int, limit: int,
                    waiting_only: bool = True) -> list[int]:
        """Ids of a queue's messages past ``after_id``; by default only those not in flight."""
        m = schema.messages
        q = (select(m.c.id).where(m.c.grp == self.group, m.c.destination_id == destination_id,
                                  m.c.id > after_id, deliverable())
             .order_by(m.c.id).limit(limit))
        if waiting_only:
            q = q.where(m.c.inflight_epoch.is_(None))
        return [r.id for r in self._rows(q)]

    def full_rows(self, ids: list[int]) -> list[dict[str, Any]]:
        """Whole messages (headers decoded, body bytes) for a move; missing ids skipped."""
        if not ids:
            return []
        m = schema.messages
        rows = self._rows(
            select(m.c.id, m.c.destination_id, m.c.message_id, m.c.priority, m.c.expires_at,
                   m.c.inflight_epoch, m.c.headers, m.c.body)
            .where(m.c.grp == self.group, m.c.id.in_(ids), deliverable()).order_by(m.c.id))
        return [{"id": r.id, "destination_id": r.destination_id, "message_id": r.message_id,
                 "priority": r.priority, "expires_at": r.expires_at,
                 "inflight": r.inflight_epoch is not None,
                 "headers": json.loads(r.headers), "body": bytes(r.body)} for r in rows]


    # -- scheduled messages ------------------------------------------------------------------
    def scheduled(self, destination_id: int | None,
                  limit: int) -> tuple[list[dict[str, Any]], int]:
        """Scheduled messages, earliest due first (of one destination if given), with a
        body preview and their plan; and how many there are. Through the partial index
        on due times: only scheduled rows are read."""
        m, d = schema.messages, schema.destinations
        where = [m.c.grp == self.group, m.c.deliver_at > literal_column("0")]
        if destination_id is not None:
            where.append(m.c.destination_id == destination_id)
        rows = self._rows(
            select(m.c.id, m.c.message_id, m.c.priority, m.c.enqueued_at, m.c.deliver_at,
                   m.c.schedule, m.c.headers, d.c.name.label("destination"),
                   func.length(m.c.body).label("size"),
                   func.substr(m.c.body, 1, BODY_PREVIEW_BYTES).label("preview"))
            .outerjoin(d, (d.c.grp == m.c.grp) & (d.c.id == m.c.destination_id))
            .where(*where).order_by(m.c.deliver_at, m.c.id).limit(limit))
        total = self._rows(select(func.count()).select_from(m).where(*where))[0][0]
        return [_scheduled_json(r) for r in rows], int(total)

    def scheduled_counts(self, max_age: float = DEPTH_CACHE_SECONDS) -> dict[str, int]:
        """Scheduled messages per destination name: one query, cached ``max_age`` s."""
        if time.monotonic() - self._scheduled_at < max_age:
            return self._scheduled
        m, d = schema.messages, schema.destinations
        # A delayed redelivery (amqlite.broker.redelivery) is a scheduled row that was
        # delivered before: still in its queue's depth, so counted apart too.
        rows = self._rows(
            select(d.c.name, func.count().label("n"),
                   func.sum(case((m.c.delivery_count > 0, 1), else_=0)).label("delayed"))
            .select_from(m.join(d, (d.c.grp == m.c.grp) & (d.c.id == m.c.destination_id)))
            .where(m.c.grp == self.group, m.c.deliver_at > literal_column("0"))
            .group_by(d.c.name))
        self._scheduled = {r.name: int(r.n) for r in rows}
        self.delayed = {r.name: int(r.delayed or 0) for r in rows if r.delayed}
        self._scheduled_at = time.monotonic()
        return self._scheduled


def _scheduled_json(r: Any) -> dict[str, Any]:
    return {
        "id": r.id, "message_id": r.message_id, "destination": r.destination,
        "deliver_at": r.deliver_at, "enqueued_at": r.enqueued_at, "priority": r.priority,
        # delay, period, repeat, cron, fired (copies so far), ttl (ms each copy lives)
        "schedule": json.loads(r.schedule) if r.schedule else None,
        "headers": json.loads(r.headers), **_body_json(_preview(r), r.size),
    }


def _preview(r: Any) -> bytes:
    """A row's ``preview`` column: SQLite's substr() of an empty BLOB is NULL."""
    return bytes(r.preview) if r.preview is not None else b""


def _message_json(r: Any, body: bytes) -> dict[str, Any]:
    return {
        "id": r.id, "message_id": r.message_id, "priority": r.priority,
        "expires_at": r.expires_at or None, "enqueued_at": r.enqueued_at,
        "delivery_count": r.delivery_count, "in_flight": r.inflight_epoch is not None,
        "headers": json.loads(r.headers), **_body_json(body, r.size),
    }


def _body_json(body: bytes, size: int) -> dict[str, Any]:
    """A body (or its first bytes) as text when it is UTF-8, else base64."""
    try:
        text: str | None = body.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    return {"size": size, "body": text,
            "body_base64": None if text is not None else _b64(body),
            "truncated": len(body) < size}


def _b64(data: bytes) -> str:
    import base64

    return base64.b64encode(data).decode()
