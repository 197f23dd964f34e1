"""The group commit's packed arrays (store.pg_arrays), sent as the committer sends them
(store.pg_pipeline: prepared, binary parameters with the array's type oid), read back by a
real PostgreSQL as the values they were made from: NULLs, empty arrays, non-ASCII text,
binary bodies, the edges of each integer type, and a value out of range refused before it
leaves Python (OverflowError: the store refuses the data, store.errors)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import psycopg
import pytest

from store import pg_arrays
from store.errors import is_rejection
from store.pg_pipeline import Pipeline, Statement


@pytest.fixture
def pipeline(pg_url: str) -> Iterator[Pipeline]:
    with psycopg.connect(pg_url) as c:
        yield Pipeline(c)


def as_json(pipeline: Pipeline, sql: str, params: dict[str, bytes], oids: dict[str, int]
            ) -> Any:
    """``sql``'s one value (JSON text) for the packed ``params``."""
    name = f"t{abs(hash((sql, tuple(oids.items()))))}"
    result = pipeline.transaction([(Statement(name, sql, oids), params)])[0]
    return json.loads(pipeline.texts(result)[0])


CASES: list[tuple[str, Callable[[Any], bytes], int, Sequence[Any]]] = [
    ("int8", pg_arrays.int8s, pg_arrays.INT8_ARRAY_OID, [1, -(2**63), 2**63 - 1, None, 0]),
    ("int8", pg_arrays.int8s, pg_arrays.INT8_ARRAY_OID, []),
    ("int8", pg_arrays.int8s, pg_arrays.INT8_ARRAY_OID, [None]),
    ("int4", pg_arrays.int4s, pg_arrays.INT4_ARRAY_OID, [2**31 - 1, -(2**31), None, 7]),
    ("int2", pg_arrays.int2s, pg_arrays.INT2_ARRAY_OID, [2**15 - 1, -(2**15), 4, None]),
    ("text", pg_arrays.texts, pg_arrays.TEXT_ARRAY_OID,
     ["a", "", None, "ünïcødé ✓ 𝄞", '{"k":"v,\\"}']),
    ("text", pg_arrays.texts, pg_arrays.TEXT_ARRAY_OID, []),
    ("bytea", pg_arrays.byteas, pg_arrays.BYTEA_ARRAY_OID,
     [b"", b"\x00\xff" * 600, None, bytes(range(256))]),
]


@pytest.mark.parametrize(("kind", "pack", "oid", "values"), CASES)
def test_packed_array_reads_back_as_the_values(
    pipeline: Pipeline, kind: str, pack: Callable[[Any], bytes], oid: int,
    values: Sequence[Any],
) -> None:
    back = as_json(pipeline, f"SELECT json_build_array(coalesce(to_json(%(a)b::{kind}[]), "
                             f"'[]'), array_length(%(a)b::{kind}[], 1))",
                   {"a": pack(values)}, {"a": oid})
    if kind == "bytea":  # to_json writes a bytea as its hex form
        values = [None if v is None else "\\x" + v.hex() for v in values]
    assert back[0] == list(values)
    assert back[1] == (len(values) or None)


def test_unnest_of_packed_columns_lines_up_the_rows(pipeline: Pipeline) -> None:
    """How the group commit uses them: one array per column, unnest()ed side by side."""
    rows = as_json(
        pipeline,
        "SELECT json_agg(json_build_array(i, t, encode(b, 'hex')) ORDER BY i) "
        "FROM unnest(%(i)b::int8[], %(t)b::text[], %(b)b::bytea[]) AS u(i, t, b)",
        {"i": pg_arrays.int8s([2, 1]), "t": pg_arrays.texts(["two", None]),
         "b": pg_arrays.byteas([b"\x02", b"\x01"])},
        {"i": pg_arrays.INT8_ARRAY_OID, "t": pg_arrays.TEXT_ARRAY_OID,
         "b": pg_arrays.BYTEA_ARRAY_OID})
    assert rows == [[1, None, "01"], [2, "two", "02"]]


@pytest.mark.parametrize(("pack", "value"), [
    (pg_arrays.int8s, 2**63), (pg_arrays.int4s, 2**31), (pg_arrays.int2s, -(2**15) - 1),
    (pg_arrays.int8s, "1"),
])
def test_out_of_range_is_a_refusal_of_the_data(pack: Callable[[Any], Any], value: Any) -> None:
    with pytest.raises(OverflowError) as caught:
        pack([1, value])
    assert is_rejection(caught.value)
