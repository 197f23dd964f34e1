"""The evaluating half of ``amqlite.broker.selector``: the expression tree, the values
it computes with (Java's, as ActiveMQ's filter classes use them), and the compilation
of a tree into closures. Sans-I/O, stdlib only; nothing here raises on a message.

Values: ``None`` (NULL/UNKNOWN), ``bool``, ``str``, ``int`` (a Java ``int``), ``Long``
(a Java ``long``) and ``float`` (a Java ``double``). Boolean results are three-valued:
``True``, ``False`` or ``None`` for UNKNOWN.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol, TypeAlias


class Long(int):
    """A Java ``long``: JMSTimestamp, JMSExpiration, an integer literal beyond the
    ``int`` range. A plain ``int`` value is a Java ``int``; the difference decides the
    range a string header must fit when it is compared with the number."""

    __slots__ = ()


Value: TypeAlias = "bool | str | int | float | None"
Headers: TypeAlias = Mapping[str, str]

INT_MIN, INT_MAX = -(2**31), 2**31 - 1
LONG_MIN, LONG_MAX = -(2**63), 2**63 - 1


class SelectorContext(Protocol):
    """The JMS header fields of a message, read only when a selector names them
    (``amqlite.broker.message.Message`` has them all). JMSType, JMSCorrelationID and
    JMSReplyTo come from the ``type``, ``correlation-id`` and ``reply-to`` headers."""

    @property
    def message_id(self) -> str: ...  # JMSMessageID; "" reads as NULL
    @property
    def priority(self) -> int: ...  # JMSPriority (a Java int)
    @property
    def enqueued_at(self) -> int: ...  # JMSTimestamp: the enqueue time, ms (a long)
    @property
    def expires_at(self) -> int: ...  # JMSExpiration: ms, 0 = never (a long)
    @property
    def persistent(self) -> bool: ...  # JMSDeliveryMode: 'PERSISTENT' / 'NON_PERSISTENT'
    @property
    def destination(self) -> str: ...  # JMSDestination, e.g. '/queue/a' reads 'queue://a'


@dataclass(frozen=True, slots=True)
class MessageFields:
    """A ready-made ``SelectorContext``, for callers without a broker ``Message``."""

    message_id: str = ""
    priority: int = 4
    enqueued_at: int = 0
    expires_at: int = 0
    persistent: bool = False
    destination: str = ""


# --- the expression tree -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Lit:
    value: Value


@dataclass(frozen=True, slots=True)
class Ident:
    name: str


@dataclass(frozen=True, slots=True)
class Neg:
    operand: Node


@dataclass(frozen=True, slots=True)
class Arith:
    """``first op1 x1 op2 x2 ...``, left to right (one precedence level per node)."""

    first: Node
    rest: tuple[tuple[str, Node], ...]


@dataclass(frozen=True, slots=True)
class Cmp:
    op: str  # = <> < <= > >=
    left: Node
    right: Node


@dataclass(frozen=True, slots=True)
class Between:
    operand: Node
    low: Node
    high: Node
    negated: bool


@dataclass(frozen=True, slots=True)
class InList:
    ident: Ident
    values: tuple[str, ...]
    negated: bool


@dataclass(frozen=True, slots=True)
class Like:
    operand: Node
    pattern: str
    escape: str | None
    negated: bool


@dataclass(frozen=True, slots=True)
class IsNull:
    operand: Node
    negated: bool


@dataclass(frozen=True, slots=True)
class Not:
    operand: Node


@dataclass(frozen=True, slots=True)
class And:
    operands: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Or:
    operands: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Truth:
    """A bare identifier used as a condition: TRUE only for a boolean TRUE value (a
    STOMP header is a string, so FALSE), UNKNOWN when absent (ActiveMQ's boolean cast)."""

    ident: Ident


Node: TypeAlias = (
    "Lit | Ident | Neg | Arith | Cmp | Between | InList | Like | IsNull | Not | And | Or | Truth"
)
BOOLEAN_NODES = (Cmp, Between, InList, Like, IsNull, Not, And, Or, Truth)

# --- Java values -----------------------------------------------------------------------


def is_number(v: Value) -> bool:
    t = type(v)
    return t is int or t is Long or t is float


def _wrap(v: int, long: bool) -> int:
    """Java's two's-complement overflow of an int (or long) result."""
    if long:
        return Long((v - LONG_MIN) % 2**64 + LONG_MIN)
    return (v - INT_MIN) % 2**32 + INT_MIN


def arithmetic(op: str, a: Value, b: Value) -> Value:
    """``a op b`` as ActiveMQ's ArithmeticExpression: int op int stays int, a long makes
    it long, a double makes it double; ``/`` and ``%`` always give a double. A NULL or
    non-number operand, or a zero divisor, gives UNKNOWN (None)."""
    if not (is_number(a) and is_number(b)):
        return None
    assert isinstance(a, int | float) and isinstance(b, int | float)
    if isinstance(a, int) and isinstance(b, int) and op in "+-*":
        r = a + b if op == "+" else a - b if op == "-" else a * b
        return _wrap(r, type(a) is Long or type(b) is Long)
    x, y = float(a), float(b)
    if op == "/":
        return x / y if y != 0.0 else None
    if op == "%":
        return math.fmod(x, y) if y != 0.0 and math.isfinite(x) else None
    return x + y if op == "+" else x - y if op == "-" else x * y


def negate(v: Value) -> Value:
    if not is_number(v):
        return None  # ActiveMQ: negating NULL or a non-number is NULL
    if isinstance(v, float):
        return -v
    assert isinstance(v, int)
    return _wrap(-v, type(v) is Long)


_INT_RE = re.compile(r"[+-]?\d+")  # Integer.valueOf/Long.valueOf: Unicode digits, no spaces
_DOUBLE_RE = re.compile(
    r"[+-]?(?:NaN|Infinity|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?[fFdD]?)", re.ASCII
)
_HEX_DOUBLE_RE = re.compile(
    r"[+-]?0[xX](?:[0-9a-fA-F]+\.?|[0-9a-fA-F]*\.[0-9a-fA-F]+)[pP][+-]?\d+[fFdD]?", re.ASCII
)
_JAVA_TRIM = "".join(map(chr, range(33)))  # String.trim(): every char <= U+0020


def _to_integer(s: str, long: bool) -> int | None:
    """``Integer.valueOf(s)`` (``Long.valueOf``): None where Java throws."""
    if not _INT_RE.fullmatch(s):
        return None
    try:
        v = int(s)
    except ValueError:  # beyond Python's int-string digit limit: beyond a long anyway
        return None
    if long:
        return Long(v) if LONG_MIN <= v <= LONG_MAX else None
    return v if INT_MIN <= v <= INT_MAX else None


def _to_double(s: str) -> float | None:
    """``Double.valueOf(s)``: None where Java throws."""
    t = s.strip(_JAVA_TRIM)
    if _DOUBLE_RE.fullmatch(t):
        return float(t.rstrip("fFdD"))
    if _HEX_DOUBLE_RE.fullmatch(t):
        return float.fromhex(t.rstrip("fFdD"))
    return None


def _convert(s: str, like: Value) -> Value:
    """The string ``s`` as the Java type of ``like`` (ActiveMQ's ComparisonExpression
    with convert_string_expressions); None when it does not parse as one."""
    if type(like) is bool:
        return s.lower() == "true"  # Boolean.valueOf: never fails
    if type(like) is float:
        return _to_double(s)
    return _to_integer(s, type(like) is Long)


def _dcmp(x: float, y: float) -> int:
    """``Double.compare``: NaN is above everything and equal to itself; -0.0 < 0.0."""
    if x < y:
        return -1
    if x > y:
        return 1
    xn, yn = x != x, y != y
    if xn or yn:
        return int(xn) - int(yn)
    xs, ys = math.copysign(1.0, x), math.copysign(1.0, y)
    return (xs > ys) - (xs < ys)


def _scmp(a: str, b: str) -> int:
    """``String.compareTo``: by UTF-16 code unit (not code point)."""
    if a == b:
        return 0
    if not (a.isascii() and b.isascii()):
        a16, b16 = a.encode("utf-16-be", "surrogatepass"), b.encode("utf-16-be", "surrogatepass")
        return -1 if a16 < b16 else 1
    return -1 if a < b else 1


def java_compare(a: Value, b: Value) -> int | None:
    """The sign of ``a.compareTo(b)`` after ActiveMQ's conversions, or None for values
    that do not compare (the comparison is then FALSE). Operands are not NULL."""
    if isinstance(a, str) != isinstance(b, str):
        if isinstance(a, str):
            a = _convert(a, b)
        else:
            assert isinstance(b, str)
            b = _convert(b, a)
        if a is None or b is None:
            return None
    if isinstance(a, str) and isinstance(b, str):
        return _scmp(a, b)
    if isinstance(a, bool) or isinstance(b, bool):
        return int(a) - int(b) if isinstance(a, bool) and isinstance(b, bool) else None
    assert isinstance(a, int | float) and isinstance(b, int | float)
    if isinstance(a, float) or isinstance(b, float):
        return _dcmp(float(a), float(b))
    return (a > b) - (a < b)


_CMP: dict[str, Callable[[int], bool]] = {
    "=": lambda c: c == 0,
    "<>": lambda c: c != 0,
    "<": lambda c: c < 0,
    "<=": lambda c: c <= 0,
    ">": lambda c: c > 0,
    ">=": lambda c: c >= 0,
}


def compare(op: str, a: Value, b: Value) -> bool | None:
    """``a op b``: UNKNOWN when either is NULL, FALSE when they do not compare (so
    ``<>``, which is NOT ``=``, is then TRUE)."""
    if a is None or b is None:
        return None
    c = java_compare(a, b)
    if c is None:
        return op == "<>"
    return _CMP[op](c)


def not3(v: Value) -> bool | None:
    return None if v is None else not v


def like_matcher(pattern: str, escape: str | None) -> Callable[[str], bool]:
    """A matcher for a LIKE pattern: ``%`` any run, ``_`` one character; the escape
    character makes a following ``%``, ``_`` or escape literal and is itself literal
    before anything else (ActiveMQ's LikeExpression). Linear segment scanning, no
    regex backtracking: a hostile pattern costs at most len(pattern) * len(value)."""
    segments: list[list[str | None]] = [[]]  # split at %; None stands for _
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == escape and i + 1 < n and pattern[i + 1] in ("%", "_", escape):
            segments[-1].append(pattern[i + 1])
            i += 2
            continue
        if c == "%":
            segments.append([])
        else:
            segments[-1].append(None if c == "_" else c)
        i += 1
    segs = [_Segment(s) for s in segments]
    if len(segs) == 1:
        only = segs[0]
        return lambda s: len(s) == only.size and only.at(s, 0)
    first, middle, last = segs[0], segs[1:-1], segs[-1]
    least = sum(seg.size for seg in segs)

    def match(s: str) -> bool:
        if len(s) < least or not first.at(s, 0) or not last.at(s, len(s) - last.size):
            return False
        pos, end = first.size, len(s) - last.size
        for seg in middle:
            found = seg.find(s, pos, end)
            if found < 0:
                return False
            pos = found + seg.size
        return True

    return match


class _Segment:
    """A LIKE segment between two ``%``: literal chunks at fixed offsets."""

    __slots__ = ("chunks", "size", "text")

    def __init__(self, chars: list[str | None]) -> None:
        self.size = len(chars)
        self.text = "".join(c for c in chars if c is not None) if None not in chars else None
        self.chunks: list[tuple[int, str]] = []
        run: list[str] = []
        for k, c in enumerate([*chars, None]):
            if c is not None:
                run.append(c)
            elif run:
                self.chunks.append((k - len(run), "".join(run)))
                run = []

    def at(self, s: str, i: int) -> bool:
        return all(s.startswith(chunk, i + off) for off, chunk in self.chunks)

    def find(self, s: str, start: int, end: int) -> int:
        if self.text is not None:
            return s.find(self.text, start, end)
        for i in range(start, end - self.size + 1):
            if self.at(s, i):
                return i
        return -1


# --- identifiers -----------------------------------------------------------------------

Fn: TypeAlias = Callable[[Headers, SelectorContext], Value]


def jms_destination(name: str | None) -> str | None:
    """A STOMP destination as ActiveMQDestination.toString(): '/queue/a' -> 'queue://a'."""
    if not name:
        return None
    for kind in ("queue", "topic", "temp-queue", "temp-topic"):
        if name.startswith(f"/{kind}/"):
            return f"{kind}://{name[len(kind) + 2 :]}"
    return name


#: The JMS header names (case-sensitive, as ActiveMQ's PropertyExpression) and what
#: they read; any other identifier reads the STOMP header of that name.
JMS_FIELDS: dict[str, Fn] = {
    "JMSMessageID": lambda h, m: m.message_id or None,
    "JMSPriority": lambda h, m: m.priority,
    "JMSTimestamp": lambda h, m: Long(m.enqueued_at),
    "JMSExpiration": lambda h, m: Long(m.expires_at),
    "JMSDeliveryMode": lambda h, m: "PERSISTENT" if m.persistent else "NON_PERSISTENT",
    "JMSType": lambda h, m: h.get("type"),
    "JMSCorrelationID": lambda h, m: h.get("correlation-id"),
    "JMSDestination": lambda h, m: jms_destination(m.destination),
    "JMSReplyTo": lambda h, m: jms_destination(h.get("reply-to")),
}


def _header(name: str) -> Fn:
    return lambda h, m: h.get(name)


# --- compilation -----------------------------------------------------------------------


def compile_node(node: Node) -> Fn:
    """A closure computing ``node`` (its depth is bounded by the parser's nesting limit)."""
    if isinstance(node, Lit):
        value = node.value
        return lambda h, m: value
    if isinstance(node, Ident):
        return JMS_FIELDS.get(node.name) or _header(node.name)
    if isinstance(node, Neg):
        operand = compile_node(node.operand)
        return lambda h, m: negate(operand(h, m))
    if isinstance(node, Arith):
        return _compile_arith(node)
    if isinstance(node, Cmp):
        op, left, right = node.op, compile_node(node.left), compile_node(node.right)
        return lambda h, m: compare(op, left(h, m), right(h, m))
    if isinstance(node, Between):
        return _compile_between(node)
    if isinstance(node, InList):
        return _compile_in(node)
    if isinstance(node, Like):
        return _compile_like(node)
    if isinstance(node, IsNull):
        operand, negated = compile_node(node.operand), node.negated
        return lambda h, m: (operand(h, m) is None) != negated
    if isinstance(node, Not):
        operand = compile_node(node.operand)
        return lambda h, m: not3(operand(h, m))
    if isinstance(node, And | Or):
        return _compile_logic(node)
    value_of = compile_node(node.ident)

    def truth(h: Headers, m: SelectorContext) -> Value:
        v = value_of(h, m)
        return v if v is None or type(v) is bool else False

    return truth


def _compile_arith(node: Arith) -> Fn:
    first = compile_node(node.first)
    rest = [(op, compile_node(n)) for op, n in node.rest]

    def arith(h: Headers, m: SelectorContext) -> Value:
        acc = first(h, m)
        for op, fn in rest:
            if acc is None:
                return None
            acc = arithmetic(op, acc, fn(h, m))
        return acc

    return arith


def _compile_between(node: Between) -> Fn:
    operand, low, high = (compile_node(n) for n in (node.operand, node.low, node.high))
    if node.negated:  # x < low OR x > high
        def outside(h: Headers, m: SelectorContext) -> Value:
            v = operand(h, m)
            return _logic3((compare("<", v, low(h, m)), compare(">", v, high(h, m))), True)

        return outside

    def inside(h: Headers, m: SelectorContext) -> Value:  # x >= low AND x <= high
        v = operand(h, m)
        return _logic3((compare(">=", v, low(h, m)), compare("<=", v, high(h, m))), False)

    return inside


def _compile_in(node: InList) -> Fn:
    value_of, negated = compile_node(node.ident), node.negated
    values = frozenset(node.values)

    def in_list(h: Headers, m: SelectorContext) -> Value:
        v = value_of(h, m)
        if not isinstance(v, str):
            return None  # ActiveMQ: NULL and non-strings are UNKNOWN, for IN and NOT IN
        return (v in values) != negated

    return in_list


def _compile_like(node: Like) -> Fn:
    value_of, negated = compile_node(node.operand), node.negated
    matcher = like_matcher(node.pattern, node.escape)

    def like(h: Headers, m: SelectorContext) -> Value:
        v = value_of(h, m)
        if v is None:
            return None
        return (isinstance(v, str) and matcher(v)) != negated  # a non-string: LIKE FALSE

    return like


def _logic3(values: tuple[Value, ...] | list[Value], decides: bool) -> bool | None:
    """SQL's three-valued AND (``decides`` FALSE) or OR (``decides`` TRUE): the deciding
    value wins, else any UNKNOWN makes it UNKNOWN, else the other value."""
    unknown = False
    for v in values:
        if v is decides:
            return decides
        unknown = unknown or v is None
    return None if unknown else not decides


def _compile_logic(node: And | Or) -> Fn:
    parts = [compile_node(n) for n in node.operands]
    stop = isinstance(node, Or)  # the value that decides: TRUE for OR, FALSE for AND

    def logic(h: Headers, m: SelectorContext) -> Value:
        unknown = False
        for part in parts:
            v = part(h, m)
            if v is stop:
                return stop
            unknown = unknown or v is None
        return None if unknown else not stop

    return logic
