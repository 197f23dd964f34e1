"""The checks pushed into PostgreSQL: statements Spark runs as partitions, in the
audit's snapshot, that return only rows at fault and per-slice summaries.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark.audit.checks import as_finding, pg_headers_sha
from spark.audit.limits import (
    DEDUP_GRACE_MS,
    DUPLICATE_CONTENT_WINDOW_MS,
    DUPLICATE_ROWS_PER_STATEMENT,
    EXPIRY_GRACE_MS,
    GAP_BUCKET_SEQS,
)
from spark.audit.reader import StoreReader, grp_in
from spark.audit.source import sql_literal

STORE_CHECK_TYPES = {
    "finding": "string",
    "grp": "string",
    "destination_id": "bigint",
    "msg_id": "bigint",
    "at": "bigint",
    "dedup_key": "string",
    "producer_id": "string",
    "producer_seq": "bigint",
    "sub_id": "bigint",
}


def _groups_cte(groups: Sequence[tuple[str, int, int]]) -> str:
    """``g(grp, window_ms, pruned)``: each group's dedup window and the cut-off of its
    last recorded prune (0 when none: nothing is older)."""
    rows = ", ".join(
        f"({sql_literal(g)}, CAST({w} AS BIGINT), CAST({p} AS BIGINT))" for g, w, p in groups
    )
    return f"g (grp, window_ms, pruned) AS (VALUES {rows})"


def store_check_statement(
    reader: StoreReader, groups: Sequence[tuple[str, int, int]], now_ms: int
) -> tuple[str, dict[str, tuple[int, int]]]:
    """The checks an index answers, run in the store in the snapshot, returning only
    the rows at fault: messages of destinations that are gone (the destinations
    in use found by a loose walk of ix_amq_messages_dest, one probe each), expired
    rows the reaper left (ix_amq_messages_expiry), dedup entries the last recorded
    prune left (ix_amq_dedup_age), and the orphans around pending rows (key and
    index probes). Also, per group, the overdue entries that no recorded prune
    reached: housekeeping pending, (count, oldest created_at)."""
    snap = reader.snapshot
    assert snap is not None
    names = ", ".join(sql_literal(g) for g, _, _ in groups)
    in_use = (
        f"WITH RECURSIVE {_groups_cte(groups)}, d (grp, id) AS ("
        " SELECT grp, (SELECT MIN(m.destination_id) FROM amq_messages m WHERE m.grp = g.grp)"
        " FROM g UNION ALL SELECT d.grp, (SELECT MIN(m.destination_id) FROM amq_messages m"
        " WHERE m.grp = d.grp AND m.destination_id > d.id) FROM d WHERE d.id IS NOT NULL)"
        " SELECT grp, id FROM d WHERE id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM"
        " amq_destinations x WHERE x.grp = d.grp AND x.id = d.id)"
    )
    gone = snap.query(in_use)
    overdue = f"d.created_at < {now_ms - DEDUP_GRACE_MS} - g.window_ms AND g.window_ms > 0"
    pending = {
        str(grp): (int(n), int(oldest))
        for grp, n, oldest in snap.query(
            f"WITH {_groups_cte(groups)} SELECT d.grp, COUNT(*), MIN(d.created_at)"
            f" FROM amq_dedup d JOIN g ON d.grp = g.grp WHERE {overdue}"
            " AND d.created_at >= g.pruned GROUP BY d.grp"
        )
    }
    none = "CAST(NULL AS BIGINT)"
    text = "CAST(NULL AS TEXT)"
    no_dedup = f"{text}, {text}, {none}"
    parts = [
        f"SELECT 'expired_unreaped' AS finding, grp, destination_id, id AS msg_id,"
        f" expires_at AS at, {text} AS dedup_key, {text} AS producer_id,"
        f" {none} AS producer_seq, {none} AS sub_id FROM amq_messages WHERE grp IN ({names})"
        f" AND expires_at > 0 AND expires_at < {now_ms - EXPIRY_GRACE_MS}",
        f"SELECT 'dedup_expired', d.grp, {none}, d.msg_id, d.created_at, d.dedup_key,"
        f" d.producer_id, d.producer_seq, {none} FROM amq_dedup d JOIN g ON d.grp = g.grp"
        f" WHERE {overdue} AND d.created_at < g.pruned",
        # Pending rows: of a subscription that is gone (by the primary key), pointing at
        # no message (a probe of the messages' key each); topic messages owed to nobody
        # (a probe of ix_amq_sub_pending_msg each). A scheduled topic message
        # (deliver_at > 0) is owed to nobody until a copy of it is due.
        f"SELECT 'orphan_subscription', p.grp, m.destination_id, p.msg_id, {none}, {no_dedup},"
        f" p.sub_id FROM amq_sub_pending p LEFT JOIN amq_messages m ON m.grp = p.grp"
        f" AND m.id = p.msg_id WHERE p.grp IN ({names}) AND NOT EXISTS (SELECT 1 FROM"
        " amq_subscriptions s WHERE s.grp = p.grp AND s.id = p.sub_id)",
        f"SELECT 'ack_without_message', p.grp, s.destination_id, p.msg_id, {none}, {no_dedup},"
        f" p.sub_id FROM amq_sub_pending p LEFT JOIN amq_subscriptions s ON s.grp = p.grp"
        f" AND s.id = p.sub_id WHERE p.grp IN ({names}) AND NOT EXISTS (SELECT 1 FROM"
        " amq_messages m WHERE m.grp = p.grp AND m.id = p.msg_id)",
        f"SELECT 'orphan_topic_message', m.grp, m.destination_id, m.id, m.enqueued_at,"
        f" {no_dedup}, {none} FROM amq_messages m JOIN amq_destinations t ON t.grp = m.grp"
        f" AND t.id = m.destination_id WHERE t.grp IN ({names}) AND t.kind = 'topic'"
        " AND COALESCE(m.deliver_at, 0) <= 0 AND NOT EXISTS (SELECT 1 FROM amq_sub_pending p"
        " WHERE p.grp = m.grp AND p.msg_id = m.id)",
    ]
    parts += [
        f"SELECT 'orphan_destination', grp, destination_id, id, enqueued_at, {no_dedup},"
        f" {none} FROM amq_messages WHERE grp = {sql_literal(str(grp))}"
        f" AND destination_id = {int(dest)}"
        for grp, dest in gone
    ]
    return f"WITH {_groups_cte(groups)} " + " UNION ALL ".join(parts), pending


def store_findings(sf: DataFrame, now_ms: int) -> list[DataFrame]:
    """The pushed-down checks' rows as findings, each named as it always was."""

    def rows(name: str) -> DataFrame:
        return sf.where(F.col("finding") == name)

    now = F.lit(now_ms)
    gone = rows("orphan_destination").withColumnRenamed("at", "enqueued_at")
    # The reaper takes expired rows whether in flight or not (store/sql.py
    # ``reap_expired``), so in-flight rows are no excuse.
    expired = rows("expired_unreaped").select(
        "grp", "destination_id", "msg_id", F.col("at").alias("expires_at"),
        (now - F.col("at")).alias("overdue_ms"),
    )  # fmt: skip
    old = rows("dedup_expired").select(
        "grp", "destination_id", "dedup_key", "producer_id", "producer_seq", "msg_id",
        F.col("at").alias("created_at"), (now - F.col("at")).alias("age_ms"),
    )  # fmt: skip
    expiry = ["grp", "destination_id", "msg_id", "expires_at", "overdue_ms"]
    age = ["grp", "dedup_key", "producer_id", "producer_seq", "msg_id", "created_at", "age_ms"]
    owed = ["grp", "destination_id", "sub_id", "msg_id"]
    message = ["grp", "destination_id", "msg_id", "enqueued_at"]
    unowed = rows("orphan_topic_message").withColumnRenamed("at", "enqueued_at")
    return [
        as_finding("orphan_destination", gone, message),
        as_finding("orphan_subscription", rows("orphan_subscription"), owed),
        as_finding("orphan_topic_message", unowed, message),
        as_finding("ack_without_message", rows("ack_without_message"), owed),
        as_finding("expired_unreaped", expired, expiry),
        as_finding("dedup_expired", old, age),
    ]


# --------------------------------------------------------------------------- pushed into PostgreSQL

#: Columns of each finding the store judges on PostgreSQL (``identity_findings``,
#: ``content_findings``, the slices' stale rows): what Spark's own check of the same
#: name reports, so that both backends write the same rows.
IDENTITY_FINDING = {
    "grp": "string", "destination_id": "bigint", "msg_id": "bigint", "identity": "string",
    "copies": "bigint", "first_msg_id": "bigint",
}  # fmt: skip
CONTENT_FINDING = {
    "grp": "string", "destination_id": "bigint", "msg_id": "bigint", "producer_id": "string",
    "dedup_key": "string", "previous_msg_id": "bigint", "previous_dedup_key": "string",
    "apart_ms": "bigint", "body_sha256": "string",
}  # fmt: skip
STALE_FINDING = {
    "grp": "string", "destination_id": "bigint", "msg_id": "bigint", "sub_id": "bigint",
    "inflight_epoch": "bigint", "current_epoch": "bigint", "epoch_started_at": "bigint",
    "live_master": "string",
}  # fmt: skip
#: A run of consecutive sequence numbers of one producer inside one gap bucket.
RUN_TYPES = {"grp": "string", "producer_id": "string", "lo": "bigint", "hi": "bigint"}
#: A slice of amq_messages: its runs (producer_id set) and its stale rows (msg_id set).
SLICE_TYPES = {**RUN_TYPES, **STALE_FINDING}


def _identity_sql(prefix: str = "") -> str:
    """A message's identity in SQL, as ``_identity`` has it in Spark."""
    p = prefix
    return f"COALESCE({p}dedup_key, {p}producer_id || ':' || {p}producer_seq)"


def _shares(reader: StoreReader, pack: list[str]) -> list[str]:
    """A pack's statements for a check that compares rows across a whole group: one,
    or for a single group of more than ``DUPLICATE_ROWS_PER_STATEMENT`` rows that
    many shares of it, each a hash class of ``{key}`` (rows that must be compared
    hash alike, so every share is judged on its own, in parallel)."""
    rows = sum(reader.group_counts("amq_messages").get(g, 0) for g in pack)
    shares = max(1, -(-rows // DUPLICATE_ROWS_PER_STATEMENT)) if len(pack) == 1 else 1
    if shares == 1:
        return ["TRUE"]
    return [f"abs(hashtext({{key}}) % {shares}) = {i}" for i in range(shares)]


def identity_statements(reader: StoreReader) -> list[str]:
    """``check_duplicate_identity`` in the store, per group (small ones packed):
    the candidates are every row of an identity stored more than once (a hash
    aggregate) and every row whose identity's dedup entry names another message (a
    hash join with amq_dedup); a group's candidates are all in its statement, so it
    judges them too (a healthy store has none). The rule, as in Spark: every row
    but an identity's first is surplus, and all are when its dedup entry names a
    message that is not among them (that first copy was consumed). A big group is
    several statements, a hash class of identities each (``_shares``)."""
    statements = []
    ident, m_ident = _identity_sql(), _identity_sql("m.")
    for pack in reader.group_packs("amq_messages"):
        for share in _shares(reader, pack):
            mine, m_mine = share.format(key=ident), share.format(key=m_ident)
            statements.append(
                "WITH cand AS MATERIALIZED ("
                f"SELECT grp, id, destination_id, {ident} AS identity, CAST(NULL AS BIGINT) AS d"
                f" FROM amq_messages WHERE {grp_in(pack)} AND {mine} AND (grp, {ident}) IN (SELECT"
                f" grp, {ident} FROM amq_messages WHERE {grp_in(pack)} AND {ident} IS NOT NULL"
                f" AND {mine} GROUP BY 1, 2 HAVING COUNT(*) > 1)"
                f" UNION ALL SELECT m.grp, m.id, m.destination_id, {m_ident}, d.msg_id"
                " FROM amq_messages m JOIN amq_dedup d ON d.grp = m.grp"
                f" AND d.dedup_key = {m_ident}"
                f" WHERE {grp_in(pack, 'm.grp')} AND {m_mine} AND d.msg_id <> m.id),"
                " cand_ids AS (SELECT grp, id, MIN(destination_id) AS destination_id,"
                " MIN(identity) AS identity FROM cand GROUP BY grp, id),"
                " cand_keys AS (SELECT grp, identity, MAX(d) AS d FROM cand"
                " GROUP BY grp, identity),"
                " judged AS (SELECT r.grp, r.id, r.destination_id, r.identity, k.d,"
                " COUNT(*) OVER w AS n, MIN(r.id) OVER w AS first_id, k.d IS NOT NULL AND NOT"
                " COALESCE(BOOL_OR(r.id = k.d) OVER w, FALSE) AS ghost FROM cand_ids r"
                " JOIN cand_keys k ON k.grp = r.grp AND k.identity = r.identity"
                " WINDOW w AS (PARTITION BY r.grp, r.identity))"
                " SELECT grp, destination_id, id AS msg_id, identity,"
                " n + CASE WHEN ghost THEN 1 ELSE 0 END AS copies,"
                " CASE WHEN ghost THEN d ELSE first_id END AS first_msg_id"
                " FROM judged WHERE id <> first_id OR ghost"
            )
    return statements


def content_statements(reader: StoreReader) -> list[str]:
    """``check_duplicate_content`` in the store, per group (small ones packed): only
    rows whose producer stored their body more than once (md5 in a hash aggregate)
    are hashed (body; headers without the identity headers) and compared with the
    previous copy of the same content. A big group is several statements, a hash
    class of producers each (``_shares``: one producer's copies are in one)."""
    statements = []
    cols = "grp, id, destination_id, producer_id, dedup_key, enqueued_at"
    for pack in reader.group_packs("amq_messages"):
        for share in _shares(reader, pack):
            mine = share.format(key="producer_id")
            statements.append(
                f"SELECT grp, destination_id, id AS msg_id, producer_id, dedup_key,"
                " prev_id AS previous_msg_id, prev_key AS previous_dedup_key,"
                " enqueued_at - prev_at AS apart_ms, encode(body_sha, 'hex') AS body_sha256"
                f" FROM (SELECT {cols}, body_sha, LAG(enqueued_at) OVER w AS prev_at,"
                " LAG(id) OVER w AS prev_id, LAG(dedup_key) OVER w AS prev_key"
                f" FROM (SELECT {cols}, sha256(body) AS body_sha,"
                f" {pg_headers_sha()} AS headers_sha"
                f" FROM amq_messages WHERE {grp_in(pack)} AND producer_id IS NOT NULL AND {mine}"
                " AND (grp, producer_id, md5(body)) IN (SELECT grp, producer_id, md5(body)"
                f" FROM amq_messages WHERE {grp_in(pack)} AND producer_id IS NOT NULL AND {mine}"
                " GROUP BY 1, 2, 3 HAVING COUNT(*) > 1)) cand"
                " WINDOW w AS (PARTITION BY grp, producer_id, body_sha, headers_sha"
                " ORDER BY enqueued_at, id)) amq_x"
                " WHERE prev_at IS NOT NULL"
                f" AND enqueued_at - prev_at <= {DUPLICATE_CONTENT_WINDOW_MS}"
                " AND NOT (dedup_key IS NOT NULL AND dedup_key IS NOT DISTINCT FROM prev_key)"
            )
    return statements


def _runs_sql(table: str, where: str) -> str:
    """The runs of consecutive sequence numbers per producer and gap bucket among
    the rows of ``table`` that ``where`` picks (islands: a number minus its dense
    rank is constant along a run). A healthy slice is one run per producer; only
    holes (and numbers that interleave with another slice's) add runs. Sorted by
    bytes (COLLATE "C"): cheaper than the database's collation, and any one order
    does."""
    return (
        "SELECT grp, producer_id, MIN(seq) AS lo, MAX(seq) AS hi FROM (SELECT grp, producer_id,"
        f" producer_seq AS seq, producer_seq / {GAP_BUCKET_SEQS} AS b, producer_seq - DENSE_RANK()"
        f' OVER (PARTITION BY grp, producer_id COLLATE "C", producer_seq / {GAP_BUCKET_SEQS}'
        f" ORDER BY producer_seq) AS isl FROM {table} WHERE ({where})"
        " AND producer_id IS NOT NULL AND producer_seq IS NOT NULL) amq_s"
        " GROUP BY grp, producer_id, b, isl"
    )


#: A settled group as the stale checks need it: (group, current epoch, when that
#: epoch began, the live master or None).
Settled = tuple[str, int, int | None, str | None]


def _epochs_values(settled: Sequence[Settled]) -> str:
    """The settled groups as a VALUES list joined by the stale checks."""
    def text(v: str | None) -> str:
        return "CAST(NULL AS TEXT)" if v is None else f"CAST({sql_literal(v)} AS TEXT)"

    def number(v: int | None) -> str:
        return f"CAST({'NULL' if v is None else int(v)} AS BIGINT)"

    rows = ", ".join(
        f"({sql_literal(g)}, {number(e)}, {number(at)}, {text(live)})"
        for g, e, at, live in settled
    )
    return f"(VALUES {rows}) amq_e (e_grp, e_epoch, e_started, e_live)"


def slice_statements(reader: StoreReader, settled: Sequence[Settled]) -> list[str]:
    """amq_messages cut at quantiles of its key, one statement per slice: the
    slice's runs of sequence numbers, and its rows in flight under an older epoch
    of a settled group (``check_stale_inflight``'s queue rows, judged here)."""
    none, text = "CAST(NULL AS BIGINT)", "CAST(NULL AS TEXT)"
    statements = []
    for pred in reader.key_predicates("amq_messages", "id"):
        sql = (
            f"SELECT grp, producer_id, lo, hi, {none} AS destination_id, {none} AS msg_id,"
            f" {none} AS sub_id, {none} AS inflight_epoch, {none} AS current_epoch,"
            f" {none} AS epoch_started_at, {text} AS live_master"
            f" FROM ({_runs_sql('amq_messages', pred)}) amq_r"
        )
        if settled:
            sql += (
                f" UNION ALL SELECT grp, {text}, {none}, {none}, destination_id, id, {none},"
                f" inflight_epoch, e_epoch, e_started, e_live FROM amq_messages"
                f" JOIN {_epochs_values(settled)} ON e_grp = grp"
                f" WHERE ({pred}) AND inflight_epoch < e_epoch"
            )
        statements.append(sql)
    return statements


def dedup_run_statements(reader: StoreReader) -> list[str]:
    """amq_dedup cut at quantiles of created_at (ix_amq_dedup_age), one statement
    per slice: its runs. Quantiles, not min/max strides (one old entry made one
    stride hold every other row); and not ranges of the key: entries are stored in
    the order they were made, so a range of keys ("p1:1".."p1:5") is spread over the
    whole table and every slice read most of its pages (9.5 s of statements at a
    million entries, against 2 by created_at)."""
    preds = reader.key_predicates("amq_dedup", "created_at")
    return [_runs_sql("amq_dedup", p) for p in preds]


def stale_pending_statements(reader: StoreReader, settled: Sequence[Settled]) -> list[str]:
    """``check_stale_inflight``'s pending rows, judged in the store: in flight under
    an older epoch of a settled group, read in slices of amq_sub_pending; the
    destination is the subscription's."""
    # Also what it reads, for the summary.
    preds = reader.key_predicates("amq_sub_pending", "msg_id")
    if not settled:
        return []
    select = (
        "SELECT p.grp, s.destination_id, p.msg_id, p.sub_id, p.inflight_epoch,"
        " e_epoch AS current_epoch, e_started AS epoch_started_at, e_live AS live_master"
        f" FROM amq_sub_pending p JOIN {_epochs_values(settled)} ON e_grp = p.grp"
        " LEFT JOIN amq_subscriptions s ON s.grp = p.grp AND s.id = p.sub_id"
        " WHERE p.inflight_epoch < e_epoch"
    )
    return [f"SELECT * FROM ({select}) amq_t WHERE {p}" for p in preds]
