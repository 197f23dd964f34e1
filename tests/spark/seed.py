"""Seed a store the way a healthy broker leaves it, then damage it with SQL.

Rows go in with SQLAlchemy Core against ``store.schema`` (not through
``store.sql``, which is being written in parallel); damage is raw SQL, one
kind per group, so that one audit run proves every finding type at once and
that each group reports exactly its own damage and nothing else.

The healthy group also holds the borderline cases that must *not* be
reported: rows just inside each grace, an expired row still in flight,
consumed messages whose dedup entries are gone (below the gap floor), equal
bodies from different producers or far apart in time.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from sqlalchemy import Connection, create_engine, insert, text

from spark.audit_job import (
    DEDUP_GRACE_MS,
    DUPLICATE_CONTENT_WINDOW_MS,
    EXPIRY_GRACE_MS,
    STALE_INFLIGHT_GRACE_MS,
)
from store.housekeeping import dedup_pruned_key
from store.schema import (
    dedup,
    destinations,
    groups,
    messages,
    meta,
    metadata,
    registry,
    sub_pending,
    subscriptions,
)

MINUTE_MS = 60_000
HOUR_MS = 60 * MINUTE_MS
#: The broker's default dedup window (amqlite/settings.py DEFAULT_DEDUP_WINDOW).
WINDOW_MS = 600_000
EPOCH = 3

# Destination ids of every seeded group.
ORDERS, AUDIT, PRICES, OLD = 1, 2, 3, 4


@dataclass(frozen=True)
class Damage:
    """One kind of damage: the SQL that makes it and what the audit must say."""

    finding: str
    count: int  # summed over the group: rows, or missing numbers for gaps
    rows: int  # finding rows written
    destinations: dict[str, int]  # destination label -> count


def engine_url(url: str) -> str:
    """SQLAlchemy needs the driver named; the audit takes the plain URL."""
    if url.startswith("postgresql://"):
        return "postgresql+psycopg://" + url[len("postgresql://") :]
    return url


def _headers(user: dict[str, str], producer: str | None, seq: int | None) -> str:
    """As the broker stores them: the user's headers with the client's identity
    headers (amqlite/client/asyncclient.py), in frame order, compact JSON."""
    headers = dict(user)
    if producer is not None:
        headers |= {"amqlite.producerId": producer, "amqlite.producerSeq": str(seq)}
    return json.dumps(headers, separators=(",", ":"))


def _msg(
    grp: str,
    id_: int,
    dest: int,
    at: int,
    body: bytes,
    *,
    producer: str | None = None,
    seq: int | None = None,
    key: str | None = None,
    headers: dict[str, str] | None = None,
    expires_at: int = 0,
    inflight: int | None = None,
) -> dict[str, object]:
    return {
        "grp": grp,
        "id": id_,
        "destination_id": dest,
        "message_id": f"ID:{grp}-{id_}",
        "producer_id": producer,
        "producer_seq": seq,
        "dedup_key": key if key is not None else (f"{producer}:{seq}" if producer else None),
        "priority": 4,
        "expires_at": expires_at,
        "enqueued_at": at,
        "delivery_count": 1 if inflight is not None else 0,
        "inflight_epoch": inflight,
        "headers": _headers(headers or {"persistent": "true"}, producer, seq),
        "body": body,
    }


def seed_group(
    conn: Connection,
    grp: str,
    now: int,
    *,
    epoch_started_at: int | None = None,
    dedup_window_ms: int = WINDOW_MS,
) -> None:
    """A healthy group: 33 message ids allocated, 23 rows stored.

    p1: seq 1-10 consumed (dedup only, ids 1-10), 11-16 on /queue/orders,
        17-20 on /topic/prices (sub 1 owes 17-20, sub 2 acked 17 and 18).
    p2: seq 1-5 on /queue/audit (ids 21-25).
    p3: seq 1-2 from two hours ago on /queue/old (ids 26-27, dedup pruned),
        3-49 consumed and pruned, 50-52 recent (ids 28-30).
    no producer: ids 31-33 on /queue/orders, the client's own ids, same body.
    """
    started = epoch_started_at if epoch_started_at is not None else now - HOUR_MS
    conn.execute(
        insert(groups).values(
            grp=grp,
            epoch=EPOCH,
            master=f"{grp}-node1",
            epoch_started_at=started,
            msg_count=23,
            max_msg_id=33,
            checkpoint_at=now,
            dedup_window_ms=dedup_window_ms,
        )
    )
    # The master's housekeeping pruned a grace ago (store/housekeeping.py records it):
    # every dedup entry older than the window then was gone.
    pruned_at = now - DEDUP_GRACE_MS
    conn.execute(
        insert(meta).values(
            key=dedup_pruned_key(grp),
            value=json.dumps(
                {"grp": grp, "before": pruned_at - dedup_window_ms, "at": pruned_at}
            ),
        )
    )
    conn.execute(
        insert(registry).values(
            grp=grp,
            name=f"{grp}-node1",
            role="master",
            services="tcp://127.0.0.1:61613",
            epoch=EPOCH,
            started_at=started,
            heartbeat_at=now,
        )
    )
    conn.execute(
        insert(destinations),
        [
            {"grp": grp, "id": i, "name": n, "kind": k, "created_at": now - 3 * HOUR_MS}
            for i, n, k in (
                (ORDERS, "/queue/orders", "queue"),
                (AUDIT, "/queue/audit", "queue"),
                (PRICES, "/topic/prices", "topic"),
                (OLD, "/queue/old", "queue"),
            )
        ],
    )
    conn.execute(
        insert(subscriptions),
        [
            {
                "grp": grp,
                "id": 1,
                "client_id": "c1",
                "name": "s1",
                "destination_id": PRICES,
                "created_at": now - 3 * HOUR_MS,
            },
            {
                "grp": grp,
                "id": 2,
                "client_id": "c2",
                "name": "s2",
                "destination_id": PRICES,
                "created_at": now - 3 * HOUR_MS,
            },
        ],
    )
    rows: list[dict[str, object]] = []
    ded: list[dict[str, object]] = []

    def remember(producer: str | None, seq: int | None, key: str, msg_id: int, at: int) -> None:
        ded.append(
            {
                "grp": grp,
                "dedup_key": key,
                "producer_id": producer,
                "producer_seq": seq,
                "msg_id": msg_id,
                "created_at": at,
            }
        )

    # p1: 20 sends over the last five minutes; the first just inside the window + grace.
    for seq in range(1, 21):
        at = now - 5 * MINUTE_MS + seq * 1000
        if seq == 1:
            at = now - dedup_window_ms - DEDUP_GRACE_MS + 1000
        remember("p1", seq, f"p1:{seq}", seq, at)
        if seq <= 10:
            continue  # consumed
        dest = ORDERS if seq <= 16 else PRICES
        body = b"same body" if seq == 12 else f"p1 order {seq}".encode()
        extra: dict[str, object] = {}
        if seq == 11:  # in flight under the live epoch
            extra = {"inflight": EPOCH}
        if seq == 16:  # expired, but the reaper still has its grace
            extra = {"expires_at": now - EXPIRY_GRACE_MS + 1000}
        if seq == 15:
            extra = {"expires_at": now + HOUR_MS}
        rows.append(_msg(grp, seq, dest, at, body, producer="p1", seq=seq, **extra))
    # p2: equal bodies two minutes apart (outside the content window), one equal
    # to p1's seq 12 (another producer).
    for seq in range(1, 6):
        id_ = 20 + seq
        at = now - 8 * MINUTE_MS + seq * (DUPLICATE_CONTENT_WINDOW_MS + 1000)
        body = {1: b"same body", 2: b"twice", 3: b"twice"}.get(seq, f"p2 {seq}".encode())
        remember("p2", seq, f"p2:{seq}", id_, at)
        rows.append(_msg(grp, id_, AUDIT, at, body, producer="p2", seq=seq))
    # p3: old unconsumed messages below the dedup floor, then recent ones.
    for seq, id_ in ((1, 26), (2, 27), (50, 28), (51, 29), (52, 30)):
        at = now - 2 * HOUR_MS + seq if seq < 3 else now - MINUTE_MS + seq
        if seq >= 50:
            remember("p3", seq, f"p3:{seq}", id_, at)
        rows.append(_msg(grp, id_, OLD, at, f"p3 {seq}".encode(), producer="p3", seq=seq))
    # No producer identity: the client's own ids; equal bodies are not content duplicates.
    for i, id_ in enumerate((31, 32, 33), start=1):
        at = now - MINUTE_MS + i
        key = f"client-{grp}-{i}"
        remember(None, None, key, id_, at)
        rows.append(_msg(grp, id_, ORDERS, at, b"ping", key=key))
    conn.execute(insert(messages), rows)
    conn.execute(insert(dedup), ded)
    pending = [(1, 17), (1, 18), (1, 19), (1, 20), (2, 19), (2, 20)]
    conn.execute(
        insert(sub_pending),
        [
            {
                "grp": grp,
                "sub_id": s,
                "msg_id": m,
                "delivery_count": 0,
                "inflight_epoch": EPOCH if (s, m) == (1, 17) else None,
            }
            for s, m in pending
        ],
    )


#: Damage per finding type: SQL statements (run with :g = group, :now) and the verdict.
DAMAGE: dict[str, tuple[list[str], Damage]] = {
    "duplicate_identity": (
        [
            # Two more copies of p1:13, one of p1:12 (a failover re-send stored again)...
            "INSERT INTO amq_messages (grp, id, destination_id, message_id, producer_id,"
            " producer_seq, dedup_key, priority, expires_at, enqueued_at, delivery_count,"
            " inflight_epoch, headers, body)"
            " SELECT grp, id + 90, destination_id, message_id, producer_id, producer_seq,"
            " dedup_key, priority, expires_at, enqueued_at, delivery_count, inflight_epoch,"
            " headers, body FROM amq_messages WHERE grp = :g AND id IN (12, 13)",
            "INSERT INTO amq_messages (grp, id, destination_id, message_id, producer_id,"
            " producer_seq, dedup_key, priority, expires_at, enqueued_at, delivery_count,"
            " inflight_epoch, headers, body)"
            " SELECT grp, 104, destination_id, message_id, producer_id, producer_seq,"
            " dedup_key, priority, expires_at, enqueued_at, delivery_count, inflight_epoch,"
            " headers, body FROM amq_messages WHERE grp = :g AND id = 13",
            # ...and p1:5 stored again after its first copy (id 5) was consumed.
            "INSERT INTO amq_messages (grp, id, destination_id, message_id, producer_id,"
            " producer_seq, dedup_key, priority, expires_at, enqueued_at, delivery_count,"
            " headers, body) VALUES (:g, 105, 1, 'ID:again-5', 'p1', 5, 'p1:5', 4, 0,"
            " :now - 1000, 0, '{}', :ghost_body)",
        ],
        Damage("duplicate_identity", 4, 4, {"/queue/orders": 4}),
    ),
    "duplicate_content": (
        [
            # p1 sends one payload three times in 20 s, each under a new identity (the
            # stored headers differ in the sequence number, the last also in key order).
            "INSERT INTO amq_messages (grp, id, destination_id, message_id, producer_id,"
            " producer_seq, dedup_key, priority, expires_at, enqueued_at, delivery_count,"
            " headers, body) VALUES"
            " (:g, 34, 1, 'ID:c-34', 'p1', 21, 'p1:21', 4, 0, :now - 30000, 0, :h21,"
            " :dup_body),"
            " (:g, 35, 1, 'ID:c-35', 'p1', 22, 'p1:22', 4, 0, :now - 20000, 0, :h22,"
            " :dup_body),"
            " (:g, 36, 1, 'ID:c-36', 'p1', 23, 'p1:23', 4, 0, :now - 10000, 0, :h23,"
            " :dup_body)",
            "INSERT INTO amq_dedup (grp, dedup_key, producer_id, producer_seq, msg_id, created_at)"
            " VALUES (:g, 'p1:21', 'p1', 21, 34, :now - 30000),"
            " (:g, 'p1:22', 'p1', 22, 35, :now - 20000),"
            " (:g, 'p1:23', 'p1', 23, 36, :now - 10000)",
        ],
        Damage("duplicate_content", 2, 2, {"/queue/orders": 2}),
    ),
    "orphan_destination": (
        ["DELETE FROM amq_destinations WHERE grp = :g AND id = 2"],
        Damage("orphan_destination", 5, 5, {"#2 (gone)": 5}),
    ),
    "orphan_subscription": (
        ["DELETE FROM amq_subscriptions WHERE grp = :g AND id = 2"],
        Damage("orphan_subscription", 2, 2, {"/topic/prices": 2}),
    ),
    "orphan_topic_message": (
        ["DELETE FROM amq_sub_pending WHERE grp = :g AND msg_id = 19"],
        Damage("orphan_topic_message", 1, 1, {"/topic/prices": 1}),
    ),
    "ack_without_message": (
        [
            "INSERT INTO amq_sub_pending (grp, sub_id, msg_id, delivery_count)"
            " VALUES (:g, 1, 8, 0), (:g, 2, 9, 0)"
        ],
        Damage("ack_without_message", 2, 2, {"/topic/prices": 2}),
    ),
    "stale_inflight": (
        [
            "UPDATE amq_messages SET inflight_epoch = 2 WHERE grp = :g AND id IN (12, 13)",
            "UPDATE amq_sub_pending SET inflight_epoch = 1"
            " WHERE grp = :g AND sub_id = 2 AND msg_id = 20",
        ],
        Damage("stale_inflight", 3, 3, {"/queue/orders": 2, "/topic/prices": 1}),
    ),
    "expired_unreaped": (
        [
            "UPDATE amq_messages SET expires_at = :now - 600000"
            " WHERE grp = :g AND id IN (13, 14, 27)",
        ],
        Damage("expired_unreaped", 3, 3, {"/queue/orders": 2, "/queue/old": 1}),
    ),
    "dedup_expired": (
        [
            f"UPDATE amq_dedup SET created_at = :now - {WINDOW_MS + DEDUP_GRACE_MS + 1000}"
            " WHERE grp = :g AND producer_id = 'p1' AND producer_seq IN (2, 3, 4, 5)",
        ],
        Damage("dedup_expired", 4, 4, {"-": 4}),
    ),
    "sequence_gap": (
        [
            # Three consumed numbers lose their dedup entries early; message p1:14 vanishes.
            "DELETE FROM amq_dedup WHERE grp = :g AND producer_id = 'p1'"
            " AND producer_seq IN (3, 4, 5)",
            "DELETE FROM amq_messages WHERE grp = :g AND id = 14",
            "DELETE FROM amq_dedup WHERE grp = :g AND dedup_key = 'p1:14'",
        ],
        Damage("sequence_gap", 4, 2, {"-": 4}),
    ),
}

#: Groups that are healthy although they look borderline.
CLEAN_GROUPS = ("alpha", "recent_failover", "no_window")


def seed_clean(conn: Connection, now: int) -> None:
    """Healthy groups, including a failover inside the grace and a group that
    keeps dedup entries forever (window 0)."""
    seed_group(conn, "alpha", now)
    seed_group(conn, "recent_failover", now, epoch_started_at=now - STALE_INFLIGHT_GRACE_MS + 1000)
    conn.execute(
        text(
            "UPDATE amq_messages SET inflight_epoch = 2 WHERE grp = 'recent_failover'"
            " AND id IN (12, 13)"
        )
    )
    conn.execute(
        text(
            "UPDATE amq_sub_pending SET inflight_epoch = 2 WHERE grp = 'recent_failover'"
            " AND sub_id = 2 AND msg_id = 20"
        )
    )
    seed_group(conn, "no_window", now, dedup_window_ms=0)
    conn.execute(
        text("UPDATE amq_dedup SET created_at = :old WHERE grp = 'no_window'"),
        {"old": now - 10 * HOUR_MS},
    )


def seed_damaged(conn: Connection, now: int) -> None:
    """The clean groups, plus one group per finding type carrying only that damage."""
    seed_clean(conn, now)
    for finding, (statements, _) in DAMAGE.items():
        seed_group(conn, finding, now)
        for sql in statements:
            conn.execute(
                text(sql),
                {
                    "g": finding,
                    "now": now,
                    "ghost_body": b"again",
                    "dup_body": b"resent payload",
                    "h21": _headers({"k": "v"}, "p1", 21),
                    "h22": _headers({"k": "v"}, "p1", 22),
                    "h23": json.dumps(
                        {"amqlite.producerSeq": "23", "k": "v", "amqlite.producerId": "p1"}
                    ),
                },
            )


def create_store(url: str, now: int, *, damaged: bool) -> None:
    """Create the schema at ``url`` and seed it."""
    engine = create_engine(engine_url(url))
    try:
        metadata.create_all(engine)
        with engine.begin() as conn:
            (seed_damaged if damaged else seed_clean)(conn, now)
    finally:
        engine.dispose()
