"""Unit tests of the JMS selector's store translation: which selectors become an SQL
filter (header and column terms) and that an exact filter selects what matches() does."""

from __future__ import annotations

import itertools

import pytest

from amqlite.broker.selector import FilterTerm, SqlFilter, parse_selector
from amqlite.broker.selector_eval import Long
from tests.helpers.selector import CTX

# --- store translation -----------------------------------------------------------------


def _h(field: str, op: str, value: object = None) -> FilterTerm:
    return FilterTerm("header", field, op, value)  # type: ignore[arg-type]


def _c(field: str, op: str, value: object) -> FilterTerm:
    return FilterTerm("column", field, op, value)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("color = 'red'", SqlFilter((_h("color", "=", "red"),), True)),
        ("'red' = color", SqlFilter((_h("color", "=", "red"),), True)),
        ("color <> 'red'", SqlFilter((_h("color", "<>", "red"),), True)),
        ("price > 10", SqlFilter((_h("price", ">", 10),), True)),
        ("10 > price", SqlFilter((_h("price", "<", 10),), True)),
        ("price <= 2.5", SqlFilter((_h("price", "<=", 2.5),), True)),
        ("price BETWEEN 1 AND 5",
         SqlFilter((_h("price", ">=", 1), _h("price", "<=", 5)), True)),
        ("c IN ('a', 'b')", SqlFilter((_h("c", "in", ("a", "b")),), True)),
        ("c NOT IN ('a')", SqlFilter((_h("c", "not in", ("a",)),), True)),
        ("c IS NULL", SqlFilter((_h("c", "is null"),), True)),
        ("c IS NOT NULL", SqlFilter((_h("c", "is not null"),), True)),
        ("JMSPriority > 4", SqlFilter((_c("priority", ">", 4),), True)),
        ("JMSPriority BETWEEN 3 AND 6",
         SqlFilter((_c("priority", ">=", 3), _c("priority", "<=", 6)), True)),
        ("JMSTimestamp >= 1000", SqlFilter((_c("enqueued_at", ">=", 1000),), True)),
        ("JMSExpiration = 0", SqlFilter((_c("expires_at", "=", 0),), True)),
        ("JMSMessageID = 'ID:1'", SqlFilter((_c("message_id", "=", "ID:1"),), True)),
        ("JMSMessageID IN ('ID:1')", SqlFilter((_c("message_id", "in", ("ID:1",)),), True)),
        ("JMSType = 'order'", SqlFilter((_h("type", "=", "order"),), True)),
        ("JMSCorrelationID = 'c'", SqlFilter((_h("correlation-id", "=", "c"),), True)),
        ("(color = 'red') AND (JMSPriority >= -1)",
         SqlFilter((_h("color", "=", "red"), _c("priority", ">=", -1)), True)),
        ("color = 'red' AND size LIKE 'L%'", SqlFilter((_h("color", "=", "red"),), False)),
        ("color = 'red' AND (a = '1' OR b = '2')",
         SqlFilter((_h("color", "=", "red"),), False)),
        ("color = 'red' OR JMSPriority > 4", None),
        ("NOT color = 'red'", None),
        ("color LIKE 'r%'", None),
        ("price NOT BETWEEN 1 AND 5", None),
        ("a = b", None),
        ("a + 1 = 2", None),
        ("flag = TRUE", None),
        ("flag", None),
        ("TRUE", None),
        ("JMSPriority = '4'", None),
        ("JMSMessageID = 1", None),
        ("JMSPriority IN ('4')", None),
        ("JMSPriority IS NULL", None),
        ("JMSDeliveryMode = 'PERSISTENT'", None),
        ("JMSDestination = 'queue://a'", None),
    ],
)
def test_sql_filter(text: str, expected: SqlFilter | None) -> None:
    assert parse_selector(text).sql_filter() == expected


def test_sql_filter_long_values_keep_their_kind() -> None:
    flt = parse_selector("price > 3000000000").sql_filter()
    assert flt is not None and type(flt.terms[0].value) is Long


@pytest.mark.parametrize(
    "text",
    ["color = 'red'", "color <> 'red'", "price > 10", "price = 10.0", "10 >= price",
     "price BETWEEN 1 AND 5", "c IN ('red', 'x')", "c NOT IN ('red')", "c IS NULL",
     "c IS NOT NULL", "color = 'red' AND price < 3000000000 AND c IS NOT NULL"],
)
def test_sql_filter_terms_agree_with_matches(text: str) -> None:
    """An exact filter selects what matches() selects, header value by header value."""
    sel = parse_selector(text)
    flt = sel.sql_filter()
    assert flt is not None and flt.exact
    values = [None, "", "red", "abc", "5", "10", "10.0", "12", "NaN", "2147483648", " 7"]
    for color, price, c in itertools.product(values, repeat=3):
        headers = {k: v for k, v in (("color", color), ("price", price), ("c", c)) if v is not None}
        by_terms = all(t.test(headers.get(t.field)) for t in flt.terms)
        assert by_terms is sel.matches(headers, CTX), (headers, flt)


def test_sql_filter_column_terms() -> None:
    assert _c("priority", ">", 4).test(5)
    assert not _c("priority", ">", 4).test(4)
    assert _c("enqueued_at", ">=", 1000).test(5_000_000_000)
    assert _c("message_id", "in", ("a", "b")).test("b")
    assert not _h("x", "not in", ("a",)).test(None)
    assert not _h("x", "<>", "a").test(None)
