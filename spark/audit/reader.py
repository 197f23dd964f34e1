"""Reading the store through Spark's JDBC source: partitions per group, cut at
quantiles of the key, in the audit's snapshot.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame, DataFrameReader, SparkSession
from pyspark.sql import functions as F

from spark.audit.limits import (
    CHECK_ROWS_PER_TASK,
    JDBC_FETCH_SIZE,
    MAX_READ_PARTITIONS,
    QUANTILE_EXACT_MAX_ROWS,
    QUANTILE_SAMPLE_ROWS_PER_PART,
)
from spark.audit.session import QUIET, Progress
from spark.audit.snapshot import Snapshot
from spark.audit.source import StoreSource, sql_literal

# --------------------------------------------------------------------------- reading


@dataclass
class TableRead:
    """What one table cost, for the summary: the rows of the audited groups and
    the partitions (statements) they were read in."""

    rows: int = 0
    partitions: int = 0


class StoreReader:
    """Spark JDBC reads of one store, restricted to the audited groups, all in one
    snapshot when one is given."""

    def __init__(
        self,
        spark: SparkSession | None,
        source: StoreSource,
        group: str | None,
        rows_per_partition: int,
        progress: Progress = QUIET,
        snapshot: Snapshot | None = None,
    ) -> None:
        self.progress = progress
        #: None until the session is up (the driver plans and runs the pushed
        #: statements meanwhile); every Spark read needs it.
        self._spark = spark
        self.source = snapshot.source if snapshot is not None else source
        self.described = source.description
        self.snapshot = snapshot
        self.group = group
        #: The audited groups, once known (``where_groups``).
        self.groups: list[str] = [] if group is None else [group]
        self.rows_per_partition = rows_per_partition
        self.reads: dict[str, TableRead] = {}
        #: Rows per audited group of each table, counted in the snapshot.
        self._counts: dict[str, dict[str, int]] = {}
        #: Rows each read brought back to Spark (``materialize``).
        self.returned: dict[str, int] = {}
        #: Who ran the statements pushed into the store, and how long (the summary).
        self.pushed: dict[str, Any] = {"run_by": "spark"}

    @property
    def spark(self) -> SparkSession:
        assert self._spark is not None, "the Spark session is not started yet"
        return self._spark

    @spark.setter
    def spark(self, session: SparkSession) -> None:
        self._spark = session

    def where_group(self, *extra: str) -> str:
        conds = [f"grp = {sql_literal(self.group)}"] if self.group is not None else []
        conds += [c for c in extra if c]
        return (" WHERE " + " AND ".join(conds)) if conds else ""

    def where_groups(self) -> str:
        """Every read names its groups: an index on (grp, ...) is then walked only
        within them."""
        names = ", ".join(sql_literal(g) for g in self.groups) or "NULL"
        return f" WHERE grp IN ({names})"

    def _reader(self) -> DataFrameReader:
        r = (
            self.spark.read.format("jdbc")
            .option("url", self.source.jdbc_url)
            .option("driver", self.source.driver)
            .option("fetchsize", str(JDBC_FETCH_SIZE))
        )
        if self.snapshot is not None and self.snapshot.init_statement:
            r = r.option("sessionInitStatement", self.snapshot.init_statement)
        for key, value in self.source.properties.items():
            r = r.option(key, value)
        return r

    def small(self, select: str, types: dict[str, str], declared: bool = False) -> DataFrame:
        """A small table or a one-row aggregate: one statement, one partition.
        ``declared``: read the columns as ``types`` say (Spark's customSchema), for
        expressions whose type xerial's driver cannot tell before a row arrives."""
        r = self._reader().option("dbtable", f"({select}) amq_q")
        if declared:
            r = r.option("customSchema", ddl_schema(types))
        return _typed(r.load(), types)

    def partitioned(self, name: str, select: str, types: dict[str, str], key: str) -> DataFrame:
        """A read of ``select`` (a SELECT from table ``name`` without WHERE) split by
        ``key_predicates``: each partition one group (or a few small ones) and one
        range of ``key`` holding about ``rows_per_partition`` rows."""
        predicates = self.key_predicates(name, key)
        df = self._reader().jdbc(
            self.source.jdbc_url, f"({select}) amq_t", predicates=predicates, properties={}
        )
        return _typed(df, types)

    def group_counts(self, table: str) -> dict[str, int]:
        """Rows of ``table`` per audited group, counted in the snapshot; ``reads``
        reports their total as the rows the audit covers."""
        if table not in self._counts:
            assert self.snapshot is not None, "partitioned reads need the snapshot"
            self._counts[table] = {
                str(g): int(n)
                for g, n in self.snapshot.query(
                    f"SELECT grp, COUNT(*) FROM {table}{self.where_groups()} GROUP BY grp"
                )
            }
        return self._counts[table]

    def _per_part(self, counts: dict[str, int]) -> int:
        return max(self.rows_per_partition, math.ceil(sum(counts.values()) / MAX_READ_PARTITIONS))

    def group_packs(self, table: str) -> list[list[str]]:
        """The audited groups with rows in ``table``, one group or a few small ones of
        about ``rows_per_partition`` rows together: the unit of a check that compares
        rows across a whole group (identities, contents)."""
        counts = self.group_counts(table)
        per_part = self._per_part(counts)
        packs: list[list[str]] = []
        pack: list[str] = []
        packed = 0
        for grp in sorted(counts):
            if pack and packed + counts[grp] > per_part:
                packs.append(pack)
                pack, packed = [], 0
            pack.append(grp)
            packed += counts[grp]
        return packs + ([pack] if pack else [])

    def arms(self, statements: Sequence[str], types: dict[str, str]) -> DataFrame:
        """One read of several statements, one partition each (an aggregate per slice
        cannot take Spark's WHERE from outside): a UNION ALL of them, each arm tagged
        with its number, and partition ``k`` asks for ``arm_k = k``; PostgreSQL's
        planner drops every other arm (a constant-false filter) before running any."""
        if not statements:
            return empty_frame(self.spark, types)
        union = " UNION ALL ".join(
            f"SELECT {k} AS arm_k, amq_a.* FROM ({sql}) amq_a" for k, sql in enumerate(statements)
        )
        df = self._reader().jdbc(
            self.source.jdbc_url,
            f"({union}) amq_t",
            predicates=[f"arm_k = {k}" for k in range(len(statements))],
            properties={},
        )
        return _typed(df, types)

    def key_predicates(self, table: str, key: str) -> list[str]:
        """WHERE clauses that split ``table`` into partitions of about
        ``rows_per_partition`` rows: rows counted per group, a big group cut at
        quantiles of ``key`` (``_quantiles``, in the snapshot), small groups
        packed together. Never min/max strides: one outlier would put every row
        into one partition."""
        assert self.snapshot is not None, "partitioned reads need the snapshot"
        counts = self.group_counts(table)
        per_part = self._per_part(counts)
        predicates: list[str] = []
        pack: list[str] = []
        packed = 0
        for grp in sorted(counts):
            n = counts[grp]
            if n > per_part:
                cuts = _quantiles(self.snapshot, table, key, grp, n, math.ceil(n / per_part))
                bounds: list[str | None] = [None, *cuts, None]
                for lo, hi in itertools.pairwise(bounds):
                    cond = [f"grp = {sql_literal(grp)}"]
                    cond += [f"{key} >= {lo}"] if lo is not None else []
                    cond += [f"{key} < {hi}"] if hi is not None else []
                    predicates.append(" AND ".join(cond))
                continue
            if pack and packed + n > per_part:
                predicates.append(f"grp IN ({', '.join(pack)})")
                pack, packed = [], 0
            pack.append(sql_literal(grp))
            packed += n
        if pack:
            predicates.append(f"grp IN ({', '.join(pack)})")
        predicates = predicates or ["1 = 0"]
        self.reads[table] = TableRead(sum(counts.values()), len(predicates))
        return predicates

    def materialize(self, reads: dict[str, DataFrame]) -> dict[str, DataFrame]:
        """Read everything now, in one Spark job (one stage of every read's
        partitions), into Spark's block store (``settle``), so that every check
        works from the same rows and the snapshot can be let go; ``returned`` says
        how many rows each read brought back. One result, not one per read: each
        would be a job of its own."""
        if not reads:
            return {}
        columns: dict[str, str] = {}
        for df in reads.values():
            for name, kind in df.dtypes:
                columns.setdefault(name, kind)

        def widened(read: str, df: DataFrame) -> DataFrame:
            return df.select(
                F.lit(read).alias("audit_read"),
                *[F.col(c) if c in df.columns else F.lit(None).cast(t).alias(c)
                  for c, t in columns.items()],
            )  # fmt: skip

        self.progress.say(f"reading in the snapshot: {', '.join(reads)}")
        every = settle(
            functools.reduce(DataFrame.unionByName, [widened(n, df) for n, df in reads.items()])
        )
        counts = {str(r[0]): int(r[1]) for r in every.groupBy("audit_read").count().collect()}
        self.returned = {name: counts.get(name, 0) for name in reads}
        for table, read in self.reads.items():
            parts = f"{read.partitions} partition{'s' * (read.partitions != 1)}"
            self.progress.say(f"read {read.rows} rows of {table} in {parts}")
        self.progress.say(f"{sum(self.returned.values())} rows came back to Spark")
        # The checks' tasks follow what came back, not how it was read: a store
        # without faults returns a few thousand rows from hundreds of partitions.
        return {
            name: every.where(F.col("audit_read") == name)
            .select(*df.columns)
            .coalesce(max(1, math.ceil(self.returned[name] / CHECK_ROWS_PER_TASK)))
            for name, df in reads.items()
        }



#: JSON text per literal of ``local_frame``: a few MB keeps every literal small in
#: the plan Spark ships with each task.
LOCAL_CHUNK_CHARS = 4_000_000


def local_frame(
    spark: SparkSession, columns: Sequence[str], rows: Sequence[Sequence[Any]],
    types: dict[str, str],
) -> DataFrame:
    """Rows the driver holds (``spark.audit.pool``) as a DataFrame parsed by the JVM
    from JSON literals: ``createDataFrame`` would start a Python worker on an
    executor to re-pickle them, and executors run no Python of the audit."""
    if not rows:
        return empty_frame(spark, types)
    chunks: list[str] = []
    lines: list[str] = []
    size = 0
    for row in rows:
        line = json.dumps(dict(zip(columns, row, strict=True)), default=str)
        if lines and size + len(line) > LOCAL_CHUNK_CHARS:
            chunks.append("\n".join(lines))
            lines, size = [], 0
        lines.append(line)
        size += len(line) + 1
    chunks.append("\n".join(lines))
    text = F.explode(F.array(*[F.lit(c) for c in chunks]))
    line_col = F.explode(F.split(F.col("audit_chunk"), "\n"))
    parsed = F.from_json(F.col("audit_line"), ddl_schema(types))
    return (
        spark.range(1).select(text.alias("audit_chunk")).select(line_col.alias("audit_line"))
        .select(parsed.alias("audit_row")).select("audit_row.*")
    )  # fmt: skip


def settle(df: DataFrame) -> DataFrame:
    """``df`` computed now and kept (memory, else local disk) with its lineage cut:
    a later query plans over a leaf, not over the reads and checks behind it
    (planning the union of every check over cached reads took seconds), and a
    lost block fails the audit instead of reading the store again after its
    snapshot was let go."""
    return df.localCheckpoint(eager=True)


def grp_in(groups: Sequence[str], column: str = "grp") -> str:
    """``column`` is one of ``groups`` (an equality for one: the index's prefix)."""
    if len(groups) == 1:
        return f"{column} = {sql_literal(groups[0])}"
    return f"{column} IN ({', '.join(sql_literal(g) for g in groups)})"


def _quantiles(
    snapshot: Snapshot, table: str, key: str, grp: str, rows: int, parts: int
) -> list[str]:
    """SQL literals of the values of ``key`` that cut one group's rows of ``table``
    into ``parts`` about equal ranges (ascending, distinct). Exact up to
    ``QUANTILE_EXACT_MAX_ROWS`` (ntile over the (grp, key) index, one walk of the
    group's range); above, PostgreSQL takes them from a block sample
    (TABLESAMPLE SYSTEM) of about ``QUANTILE_SAMPLE_ROWS_PER_PART`` rows per part."""
    where = f"WHERE grp = {sql_literal(grp)}"
    if snapshot.source.backend == "postgresql" and rows > QUANTILE_EXACT_MAX_ROWS:
        percent = min(100.0, 100.0 * QUANTILE_SAMPLE_ROWS_PER_PART * parts / rows)
        fractions = ", ".join(f"{i / parts:.9f}" for i in range(1, parts))
        sql = (
            f"SELECT unnest(percentile_disc(ARRAY[{fractions}]::float8[]) WITHIN GROUP"
            f" (ORDER BY {key})) FROM {table} TABLESAMPLE SYSTEM ({percent:.6f})"
            f" REPEATABLE (0) {where}"
        )
        values = [r[0] for r in snapshot.query(sql)]
    else:
        sql = (
            f"SELECT MIN(k) FROM (SELECT {key} AS k, NTILE({parts}) OVER (ORDER BY {key}) AS b"
            f" FROM {table} {where}) amq_n GROUP BY b ORDER BY 1"
        )
        values = [r[0] for r in snapshot.query(sql)][1:]
    cuts: list[Any] = []
    for v in values:  # ascending in the database's own order (its collation for text)
        if v is not None and (not cuts or v != cuts[-1]):
            cuts.append(v)
    return [sql_literal(v) if isinstance(v, str) else str(int(v)) for v in cuts]


def _typed(df: DataFrame, types: dict[str, str]) -> DataFrame:
    """SQLite reports BIGINT as decimal(20,0): cast every column to what the checks expect."""
    return df.select(*[F.col(c).cast(t).alias(c) for c, t in types.items()])


#: amq_messages' content columns: not in every read (``message_select``).

def empty_frame(spark: SparkSession, types: dict[str, str]) -> DataFrame:
    """No rows and no partitions (``createDataFrame([])`` has a task per core)."""
    return spark.createDataFrame(spark.sparkContext.emptyRDD(), ddl_schema(types))


def ddl_schema(types: dict[str, str]) -> str:
    return ", ".join(f"{c} {t}" for c, t in types.items())
