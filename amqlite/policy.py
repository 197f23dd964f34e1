"""Policies per destination, as ActiveMQ's ``policyEntry`` and RabbitMQ's policies.

A config file (``--config``) may hold ``[[policy]]`` tables::

    [[policy]]
    destination = "/queue/orders.>"        # amqlite.wildcard: '*' one segment, '>' the rest
    dead_letter_strategy = "individual"    # /queue/DLQ.orders.eu for /queue/orders.eu
    max_redeliveries = 3
    redelivery_delay = 1.0                 # s before the first redelivery after a NACK
    redelivery_multiplier = 2.0            # back-off: 1 s, 2 s, 4 s ...
    max_redelivery_delay = 30.0            # ... at most 30 s
    message_ttl = 3600                     # s: an expiry for messages that have none
    max_message_ttl = 86400                # s: a cap for those that have one
    max_length = 10000                     # waiting messages of a queue
    max_bytes = 104857600                  # their bodies' bytes
    overflow = "reject-publish"            # or "drop-head" (the default)

The rules (docs/policies.md says the same for users):

- One policy applies to a destination: of the entries whose pattern matches its name,
  the **most specific**. Patterns are compared element by element from the left; at the
  first element where they differ a literal name beats ``*`` and ``*`` beats ``>``;
  when one pattern is the other's prefix up to a ``>``, the longer (the one without
  the ``>`` there) wins. Two patterns that match one name always differ somewhere
  they are compared (distinct literals cannot both match it), so the choice never
  depends on the order in the file. The same pattern twice is refused at start.
- Nothing is merged (neither ActiveMQ nor RabbitMQ merge): what the winning entry does
  not set comes from the broker-wide settings (``max_redeliveries``,
  ``dead_letter_queue``) or is off.
- A destination no entry matches gets the broker-wide defaults.

This module is pure (no broker, no I/O): ``parse_policies`` reads the TOML tables,
``Policies.resolve`` answers "which policy for this name" once per name and caches it,
so the broker pays a dict lookup per message, never a pattern match.
"""

from __future__ import annotations

import enum
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from amqlite.validation import BrokerError, check_destination
from amqlite.wildcard import (
    ANY_CHILD,
    ANY_DESCENDANT,
    Pattern,
    WildcardError,
    WildcardIndex,
    compile_pattern,
)

#: The config file's table array: ``[[policy]]``.
POLICY_TABLE = "policy"
log = logging.getLogger("amqlite.broker")  # the dead-letter warning's, as before
#: ActiveMQ's ``IndividualDeadLetterStrategy`` prefixes queue names with
#: ``ActiveMQ.DLQ.Queue.``; a STOMP user writes ``DLQ.`` (the brief's ``DLQ.<name>``).
DEFAULT_DEAD_LETTER_PREFIX = "DLQ."
#: What goes between the prefix and a topic's name, so ``/topic/x`` and ``/queue/x``
#: do not share one dead-letter queue (ActiveMQ's separate ``topicPrefix``).
TOPIC_DEAD_LETTER_INFIX = "Topic."
#: Resolved names cached at most; past it the cache starts over (issue 23: a client
#: cycling through new names must not grow the broker). A few hundred bytes each.
RESOLVE_CACHE_SIZE = 65_536
#: ActiveMQ's ``RedeliveryPolicy.backOffMultiplier`` when exponential back-off is on is
#: 5; ours is off (1.0) unless a policy sets one, as ActiveMQ's ``useExponentialBackOff``
#: defaults to false.
DEFAULT_MULTIPLIER = 1.0


class PolicyError(ValueError):
    """A ``[[policy]]`` table that cannot be used; the message is one line naming it."""


class Overflow(enum.Enum):
    """What a full queue does with one more message (RabbitMQ's ``overflow``)."""

    #: The oldest waiting message is dropped to make room (RabbitMQ's default).
    DROP_HEAD = "drop-head"
    #: The SEND is refused: an ERROR, no RECEIPT (RabbitMQ's ``reject-publish``).
    REJECT_PUBLISH = "reject-publish"


class DeadLetterStrategy(enum.Enum):
    """Where a message past its redeliveries goes (ActiveMQ's dead-letter strategies)."""

    #: One queue for all (``dead_letter_queue``): ActiveMQ's ``SharedDeadLetterStrategy``.
    SHARED = "shared"
    #: One per destination, ``/queue/<prefix><name>``: ``IndividualDeadLetterStrategy``.
    INDIVIDUAL = "individual"


@dataclass(frozen=True, slots=True)
class DestinationPolicy:
    """What applies to one destination: an entry's values with the broker's defaults
    filled in. ``pattern`` is the entry's, or None for the broker-wide defaults."""

    pattern: str | None = None
    dead_letter_queue: str = "/queue/DLQ"
    dead_letter_strategy: DeadLetterStrategy = DeadLetterStrategy.SHARED
    dead_letter_prefix: str = DEFAULT_DEAD_LETTER_PREFIX
    max_redeliveries: int = 6
    redelivery_delay: float = 0.0  # s; 0: at once
    redelivery_multiplier: float = DEFAULT_MULTIPLIER
    max_redelivery_delay: float = 0.0  # s; 0: no cap
    message_ttl: float = 0.0  # s; 0: messages without expires never expire
    max_message_ttl: float = 0.0  # s; 0: no cap
    max_length: int = 0  # 0: no limit
    max_bytes: int = 0  # 0: no limit
    overflow: Overflow = Overflow.DROP_HEAD

    @property
    def limited(self) -> bool:
        """A queue under this policy is bounded (its waiting messages are counted)."""
        return bool(self.max_length or self.max_bytes)

    @property
    def stamps_expiry(self) -> bool:
        """A SEND's expiry may change (``expires_at``)."""
        return bool(self.message_ttl or self.max_message_ttl)

    def dead_letter_for(self, destination: str) -> str:
        """The dead-letter queue of a message of ``destination``."""
        if self.dead_letter_strategy is DeadLetterStrategy.SHARED:
            return self.dead_letter_queue
        kind, _, name = destination[1:].partition("/")
        infix = TOPIC_DEAD_LETTER_INFIX if kind == "topic" else ""
        return f"/queue/{self.dead_letter_prefix}{infix}{name}"

    def redelivery_delay_ms(self, deliveries: int) -> int:
        """How long a message NACKed after its ``deliveries``-th delivery waits (ms):
        ``redelivery_delay * multiplier ** (deliveries - 1)``, at most
        ``max_redelivery_delay`` (ActiveMQ's ``RedeliveryPolicy.getNextRedeliveryDelay``)."""
        if self.redelivery_delay <= 0:
            return 0
        exponent = max(deliveries - 1, 0)
        try:
            delay = self.redelivery_delay * self.redelivery_multiplier ** exponent
        except OverflowError:
            delay = math.inf
        if self.max_redelivery_delay > 0:
            delay = min(delay, self.max_redelivery_delay)
        return int(min(delay, MAX_DELAY_SECONDS) * 1000)

    def expires_at(self, expires: int, now: int) -> int:
        """A SEND's expiry (ms since the epoch, 0 = never) under this policy: the default
        TTL for one without (ActiveMQ's ``TimeStampingBrokerPlugin.zeroExpirationOverride``,
        RabbitMQ's ``message-ttl``), capped at ``max_message_ttl`` (``ttlCeiling``)."""
        if expires <= 0 and self.message_ttl > 0:
            expires = now + int(self.message_ttl * 1000)
        if self.max_message_ttl > 0:
            ceiling = now + int(self.max_message_ttl * 1000)
            if expires <= 0 or expires > ceiling:
                expires = ceiling
        return expires

    def to_json(self) -> dict[str, Any]:
        """As the management API and ``queue list --json`` show it (seconds, names)."""
        return {
            "pattern": self.pattern,
            "dead_letter_queue": self.dead_letter_queue
            if self.dead_letter_strategy is DeadLetterStrategy.SHARED else None,
            "dead_letter_strategy": self.dead_letter_strategy.value,
            "max_redeliveries": self.max_redeliveries,
            "redelivery_delay": self.redelivery_delay,
            "redelivery_multiplier": self.redelivery_multiplier,
            "max_redelivery_delay": self.max_redelivery_delay,
            "message_ttl": self.message_ttl,
            "max_message_ttl": self.max_message_ttl,
            "max_length": self.max_length,
            "max_bytes": self.max_bytes,
            "overflow": self.overflow.value,
        }

    def summary(self, destination: str) -> str:
        """A short text for tables (``queue list``, the console): what differs from off."""
        parts = [f"dlq={self.dead_letter_for(destination)}",
                 f"redeliveries={self.max_redeliveries}"]
        if self.redelivery_delay:
            parts.append(f"delay={self.redelivery_delay:g}s"
                         + (f"x{self.redelivery_multiplier:g}"
                            if self.redelivery_multiplier != 1 else "")
                         + (f"<={self.max_redelivery_delay:g}s"
                            if self.max_redelivery_delay else ""))
        if self.message_ttl:
            parts.append(f"ttl={self.message_ttl:g}s")
        if self.max_message_ttl:
            parts.append(f"ttl<={self.max_message_ttl:g}s")
        if self.max_length:
            parts.append(f"max-length={self.max_length}")
        if self.max_bytes:
            parts.append(f"max-bytes={self.max_bytes}")
        if self.limited:
            parts.append(self.overflow.value)
        return " ".join(parts)


#: A redelivery delay beyond a day is a typo (and a multiplier's overflow): capped.
MAX_DELAY_SECONDS = 86_400.0


def _seconds(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) \
        and 0 <= v <= MAX_DELAY_SECONDS * 365


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _multiplier(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) \
        and 1 <= v <= 100


def _text(v: Any) -> bool:
    return isinstance(v, str)


#: Keys of a ``[[policy]]`` table and what each must be: (check, description).
_KEYS: dict[str, tuple[Any, str]] = {
    "destination": (_text, "a pattern /queue/NAME or /topic/NAME ('*', '>' allowed)"),
    "dead_letter_queue": (_text, "a queue /queue/NAME"),
    "dead_letter_strategy": (_text, "'shared' or 'individual'"),
    "dead_letter_prefix": (_text, "a name prefix like 'DLQ.'"),
    "max_redeliveries": (_count, "an integer >= 0"),
    "redelivery_delay": (_seconds, "a number of seconds >= 0"),
    "redelivery_multiplier": (_multiplier, "a number from 1 to 100"),
    "max_redelivery_delay": (_seconds, "a number of seconds >= 0"),
    "message_ttl": (_seconds, "a number of seconds >= 0"),
    "max_message_ttl": (_seconds, "a number of seconds >= 0"),
    "max_length": (_count, "an integer >= 0 (0: no limit)"),
    "max_bytes": (_count, "an integer >= 0 (0: no limit)"),
    "overflow": (_text, "'drop-head' or 'reject-publish'"),
}


@dataclass(frozen=True, slots=True)
class PolicyEntry:
    """One ``[[policy]]`` table as written: its pattern and the keys it sets."""

    pattern: Pattern
    values: Mapping[str, Any]

    def apply(self, defaults: DestinationPolicy) -> DestinationPolicy:
        """``defaults`` with this entry's values over them."""
        return replace(defaults, pattern=self.pattern.text, **self.values)


def _queue_name_ok(value: str) -> bool:
    from amqlite.validation import BrokerError, check_destination, is_temporary

    try:
        return check_destination(value) == "queue" and not is_temporary(value)
    except BrokerError:
        return False


def _prefix_ok(prefix: str) -> bool:
    return bool(prefix) and prefix.isprintable() and not any(c in prefix for c in "/*>")


def parse_policies(raw: object, where: str) -> tuple[PolicyEntry, ...]:
    """The ``[[policy]]`` tables of a config file (``where`` names it), checked;
    PolicyError (one line naming the table and key) when one cannot be used."""
    if not isinstance(raw, list):
        raise PolicyError(f"{where}: {POLICY_TABLE} must be [[{POLICY_TABLE}]] tables")
    entries: list[PolicyEntry] = []
    seen: dict[str, int] = {}
    for i, table in enumerate(raw, 1):
        at = f"{where}: [[{POLICY_TABLE}]] #{i}"
        if not isinstance(table, dict):
            raise PolicyError(f"{at} must be a table")
        unknown = sorted(set(table) - set(_KEYS))
        if unknown:
            raise PolicyError(f"{at}: unknown key(s) {', '.join(unknown)} (known: "
                              f"{', '.join(_KEYS)})")
        for key, value in table.items():
            check, must_be = _KEYS[key]
            if not check(value):
                raise PolicyError(f"{at}: {key} must be {must_be}, got {value!r}")
        if "destination" not in table:
            raise PolicyError(f"{at}: destination is missing (e.g. \"/queue/orders.>\")")
        try:
            pattern = compile_pattern(table["destination"])
        except WildcardError as e:
            raise PolicyError(f"{at}: {e}") from None
        if pattern.text in seen:
            raise PolicyError(f"{at}: destination {pattern.text!r} is already the pattern "
                              f"of [[{POLICY_TABLE}]] #{seen[pattern.text]}")
        seen[pattern.text] = i
        values = {k: v for k, v in table.items() if k != "destination"}
        if "dead_letter_queue" in values and not _queue_name_ok(values["dead_letter_queue"]):
            raise PolicyError(f"{at}: dead_letter_queue must be a queue /queue/NAME, got "
                              f"{values['dead_letter_queue']!r}")
        if "dead_letter_prefix" in values and not _prefix_ok(values["dead_letter_prefix"]):
            raise PolicyError(f"{at}: dead_letter_prefix must be non-empty text without "
                              f"'/', '*' or '>', got {values['dead_letter_prefix']!r}")
        for key, kind in (("dead_letter_strategy", DeadLetterStrategy),
                          ("overflow", Overflow)):
            if key in values:
                try:
                    values[key] = kind(values[key])
                except ValueError:
                    raise PolicyError(f"{at}: {key} must be {_KEYS[key][1]}, got "
                                      f"{values[key]!r}") from None
        if "dead_letter_queue" in values and values.get(
                "dead_letter_strategy") is DeadLetterStrategy.INDIVIDUAL:
            raise PolicyError(f"{at}: dead_letter_queue and dead_letter_strategy = "
                              "'individual' exclude each other")
        if "dead_letter_queue" in values:  # naming one queue says "shared" by itself
            values.setdefault("dead_letter_strategy", DeadLetterStrategy.SHARED)
        if "dead_letter_prefix" in values:
            values.setdefault("dead_letter_strategy", DeadLetterStrategy.INDIVIDUAL)
        if "redelivery_delay" in values:
            values["redelivery_delay"] = float(values["redelivery_delay"])
        for key in ("redelivery_multiplier", "max_redelivery_delay", "message_ttl",
                    "max_message_ttl"):
            if key in values:
                values[key] = float(values[key])
        if pattern.prefix == "/topic/" and ("max_length" in values or "max_bytes" in values
                                            or "overflow" in values):
            raise PolicyError(f"{at}: max_length, max_bytes and overflow apply to queues; "
                              f"{pattern.text} names topics")
        entries.append(PolicyEntry(pattern, values))
    return tuple(entries)


def take_policies(data: dict[str, Any], broker_table: str,
                  where: str) -> tuple[dict[str, Any], tuple[PolicyEntry, ...] | None]:
    """A config file's TOML without its ``[[policy]]`` tables, and those tables parsed
    (None: there are none). They may stand at top level beside ``[broker_table]`` or
    inside it, not both."""
    data = dict(data)
    raw = data.pop(POLICY_TABLE, None)
    inner = data.get(broker_table)
    if isinstance(inner, dict) and POLICY_TABLE in inner:
        if raw is not None:
            raise PolicyError(f"{where} has [[{POLICY_TABLE}]] tables both in "
                              f"[{broker_table}] and outside: put them in one place")
        inner = dict(inner)
        raw = inner.pop(POLICY_TABLE)
        data[broker_table] = inner
    return data, None if raw is None else parse_policies(raw, where)


def _rank(element: str) -> int:
    """How specific one pattern element is: a literal name over ``*`` over ``>``."""
    if element == ANY_DESCENDANT:
        return 0
    if element == ANY_CHILD:
        return 1
    return 2


def specificity(pattern: Pattern) -> tuple[int, ...]:
    """A sort key: of two patterns matching one name, the larger key is the more
    specific (module docstring): element ranks compared from the left. (Two patterns
    that match one name never end at different places unless the longer one goes on,
    and one that stops cannot match what the other's extra elements need.)"""
    return tuple(_rank(e) for e in pattern.elements)


@dataclass
class Policies:
    """The resolver: destination name -> its ``DestinationPolicy``, cached."""

    entries: Sequence[PolicyEntry] = ()
    defaults: DestinationPolicy = field(default_factory=DestinationPolicy)
    _index: WildcardIndex[PolicyEntry] = field(init=False, repr=False)
    _cache: dict[str, DestinationPolicy] = field(init=False, repr=False, default_factory=dict)
    _applied: dict[int, DestinationPolicy] = field(init=False, repr=False,
                                                   default_factory=dict)
    #: Destination name -> its dead-letter queue, checked once (``dead_letter_queue``).
    _dead_letters: dict[str, str] = field(init=False, repr=False, default_factory=dict)

    #: Some ``[[policy]]`` entry exists (else every name has the defaults).
    any: bool = field(init=False)
    #: Some policy bounds queues (the broker then keeps their ledgers).
    limits_queues: bool = field(init=False)

    def __post_init__(self) -> None:
        self._index = WildcardIndex()
        for entry in self.entries:
            self._index.add(entry.pattern, entry)
            # One immutable policy per entry, shared by every name it wins for.
            self._applied[id(entry)] = entry.apply(self.defaults)
        self.any = bool(self.entries)
        self.limits_queues = any(p.limited for p in self._applied.values())

    def resolve(self, destination: str) -> DestinationPolicy:
        """The policy of ``destination``: one dict lookup once a name has been seen.
        Without ``[[policy]]`` entries every name has the defaults and none is
        remembered (issue 23 item 8: 200,000 SUBSCRIBE/UNSUBSCRIBE pairs on new names
        left +7-8 MiB, the cache filling and starting over, where they leave ~1)."""
        if not self.any:
            return self.defaults
        hit = self._cache.get(destination)
        if hit is not None:
            return hit
        policy = self._choose(destination)
        if len(self._cache) >= RESOLVE_CACHE_SIZE:
            self._cache.clear()
        self._cache[destination] = policy
        return policy

    def dead_letter_queue(self, destination: str, fallback: str) -> str:
        """Where ``destination``'s dead letters go (its policy), or ``fallback`` (the
        broker-wide ``dead_letter_queue``) when that name is not one a destination may
        have (an individual one too long): decided once per name, not per dead letter."""
        hit = self._dead_letters.get(destination)
        if hit is not None:
            return hit
        dlq = self.resolve(destination).dead_letter_for(destination)
        try:
            check_destination(dlq)
        except BrokerError:
            log.warning("dead-letter queue %r of %s is not a usable name; using %s",
                        dlq[:80], destination, fallback)
            dlq = fallback
        if len(self._dead_letters) >= RESOLVE_CACHE_SIZE:
            self._dead_letters.clear()
        self._dead_letters[destination] = dlq
        return dlq

    def _choose(self, destination: str) -> DestinationPolicy:
        matching = self._index.matching(destination) if self.entries else []
        if not matching:
            return self.defaults
        best = max(matching, key=lambda e: specificity(e.pattern))
        return self._applied[id(best)]
