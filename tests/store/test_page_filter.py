"""A selective consumer's scan (issue 21): ``load_page_matching`` narrows a page by the
terms the database can check, on SQLite and PostgreSQL, and leaves out what it cannot."""

from __future__ import annotations

import pytest

from store import Batch, SqlStore
from tests.helpers.store import QUEUE, MakeStore, master, msg

COLORS = ["red", "blue", "green", "red", "blue", "red"]


def _seed(make_store: MakeStore) -> SqlStore:
    s, e = master(make_store)
    rows = [msg(i + 1, headers={"color": color, "n": str(i + 1), "odd-name!": "x"})
            for i, color in enumerate(COLORS)]
    rows.append(msg(len(COLORS) + 1, headers={"n": "7"}))  # no color
    s.commit_batch(e, Batch(inserts=rows))
    return s


@pytest.mark.parametrize(("terms", "ids"), [
    ((("header", "color", "=", "red"),), [1, 4, 6]),
    ((("header", "color", "<>", "red"),), [2, 3, 5]),  # NULL is not "<> red"
    ((("header", "color", "in", ("blue", "green")),), [2, 3, 5]),
    ((("header", "color", "not in", ("blue", "green")),), [1, 4, 6]),
    ((("header", "color", "is null", None),), [7]),
    ((("header", "color", "is not null", None),), [1, 2, 3, 4, 5, 6]),
    ((("column", "message_id", "=", "ID:m-3"),), [3]),
    ((("column", "priority", ">=", 4),), [1, 2, 3, 4, 5, 6, 7]),
    ((("header", "color", "=", "red"), ("column", "message_id", "<>", "ID:m-4")), [1, 6]),
    # Not for the database (a number against a header; a name it will not splice into a
    # JSON path): left out, so every row is a candidate the broker checks itself.
    ((("header", "n", ">", 3),), [1, 2, 3, 4, 5, 6, 7]),
    ((("header", "odd-name!", "=", "y"),), [1, 2, 3, 4, 5, 6, 7]),
])
def test_page_is_narrowed_by_the_terms_the_store_can_check(
        make_store: MakeStore, terms: tuple[tuple[str, str, str, object], ...],
        ids: list[int]) -> None:
    s = _seed(make_store)
    assert [m.id for m in s.load_page_matching(QUEUE.id, 0, 100, terms)] == ids


def test_filtered_pages_follow_the_cursor_and_the_limit(make_store: MakeStore) -> None:
    s = _seed(make_store)
    red = (("header", "color", "=", "red"),)
    assert [m.id for m in s.load_page_matching(QUEUE.id, 0, 2, red)] == [1, 4]
    assert [m.id for m in s.load_page_matching(QUEUE.id, 4, 2, red)] == [6]
    page = s.load_page_matching(QUEUE.id, 5, 2, red)
    assert page[0].headers["color"] == "red" and page[0].message_id == "ID:m-6"
