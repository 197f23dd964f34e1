"""Checks every client frame against what the store can hold and every consumer can read.

A value the store cannot hold (a destination longer than its column, an ``expires``
past BIGINT) used to fail the group commit, which the master took for a lost store:
one SEND demoted the whole group. A header a consumer's STOMP version cannot carry
raised inside dispatch. Both are refused here, when the frame arrives, with an ERROR
to that client only (``BrokerError``); nothing is stored and nothing half-applied.

The limits come from ``store.schema`` (one constant per column), so the schema and
the checks cannot drift.
"""

from __future__ import annotations

from collections.abc import Mapping

from amqlite.codec import ProtocolError, parse_uint
from amqlite.wire import PRODUCER_ID_HEADER, PRODUCER_SEQ_HEADER
from store.schema import (
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
    "BrokerError",
    "check_connect",
    "check_destination",
    "check_subscribe",
    "check_user_headers",
    "destination_kind",
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

_PERSISTENT = {"true": True, "false": False}
#: A header name every STOMP version can carry in a MESSAGE: 1.0 cannot escape, so no
#: ':' (it would split the name) and no EOL; NUL ends the frame for most clients.
_BAD_IN_NAME = (":", "\r", "\n", "\x00")
#: A value likewise: 1.0 cannot escape EOLs, 1.1 cannot carry a CR at all.
_BAD_IN_VALUE = ("\r", "\n", "\x00")


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
    checked); BrokerError for neither."""
    if len(destination) > 7:
        if destination.startswith("/queue/"):
            return "queue"
        if destination.startswith("/topic/"):
            return "topic"
    raise BrokerError(f"destination {_shown(destination)}: use /queue/NAME or /topic/NAME")


def _check_name(what: str, value: str, limit: int) -> None:
    if len(value) > limit:
        raise BrokerError(f"{what} of {len(value)} characters: at most {limit}")
    if "\x00" in value:
        raise BrokerError(f"{what} {_shown(value)}: NUL is not allowed")


def check_user_headers(headers: Mapping[str, str]) -> int:
    """Every header copied from SEND to MESSAGE must be encodable for STOMP 1.0, 1.1 and
    1.2 consumers alike; say which header is not, and why. Returns the characters of
    the names and values (the message's size needs them: one pass, not two)."""
    names = "".join(headers)
    values = "".join(headers.values())
    # Fast path: a few C-level scans of two joined strings for the usual clean frame
    # (NUL cannot get here: the codec refuses it in any header).
    if not (":" in names or "\r" in names or "\n" in names or "\r" in values
            or "\n" in values or "\x00" in names or "\x00" in values):
        return len(names) + len(values)
    for name, value in headers.items():
        for char in _BAD_IN_NAME:
            if char in name:
                raise BrokerError(
                    f"header name {_shown(name)} contains {char!r}: STOMP 1.0 consumers "
                    "cannot receive it")
        for char in _BAD_IN_VALUE:
            if char in value:
                why = ("STOMP 1.0 and 1.1 consumers cannot receive it" if char == "\r"
                       else "STOMP 1.0 consumers cannot receive it")
                raise BrokerError(f"header {_shown(name)}: value contains {char!r}: {why}")
    return len(names) + len(values)


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
