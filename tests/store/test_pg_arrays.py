"""The group commit's packed arrays (store.pg_arrays) read back by a real PostgreSQL as
the values psycopg's own list dumper would have sent: NULLs, empty arrays, non-ASCII
text, binary bodies, the edges of each integer type, and a value out of range refused
before it leaves Python (OverflowError: the store refuses the data, store.errors)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import psycopg
import pytest

from store import pg_arrays
from store.errors import is_rejection


@pytest.fixture
def conn(pg_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(pg_url, autocommit=True) as c:
        pg_arrays.register(c)
        yield c


CASES: list[tuple[str, Callable[[Any], pg_arrays.PackedArray], Sequence[Any]]] = [
    ("int8", pg_arrays.int8s, [1, -(2**63), 2**63 - 1, None, 0]),
    ("int8", pg_arrays.int8s, []),
    ("int8", pg_arrays.int8s, [None]),
    ("int4", pg_arrays.int4s, [2**31 - 1, -(2**31), None, 7]),
    ("int2", pg_arrays.int2s, [2**15 - 1, -(2**15), 4, None]),
    ("text", pg_arrays.texts, ["a", "", None, "ünïcødé ✓ 𝄞", '{"k":"v,\\"}']),
    ("text", pg_arrays.texts, []),
    ("bytea", pg_arrays.byteas, [b"", b"\x00\xff" * 600, None, bytes(range(256))]),
]


@pytest.mark.parametrize(("kind", "pack", "values"), CASES)
def test_packed_array_reads_back_as_the_values(
    conn: psycopg.Connection[Any], kind: str, pack: Callable[[Any], pg_arrays.PackedArray],
    values: Sequence[Any],
) -> None:
    row = conn.execute(f"SELECT %b::{kind}[], array_length(%b::{kind}[], 1)",
                       (pack(values), pack(values))).fetchone()
    assert row is not None
    back = [bytes(v) if isinstance(v, memoryview) else v for v in row[0]]
    assert back == list(values)
    assert row[1] == (len(values) or None)


def test_unnest_of_packed_columns_lines_up_the_rows(conn: psycopg.Connection[Any]) -> None:
    """How the group commit uses them: one array per column, unnest()ed side by side."""
    rows = conn.execute(
        "SELECT * FROM unnest(%b::int8[], %b::text[], %b::bytea[]) AS u(i, t, b) ORDER BY i",
        (pg_arrays.int8s([2, 1]), pg_arrays.texts(["two", None]),
         pg_arrays.byteas([b"\x02", b"\x01"]))).fetchall()
    assert rows == [(1, None, b"\x01"), (2, "two", b"\x02")]


@pytest.mark.parametrize(("pack", "value"), [
    (pg_arrays.int8s, 2**63), (pg_arrays.int4s, 2**31), (pg_arrays.int2s, -(2**15) - 1),
    (pg_arrays.int8s, "1"),
])
def test_out_of_range_is_a_refusal_of_the_data(pack: Callable[[Any], Any], value: Any) -> None:
    with pytest.raises(OverflowError) as caught:
        pack([1, value])
    assert is_rejection(caught.value)
