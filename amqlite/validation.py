"""Checks every client frame against what the store can hold and every consumer can read.

A value the store cannot hold (a destination longer than its column, an ``expires``
past BIGINT) used to fail the group commit, which the master took for a lost store:
one SEND demoted the whole group. A header a consumer's STOMP version cannot carry
raised inside dispatch. The first is refused here, when the frame arrives, with an ERROR
to that client only (``BrokerError``); nothing is stored and nothing half-applied. The
second is not an error of the sender's: such a header is left out of that consumer's
MESSAGE and named in ``OMITTED_HEADERS_HEADER`` (``headers_for``).

The limits come from ``store.schema`` (one constant per column), so the schema and
the checks cannot drift.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import quote

from amqlite.codec import ProtocolError, parse_uint
from amqlite.wire import (
    OMITTED_HEADERS_HEADER,
    PRODUCER_ID_HEADER,
    PRODUCER_SEQ_HEADER,
    STOMP_1_0,
    STOMP_1_1,
    STOMP_1_2,
)
from store.limits import (
    BIGINT_MAX,
    CLIENT_ID_LENGTH,
    DESTINATION_NAME_LENGTH,
    PRIORITY_MAX,
    PRIORITY_MIN,
    PRODUCER_ID_LENGTH,
    SUBSCRIPTION_NAME_LENGTH,
)

__all__ = [
    "MAX_ACK_KEY",
    "MAX_PREFETCH",
    "MAX_PRIORITY_VALUE",
    "MAX_SUBSCRIPTION_ID_LENGTH",
    "REMOTE_TEMP_KINDS",
    "REMOTE_TEMP_QUEUE",
    "REMOTE_TEMP_TOPIC",
    "TEMP_QUEUE",
    "TEMP_TOPIC",
    "BrokerError",
    "carries",
    "check_connect",
    "check_destination",
    "check_subscribe",
    "check_user_headers",
    "destination_kind",
    "header_floor",
    "headers_for",
    "is_temporary",
    "parse_ack_key",
    "parse_send",
]

#: Upper bound of ``activemq.prefetchSize``: ActiveMQ's largest default prefetch
#: (topics, Short.MAX_VALUE - 1). Larger asks for the whole backlog in RAM: ERROR.
MAX_PREFETCH = 32_766
#: The subscription ``id`` is echoed on every MESSAGE; as long as a durable name.
MAX_SUBSCRIPTION_ID_LENGTH = SUBSCRIPTION_NAME_LENGTH
#: ``priority`` is read like ActiveMQ's Integer.parseInt (a Java int), then clamped
#: to 0..9 as ActiveMQ does; a sign, a fraction or any other text is an ERROR.
MAX_PRIORITY_VALUE = 2**31 - 1
#: The subscription key of a STOMP 1.2 ack id (``key:message-id``); keys count up
#: from 1 per connection, so anything past a BIGINT names nothing.
MAX_ACK_KEY = BIGINT_MAX

#: Temporary destinations (``amqlite.broker.temporary``), ActiveMQ's STOMP prefixes: a
#: connection names its own ``/temp-queue/NAME``, and the broker gives each one a
#: broker-wide name under ``/remote-temp-queue/`` that others SEND to (its reply-to).
TEMP_QUEUE, TEMP_TOPIC = "/temp-queue/", "/temp-topic/"
REMOTE_TEMP_QUEUE, REMOTE_TEMP_TOPIC = "/remote-temp-queue/", "/remote-temp-topic/"
#: The broker-wide temporary prefixes and their kind: the names the broker itself uses.
REMOTE_TEMP_KINDS = {REMOTE_TEMP_QUEUE: "queue", REMOTE_TEMP_TOPIC: "topic"}

_PERSISTENT = {"true": True, "false": False}
#: Characters of a header name that STOMP 1.0 cannot carry in a MESSAGE (it cannot
#: escape: ':' would split the name, an EOL would end the line).
_BAD_IN_NAME_1_0 = (":", "\r", "\n")
#: Characters of a value that STOMP 1.0 cannot carry (no escapes: an EOL ends the line).
_BAD_IN_VALUE_1_0 = ("\r", "\n")
#: STOMP 1.1 escapes LF and ':' but has no escape for CR: a CR anywhere is 1.2 only.
_BAD_1_1 = "\r"


class BrokerError(Exception):
    """The client asked for something the broker refuses; becomes an ERROR frame."""


def _shown(text: str) -> str:
    """A client's text for an ERROR message: quoted (control characters escaped), short."""
    return repr(text[:60]) + ("..." if len(text) > 60 else "")


def check_destination(destination: str) -> str:
    """The destination's kind, ``"queue"`` or ``"topic"``; BrokerError if it is not one
    the store can hold and every consumer can read."""
    if len(destination) > DESTINATION_NAME_LENGTH:
        raise BrokerError(f"destination of {len(destination)} characters: at most "
                          f"{DESTINATION_NAME_LENGTH}")
    if "\r" in destination or "\n" in destination or "\x00" in destination:
        raise BrokerError(f"destination {_shown(destination)}: CR, LF and NUL are not allowed")
    return destination_kind(destination)


def destination_kind(destination: str) -> str:
    """``"queue"`` or ``"topic"`` by the name's prefix alone (for a name already
    checked); BrokerError for neither. A temporary destination's broker-wide name
    (``/remote-temp-queue/...``) has the kind it behaves as; a connection's own
    ``/temp-queue/NAME`` is resolved to one before anything asks (``amqlite.broker.
    temporary``), so it is no kind here."""
    if len(destination) > 7:
        if destination.startswith("/queue/"):
            return "queue"
        if destination.startswith("/topic/"):
            return "topic"
        for prefix, kind in REMOTE_TEMP_KINDS.items():
            if destination.startswith(prefix) and len(destination) > len(prefix):
                return kind
    raise BrokerError(f"destination {_shown(destination)}: use /queue/NAME, /topic/NAME, "
                      "/temp-queue/NAME or /temp-topic/NAME")


def is_temporary(destination: str) -> bool:
    """Does the name start with a temporary destination's prefix (a connection's own
    or a broker-wide one)? Such a destination is never stored: the operator API and
    settings that name a stored destination refuse it."""
    return destination.startswith((TEMP_QUEUE, TEMP_TOPIC, REMOTE_TEMP_QUEUE, REMOTE_TEMP_TOPIC))


def _check_name(what: str, value: str, limit: int) -> None:
    if len(value) > limit:
        raise BrokerError(f"{what} of {len(value)} characters: at most {limit}")
    if "\x00" in value:
        raise BrokerError(f"{what} {_shown(value)}: NUL is not allowed")


def check_user_headers(headers: Mapping[str, str]) -> tuple[int, str]:
    """``(characters, floor)`` of the headers a SEND hands on to its MESSAGEs: the
    characters of names and values (the message's size needs them: one pass, not two)
    and the oldest STOMP version that can carry every one of them (``header_floor``).

    Nothing the sender's own version could express is refused here: the codec already
    refused what that version cannot carry (an undefined escape, a raw CR in 1.1). A
    consumer of an older version gets such a header left out (``headers_for``)."""
    names = "".join(headers)
    values = "".join(headers.values())
    # Fast path: a few C-level scans of two joined strings for the usual clean frame.
    if not (":" in names or "\r" in names or "\n" in names or "\r" in values
            or "\n" in values or "\x00" in names or "\x00" in values):
        return len(names) + len(values), STOMP_1_0
    for name, value in headers.items():
        if "\x00" in name or "\x00" in value:  # the codec refuses it; a defence in depth
            raise BrokerError(f"header {_shown(name)}: NUL is not allowed")
    return len(names) + len(values), header_floor(headers)


def header_floor(headers: Mapping[str, str]) -> str:
    """The oldest STOMP version whose MESSAGE frame can carry every header as it is."""
    floor = STOMP_1_0
    for name, value in headers.items():
        if _BAD_1_1 in name or _BAD_1_1 in value:
            return STOMP_1_2
        if any(c in name for c in _BAD_IN_NAME_1_0) or any(
                c in value for c in _BAD_IN_VALUE_1_0):
            floor = STOMP_1_1
    return floor


def carries(version: str, name: str, value: str) -> bool:
    """Whether a MESSAGE of STOMP ``version`` can carry this header as it is."""
    if version == STOMP_1_2:
        return True
    if _BAD_1_1 in name or _BAD_1_1 in value:
        return False
    return version != STOMP_1_0 or not (
        any(c in name for c in _BAD_IN_NAME_1_0) or any(c in value for c in _BAD_IN_VALUE_1_0))


def headers_for(version: str, headers: Mapping[str, str]) -> dict[str, str]:
    """The headers a consumer of ``version`` gets of a message whose ``header_floor`` is
    newer: those it can carry, and ``OMITTED_HEADERS_HEADER`` naming the others
    (percent-encoded, comma-separated), so that its framing never breaks and it knows
    what it did not get."""
    kept: dict[str, str] = {}
    omitted: list[str] = []
    for name, value in headers.items():
        if carries(version, name, value):
            kept[name] = value
        else:
            omitted.append(quote(name, safe=""))
    kept[OMITTED_HEADERS_HEADER] = ",".join(omitted)
    return kept


def _uint(headers: Mapping[str, str], name: str, limit: int) -> int | None:
    text = headers.get(name)
    if text is None:
        return None
    return _uint_value(name, text, limit)


def _uint_value(name: str, text: str, limit: int) -> int:
    value = parse_uint(text, limit)
    if value is None:
        raise BrokerError(f"{name} {_shown(text)}: must be an integer in 0..{limit} "
                          "(ASCII digits only)")
    return value


def parse_send(
    headers: Mapping[str, str], default_priority: int,
    producer_id_header: str = PRODUCER_ID_HEADER,
    producer_seq_header: str = PRODUCER_SEQ_HEADER,
) -> tuple[bool, int, int, str | None, int | None]:
    """``(persistent, priority, expires, producer_id, producer_seq)`` of a SEND, checked
    against the store's columns; BrokerError names the first bad header."""
    get = headers.get  # on every SEND: one lookup per header, no helper calls when absent
    text = get("persistent")
    if text is None:
        persistent = True
    else:
        flag = _PERSISTENT.get(text)
        if flag is None:
            flag = _PERSISTENT.get(text.lower())
            if flag is None:
                raise BrokerError(f"persistent {_shown(text)}: use true or false")
        persistent = flag
    text = get("priority")
    if text is None:
        priority = default_priority
    else:
        priority = min(max(_uint_value("priority", text, MAX_PRIORITY_VALUE), PRIORITY_MIN),
                       PRIORITY_MAX)
    text = get("expires")
    expires = _uint_value("expires", text, BIGINT_MAX) if text else 0
    producer_id = get(producer_id_header)
    if producer_id is not None and (len(producer_id) > PRODUCER_ID_LENGTH
                                    or "\x00" in producer_id):
        _check_name(producer_id_header, producer_id, PRODUCER_ID_LENGTH)
    text = get(producer_seq_header)
    producer_seq = None if text is None else _uint_value(producer_seq_header, text,
                                                         BIGINT_MAX)
    return persistent, priority, expires, producer_id, producer_seq


def check_subscribe(headers: Mapping[str, str], default_prefetch: int) -> int:
    """Check a SUBSCRIBE's ids and names; return its prefetch (0 or absent: default)."""
    sub_id = headers.get("id")
    if sub_id is not None and len(sub_id) > MAX_SUBSCRIPTION_ID_LENGTH:
        raise BrokerError(f"subscription id of {len(sub_id)} characters: at most "
                          f"{MAX_SUBSCRIPTION_ID_LENGTH}")
    for name in ("activemq.subscriptionName", "durable-subscription-name"):
        value = headers.get(name)
        if value is not None:
            _check_name(name, value, SUBSCRIPTION_NAME_LENGTH)
    prefetch = _uint(headers, "activemq.prefetchSize", MAX_PREFETCH)
    return prefetch or default_prefetch


def parse_ack_key(text: str) -> int | None:
    """The subscription key of a STOMP 1.2 ack id, strictly parsed; None names nothing."""
    return parse_uint(text, MAX_ACK_KEY)


def check_connect(headers: Mapping[str, str]) -> None:
    """A CONNECT's ``client-id`` must fit the durable subscriptions' column."""
    client_id = headers.get("client-id")
    if client_id is None:
        return
    receipt = headers.get("receipt")
    if len(client_id) > CLIENT_ID_LENGTH:
        raise ProtocolError("invalid client-id", f"client-id of {len(client_id)} characters: "
                            f"at most {CLIENT_ID_LENGTH}", receipt_id=receipt)
    if "\x00" in client_id:
        raise ProtocolError("invalid client-id", "NUL is not allowed", receipt_id=receipt)
