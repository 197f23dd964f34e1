"""What the audit reads from the store (``StoreData``) and how the findings of
every check are put together.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark.audit.checks import (
    as_finding,
    check_duplicate_content,
    check_duplicate_identity,
    check_sequence_runs,
    check_stale_inflight,
    hash_content,
    message_select,
    rows_as_runs,
)
from spark.audit.limits import (
    DEDUP_PRUNED_PREFIX,
    REGISTRY_LIVE_MS,
    STALE_INFLIGHT_GRACE_MS,
    STORE_COLUMNS,
    AuditError,
)
from spark.audit.pool import PushedRead
from spark.audit.reader import StoreReader, TableRead, ddl_schema, empty_frame, local_frame
from spark.audit.snapshot import Snapshot
from spark.audit.source import sql_literal
from spark.audit.store_checks import (
    CONTENT_FINDING,
    IDENTITY_FINDING,
    RUN_TYPES,
    SLICE_TYPES,
    STALE_FINDING,
    STORE_CHECK_TYPES,
    Settled,
    content_statements,
    dedup_run_statements,
    identity_statements,
    slice_statements,
    stale_pending_statements,
    store_check_statement,
    store_findings,
)

# --------------------------------------------------------------------------- the audit


@dataclass
class StoreData:
    """What the checks work from, read in one snapshot."""

    now_ms: int
    group_names: list[str]
    #: (group, destination id): name, read by the driver.
    destination_names: dict[tuple[str, int], str]
    #: Duplicates by identity and content and stale in-flight rows, as findings:
    #: judged in the store on PostgreSQL (``_pushed_down``), by Spark's checks over
    #: every row on SQLite (``_read_rows``).
    judged: list[DataFrame]
    #: Sequence runs (grp, producer_id, lo, hi, dd), merged across slices by Spark.
    runs: DataFrame
    store_checks: DataFrame  # the rows at fault of the checks run in the store
    #: Per group, overdue dedup entries no recorded prune reached (not a finding).
    housekeeping: dict[str, dict[str, Any]]
    #: ``runs`` are per slice (PostgreSQL), not per row (SQLite).
    few_runs: bool = False


def _now_ms(reader: StoreReader) -> int:
    """The store's clock where it has one: the broker stamps rows with wall time,
    and the database is the clock both sides can see."""
    if reader.snapshot is not None and reader.source.backend == "postgresql":
        rows = reader.snapshot.query(
            "SELECT CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)"
        )
        return int(rows[0][0])
    return int(time.time() * 1000)


GROUP_TYPES = STORE_COLUMNS["amq_groups"]
REGISTRY_TYPES = STORE_COLUMNS["amq_registry"]
DESTINATION_TYPES = STORE_COLUMNS["amq_destinations"]
SUBSCRIPTION_TYPES = STORE_COLUMNS["amq_subscriptions"]
PENDING_TYPES = STORE_COLUMNS["amq_sub_pending"]
DEDUP_TYPES = STORE_COLUMNS["amq_dedup"]
META_TYPES = STORE_COLUMNS["amq_meta"]


def _select(types: dict[str, str], table: str, where: str = "") -> str:
    return f"SELECT {', '.join(types)} FROM {table}{where}"


def _last_prunes(snapshot: Snapshot) -> dict[str, tuple[int, int | None]]:
    """Per group, the last dedup prune a master recorded: (before, at), see
    ``DEDUP_PRUNED_PREFIX``. A value that does not parse is ignored (as no prune)."""
    prunes: dict[str, tuple[int, int | None]] = {}
    rows = snapshot.query(
        f"{_select(META_TYPES, 'amq_meta')} WHERE key LIKE {sql_literal(DEDUP_PRUNED_PREFIX + '%')}"
    )
    for _key, value in rows:
        with contextlib.suppress(ValueError, TypeError, KeyError, AttributeError):
            v = json.loads(str(value))
            at = v.get("at")
            prunes[str(v["grp"])] = (int(v["before"]), int(at) if at is not None else None)
    return prunes


#: The groups as the driver reads them (``_read_groups``), for Spark's stale check.
GROUP_ROW_SCHEMA = (
    "grp string, epoch bigint, epoch_started_at bigint, dedup_window_ms bigint, "
    "live_master string, dedup_pruned_before bigint, dedup_pruned_at bigint"
)


def _read_groups(
    reader: StoreReader, now_ms: int
) -> tuple[list[str], list[tuple[Any, ...]], dict[str, tuple[int, int | None]], list[Settled]]:
    """Groups, registry and the last prunes are a few rows each: read in the
    snapshot by the driver, joined there."""
    snap = reader.snapshot
    assert snap is not None
    where = reader.where_group()
    group_rows = [dict(zip(GROUP_TYPES, r, strict=True))
                  for r in snap.query(_select(GROUP_TYPES, "amq_groups", where))]
    if reader.group is not None and not group_rows:
        raise AuditError(f"group {reader.group!r} not found in {reader.described}")
    registry = [dict(zip(REGISTRY_TYPES, r, strict=True))
                for r in snap.query(_select(REGISTRY_TYPES, "amq_registry", where))]
    prunes = _last_prunes(snap)
    rows = []
    for g in group_rows:
        live = sorted(
            r["name"]
            for r in registry
            if r["grp"] == g["grp"]
            and r["role"] == "master"
            and r["epoch"] == g["epoch"]
            and (r["heartbeat_at"] or 0) >= now_ms - REGISTRY_LIVE_MS
        )
        before, at = prunes.get(g["grp"], (None, None))
        rows.append(
            (
                g["grp"],
                int(g["epoch"]),
                None if g["epoch_started_at"] is None else int(g["epoch_started_at"]),
                int(g["dedup_window_ms"] or 0),
                live[0] if live else None,
                before,
                at,
            )
        )
    names = sorted(r[0] for r in rows)
    reader.groups = names
    windows = {str(r[0]): (int(r[3]), r[5]) for r in rows}
    # Groups whose master took over more than the grace ago: their older epochs' rows
    # still in flight are stale (``check_stale_inflight`` has the same rule).
    settled: list[Settled] = [
        (str(r[0]), int(r[1]), r[2], r[4]) for r in rows
        if r[2] is None or r[2] <= now_ms - STALE_INFLIGHT_GRACE_MS
    ]  # fmt: skip
    return names, rows, windows, settled


def _driver_table(reader: StoreReader, table: str, types: dict[str, str]) -> list[tuple[Any, ...]]:
    """A small table (destinations, subscriptions: bounded by what the operators
    created, not by traffic) read by the driver in the snapshot: no Spark job."""
    assert reader.snapshot is not None
    rows = reader.snapshot.query(_select(types, table, reader.where_groups()))
    reader.reads[table] = TableRead(len(rows), 1)
    return [tuple(None if v is None else (int(v) if t == "bigint" else str(v))
                  for v, t in zip(r, types.values(), strict=True)) for r in rows]  # fmt: skip


def _pushed_down(
    reader: StoreReader, settled: Sequence[Settled], store: dict[str, PushedRead]
) -> dict[str, PushedRead]:
    """PostgreSQL: each check's per-row work as statements for the store, the
    longest first (the pool takes them in this order); Spark receives only
    candidates and runs."""
    return {
        "duplicate contents": PushedRead(content_statements(reader), CONTENT_FINDING),
        "duplicate identities": PushedRead(identity_statements(reader), IDENTITY_FINDING),
        **store,
        "amq_messages slices": PushedRead(slice_statements(reader, settled), SLICE_TYPES),
        "amq_dedup runs": PushedRead(dedup_run_statements(reader), RUN_TYPES),
        "amq_sub_pending in flight": PushedRead(
            stale_pending_statements(reader, settled), STALE_FINDING
        ),
    }


def _read_rows(reader: StoreReader) -> dict[str, DataFrame]:
    """SQLite: every row of the three big tables (a local file; Spark hashes)."""
    m_sql, m_types = message_select()
    return {
        "amq_messages": reader.partitioned("amq_messages", m_sql, m_types, "id"),
        "amq_sub_pending": reader.partitioned(
            "amq_sub_pending", _select(PENDING_TYPES, "amq_sub_pending"), PENDING_TYPES, "msg_id"
        ),
        # The primary key (grp, dedup_key) spreads evenly; created_at does not (one old
        # entry made one stride hold every other row).
        "amq_dedup": reader.partitioned(
            "amq_dedup", _select(DEDUP_TYPES, "amq_dedup"), DEDUP_TYPES, "dedup_key"
        ),
    }


def _check_inputs(
    pg: bool, reads: dict[str, DataFrame], subs: list[tuple[Any, ...]],
    groups: list[tuple[Any, ...]], now_ms: int,
) -> tuple[list[DataFrame], DataFrame]:
    """(findings of the checks judged whole, sequence runs) from ``_pushed_down``'s
    reads (judged in the store: only a projection here) or ``_read_rows``' (every
    row: Spark's checks)."""
    if not pg:
        m, dd, p = reads["amq_messages"], reads["amq_dedup"], reads["amq_sub_pending"]
        spark = m.sparkSession
        subs_df = spark.createDataFrame(subs, ddl_schema(SUBSCRIPTION_TYPES))
        groups_df = spark.createDataFrame(groups, GROUP_ROW_SCHEMA)
        return [
            check_duplicate_identity(m, dd),
            check_duplicate_content(hash_content(m)),
            check_stale_inflight(m, p, subs_df, groups_df, now_ms),
        ], rows_as_runs(m, dd)
    slices = reads["amq_messages slices"]
    run_cols = ["grp", "producer_id", "lo", "hi"]
    runs = slices.where(F.col("producer_id").isNotNull()).select(
        *run_cols, F.lit(False).alias("dd")
    ).unionByName(reads["amq_dedup runs"].select(*run_cols, F.lit(True).alias("dd")))
    stale = slices.where(F.col("msg_id").isNotNull()).select(*STALE_FINDING).unionByName(
        reads["amq_sub_pending in flight"]
    )
    return [
        as_finding("duplicate_identity", reads["duplicate identities"], list(IDENTITY_FINDING)),
        as_finding("duplicate_content", reads["duplicate contents"], list(CONTENT_FINDING)),
        as_finding("stale_inflight", stale, list(STALE_FINDING)),
    ], runs


@dataclass
class StorePlan:
    """What the driver reads in the snapshot and decides before Spark runs anything:
    the small tables, and the statements pushed into the store (``pushed``; the
    driver's pool may run them while the JVM starts)."""

    now_ms: int
    group_names: list[str]
    groups: list[tuple[Any, ...]]
    destinations: list[tuple[Any, ...]]
    subscriptions: list[tuple[Any, ...]]
    pushed: dict[str, PushedRead]
    housekeeping: dict[str, dict[str, Any]]


def plan_store(reader: StoreReader, now_ms: int | None) -> StorePlan:
    """The snapshot's small reads (groups, counts, quantiles) and the statements of
    every pushed check; no Spark."""
    now = now_ms if now_ms is not None else _now_ms(reader)
    group_names, groups, windows, settled = _read_groups(reader, now)
    dests = _driver_table(reader, "amq_destinations", DESTINATION_TYPES)
    subs = _driver_table(reader, "amq_subscriptions", SUBSCRIPTION_TYPES)
    store: dict[str, PushedRead] = {}
    housekeeping: dict[str, dict[str, Any]] = {}
    if group_names:
        cte = [(g, w, before or 0) for g, (w, before) in sorted(windows.items())]
        sql, pending = store_check_statement(reader, cte, now)
        store["store checks"] = PushedRead([sql], STORE_CHECK_TYPES)
        prunes = _last_prunes(reader.snapshot) if reader.snapshot is not None else {}
        housekeeping = {
            g: {
                "dedup_entries_past_window": n,
                "oldest_created_at": oldest,
                "last_prune_at": prunes[g][1] if g in prunes else None,
            }
            for g, (n, oldest) in pending.items()
        }
    pg = reader.source.backend == "postgresql"
    pushed = _pushed_down(reader, settled, store) if pg else store
    return StorePlan(now, group_names, groups, dests, subs, pushed, housekeeping)


def _frame(reader: StoreReader, name: str, read: PushedRead) -> DataFrame:
    """A pushed read as a DataFrame: the rows the driver's pool brought back, else
    Spark's partitions run its statements (one for the store checks: SQLite's
    driver cannot tell the types of its expressions, so they are declared)."""
    if read.rows is not None:
        return local_frame(reader.spark, read.columns, read.rows, read.types)
    if name == "store checks":
        return reader.small(read.statements[0], read.types, declared=True)
    return reader.arms(read.statements, read.types)


def read_store(reader: StoreReader, plan: StorePlan) -> StoreData:
    """Every read, all in the reader's one snapshot: what the driver's pool
    returned, and what Spark reads itself in one job: a live broker's writes are
    either wholly in it or not at all, so their order does not matter."""
    pg = reader.source.backend == "postgresql"
    reads = {} if pg else _read_rows(reader)
    reads |= {name: _frame(reader, name, read) for name, read in plan.pushed.items()}
    if not plan.group_names:
        reads["store checks"] = empty_frame(reader.spark, STORE_CHECK_TYPES)
    local = {n: len(r.rows) for n, r in plan.pushed.items() if r.rows is not None}
    cached = {n: df for n, df in reads.items() if n in local}
    cached |= reader.materialize({n: df for n, df in reads.items() if n not in local})
    reader.returned |= local
    judged, runs = _check_inputs(pg, cached, plan.subscriptions, plan.groups, plan.now_ms)
    names = {(str(r[0]), int(r[1])): str(r[2]) for r in plan.destinations}
    return StoreData(
        plan.now_ms, plan.group_names, names, judged, runs, cached["store checks"],
        plan.housekeeping, pg,
    )  # fmt: skip


def all_findings(d: StoreData) -> DataFrame:
    """Every check, as one DataFrame of one shape."""
    checks = [
        *d.judged,
        check_sequence_runs(d.runs, few=d.few_runs),
        *store_findings(d.store_checks, d.now_ms),
    ]
    findings = checks[0]
    for df in checks[1:]:
        findings = findings.unionByName(df)
    return findings
