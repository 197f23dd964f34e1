"""Column arrays of the pipelined group commit, in PostgreSQL's binary array format.

psycopg dumps a Python list to a binary array one element at a time in Python
(a dumper call, two list appends and a ``struct.pack`` per element, for any
nesting and element type). The group commit sends a dozen one-dimensional
arrays per transaction, and that loop was most of the committer thread's CPU
under W1 (bench/README.md, session 9). Here each array is packed with C-level
``struct``/``bytes.join`` calls into the bytes of a binary parameter, which
``store.pg_pipeline`` sends with the array's type oid.

The format (``array_recv``): ndim, has-null flag, element oid, then per dimension
its length and lower bound, then per element its byte length (-1: NULL) and bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from itertools import repeat

_HEAD = struct.Struct(">iiiii")  # ndim 1, has_null, element oid, length, lower bound 1
_EMPTY = struct.Struct(">iii")  # ndim 0, has_null 0, element oid
_LEN = struct.Struct(">i")
_NULL = _LEN.pack(-1)
_INT8 = struct.Struct(">iq")
_INT4 = struct.Struct(">ii")
_INT2 = struct.Struct(">ih")

# Type oids (pg_type: fixed since PostgreSQL's first binary protocol).
INT8_OID, INT4_OID, INT2_OID, TEXT_OID, BYTEA_OID = 20, 23, 21, 25, 17
INT8_ARRAY_OID, INT4_ARRAY_OID, INT2_ARRAY_OID = 1016, 1007, 1005
TEXT_ARRAY_OID, BYTEA_ARRAY_OID = 1009, 1001


def _fixed(values: Sequence[int | None], elem: struct.Struct, size: int, oid: int) -> bytes:
    """An integer array; OverflowError for a value out of the column's range (the
    store refuses the data, as psycopg's own dumper would: ``store.errors``)."""
    n = len(values)
    if not n:
        return _EMPTY.pack(0, 0, oid)
    try:
        if None in values:
            pack = elem.pack
            body = b"".join([_NULL if v is None else pack(size, v) for v in values])
            return _HEAD.pack(1, 1, oid, n, 1) + body
        return _HEAD.pack(1, 0, oid, n, 1) + b"".join(map(elem.pack, repeat(size, n), values))
    except struct.error as exc:
        raise OverflowError(f"{exc} (a {size}-byte integer column)") from None


def int8s(values: Sequence[int | None]) -> bytes:
    return _fixed(values, _INT8, 8, INT8_OID)


def int4s(values: Sequence[int | None]) -> bytes:
    return _fixed(values, _INT4, 4, INT4_OID)


def int2s(values: Sequence[int | None]) -> bytes:
    return _fixed(values, _INT2, 2, INT2_OID)


def _varlen(values: Sequence[bytes | None], oid: int) -> bytes:
    n = len(values)
    if not n:
        return _EMPTY.pack(0, 0, oid)
    pack = _LEN.pack
    has_null = 1 if None in values else 0
    body = b"".join([_NULL if v is None else pack(len(v)) + v for v in values])
    return _HEAD.pack(1, has_null, oid, n, 1) + body


def texts(values: Sequence[str | None]) -> bytes:
    return _varlen([None if v is None else v.encode() for v in values], TEXT_OID)


def byteas(values: Sequence[bytes | None]) -> bytes:
    return _varlen(values, BYTEA_OID)
