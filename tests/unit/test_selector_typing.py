"""Unit tests of the JMS selector's values: ActiveMQ's STOMP typing rule (a header
compared with a number or boolean is converted as Java would), the JMS field mappings, and
that evaluation never raises."""

from __future__ import annotations

import itertools

import pytest

from amqlite.broker.selector import MessageFields, parse_selector
from tests.helpers.selector import CTX, ev

# --- the STOMP typing rule -------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value", "expected"),
    [
        ("price > 10", "12", True),
        ("price > 10", "9", False),
        ("price > 10", "abc", False),  # FALSE, not UNKNOWN (ActiveMQ)
        ("NOT (price > 10)", "abc", True),
        ("price <> 10", "abc", True),
        ("price = 10", "10", True),
        ("price = 10", "010", True),  # Integer.valueOf is decimal
        ("price = 10", "+10", True),
        ("price = 10", " 10", False),  # Integer.valueOf does not trim
        ("price = 10", "10.0", False),  # not an int
        ("price > 10", "12.5", False),
        ("price > 10.0", "12.5", True),  # a double literal: Double.valueOf
        ("price > 10.0", "12", True),
        ("price > 10.0", " 12 ", True),  # Double.valueOf trims
        ("price > 10.0", "1.2e1", True),
        ("price > 10.0", "12d", True),  # Java's float suffixes
        ("price > 10.0", "12f", True),
        ("price > 10.0", "0x1.8p3", True),  # Java hex float: 12.0
        ("price > 10.0", "Infinity", True),
        ("price > 10.0", "-Infinity", False),
        ("price > 10.0", "NaN", True),  # Double.compareTo: NaN above everything
        ("price = 10.0", "NaN", False),
        ("price > 10.0", "nan", False),  # Java is case-sensitive: does not parse
        ("price > 10", "3000000000", False),  # not a Java int
        ("price > 2147483648", "3000000000", True),  # a long literal
        ("price < -2147483649", "-3000000000", True),
        ("price > 0", "99999999999999999999", False),
        ("price > 10", "\uff11\uff12", True),  # fullwidth 12: Unicode digits, as Character.digit
        ("price BETWEEN 10 AND 20", "15", True),
        ("price BETWEEN 10 AND 20", "x", False),
        ("10 < price", "12", True),
        ("price + 1 > 10", "12", None),  # arithmetic never converts
        ("-price < 0", "12", None),
        ("price * 1.0 > 10", "12", None),
        ("flag = TRUE", "true", True),
        ("flag = TRUE", "TRUE", True),
        ("flag = TRUE", "yes", False),
        ("flag = FALSE", "yes", True),  # Boolean.valueOf: anything else is false
        ("TRUE = flag", "True", True),
        ("flag <> FALSE", "true", True),
        ("price = '12'", "12", True),
    ],
)
def test_stomp_typing_rule(text: str, value: str, expected: bool | None) -> None:
    assert ev(text, {"price": value, "flag": value}) is expected


def test_typing_rule_with_jms_fields() -> None:
    ctx = MessageFields(priority=7, enqueued_at=5_000_000_000)
    assert ev("JMSPriority = p", {"p": "7"}, ctx) is True  # p as a Java int
    assert ev("JMSPriority = p", {"p": "7.0"}, ctx) is False
    assert ev("JMSTimestamp = t", {"t": "5000000000"}, ctx) is True  # t as a Java long
    assert ev("JMSTimestamp > 0", {}, ctx) is True
    assert ev("JMSTimestamp + 1 = 5000000001", {}, ctx) is True
    assert ev("JMSPriority = '7'", {}, ctx) is True


# --- JMS fields ------------------------------------------------------------------------


class BrokerLikeMessage:
    """Not a MessageFields: any object with the attributes is a SelectorContext."""

    def __init__(self) -> None:
        self.message_id = "ID:b-7"
        self.priority = 9
        self.enqueued_at = 1234
        self.expires_at = 99
        self.persistent = False
        self.destination = "/topic/prices"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("JMSMessageID = 'ID:b-7'", True),
        ("JMSPriority = 9", True),
        ("JMSPriority > 8 AND JMSPriority < 10", True),
        ("JMSTimestamp = 1234", True),
        ("JMSExpiration = 99", True),
        ("JMSDeliveryMode = 'NON_PERSISTENT'", True),
        ("JMSDestination = 'topic://prices'", True),
        ("JMSType = 'order'", True),
        ("JMSCorrelationID = 'c-1'", True),
        ("JMSReplyTo = 'queue://replies'", True),
        ("type = 'order'", True),  # the header itself
        ("priority = 1", True),  # a header named priority, as sent
        ("jmspriority = 9", None),  # JMS names are case-sensitive: a header
        ("JMSRedelivered", None),  # not mapped: a (missing) header
    ],
)
def test_jms_fields(text: str, expected: bool | None) -> None:
    headers = {"type": "order", "correlation-id": "c-1", "reply-to": "/queue/replies",
               "priority": "1"}
    assert parse_selector(text).evaluate(headers, BrokerLikeMessage()) is expected


def test_jms_field_defaults() -> None:
    ctx = MessageFields()
    assert ev("JMSMessageID IS NULL", {}, ctx) is True  # no id yet
    assert ev("JMSDeliveryMode = 'NON_PERSISTENT'", {}, ctx) is True
    assert ev("JMSDestination IS NULL", {}, ctx) is True
    assert ev("JMSPriority = 4", {}, ctx) is True
    assert ev("JMSDeliveryMode = 'PERSISTENT'") is True  # CTX is persistent
    assert ev("JMSDestination = 'queue://orders'") is True
    assert ev("JMSDestination = 'x'", {}, MessageFields(destination="x")) is True
    assert ev("JMSReplyTo = '/temp-queue/r'", {"reply-to": "/temp-queue/r"}) is False
    assert ev("JMSReplyTo = 'temp-queue://r'", {"reply-to": "/temp-queue/r"}) is True


# --- evaluation never raises -----------------------------------------------------------


def test_evaluation_never_raises() -> None:
    texts = [
        "a = 1", "a > 1.5", "a + b > 1", "a * 2 = b", "a / b > 0", "a % b = 0", "-a = b",
        "a LIKE '%1%'", "a IN ('1')", "a BETWEEN b AND 9", "a = b", "a > b", "a",
        "JMSTimestamp / a > 1", "JMSPriority * a = 8", "a = TRUE", "a <> b AND NOT a < 1",
    ]
    values = ["", "0", "1", "-1", "1.5", "abc", "NaN", "Infinity", "-0.0", "true",
              "9" * 5000, "1e999", "0x1p3", "\udcff", "2147483648", "-9223372036854775809"]
    for text in texts:
        sel = parse_selector(text)
        for a, b in itertools.product(values, repeat=2):
            assert sel.evaluate({"a": a, "b": b}, CTX) in (True, False, None)


class Exploding:
    @property
    def priority(self) -> int:
        raise RuntimeError("boom")


def test_a_broken_context_does_not_raise() -> None:
    sel = parse_selector("JMSPriority > 1")
    assert sel.matches({}, Exploding()) is False  # type: ignore[arg-type]
    assert sel.evaluate({}, Exploding()) is None  # type: ignore[arg-type]
