"""The audit's output: the summary, the findings files (local or Hadoop paths)
and the table printed to the terminal.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import urllib.parse
from typing import Any

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from spark.audit.data import StoreData
from spark.audit.limits import (
    DEDUP_GRACE_MS,
    DUPLICATE_CONTENT_WINDOW_MS,
    EXPIRY_GRACE_MS,
    FINDINGS,
    JDBC_FETCH_SIZE,
    SAMPLE_ROWS,
    STALE_INFLIGHT_GRACE_MS,
    AuditError,
)
from spark.audit.reader import StoreReader


def summarize(reader: StoreReader, d: StoreData, findings: DataFrame) -> dict[str, Any]:
    """Totals per finding, group and destination, and a few sample rows: the only
    things that come back to the driver, and they are bounded by the number of
    destinations, not of messages."""
    names = d.destination_names
    none = F.lit(None)
    totals = findings.groupBy("finding", "grp", "destination_id").agg(
        F.sum("weight").alias("count"), F.count(F.lit(1)).alias("rows"),
    ).select("finding", "grp", "destination_id", "count", "rows",
             none.cast("string").alias("detail"), none.cast("int").alias("n"))  # fmt: skip
    w = Window.partitionBy("finding").orderBy("grp", "destination_id", "detail")
    sampled = (
        findings.withColumn("n", F.row_number().over(w))
        .where(F.col("n") <= SAMPLE_ROWS)
        .select("finding", "grp", "destination_id", none.cast("bigint").alias("count"),
                none.cast("bigint").alias("rows"), "detail", "n")
    )  # fmt: skip
    # Totals and samples in one action: each Spark job costs more than these rows.
    collected = totals.unionByName(sampled).collect()
    by_dest = sorted(
        (
            {
                "finding": r["finding"],
                "group": r["grp"],
                "destination": _destination_label(
                    r["destination_id"], names.get((r["grp"], r["destination_id"]))
                ),
                "destination_id": r["destination_id"],
                "count": int(r["count"]),
                "rows": int(r["rows"]),
            }
            for r in collected
            if r["n"] is None
        ),
        key=lambda x: (list(FINDINGS).index(x["finding"]), x["group"], x["destination"]),
    )
    counts = {name: 0 for name in FINDINGS}
    for row in by_dest:
        counts[row["finding"]] += row["count"]
    samples: dict[str, list[dict[str, Any]]] = {}
    for r in sorted((r for r in collected if r["n"] is not None),
                    key=lambda r: (r["finding"], r["n"])):  # fmt: skip
        samples.setdefault(r["finding"], []).append(json.loads(r["detail"]))
    total = sum(counts.values())
    return {
        "tool": "amqlite-audit",
        "store": reader.described,
        "backend": reader.source.backend,
        "group": reader.group,
        "groups": d.group_names,
        "now_ms": d.now_ms,
        "audited_at": dt.datetime.fromtimestamp(d.now_ms / 1000, dt.UTC).isoformat(),
        "duration_s": None,
        "reads": {k: {"rows": v.rows, "partitions": v.partitions} for k, v in reader.reads.items()},
        "rows_read": sum(v.rows for v in reader.reads.values()),
        #: Rows each read brought back to Spark: on PostgreSQL only candidates and runs.
        "returned": dict(reader.returned),
        "snapshot": reader.snapshot.pins if reader.snapshot is not None else None,
        "housekeeping_pending": {g: d.housekeeping[g] for g in sorted(d.housekeeping)},
        "limits": {
            "expiry_grace_ms": EXPIRY_GRACE_MS,
            "dedup_grace_ms": DEDUP_GRACE_MS,
            "stale_inflight_grace_ms": STALE_INFLIGHT_GRACE_MS,
            "duplicate_content_window_ms": DUPLICATE_CONTENT_WINDOW_MS,
            "rows_per_partition": reader.rows_per_partition,
            "fetch_size": JDBC_FETCH_SIZE,
        },
        "clean": total == 0,
        "total": total,
        "counts": counts,
        "findings": by_dest,
        "samples": {k: samples[k] for k in FINDINGS if k in samples},
        "output": None,
        "files": {},
    }


def write_findings(
    spark: SparkSession, findings: DataFrame, output: str, counts: dict[str, int]
) -> dict[str, str]:
    """All finding rows in one write, as JSON lines, one folder per finding type
    (Spark names them finding=<type>; renamed to <type>). A rerun into the same
    directory leaves no rows of the previous run behind."""
    folder = join_path(output, "findings")
    _remove_tree(spark, folder)
    _make_dirs(spark, output)
    if not any(counts.values()):
        return {}
    findings.select("finding", "detail").write.partitionBy("finding").text(folder)
    files = {}
    for name, count in counts.items():
        if count:
            _rename(spark, join_path(folder, f"finding={name}"), join_path(folder, name))
            files[name] = f"findings/{name}"
    return files


def _destination_label(destination_id: int | None, name: str | None) -> str:
    if destination_id is None:
        return "-"
    return name if name is not None else f"#{destination_id} (gone)"


# --------------------------------------------------------------------------- output


def _is_local(path: str) -> bool:
    scheme = urllib.parse.urlsplit(path).scheme
    return scheme in ("", "file")


def _local(path: str) -> str:
    return urllib.parse.urlsplit(path).path if path.startswith("file:") else path


def join_path(base: str, rel: str) -> str:
    return base.rstrip("/") + "/" + rel


def _hadoop_path(spark: SparkSession, path: str) -> tuple[Any, Any]:
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    hpath = jvm.org.apache.hadoop.fs.Path(path)
    return hpath.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()), hpath


def _remove_tree(spark: SparkSession, path: str) -> None:
    if _is_local(path):
        shutil.rmtree(_local(path), ignore_errors=True)
    else:  # HDFS, S3...: through Hadoop's FileSystem, where Spark writes too.
        fs, hpath = _hadoop_path(spark, path)
        fs.delete(hpath, True)


def _make_dirs(spark: SparkSession, path: str) -> None:
    if _is_local(path):
        os.makedirs(_local(path), exist_ok=True)
    else:
        fs, hpath = _hadoop_path(spark, path)
        fs.mkdirs(hpath)


def _rename(spark: SparkSession, src: str, dst: str) -> None:
    if _is_local(src):
        os.replace(_local(src), _local(dst))
    else:
        fs, hsrc = _hadoop_path(spark, src)
        _, hdst = _hadoop_path(spark, dst)
        if not fs.rename(hsrc, hdst):
            raise AuditError(f"could not rename {src} to {dst}")


def write_text_file(spark: SparkSession, path: str, text: str) -> None:
    if _is_local(path):
        with open(_local(path), "w", encoding="utf-8") as f:
            f.write(text)
        return
    fs, hpath = _hadoop_path(spark, path)
    stream = fs.create(hpath, True)
    try:
        stream.write(bytearray(text.encode("utf-8")))
    finally:
        stream.close()


def render_table(summary: dict[str, Any]) -> str:
    """The report for people: what was read, one line per finding per group and
    destination, a few sample rows, and the verdict."""
    out: list[str] = []
    reads = ", ".join(
        f"{name} {r['rows']:,} rows/{r['partitions']} part" for name, r in summary["reads"].items()
    )
    groups = ", ".join(summary["groups"]) or "(none)"
    out.append(f"amqlite audit of {summary['store']}  groups: {groups}")
    out.append(f"read {reads}; took {summary['duration_s']:.1f} s")
    out.append("")
    rows = [
        (d["finding"], d["group"], d["destination"], f"{d['count']:,}") for d in summary["findings"]
    ]
    if rows:
        head = ("FINDING", "GROUP", "DESTINATION", "COUNT")
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
        fmt = "  ".join(f"{{:<{w}}}" for w in widths[:-1]) + f"  {{:>{widths[-1]}}}"
        out.append(fmt.format(*head))
        out.extend(fmt.format(*r) for r in rows)
        out.append("")
        out.append(f"samples (up to {SAMPLE_ROWS} per finding):")
        for name, sample in summary["samples"].items():
            out.append(f"  {name}: {FINDINGS[name]}")
            out.extend(f"    {json.dumps(s, sort_keys=True)}" for s in sample)
        out.append("")
        out.extend(_pending_lines(summary))
        kinds = sum(1 for c in summary["counts"].values() if c)
        out.append(f"FOUND {summary['total']:,} in {kinds} finding type(s)")
    else:
        out.extend(_pending_lines(summary))
        out.append("clean: no duplicates, orphans, stale state or sequence gaps found")
    if summary["files"]:
        out.append(f"rows written under {summary['output']}")
    return "\n".join(out)


def _pending_lines(summary: dict[str, Any]) -> list[str]:
    """Housekeeping that has not run yet, per group: not a finding, said anyway."""
    out = []
    for grp, p in summary.get("housekeeping_pending", {}).items():
        last = p["last_prune_at"]
        when = (
            "no prune recorded"
            if last is None
            else f"last prune {dt.datetime.fromtimestamp(last / 1000, dt.UTC):%Y-%m-%d %H:%M:%S}Z"
        )
        out.append(
            f"housekeeping pending (not a finding): group {grp}: "
            f"{p['dedup_entries_past_window']:,} dedup entries past the window ({when})"
        )
    return out + ([""] if out else [])
