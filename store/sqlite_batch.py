"""The group commit on SQLite, for the hot shapes, on the sqlite3 connection itself.

Through SQLAlchemy a W1-shaped commit (two dozen SENDs, the ACKs of the commit
before, the totals) cost the store thread about 880 µs of CPU, where the same
statements on the bare connection cost about 500: the rest was SQLAlchemy's
per-statement work (a connection checked out and returned, an execution context per
statement, expanding IN lists compiled again each time; bench/README.md, "Issue 25,
session 18"). On the embedded store that thread is
the broker's long pole (W4). Here the same statements go straight to the DB-API
connection, which the store thread keeps for itself as PostgreSQL's path keeps its
writer (``store.pg_batch``).

Which batches: those ``pg_batch.fits`` (queue messages, producer identities, queue
undeliveries, deliveries, releases and acks, the totals); everything else goes the
step-by-step way. What is written is the step-by-step path's, statement for
statement in the same order, inside one ``BEGIN IMMEDIATE`` transaction whose
first statement is the fence (``store.fencing``); a failure rolls back all of it.
"""

from __future__ import annotations

import contextlib
import sqlite3

from store.api import Batch, BatchResult, Fenced
from store.fencing import Changes
from store.rows import deliveries_by_times, fresh_only, message_row
from store.statements import IN_CHUNK, Statements, chunks, encode_headers

FENCE = ("UPDATE amq_groups SET msg_count = msg_count + ?, max_msg_id = max(max_msg_id, ?), "
         "checkpoint_at = ? WHERE grp = ? AND epoch = ?")
DEDUP_LOOKUP = "SELECT dedup_key FROM amq_dedup WHERE grp = ? AND dedup_key IN ({})"
UNDELIVER = ("UPDATE amq_messages SET delivery_count = delivery_count - 1, "
             "inflight_epoch = NULL WHERE grp = ? AND id IN ({})")
DELIVER = ("UPDATE amq_messages SET delivery_count = delivery_count + ?, inflight_epoch = ? "
           "WHERE grp = ? AND id IN ({})")
RELEASE = "UPDATE amq_messages SET inflight_epoch = NULL WHERE grp = ? AND id IN ({})"
ACK = "DELETE FROM amq_messages WHERE grp = ? AND id IN ({}) RETURNING destination_id"
DEPTH = "UPDATE amq_destinations SET depth = depth + ? WHERE grp = ? AND id = ?"
COUNT_FIX = "UPDATE amq_groups SET msg_count = msg_count + ? WHERE grp = ?"


def commit(db: sqlite3.Connection, st: Statements, description: str, group: str, epoch: int,
           batch: Batch, now: int) -> BatchResult:
    """Write ``batch`` in one fenced transaction. Raises ``Fenced`` (nothing
    written) or what sqlite3 raises (rolled back; the caller maps it)."""
    cur = db.cursor()
    cur.execute("BEGIN IMMEDIATE")
    try:
        result = _write(cur, st, description, group, epoch, batch, now)
        cur.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                cur.execute("ROLLBACK")
        raise
    return result


def _write(cur: sqlite3.Cursor, st: Statements, description: str, g: str, epoch: int,
           batch: Batch, now: int) -> BatchResult:
    result = BatchResult()
    ch = Changes()
    inserts = batch.inserts
    acks = [mid for _, mid in batch.acks]  # queue acks only (pg_batch.fits)
    # As the step-by-step path: the fence carries the expected change of msg_count,
    # corrected at the end when what really happened differs.
    predicted = len(inserts) - len(acks)
    max_id = max((x.id for x in inserts), default=0)
    cur.execute(FENCE, (predicted, max_id, now, g, epoch))
    if cur.rowcount != 1:
        raise Fenced(f"{description}: group {g!r} is no longer at epoch {epoch}")
    if inserts or batch.identities:
        _insert(cur, st, g, epoch, batch, now, result, ch)
    _by_ids(cur, UNDELIVER, (g,), batch.undeliveries)
    for (_, n), mids in deliveries_by_times(batch).items():  # queues only (pg_batch.fits)
        _by_ids(cur, DELIVER, (n, epoch, g), mids)
    _by_ids(cur, RELEASE, (g,), [mid for _, mid in batch.releases])
    for chunk in chunks(acks, IN_CHUNK):
        ch.deleted_messages([row[0] for row in cur.execute(
            ACK.format(_marks(len(chunk))), (g, *chunk))])
    if batch.counters:
        cur.executemany(st.add_counts, [(g, did, *deltas)
                                        for did, deltas in batch.counters.items()])
    depth = [(n, g, did) for did, n in ch.depth.items() if n]
    if depth:
        cur.executemany(DEPTH, depth)
    if ch.msgs != predicted:
        cur.execute(COUNT_FIX, (ch.msgs - predicted, g))
    return result


def _insert(cur: sqlite3.Cursor, st: Statements, g: str, epoch: int, batch: Batch, now: int,
            result: BatchResult, ch: Changes) -> None:
    """Messages and dedup rows, less the repeats of a stored key or of one earlier in
    the batch (the step-by-step path's ``_insert``)."""
    keys = list({x.dedup_key for x in (*batch.inserts, *batch.identities)
                 if x.dedup_key is not None})
    stored: set[str] = set()
    for chunk in chunks(keys, IN_CHUNK):
        stored.update(row[0] for row in cur.execute(
            DEDUP_LOOKUP.format(_marks(len(chunk))), (g, *chunk)))
    inserts, identities = fresh_only(batch.inserts, batch.identities, stored, result)
    # (grp, dedup_key, producer_id, producer_seq, msg_id, created_at)
    dedup: list[tuple[str, str | None, str | None, int | None, int | None, int]] = [
        (g, x.dedup_key, x.producer_id, x.producer_seq, None, now) for x in identities]
    if inserts:
        rows = []
        depth = ch.depth
        for x in inserts:
            rows.append(message_row(g, epoch, x, now, encode_headers))
            depth[x.destination_id] += 1  # pg_batch.fits: no scheduled message here
            if x.dedup_key is not None:
                dedup.append((g, x.dedup_key, x.producer_id, x.producer_seq, x.id, now))
        ch.msgs += len(rows)
        cur.executemany(st.ins_msg, rows)
    if dedup:
        cur.executemany(st.ins_dedup, dedup)


def _by_ids(cur: sqlite3.Cursor, sql: str, head: tuple[object, ...], ids: list[int]) -> None:
    """``sql`` (parameters ``head``, then an IN list) over ``ids``, a chunk at a time."""
    for chunk in chunks(ids, IN_CHUNK):
        cur.execute(sql.format(_marks(len(chunk))), (*head, *chunk))


def _marks(n: int) -> str:
    return ",".join("?" * n)
