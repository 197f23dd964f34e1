"""The checks Spark runs on rows it read (SQLite; and the merges across
partitions on PostgreSQL): duplicates, stale in-flight rows, sequence gaps.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from spark.audit.limits import (
    DUPLICATE_CONTENT_WINDOW_MS,
    GAP_BUCKET_SEQS,
    IDENTITY_HEADERS,
    STALE_INFLIGHT_GRACE_MS,
    STORE_COLUMNS,
)
from spark.audit.source import sql_literal

MESSAGE_CONTENT = ("headers", "body")
#: The amq_messages columns every check reads.
MESSAGE_TYPES = {
    c: t for c, t in STORE_COLUMNS["amq_messages"].items() if c not in MESSAGE_CONTENT
}


def message_select() -> tuple[str, dict[str, str]]:
    """SQLite: every row, with what the checks need (Spark hashes bodies and
    headers: the file has no sha256)."""
    columns = STORE_COLUMNS["amq_messages"]
    types = {**MESSAGE_TYPES, "body": columns["body"], "headers": columns["headers"]}
    return f"SELECT {', '.join(types)} FROM amq_messages", types


def pg_headers_sha(prefix: str = "") -> str:
    """The headers' sha256 without the identity headers, as ``hash_content``
    computes it in Spark: jsonb's text is canonical (keys in one order, each once)."""
    user = " - ".join([f"{prefix}headers::jsonb", *(sql_literal(h) for h in IDENTITY_HEADERS)])
    return f"sha256(convert_to(({user})::text, 'UTF8'))"


def hash_content(df: DataFrame) -> DataFrame:
    """Headers are compared without the producer's identity headers (every send
    carries a new sequence number) and regardless of their order."""
    has_producer = F.col("producer_id").isNotNull()
    df = df.withColumn(
        "body_sha", F.when(has_producer, F.unhex(F.sha2(F.col("body"), 256)))
    ).drop("body")
    parsed = F.from_json(F.col("headers"), "map<string,string>")
    user = F.map_filter(parsed, lambda k, _v: ~k.isin(*IDENTITY_HEADERS))
    canonical = F.coalesce(F.to_json(F.array_sort(F.map_entries(user))), F.col("headers"))
    return df.withColumn("headers_sha", F.when(has_producer, F.unhex(F.sha2(canonical, 256)))).drop(
        "headers"
    )


# --------------------------------------------------------------------------- the checks


def as_finding(
    name: str, df: DataFrame, detail: Sequence[str], weight: Column | None = None
) -> DataFrame:
    """Every finding as one shape, so that all of them are counted in one pass."""
    return df.select(
        F.lit(name).alias("finding"),
        F.col("grp"),
        F.col("destination_id").cast("bigint").alias("destination_id"),
        (weight if weight is not None else F.lit(1)).cast("bigint").alias("weight"),
        F.to_json(F.struct(*[F.col(c) for c in detail])).alias("detail"),
    )


def _identity() -> Column:
    pid, seq = F.col("producer_id"), F.col("producer_seq")
    return F.coalesce(
        F.col("dedup_key"),
        F.when(pid.isNotNull() & seq.isNotNull(), F.concat_ws(":", pid, seq.cast("string"))),
    )


def check_duplicate_identity(m: DataFrame, dd: DataFrame) -> DataFrame:
    """A row is surplus when another row with its identity has a lower id, or
    when the dedup window names another message for it (that first copy was
    stored, and consumed, before this one was stored again).

    One aggregation over messages and dedup entries together finds the
    identities in question; only their (few) rows are joined back."""
    rows = m.select("grp", "id", "destination_id", _identity().alias("identity")).where(
        F.col("identity").isNotNull()
    )
    none = F.lit(None).cast("bigint")
    tagged = rows.select(
        "grp", "identity", F.col("id").alias("mid"), none.alias("did")
    ).unionByName(
        dd.where(F.col("msg_id").isNotNull()).select(
            "grp",
            F.col("dedup_key").alias("identity"),
            none.alias("mid"),
            F.col("msg_id").alias("did"),
        )
    )
    suspects = (
        tagged.groupBy("grp", "identity")
        .agg(
            F.count("mid").alias("n"),
            F.min("mid").alias("first_id"),
            F.max("did").alias("dedup_msg_id"),
        )
        .where(
            (F.col("n") > 1)
            | (
                (F.col("n") == 1)
                & F.col("dedup_msg_id").isNotNull()
                & (F.col("dedup_msg_id") != F.col("first_id"))
            )
        )
    )
    per_key = Window.partitionBy("grp", "identity")
    dup = (
        rows.join(suspects, ["grp", "identity"])
        .withColumn(
            "ghost",
            F.col("dedup_msg_id").isNotNull()
            & ~F.max(F.coalesce(F.col("id") == F.col("dedup_msg_id"), F.lit(False))).over(per_key),
        )
        .where((F.col("id") != F.col("first_id")) | F.col("ghost"))
        .select(
            "grp",
            "destination_id",
            F.col("id").alias("msg_id"),
            "identity",
            (F.col("n") + F.col("ghost").cast("int")).alias("copies"),
            F.when(F.col("ghost"), F.col("dedup_msg_id"))
            .otherwise(F.col("first_id"))
            .alias("first_msg_id"),
        )
    )
    return as_finding(
        "duplicate_identity",
        dup,
        ["grp", "destination_id", "msg_id", "identity", "copies", "first_msg_id"],
    )


def check_duplicate_content(m: DataFrame) -> DataFrame:
    """Only contents seen more than once are sorted: a 64-bit hash of the key
    finds the repeats in one narrow aggregation (a collision only adds a
    candidate), and the window then runs over those rows, not the store."""
    key = ["grp", "producer_id", "body_sha", "headers_sha"]
    pm = m.where(F.col("producer_id").isNotNull() & F.col("body_sha").isNotNull()).withColumn(
        "content_hash", F.xxhash64(*key)
    )
    repeated = pm.groupBy("content_hash").count().where(F.col("count") > 1).select("content_hash")
    w = Window.partitionBy(*key).orderBy("enqueued_at", "id")
    same_identity = F.col("dedup_key").isNotNull() & F.col("dedup_key").eqNullSafe(
        F.col("prev_key")
    )
    dup = (
        pm.join(repeated, "content_hash", "left_semi")
        .withColumn("prev_at", F.lag("enqueued_at").over(w))
        .withColumn("prev_id", F.lag("id").over(w))
        .withColumn("prev_key", F.lag("dedup_key").over(w))
        .where(
            F.col("prev_at").isNotNull()
            & (F.col("enqueued_at") - F.col("prev_at") <= DUPLICATE_CONTENT_WINDOW_MS)
            & ~same_identity  # that is a duplicate_identity
        )
        .select(
            "grp",
            "destination_id",
            F.col("id").alias("msg_id"),
            "producer_id",
            "dedup_key",
            F.col("prev_id").alias("previous_msg_id"),
            F.col("prev_key").alias("previous_dedup_key"),
            (F.col("enqueued_at") - F.col("prev_at")).alias("apart_ms"),
            F.lower(F.hex("body_sha")).alias("body_sha256"),
        )
    )
    return as_finding(
        "duplicate_content",
        dup,
        [
            "grp", "destination_id", "msg_id", "producer_id", "dedup_key", "previous_msg_id",
            "previous_dedup_key", "apart_ms", "body_sha256",
        ],
    )


def check_stale_inflight(
    m: DataFrame, p: DataFrame, subs: DataFrame, groups: DataFrame, now_ms: int
) -> DataFrame:
    """Queue rows carry the in-flight epoch on the message, topic deliveries on
    the pending row; both count. A group whose master took over less than the
    grace ago is still re-taking them."""
    queued = m.where(F.col("inflight_epoch").isNotNull()).select(
        "grp",
        "destination_id",
        F.col("id").alias("msg_id"),
        F.lit(None).cast("bigint").alias("sub_id"),
        "inflight_epoch",
    )
    owed = (
        p.where(F.col("inflight_epoch").isNotNull())
        .join(
            subs.select("grp", F.col("id").alias("sub_id"), "destination_id"),
            ["grp", "sub_id"],
            "left",
        )
        .select("grp", "destination_id", "msg_id", "sub_id", "inflight_epoch")
    )
    settled = F.col("epoch_started_at").isNull() | (
        F.col("epoch_started_at") <= F.lit(now_ms - STALE_INFLIGHT_GRACE_MS)
    )
    stale = (
        queued.unionByName(owed)
        .join(groups, "grp")
        .where((F.col("inflight_epoch") < F.col("epoch")) & settled)
        .withColumnRenamed("epoch", "current_epoch")
    )
    return as_finding(
        "stale_inflight",
        stale,
        [
            "grp", "destination_id", "msg_id", "sub_id", "inflight_epoch", "current_epoch",
            "epoch_started_at", "live_master",
        ],
    )


#: The one result of the checks pushed into the store (``run_store_checks``); ``at`` is
#: the row's enqueued_at, expires_at or created_at, as the finding needs.
def check_sequence_gap(m: DataFrame, dd: DataFrame) -> DataFrame:
    """Sequence gaps from rows (SQLite, and hand-made rows), see
    ``check_sequence_runs``."""
    return check_sequence_runs(rows_as_runs(m, dd))


def rows_as_runs(m: DataFrame, dd: DataFrame) -> DataFrame:
    """Each sequence number of a message or dedup row as a run of one."""

    def runs(df: DataFrame, in_dedup: bool) -> DataFrame:
        return df.where(
            F.col("producer_id").isNotNull() & F.col("producer_seq").isNotNull()
        ).select(
            "grp", "producer_id", F.col("producer_seq").alias("lo"),
            F.col("producer_seq").alias("hi"), F.lit(in_dedup).alias("dd"),
        )  # fmt: skip

    return runs(m, False).unionByName(runs(dd, True))


def check_sequence_runs(runs: DataFrame, few: bool = False) -> DataFrame:
    """A sequence number is accounted for while its message is stored or its
    identity is in the dedup window. Below a producer's oldest dedup entry a
    consumed message leaves no trace at all, so only numbers from that entry up
    are compared; a producer with no dedup entry cannot be checked. The count
    is the number of missing sequence numbers; a number present twice (message
    and dedup entry) is no gap.

    ``runs``: (grp, producer_id, lo, hi, dd) ranges of present numbers, each inside
    one bucket of ``GAP_BUCKET_SEQS`` numbers (``lo div GAP_BUCKET_SEQS``, as the
    store's ``/`` has it); ``dd`` when they come from amq_dedup. They may overlap
    (a number in a message and in its dedup entry). A hot producer is many tasks:
    holes inside a bucket by a running maximum over its runs, holes between
    buckets by a window over the buckets' (lowest, highest) pairs.

    ``few``: the runs are a few per producer and slice (PostgreSQL's): hashed by
    producer once, every aggregate, join and window after needs no other shuffle
    (each is a stage, which costs a cold cluster more than these rows)."""
    producer = ["grp", "producer_id"]
    if few:
        runs = runs.repartition(*producer)
    floors = runs.where(F.col("dd")).groupBy(*producer).agg(F.min("lo").alias("floor"))
    judged = (
        runs.join(floors, producer)
        .where(F.col("hi") >= F.col("floor"))
        .withColumn("lo", F.greatest(F.col("lo"), F.col("floor")))
        .withColumn("bucket", F.expr(f"lo div {GAP_BUCKET_SEQS}"))
    )
    before = (
        Window.partitionBy(*producer, "bucket")
        .orderBy("lo", "hi")
        .rowsBetween(Window.unboundedPreceding, -1)
    )
    inside = judged.withColumn("prev", F.max("hi").over(before)).select(
        *producer, "prev", F.col("lo").alias("seq")
    )
    edges = judged.groupBy(*producer, "bucket").agg(
        F.min("lo").alias("seq"), F.max("hi").alias("hi")
    )
    across = edges.withColumn(
        "prev", F.lag("hi").over(Window.partitionBy(*producer).orderBy("bucket"))
    ).select(*producer, "prev", "seq")
    gaps = (
        inside.unionByName(across)
        .where(F.col("seq") - F.col("prev") > 1)
        .select(
            "grp",
            F.lit(None).cast("bigint").alias("destination_id"),
            "producer_id",
            F.col("prev").alias("after_seq"),
            F.col("seq").alias("before_seq"),
            (F.col("seq") - F.col("prev") - 1).alias("missing"),
        )
    )
    return as_finding(
        "sequence_gap",
        gaps,
        ["grp", "producer_id", "after_seq", "before_seq", "missing"],
        weight=F.col("missing"),
    )
