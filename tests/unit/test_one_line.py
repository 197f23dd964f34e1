"""``lockers.connections.errors``: the one helper that turns an error into one line (lockers,
store, registry and management API use it)."""

from __future__ import annotations

import sqlite3

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import OperationalError

from lockers.connections.errors import one_line


def test_first_line_only() -> None:
    assert one_line(RuntimeError("  connection refused\nDETAIL: x\nHINT: y ")) \
        == "connection refused"


def test_an_empty_message_is_the_type_name() -> None:
    assert one_line(TimeoutError()) == "TimeoutError"


def test_sqlalchemy_wrapping_is_dropped_for_the_drivers_error() -> None:
    engine = create_engine("sqlite://")
    with pytest.raises(OperationalError) as info, engine.connect() as conn:
        conn.execute(text("select * from no_such_table"))
    assert isinstance(info.value.orig, sqlite3.OperationalError)
    assert one_line(info.value) == "no such table: no_such_table"
