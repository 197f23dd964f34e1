"""JMS message selectors, as ActiveMQ applies them to STOMP subscriptions (issue 21).

Sans-I/O and stdlib only: ``parse_selector(text)`` gives a ``Selector`` (or raises
``SelectorError(message, position)`` for the SUBSCRIBE's ERROR frame);
``Selector.matches(headers, message)`` says whether a message is selected (JMS
three-valued logic: only TRUE selects); ``Selector.sql_filter()`` describes the simple
cases in a form the store can turn into a WHERE clause. The evaluator is in
``amqlite.broker.selector_eval``.

STOMP typing rule (ActiveMQ's STOMP selectors, ``convert_string_expressions:``): headers
are strings; comparing one (= <> < <= > >= BETWEEN) with a number converts it to the
number's Java type (int, long or double), so ``price > 10`` selects ``price:12``. A header
that does not parse as that type (``abc``; ``12.5`` or ``3000000000`` against the int 10)
makes the comparison FALSE, not UNKNOWN: ``NOT (price > 10)`` selects ``price:abc``.
Against TRUE/FALSE a header is true if it is 'true' in any case. Arithmetic never
converts: a string operand makes it UNKNOWN.

Grammar: ActiveMQ's (SelectorParser.jj): literals ``'it''s'``, ``10``, ``10L``,
``0x1F``, ``017`` (octal), ``1.5``, ``1e3``, TRUE, FALSE, NULL; Java identifiers;
``= <> < <= > >=``, ``+ - * / %``, ``[NOT] BETWEEN``, ``[NOT] IN ('a', ...)``,
``[NOT] LIKE 'p%' [ESCAPE '!']``, ``IS [NOT] NULL``, AND, OR, NOT, parentheses,
``/* */`` and ``--`` comments (the latter ended by a line end); keywords in any case.
ActiveMQ's parse-time checks are kept: ``<`` and BETWEEN reject string and boolean
literals, ``= NULL`` is an error (IS NULL is the way), IN needs an identifier, AND/OR/
NOT need conditions (a comparison, or a bare identifier: TRUE only for a boolean TRUE).

Where this differs from ActiveMQ: NOT has JMS precedence (below comparisons; ActiveMQ
binds it to one operand, so ``NOT a = 'x'`` means ``(NOT a) = 'x'`` there); a NULL
operand of ``=`` is UNKNOWN on either side (ActiveMQ: FALSE when it is on the right,
TRUE when both are); division or modulo by zero is UNKNOWN (Java: Infinity/NaN);
``'a' + x`` is UNKNOWN (ActiveMQ concatenates); XPATH and XQUERY are not supported;
integer literals beyond the long range are errors, except -9223372036854775808;
identifiers follow Java's rules (ActiveMQ's grammar takes ASCII ones only).
"""

from __future__ import annotations

import functools
import unicodedata
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal, NamedTuple

from amqlite.broker.selector_eval import (
    BOOLEAN_NODES,
    INT_MAX,
    JMS_FIELDS,
    LONG_MAX,
    And,
    Arith,
    Between,
    Cmp,
    Ident,
    InList,
    IsNull,
    Like,
    Lit,
    Long,
    MessageFields,
    Neg,
    Node,
    Not,
    Or,
    SelectorContext,
    Truth,
    Value,
    compare,
    compile_node,
    is_number,
    negate,
)

__all__ = [
    "MAX_NESTING",
    "MAX_SELECTOR_LENGTH",
    "SELECTOR_CACHE_SIZE",
    "FilterTerm",
    "MessageFields",
    "Selector",
    "SelectorContext",
    "SelectorError",
    "SqlFilter",
    "parse_selector",
]

#: Longest selector accepted, in characters. ActiveMQ has no limit; this bounds the
#: parse work (and the tree) one SUBSCRIBE can ask of the broker.
MAX_SELECTOR_LENGTH = 4096
#: Deepest nesting of parentheses, NOT, unary signs and chained comparisons. Each level
#: costs about ten Python frames to parse and a few to evaluate, so a hostile
#: ``((((...`` is an error instead of a RecursionError.
MAX_NESTING = 32
#: Parsed selectors kept (ActiveMQ's SelectorParser keeps 100): subscribers of one
#: destination usually share a handful of selector texts.
SELECTOR_CACHE_SIZE = 128


class SelectorError(ValueError):
    """A selector that does not parse: ``message`` says what was expected, ``position``
    is the 0-based character offset in the selector text."""

    def __init__(self, message: str, position: int) -> None:
        super().__init__(f"{message} at position {position}")
        self.message = message
        self.position = position


# --- lexer -----------------------------------------------------------------------------

KEYWORDS = frozenset(
    {"AND", "OR", "NOT", "BETWEEN", "LIKE", "ESCAPE", "IN", "IS", "NULL", "TRUE", "FALSE",
     "XPATH", "XQUERY"}
)
_WHITESPACE = " \t\n\r\f"
_OPERATORS = ("<>", "<=", ">=", "=", "<", ">", "+", "-", "*", "/", "%", "(", ")", ",")
_ID_START = frozenset({"Lu", "Ll", "Lt", "Lm", "Lo", "Nl", "Sc", "Pc"})
_ID_PART = _ID_START | {"Nd", "Mn", "Mc"}
_HEX = frozenset("0123456789abcdefABCDEF")


class Token(NamedTuple):
    kind: Literal["num", "str", "ident", "kw", "op", "eof"]
    text: str  # as written; the keyword in upper case for "kw"
    pos: int
    value: str | int | float | None = None  # a literal's value


def _is_id_start(c: str) -> bool:
    if c.isascii():
        return c.isalpha() or c in "_$"
    return unicodedata.category(c) in _ID_START


def _is_id_part(c: str) -> bool:
    if c.isascii():
        return c.isalnum() or c in "_$"
    return unicodedata.category(c) in _ID_PART


def _digits(text: str, i: int, allowed: str | frozenset[str] = "0123456789") -> int:
    n = len(text)
    while i < n and text[i] in allowed:
        i += 1
    return i


def _exponent(text: str, i: int) -> int:
    """The end of an exponent ``E[+-]digits`` at ``i``, or ``i`` when there is none."""
    if i < len(text) and text[i] in "eE":
        j = i + 1 + (i + 1 < len(text) and text[i + 1] in "+-")
        end = _digits(text, j)
        if end > j:
            return end
    return i


def _number(text: str, i: int) -> Token:
    """The longest of ActiveMQ's DECIMAL (``10``, ``10L``), HEX (``0x1f``), OCTAL
    (``017``, ``0``) and FLOATING_POINT (``1.``, ``.5``, ``1.5e3``, ``1e3``) literals."""
    end = _digits(text, i)
    if end < len(text) and text[end] == ".":
        end = _exponent(text, _digits(text, end + 1))
        return Token("num", text[i:end], i, float(text[i:end]))
    if _exponent(text, end) > end:
        end = _exponent(text, end)
        return Token("num", text[i:end], i, float(text[i:end]))
    if text[i] != "0":
        long_suffix = end < len(text) and text[end] in "lL"
        return Token("num", text[i : end + long_suffix], i, int(text[i:end]))
    if end == i + 1 and end < len(text) and text[end] in "xX":
        hex_end = _digits(text, end + 1, _HEX)
        if hex_end > end + 1:
            return Token("num", text[i:hex_end], i, int(text[end + 1 : hex_end], 16))
    octal_end = _digits(text, i, "01234567")
    return Token("num", text[i:octal_end], i, int(text[i:octal_end], 8))


def _string(text: str, i: int) -> Token:
    parts: list[str] = []
    j = i + 1
    while True:
        k = text.find("'", j)
        if k < 0:
            raise SelectorError("unterminated string literal", i)
        parts.append(text[j:k])
        if not text.startswith("''", k):
            return Token("str", text[i : k + 1], i, "".join(parts))
        parts.append("'")
        j = k + 2


def _skip_blank(text: str, i: int) -> int:
    n = len(text)
    while i < n:
        if text[i] in _WHITESPACE:
            i += 1
        elif text.startswith("--", i):
            ends = [e for e in (text.find("\n", i), text.find("\r", i)) if e >= 0]
            if not ends:  # ActiveMQ's line comment needs its line end: this is - -
                return i
            i = min(ends) + 1
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            if end < 0:
                raise SelectorError("unterminated comment", i)
            i = end + 2
        else:
            return i
    return i


def tokenize(text: str) -> list[Token]:
    tokens: list[Token] = []
    n = len(text)
    i = _skip_blank(text, 0)
    while i < n:
        c = text[i]
        if c == "'":
            tok = _string(text, i)
        elif (c.isascii() and c.isdigit()) or (c == "." and text[i + 1 : i + 2].isdigit()):
            tok = _number(text, i)
        elif _is_id_start(c):
            end = i + 1
            while end < n and _is_id_part(text[end]):
                end += 1
            word = text[i:end]
            upper = word.upper()
            if word.isascii() and upper in KEYWORDS:
                tok = Token("kw", upper, i)
            else:
                tok = Token("ident", word, i)
        else:
            op = next((o for o in _OPERATORS if text.startswith(o, i)), None)
            if op is None:
                hint = " (not equal is <>)" if text.startswith("!=", i) else ""
                raise SelectorError(f"unexpected character {c!r}{hint}", i)
            tok = Token("op", op, i)
        tokens.append(tok)
        i = _skip_blank(text, i + len(tok.text))
    tokens.append(Token("eof", "", n))
    return tokens


# --- parser ----------------------------------------------------------------------------


def _describe(tok: Token) -> str:
    return "end of selector" if tok.kind == "eof" else f"'{tok.text}'"


def _int_literal(v: int, long_kind: bool, pos: int) -> Lit:
    """An integer literal: a Java int when it fits one, else a long (ActiveMQ's
    ConstantExpression.createFromDecimal; a ``L`` suffix does not make a long)."""
    if not -LONG_MAX - 1 <= v <= LONG_MAX:
        raise SelectorError("integer literal out of the long range", pos)
    return Lit(Long(v) if long_kind else v)


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens = tokenize(text)
        self.i = 0
        self.depth = 0

    # token helpers
    def peek(self) -> Token:
        return self.tokens[self.i]

    def advance(self) -> Token:
        tok = self.tokens[self.i]
        self.i += 1
        return tok

    def at_kw(self, *words: str) -> bool:
        tok = self.tokens[self.i]
        return tok.kind == "kw" and tok.text in words

    def at_op(self, *ops: str) -> bool:
        tok = self.tokens[self.i]
        return tok.kind == "op" and tok.text in ops

    def expect(self, ok: bool, what: str) -> Token:
        if not ok:
            tok = self.peek()
            raise SelectorError(f"expected {what}, found {_describe(tok)}", tok.pos)
        return self.advance()

    def enter(self, pos: int) -> None:
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise SelectorError(f"nesting deeper than {MAX_NESTING} levels", pos)

    # the grammar, loosest first
    def parse(self) -> Node:
        pos = self.peek().pos
        node = self.condition(self.or_(), pos)
        self.expect(self.peek().kind == "eof", "AND, OR or end of selector")
        return node

    def condition(self, node: Node, pos: int) -> Node:
        """ActiveMQ's asBooleanExpression: a condition, or a bare identifier."""
        if isinstance(node, BOOLEAN_NODES) or (isinstance(node, Lit) and _is_bool_lit(node)):
            return node
        if isinstance(node, Ident):
            return Truth(node)
        raise SelectorError("expected a condition (a comparison or an identifier)", pos)

    def or_(self) -> Node:
        return self._logic("OR", self.and_, Or)

    def and_(self) -> Node:
        return self._logic("AND", self.not_, And)

    def _logic(self, word: str, operand: Callable[[], Node], kind: type[And | Or]) -> Node:
        pos = self.peek().pos
        first = operand()
        if not self.at_kw(word):
            return first
        items = [self.condition(first, pos)]
        while self.at_kw(word):
            self.advance()
            pos = self.peek().pos
            items.append(self.condition(operand(), pos))
        return kind(tuple(items))

    def not_(self) -> Node:
        if not self.at_kw("NOT"):
            return self.equality()
        self.enter(self.advance().pos)
        pos = self.peek().pos
        node = Not(self.condition(self.not_(), pos))
        self.depth -= 1
        return node

    def equality(self) -> Node:
        pos = self.peek().pos
        left = self.comparison()
        links = 0
        while True:
            tok = self.peek()
            if self.at_op("=", "<>"):
                self.advance()
                right_pos = self.peek().pos
                right = self.comparison()
                _check_equal(left, pos, right, right_pos)
                left = Cmp(tok.text, left, right)
            elif self.at_kw("IS"):
                self.advance()
                negated = self.at_kw("NOT")
                if negated:
                    self.advance()
                self.expect(self.at_kw("NULL"), "NULL or NOT NULL after IS")
                left = IsNull(left, negated)
            else:
                self.depth -= max(links - 1, 0)
                return left
            if links:  # a chain: (a = b) = c nests
                self.enter(tok.pos)
            links += 1

    def comparison(self) -> Node:
        pos = self.peek().pos
        left = self.additive()
        links = 0
        while True:
            tok = self.peek()
            negated = False
            if self.at_op("<", "<=", ">", ">="):
                self.advance()
                right_pos = self.peek().pos
                right = self.additive()
                _check_ordered(left, pos, tok.text)
                _check_ordered(right, right_pos, tok.text)
                left = Cmp(tok.text, left, right)
            elif self.at_kw("NOT", "LIKE", "BETWEEN", "IN"):
                if self.at_kw("NOT"):
                    self.advance()
                    negated = True
                    if not self.at_kw("LIKE", "BETWEEN", "IN"):
                        self.expect(False, "LIKE, BETWEEN or IN after NOT")
                left = self.predicate(left, pos, negated)
            else:
                self.depth -= max(links - 1, 0)
                return left
            if links:  # a chain: (a = b) = c nests
                self.enter(tok.pos)
            links += 1

    def predicate(self, left: Node, pos: int, negated: bool) -> Node:
        word = self.advance().text
        if word == "LIKE":
            pattern = self.expect(self.peek().kind == "str", "a string literal after LIKE")
            escape: str | None = None
            if self.at_kw("ESCAPE"):
                self.advance()
                tok = self.expect(self.peek().kind == "str", "a string literal after ESCAPE")
                escape = str(tok.value)
                if len(escape) != 1:
                    raise SelectorError("ESCAPE takes exactly one character", tok.pos)
            return Like(left, str(pattern.value), escape, negated)
        if word == "BETWEEN":
            low_pos = self.peek().pos
            low = self.additive()
            self.expect(self.at_kw("AND"), "AND in BETWEEN")
            high_pos = self.peek().pos
            high = self.additive()
            for node, at in ((left, pos), (low, low_pos), (high, high_pos)):
                _check_ordered(node, at, "BETWEEN")
            return Between(left, low, high, negated)
        if not isinstance(left, Ident):
            raise SelectorError("IN needs an identifier on its left", pos)
        self.expect(self.at_op("("), "'(' after IN")
        values = [str(self.expect(self.peek().kind == "str", "a string literal in IN").value)]
        while self.at_op(","):
            self.advance()
            values.append(str(self.expect(self.peek().kind == "str", "a string literal").value))
        self.expect(self.at_op(")"), "',' or ')' in the IN list")
        return InList(left, tuple(values), negated)

    def additive(self) -> Node:
        return self._arith(("+", "-"), self.multiplicative)

    def multiplicative(self) -> Node:
        return self._arith(("*", "/", "%"), self.unary)

    def _arith(self, ops: tuple[str, ...], operand: Callable[[], Node]) -> Node:
        first = operand()
        rest: list[tuple[str, Node]] = []
        while self.at_op(*ops):
            op = self.advance().text
            rest.append((op, operand()))
        return Arith(first, tuple(rest)) if rest else first

    def unary(self) -> Node:
        if not self.at_op("+", "-"):
            return self.primary()
        sign = self.advance()
        self.enter(sign.pos)
        tok = self.peek()
        if sign.text == "-" and tok.kind == "num" and isinstance(tok.value, int):
            self.advance()  # folded, so that -9223372036854775808 is a long
            if tok.value > LONG_MAX and tok.text.startswith("0"):
                raise SelectorError("integer literal out of the long range", tok.pos)
            node: Node = _int_literal(-tok.value, tok.value > INT_MAX, tok.pos)
        else:
            node = self.unary()  # unary + is the operand itself (ActiveMQ)
            if sign.text == "-" and isinstance(node, Lit) and is_number(node.value):
                node = Lit(negate(node.value))
            elif sign.text == "-":
                node = Neg(node)
        self.depth -= 1
        return node

    def primary(self) -> Node:
        tok = self.advance()
        if tok.kind == "num":
            if isinstance(tok.value, float):
                return Lit(tok.value)
            assert isinstance(tok.value, int)
            return _int_literal(tok.value, tok.value > INT_MAX, tok.pos)
        if tok.kind == "str":
            return Lit(tok.value)
        if tok.kind == "ident":
            return Ident(tok.text)
        if tok.kind == "kw" and tok.text in ("TRUE", "FALSE", "NULL"):
            return Lit({"TRUE": True, "FALSE": False, "NULL": None}[tok.text])
        if tok.kind == "kw" and tok.text in ("XPATH", "XQUERY"):
            raise SelectorError(f"{tok.text} selectors are not supported", tok.pos)
        if tok.kind == "op" and tok.text == "(":
            self.enter(tok.pos)
            node = self.or_()
            self.expect(self.at_op(")"), "')'")
            self.depth -= 1
            return node
        raise SelectorError(
            f"expected a literal, an identifier or '(', found {_describe(tok)}", tok.pos
        )


def _is_bool_lit(node: Lit) -> bool:
    return node.value is None or isinstance(node.value, bool)


def _check_ordered(node: Node, pos: int, op: str) -> None:
    """ActiveMQ's checkLessThanOperand: < <= > >= and BETWEEN compare numbers."""
    if isinstance(node, Lit) and not is_number(node.value):
        raise SelectorError(f"{op} compares numbers, not a {_lit_kind(node)} literal", pos)
    if isinstance(node, BOOLEAN_NODES):
        raise SelectorError(f"{op} compares numbers, not a condition", pos)


def _check_equal(left: Node, left_pos: int, right: Node, right_pos: int) -> None:
    """ActiveMQ's checkEqualOperand and checkEqualOperandCompatability."""
    for node, pos in ((left, left_pos), (right, right_pos)):
        if isinstance(node, Lit) and node.value is None:
            raise SelectorError("NULL does not compare with = or <>; use IS NULL", pos)
    if isinstance(left, Lit) and isinstance(right, Lit) and (
        isinstance(left.value, bool) != isinstance(right.value, bool)
    ):
        raise SelectorError("a boolean literal compares only with a boolean", left_pos)


def _lit_kind(node: Lit) -> str:
    if node.value is None:
        return "NULL"
    return "boolean" if isinstance(node.value, bool) else "string"


# --- store translation -----------------------------------------------------------------

#: JMS fields the store keeps in columns: selector name -> (column, value is a long).
COLUMNS: dict[str, tuple[str, bool]] = {
    "JMSPriority": ("priority", False),
    "JMSTimestamp": ("enqueued_at", True),
    "JMSExpiration": ("expires_at", True),
    "JMSMessageID": ("message_id", False),
}
#: JMS fields that read a header.
HEADER_FIELDS = {"JMSType": "type", "JMSCorrelationID": "correlation-id"}
Op = Literal["=", "<>", "<", "<=", ">", ">=", "in", "not in", "is null", "is not null"]
_FLIPPED: dict[str, Op] = {"=": "=", "<>": "<>", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
_AS_OP: dict[str, Op] = {"=": "=", "<>": "<>", "<": "<", "<=": "<=", ">": ">", ">=": ">="}


@dataclass(frozen=True, slots=True)
class FilterTerm:
    """``field op value`` on a message column (``priority``, ``enqueued_at``,
    ``expires_at``: numbers; ``message_id``: text) or on a header (text, NULL when
    absent). A ``str`` value compares text; an ``int``/``float`` value compares a header
    under the STOMP typing rule (it must parse as a Java int, long when the value is a
    ``Long``, or double, else the term is FALSE and ``<>`` TRUE); ``in``/``not in`` take a
    tuple of strings. NULL satisfies only ``is null``. ``test()`` is the reference."""

    source: Literal["column", "header"]
    field: str
    op: Op
    value: str | int | float | tuple[str, ...] | None = None

    def test(self, value: str | int | None) -> bool:
        """Whether a message whose field holds ``value`` satisfies this term."""
        if self.op in ("is null", "is not null"):
            return (value is None) == (self.op == "is null")
        if self.op in ("in", "not in"):
            assert isinstance(self.value, tuple)
            return isinstance(value, str) and (value in self.value) == (self.op == "in")
        assert not isinstance(self.value, tuple)
        if self.source == "column" and isinstance(value, int) and COLUMN_IS_LONG[self.field]:
            value = Long(value)
        return compare(self.op, value, self.value) is True


COLUMN_IS_LONG = {column: long for column, long in COLUMNS.values()}


@dataclass(frozen=True, slots=True)
class SqlFilter:
    """A conjunction of terms every selected message satisfies. ``exact``: the selector
    is just this conjunction, so the store's rows need no ``matches()``; otherwise they
    are candidates that still go through ``matches()``."""

    terms: tuple[FilterTerm, ...]
    exact: bool


def _terms(node: Node) -> list[FilterTerm] | None:
    """The terms saying exactly what ``node`` says, or None when it is not that simple."""
    if isinstance(node, Cmp):
        left, right, op = node.left, node.right, node.op
        if isinstance(left, Lit) and isinstance(right, Ident):
            left, right, op = right, left, _FLIPPED[op]
        if isinstance(left, Ident) and isinstance(right, Lit):
            term = _term(left.name, op, right.value)
            return None if term is None else [term]
        return None
    if isinstance(node, Between) and not node.negated:
        if isinstance(node.operand, Ident) and isinstance(node.low, Lit) and isinstance(
            node.high, Lit
        ):
            low = _term(node.operand.name, ">=", node.low.value)
            high = _term(node.operand.name, "<=", node.high.value)
            return None if low is None or high is None else [low, high]
        return None
    if isinstance(node, InList):
        where = _place(node.ident.name)
        if where is None or (where[0] == "column" and where[1] != "message_id"):
            return None
        return [FilterTerm(where[0], where[1], "not in" if node.negated else "in", node.values)]
    if isinstance(node, IsNull) and isinstance(node.operand, Ident):
        where = _place(node.operand.name)
        if where is None or where[0] == "column":
            return None
        return [FilterTerm("header", where[1], "is not null" if node.negated else "is null")]
    return None


def _place(name: str) -> tuple[Literal["column", "header"], str] | None:
    if name in COLUMNS:
        return "column", COLUMNS[name][0]
    if name in HEADER_FIELDS:
        return "header", HEADER_FIELDS[name]
    return None if name in JMS_FIELDS else ("header", name)


def _term(name: str, op: str, value: Value) -> FilterTerm | None:
    where = _place(name)
    if where is None or value is None or isinstance(value, bool):
        return None
    source, field = where
    if source == "column" and isinstance(value, str) != (field == "message_id"):
        return None  # a number column meeting a string, or message_id a number
    if isinstance(value, str) and op not in ("=", "<>"):
        return None
    return FilterTerm(source, field, _AS_OP[op], value)


# --- the public face -------------------------------------------------------------------


class Selector:
    """A parsed selector; immutable, shared by every subscription with the same text."""

    __slots__ = ("_fn", "text", "tree")

    def __init__(self, text: str, tree: Node) -> None:
        self.text = text
        self.tree = tree
        self._fn = compile_node(tree)

    def evaluate(self, headers: Mapping[str, str], message: SelectorContext) -> bool | None:
        """The selector's three-valued result: True, False or None (UNKNOWN)."""
        try:
            v = self._fn(headers, message)
        except Exception:  # the contract: evaluation never raises (a bug reads UNKNOWN)
            return None
        return v if v is None or isinstance(v, bool) else None

    def matches(self, headers: Mapping[str, str], message: SelectorContext) -> bool:
        """Whether the message is selected: the selector is TRUE (not FALSE, not UNKNOWN)."""
        return self.evaluate(headers, message) is True

    def sql_filter(self) -> SqlFilter | None:
        """The selector, or its translatable AND terms, as a ``SqlFilter``; None when no
        part qualifies. Qualifying: ``x = 'a'``, ``x <> 'a'``, ``x <op> number`` and
        ``x [NOT] IN (...)``, ``x IS [NOT] NULL`` on a header; ``x BETWEEN n AND m`` on a
        header or number column (as two terms); ``<op> number`` on JMSPriority,
        JMSTimestamp or JMSExpiration; ``= <> IN`` on JMSMessageID; literal on either
        side."""
        parts = self.tree.operands if isinstance(self.tree, And) else (self.tree,)
        terms: list[FilterTerm] = []
        exact = True
        for part in parts:
            found = _terms(part)
            if found is None:
                exact = False
            else:
                terms += found
        return SqlFilter(tuple(terms), exact) if terms else None

    def __repr__(self) -> str:
        return f"Selector({self.text!r})"


@functools.lru_cache(maxsize=SELECTOR_CACHE_SIZE)
def parse_selector(text: str) -> Selector:
    """The ``Selector`` for ``text`` (cached), or SelectorError."""
    if len(text) > MAX_SELECTOR_LENGTH:
        raise SelectorError(f"selector longer than {MAX_SELECTOR_LENGTH} characters",
                            MAX_SELECTOR_LENGTH)
    try:
        return Selector(text, _Parser(text).parse())
    except RecursionError:  # MAX_NESTING keeps far from it; a deep caller stack, though
        raise SelectorError("selector nested too deeply", 0) from None
