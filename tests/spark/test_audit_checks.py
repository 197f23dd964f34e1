"""Checks of the audit on hand-made rows, where the seeded stores cannot reach:
sequence gaps across the buckets a hot producer is cut into."""

from __future__ import annotations

import json

import pytest
from pyspark.sql import SparkSession

from spark.audit_job import GAP_BUCKET_SEQS, check_sequence_gap

pytestmark = pytest.mark.spark

B = GAP_BUCKET_SEQS


def test_gaps_inside_and_across_sequence_buckets(spark: SparkSession) -> None:
    """Floor at 5 (the oldest dedup entry); holes inside bucket 0, across the edge
    of buckets 0 and 1, across an empty bucket 2, and none below the floor."""
    messages = [1, 2, 7, 8, B - 2, B + 1, B + 2, 3 * B + 4]
    dedup = [5, 6, 8, B - 1, B + 1]
    m = spark.createDataFrame(
        [("g", "p", s) for s in messages], "grp string, producer_id string, producer_seq bigint"
    )
    dd = spark.createDataFrame(
        [("g", "p", s) for s in dedup], "grp string, producer_id string, producer_seq bigint"
    )
    rows = check_sequence_gap(m, dd).collect()
    gaps = sorted(
        (d["after_seq"], d["before_seq"], d["missing"])
        for d in (json.loads(r["detail"]) for r in rows)
    )
    assert gaps == [(8, B - 2, B - 11), (B - 1, B + 1, 1), (B + 2, 3 * B + 4, 2 * B + 1)]
    assert sum(r["weight"] for r in rows) == (B - 11) + 1 + (2 * B + 1)
