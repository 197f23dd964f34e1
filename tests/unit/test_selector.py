"""Unit tests of the sans-I/O JMS selector (amqlite.broker.selector): grammar,
precedence, three-valued logic, LIKE, error positions, limits and the parse cache. The
STOMP typing rule and JMS fields are in test_selector_typing, the store translation in
test_selector_sql."""

from __future__ import annotations

import itertools
import time

import pytest

from amqlite.broker.selector import (
    MAX_NESTING,
    MAX_SELECTOR_LENGTH,
    SELECTOR_CACHE_SIZE,
    Selector,
    SelectorError,
    parse_selector,
)
from amqlite.broker.selector_eval import like_matcher
from tests.helpers.selector import CTX, ev

T, F, U = "1 = 1", "1 = 2", "missing = 1"  # a TRUE, a FALSE and an UNKNOWN condition


def error(text: str) -> SelectorError:
    with pytest.raises(SelectorError) as info:
        parse_selector(text)
    return info.value


# --- literals and lexing ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("s = 'it''s'", True),
        ("s = ''", False),
        ("e = ''", True),
        ("n = 10", True),
        ("n = 10L", True),
        ("n = 10l", True),
        ("n = 0xA", True),
        ("n = 0Xa", True),
        ("n = 012", True),  # octal, as ActiveMQ's grammar
        ("n = 10.0", True),
        ("n = 10.", True),
        ("n = 1e1", True),
        ("n = 1E+1", True),
        ("n = 100E-1", True),
        ("n = .1e2", True),
        ("0 = 0", True),
        ("0.5 = .5", True),
        ("1.5e3 = 1500", True),
        ("TRUE", True),
        ("true", True),
        ("FaLsE", False),
        ("NULL", None),
        ("x IS null", True),
        ("-9223372036854775808 < 0", True),
        ("9223372036854775807 > 0", True),
    ],
)
def test_literals(text: str, expected: bool | None) -> None:
    assert ev(text, {"s": "it's", "n": "10", "e": ""}) is expected


@pytest.mark.parametrize(
    ("text", "position"),
    [
        ("n = 9223372036854775808", 4),
        ("n = 0x8000000000000000", 4),
        ("n = -0x8000000000000000", 5),
        ("n = 10 L", 7),  # a separate identifier
        ("n = 0L", 5),  # octal 0, then L: ActiveMQ has no suffix on octal or hex
        ("n = 09", 5),
        ("n = 5e", 5),
        ("n = 1.5.3", 7),
    ],
)
def test_bad_numbers(text: str, position: int) -> None:
    assert error(text).position == position


@pytest.mark.parametrize(
    "name", ["a", "_a", "$a", "a1", "a_b$c", "café", "ünïcödé", "δ", "a\u0301", "€x"]
)
def test_java_identifiers(name: str) -> None:
    assert ev(f"{name} = 'v'", {name: "v"}) is True


@pytest.mark.parametrize("text", ["1a = 'v'", "a.b = 'v'", "a:b = 'v'", "a#b = 'v'"])
def test_not_identifiers(text: str) -> None:
    with pytest.raises(SelectorError):
        parse_selector(text)


def test_keywords_are_case_insensitive() -> None:
    assert ev("a = 1 aNd NoT b = 2 oR c iS nOt NuLl", {"a": "1", "b": "3"}) is True
    assert ev("a bEtWeEn 1 AnD 3 AND s lIkE 'x%' eScApE '!' AND s In ('xy')",
              {"a": "2", "s": "xy"}) is True


def test_keywords_are_not_identifiers() -> None:
    for word in ("and", "OR", "not", "between", "like", "escape", "in", "is"):
        with pytest.raises(SelectorError):
            parse_selector(f"{word} = 'x'")
    assert ev("android = 'x' AND order = 'y'", {"android": "x", "order": "y"}) is True


def test_whitespace_and_comments() -> None:
    assert ev("\ta\r\n=\f1\n", {"a": "1"}) is True
    assert ev("a = 1 /* a comment */ AND b = 2 -- to the end\n", {"a": "1", "b": "2"}) is True
    assert ev("a = 1 -- the end\r", {"a": "1"}) is True
    # ActiveMQ's line comment needs a line end: without one, -- is two minus signs
    assert ev("a = 1 --1", {"a": "2"}) is True
    assert error("a = 1 /* open").position == 6


# --- precedence and associativity ------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"{T} OR {T} AND {F}", True),  # AND before OR
        (f"({T} OR {T}) AND {F}", False),
        (f"{F} AND {F} OR {T}", True),
        (f"NOT {F} AND {F}", False),  # NOT before AND
        (f"NOT ({F} AND {F})", True),
        (f"NOT {T} OR {T}", True),
        ("NOT a = 'x'", True),  # NOT below comparisons (JMS precedence)
        ("NOT NOT a = 'y'", True),
        ("1 + 2 * 3 = 7", True),
        ("(1 + 2) * 3 = 9", True),
        ("10 - 3 - 2 = 5", True),
        ("8 / 2 / 2 = 2", True),
        ("2 * 3 % 4 = 2", True),
        ("-2 * 3 = -6", True),
        ("- -1 = 1", True),
        ("+ +1 = 1", True),
        ("-(2 + 3) = -5", True),
        ("1 + 1 = 2 AND 2 > 1 + 0", True),
        ("1 < 2 = TRUE", True),  # comparisons before = (ActiveMQ's two levels)
        ("a = 'x' = FALSE", True),
        ("a = 'y' = FALSE", False),
    ],
)
def test_precedence(text: str, expected: bool | None) -> None:
    assert ev(text, {"a": "y"}) is expected


def test_and_or_chains_are_flat() -> None:
    # 200 terms: far beyond MAX_NESTING, yet fine, as ActiveMQ's n-ary AND/OR
    text = " AND ".join(f"h{i} = '{i}'" for i in range(200))
    headers = {f"h{i}": str(i) for i in range(200)}
    sel = parse_selector(text)
    assert isinstance(sel, Selector)
    assert sel.matches(headers, CTX)
    assert not sel.matches({**headers, "h199": "x"}, CTX)
    assert ev(" OR ".join(["1 = 2"] * 300) + " OR 1 = 1") is True
    assert ev(" + ".join(["1"] * 1000) + " = 1000") is True


# --- three-valued logic ----------------------------------------------------------------

VALUES = {T: True, F: False, U: None}


def _and(a: bool | None, b: bool | None) -> bool | None:
    return False if False in (a, b) else None if None in (a, b) else True


def _or(a: bool | None, b: bool | None) -> bool | None:
    return True if True in (a, b) else None if None in (a, b) else False


@pytest.mark.parametrize(("x", "y"), list(itertools.product(VALUES, VALUES)))
def test_truth_tables(x: str, y: str) -> None:
    assert ev(f"({x}) AND ({y})") is _and(VALUES[x], VALUES[y])
    assert ev(f"({x}) OR ({y})") is _or(VALUES[x], VALUES[y])
    assert ev(f"({x}) AND ({y}) AND ({x})") is _and(VALUES[x], VALUES[y])


@pytest.mark.parametrize(("x", "expected"), [(T, False), (F, True), (U, None)])
def test_not(x: str, expected: bool | None) -> None:
    assert ev(f"NOT ({x})") is expected


def test_unknown_never_matches() -> None:
    for text in (U, f"NOT ({U})", f"{U} OR {F}", f"{U} AND {T}"):
        sel = parse_selector(text)
        assert sel.evaluate({}, CTX) is None
        assert sel.matches({}, CTX) is False


@pytest.mark.parametrize(
    "text",
    ["missing = 1", "1 = missing", "missing <> 'a'", "missing > 1", "missing + 1 = 2",
     "-missing = 1", "missing = missing", "missing LIKE 'a'", "missing NOT LIKE 'a'",
     "missing IN ('a')", "missing NOT IN ('a')", "missing BETWEEN 1 AND 2",
     "missing NOT BETWEEN 1 AND 2", "missing", "NOT missing"],
)
def test_null_propagates(text: str) -> None:
    assert ev(text) is None


def test_is_null() -> None:
    assert ev("a IS NULL") is True
    assert ev("a IS NOT NULL") is False
    assert ev("a IS NULL", {"a": ""}) is False
    assert ev("a IS NOT NULL", {"a": ""}) is True
    assert ev("a + 1 IS NULL", {"a": "1"}) is True  # arithmetic on a string is UNKNOWN
    assert ev("(a = 1) IS NULL") is True
    assert ev("JMSType IS NULL") is True
    assert ev("JMSPriority IS NOT NULL") is True


def test_bare_identifier_condition() -> None:
    # ActiveMQ's boolean cast: a STOMP header is a string, never a boolean TRUE
    assert ev("flag", {"flag": "true"}) is False
    assert ev("flag") is None
    assert ev("NOT flag", {"flag": "true"}) is True
    assert ev("flag OR 1 = 1", {"flag": "x"}) is True
    assert ev("(flag)", {"flag": "x"}) is False


# --- comparisons -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1 = 1.0", True),
        ("1 <> 2", True),
        ("1 < 2", True),
        ("2 <= 2", True),
        ("3 > 2.5", True),
        ("2 >= 3", False),
        ("'a' = 'a'", True),
        ("'a' <> 'b'", True),
        ("'a' = 'A'", False),
        ("s < t", True),  # two strings compare as strings (ActiveMQ: compareTo)
        ("n9 < n10", False),  # '9' > '10' as text
        ("TRUE = TRUE", True),
        ("TRUE <> FALSE", True),
        ("0.0 = -0.0", False),  # Java Double.equals
        ("2147483647 + 1 = -2147483648", True),  # int overflow wraps
        ("2147483648 + 1 = 2147483649", True),  # a long literal
        ("9223372036854775807 + 1 = -9223372036854775808", True),
        ("7 / 2 = 3.5", True),  # division is always double
        ("-7 % 2 = -1", True),  # Java remainder: the dividend's sign
        ("7.5 % 2 = 1.5", True),
        ("1 / 0 = 1", None),
        ("1 % 0 = 1", None),
        ("1.0 / 0.0 > 1", None),
        ("'a' + 'b' = 'ab'", None),  # no concatenation
        ("-'a' = 'a'", None),
        ("+'a' = 'a'", True),  # unary plus is the operand, as ActiveMQ
        ("TRUE + 1 = 2", None),
        ("(1 = 1) = TRUE", True),
        ("1 = 'a'", False),
        ("1 <> 'a'", True),
        ("TRUE = n9", False),
    ],
)
def test_comparisons(text: str, expected: bool | None) -> None:
    assert ev(text, {"s": "abc", "t": "abd", "n9": "9", "n10": "10"}) is expected


def test_between() -> None:
    h = {"x": "5"}
    assert ev("x BETWEEN 1 AND 5", h) is True
    assert ev("x BETWEEN 5 AND 9", h) is True
    assert ev("x BETWEEN 6 AND 9", h) is False
    assert ev("x NOT BETWEEN 6 AND 9", h) is True
    assert ev("x NOT BETWEEN 1 AND 9", h) is False
    assert ev("JMSPriority BETWEEN 3 + 1 AND 2 * 2", h) is True
    assert ev("x BETWEEN 1 AND 5 AND x = 5", h) is True
    assert ev("x BETWEEN 1 AND missing", h) is None
    assert ev("x BETWEEN 6 AND missing", h) is False  # FALSE AND UNKNOWN
    assert ev("x NOT BETWEEN 1 AND missing", h) is None
    assert ev("x BETWEEN 1 AND 9", {"x": "abc"}) is False  # no number: FALSE
    # ActiveMQ's NOT BETWEEN is x < low OR x > high, not NOT (BETWEEN): FALSE too
    assert ev("x NOT BETWEEN 1 AND 9", {"x": "abc"}) is False


def test_in() -> None:
    assert ev("c IN ('red', 'blue')", {"c": "blue"}) is True
    assert ev("c IN ('red', 'blue')", {"c": "green"}) is False
    assert ev("c NOT IN ('red', 'blue')", {"c": "green"}) is True
    assert ev("c NOT IN ('red')", {"c": "red"}) is False
    assert ev("c IN ('a', 'b', 'c', 'd', 'e', 'f')", {"c": "f"}) is True
    assert ev("c IN ('it''s')", {"c": "it's"}) is True
    assert ev("JMSPriority IN ('4')") is None  # not a string: UNKNOWN (ActiveMQ)
    assert ev("JMSPriority NOT IN ('4')") is None
    assert ev("(c) IN ('a')", {"c": "a"}) is True


# --- LIKE ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "escape", "value", "expected"),
    [
        ("abc", None, "abc", True),
        ("abc", None, "abcd", False),
        ("a%", None, "a", True),
        ("a%", None, "abc", True),
        ("a%", None, "ba", False),
        ("%c", None, "abc", True),
        ("%b%", None, "abc", True),
        ("%b%", None, "ac", False),
        ("a_c", None, "abc", True),
        ("a_c", None, "ac", False),
        ("a_c", None, "abbc", False),
        ("_", None, "", False),
        ("%", None, "", True),
        ("%%", None, "x", True),
        ("a%b%c", None, "aXbYc", True),
        ("a%b%c", None, "abcb", False),
        ("a%b%c", None, "abc", True),
        ("a%a", None, "a", False),
        ("%a_b%", None, "xxaxbyy", True),
        ("%a_b%", None, "xxaxxbyy", False),
        ("_b_%_", None, "abcd", True),
        ("a%", None, "a\nb", True),  # % crosses lines (DOTALL)
        ("a.c", None, "abc", False),  # regex characters are literal
        ("a*[]+?{}()|^$\\c", None, "a*[]+?{}()|^$\\c", True),
        ("100!%", "!", "100%", True),
        ("100!%", "!", "1000", False),
        ("a!_c", "!", "a_c", True),
        ("a!_c", "!", "abc", False),
        ("a!!c", "!", "a!c", True),
        ("a!bc", "!", "a!bc", True),  # escape before another character is literal
        ("ab!", "!", "ab!", True),  # and at the end
        ("%\\%%", "\\", "50% off", True),
        ("x%%y", "%", "x%y", True),  # % as the escape: %% is a literal %
        ("x__y", "_", "x_y", True),
    ],
)
def test_like(pattern: str, escape: str | None, value: str, expected: bool) -> None:
    quoted = pattern.replace("'", "''")
    text = f"v LIKE '{quoted}'" + (f" ESCAPE '{escape}'" if escape else "")
    assert ev(text, {"v": value}) is expected
    assert ev(text.replace(" LIKE", " NOT LIKE", 1), {"v": value}) is (not expected)
    assert like_matcher(pattern, escape)(value) is expected


def test_like_non_strings() -> None:
    assert ev("JMSPriority LIKE '4'") is False  # not a string: FALSE (ActiveMQ)
    assert ev("JMSPriority NOT LIKE '4'") is True
    assert ev("(1 = 1) LIKE 'T%'") is False
    assert ev("missing LIKE '%'") is None


def test_like_escape_must_be_one_character() -> None:
    assert error("v LIKE 'a' ESCAPE '!!'").position == 18
    assert error("v LIKE 'a' ESCAPE ''").position == 18
    assert error("v LIKE a").position == 7
    assert error("v LIKE 'a' ESCAPE 1").position == 18


def test_like_hostile_pattern_is_linear() -> None:
    # a backtracking regex (ActiveMQ's .*? translation) takes forever on this
    pattern = "%a" * 200 + "b%"
    value = "a" * 3000
    start = time.perf_counter()
    assert ev(f"v LIKE '{pattern}'", {"v": value}) is False
    assert ev(f"v LIKE '{pattern}'", {"v": value + "b"}) is True
    assert time.perf_counter() - start < 2.0


# --- errors and their positions --------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "position", "words"),
    [
        ("", 0, "expected a literal"),
        ("   ", 3, "end of selector"),
        ("a =", 3, "found end of selector"),
        ("a = = 1", 4, "found '='"),
        ("(a = 1", 6, "expected ')'"),
        ("a = 1)", 5, "AND, OR or end of selector"),
        ("a = 1 b = 2", 6, "found 'b'"),
        ("a != 1", 2, "<>"),
        ("a == 1", 3, "found '='"),
        ("a = 'open", 4, "unterminated string"),
        ("a = \"x\"", 4, "unexpected character"),
        ("a = 1 AND", 9, "expected a literal"),
        ("a = 1 OR OR b", 9, "found 'OR'"),
        ("a IS 1", 5, "NULL or NOT NULL"),
        ("a IS NOT 1", 9, "NULL"),
        ("a NOT = 1", 6, "LIKE, BETWEEN or IN"),
        ("a BETWEEN 1 OR 2", 12, "AND in BETWEEN"),
        ("a IN 'x'", 5, "'(' after IN"),
        ("a IN ()", 6, "string literal"),
        ("a IN (1)", 6, "string literal"),
        ("a IN ('x' 'y')", 10, "',' or ')'"),
        ("a IN ('x',)", 10, "string literal"),
        ("1 IN ('x')", 0, "identifier on its left"),
        ("a + 1 IN ('x')", 0, "identifier on its left"),
        ("a = NULL", 4, "IS NULL"),
        ("NULL <> a", 0, "IS NULL"),
        ("a > 'x'", 4, "numbers"),
        ("'x' < a", 0, "numbers"),
        ("a > TRUE", 4, "boolean"),
        ("a < NULL", 4, "NULL"),
        ("a BETWEEN 'a' AND 'z'", 10, "numbers"),
        ("a BETWEEN 1 AND 'z'", 16, "numbers"),
        ("(a = 1) > 0", 0, "condition"),
        ("a < b < c", 0, "condition"),
        ("TRUE = 1", 0, "boolean"),
        ("1", 0, "condition"),
        ("'x'", 0, "condition"),
        ("a + 1", 0, "condition"),
        ("1 AND a", 0, "condition"),
        ("a OR 'x'", 5, "condition"),
        ("NOT 1", 4, "condition"),
        ("-a", 0, "condition"),
        ("a = NOT b", 4, "found 'NOT'"),
        ("XPATH '//a'", 0, "not supported"),
        ("a = 1 # b", 6, "unexpected character '#'"),
    ],
)
def test_error_positions(text: str, position: int, words: str) -> None:
    err = error(text)
    assert err.position == position, err
    assert words in err.message
    assert str(err) == f"{err.message} at position {position}"
    assert isinstance(err, ValueError)


# --- limits ----------------------------------------------------------------------------


def test_length_limit() -> None:
    base = "a = 1"
    fits = base + " " * (MAX_SELECTOR_LENGTH - len(base))
    assert parse_selector(fits).matches({"a": "1"}, CTX)
    err = error(fits + " ")
    assert err.position == MAX_SELECTOR_LENGTH
    assert str(MAX_SELECTOR_LENGTH) in err.message


@pytest.mark.parametrize(
    ("open_", "close"), [("(", ")"), ("NOT (", ")"), ("NOT ", ""), ("- ", ""), ("+ ", "")]
)
def test_nesting_limit(open_: str, close: str) -> None:
    def nested(depth: int) -> str:
        inner = "a" if "NOT" in open_ else "a = 1"
        if open_ in ("- ", "+ "):
            return open_ * depth + "a = 1"
        return open_ * depth + inner + close * depth

    parse_selector(nested(MAX_NESTING if open_ != "NOT (" else MAX_NESTING // 2))
    err = error(nested(MAX_NESTING + 1))
    assert "nesting" in err.message


def test_hostile_nesting_is_an_error_not_a_crash() -> None:
    for text in ("(" * 3000 + "a" + ")" * 3000, "NOT " * 1000 + "a", "-" * 4000 + "1",
                 "a = " * 1000 + "1"):
        with pytest.raises(SelectorError):
            parse_selector(text[:MAX_SELECTOR_LENGTH])


def test_chained_comparisons_count_as_nesting() -> None:
    ok = "a" + " = TRUE" * (MAX_NESTING + 1)
    assert ev(ok, {"a": "x"}) in (True, False)
    with pytest.raises(SelectorError):
        parse_selector("a = 1" + " = TRUE" * (MAX_NESTING + 1))


# --- caching and the Selector object ---------------------------------------------------


def test_parse_cache() -> None:
    text = "cached = 'yes' AND JMSPriority > 1"
    first = parse_selector(text)
    hits = parse_selector.cache_info().hits
    assert parse_selector(text) is first
    assert parse_selector.cache_info().hits == hits + 1
    assert parse_selector.cache_info().maxsize == SELECTOR_CACHE_SIZE
    assert repr(first) == f"Selector({text!r})"
    assert first.text == text
