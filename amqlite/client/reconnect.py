"""The failover client's decisions, without sockets or clocks (``ReconnectPolicy``,
``connect_order``, ``is_priority``): how long to wait, when to give up, when to warn, and
in which order to try the brokers. The supervisor that acts on them is
``amqlite.client.failover``.

It follows ActiveMQ 5.x ``FailoverTransport.doReconnect``/``doDelay`` step by step so that a
URL tuned for ActiveMQ behaves the same here:

* A *pass* tries every URI of the connect list once; a failed pass is one "attempt" for
  ``maxReconnectAttempts``/``startupMaxReconnectAttempts`` and
  ``warnAfterReconnectAttempts`` (ActiveMQ's ``connectFailures``).
* Before a pass ActiveMQ waits ``reconnectDelay`` unless it is the very first connection or
  a backup connection is ready; after a failed pass it waits ``reconnectDelay`` again and
  only then multiplies it by ``reconnectDelayExponent`` (capped at ``maxReconnectDelay``).
  So after an established connection drops, the gaps between passes are d0, d0+d1, d1+d2,
  ...; on the first connection they are d0, d1, d2, ...
* A successful connection resets the delay to ``initialReconnectDelay`` and the count to 0.

One deliberate difference: ActiveMQ's ``resetReconnectDelay`` also resets a delay that grew
to exactly 10 ms (it compares with ``DEFAULT_INITIAL_RECONNECT_DELAY``), so an
``initialReconnectDelay`` of 5 oscillates 5, 10, 5, 10; here the delay only resets on
success.

Another: ActiveMQ tries the URIs of a pass one after the other and waits on each up to
``connectionTimeout`` (30 s), so a broker that hangs on connect (SIGSTOPped, or across a
partition) holds the whole failover that long. Here the attempts of a pass run side by
side (``amqlite.client.attempts``), each with its own deadline (``attempt_timeout_s``), and
a pass ends at its first outcome; ``preference`` says which connection wins when several
are made together.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from amqlite.client.uri import INFINITE, FailoverOptions, TcpURI

__all__ = [
    "ATTEMPT_DEADLINE_S",
    "PassOutcome",
    "ReconnectPolicy",
    "attempt_timeout_s",
    "backoff_waits",
    "connect_order",
    "is_priority",
    "preference",
]

#: Deadline of one connect attempt of a failover pass (s): TCP connect plus STOMP
#: CONNECT/CONNECTED. ActiveMQ has only the socket's ``connectionTimeout`` (30 s by default)
#: and still applies that to ``tcp://`` URLs here; inside ``failover:``/``discovery:`` an
#: attempt gets the shorter of the two. 2 s is shorter than the quickest takeover a
#: shared-store group makes by itself (the PostgreSQL lock lease, ``lock_lease``, is 3 s by
#: default), so an attempt to a broker that froze has ended before its successor serves;
#: and it is 40 times what a live broker needs to answer CONNECT with a login check
#: (scrypt, 20-50 ms), so a burst of reconnecting clients still gets through.
ATTEMPT_DEADLINE_S = 2.0


@dataclass(frozen=True, slots=True)
class PassOutcome:
    """What to do after a pass in which no broker accepted us."""

    give_up: bool
    warn: bool
    failures: int
    #: ms to wait before the next pass (doDelay); 0 when giving up.
    delay_ms: float


class ReconnectPolicy:
    """Attempt counting and back-off for one client, as ActiveMQ's FailoverTransport."""

    def __init__(self, options: FailoverOptions) -> None:
        self.options = options
        self.first_connection = True
        self.failures = 0
        self.delay_ms = float(options.initial_reconnect_delay)

    def attempt_limit(self) -> int:
        """ActiveMQ ``calculateReconnectAttemptLimit``: the startup limit applies until the
        first connection succeeded (when it is not -1), ``maxReconnectAttempts`` after."""
        if self.first_connection and self.options.startup_max_reconnect_attempts != INFINITE:
            return self.options.startup_max_reconnect_attempts
        return self.options.max_reconnect_attempts

    def can_reconnect(self) -> bool:
        """ActiveMQ ``canReconnect``: a dropped connection is re-established unless the
        limit is 0 (``maxReconnectAttempts=0`` means: report the failure, do not retry)."""
        return self.attempt_limit() != 0

    def wait_before_pass(self, *, standby_ready: bool = False) -> float:
        """ms to wait before the next pass: none on the first connection or with a ready
        backup, else the current reconnect delay."""
        if standby_ready or self.first_connection:
            return 0.0
        return self.delay_ms

    def pass_failed(self) -> PassOutcome:
        """Count a failed pass; say whether to give up or warn, and how long to wait."""
        limit = self.attempt_limit()
        self.failures += 1
        if limit != INFINITE and self.failures >= limit:
            return PassOutcome(True, False, self.failures, 0.0)
        interval = self.options.warn_after_reconnect_attempts
        warn = interval > 0 and self.failures % interval == 0
        delay = self.delay_ms
        self.grow()
        return PassOutcome(False, warn, self.failures, delay)

    def grow(self) -> None:
        """The second half of ActiveMQ ``doDelay``: exponential growth up to the cap."""
        if self.options.use_exponential_backoff:
            self.delay_ms = min(
                self.delay_ms * self.options.reconnect_delay_exponent,
                float(self.options.max_reconnect_delay),
            )

    def connected(self) -> None:
        """A connection is up: reset delay and count, the startup limit no longer applies."""
        self.delay_ms = float(self.options.initial_reconnect_delay)
        self.failures = 0
        self.first_connection = False


def backoff_waits(options: FailoverOptions, passes: int, *, first_connection: bool) -> list[float]:
    """The total wait (ms) before each of ``passes`` consecutive passes when all fail, or
    fewer if the attempt limit stops earlier. For documentation and tests."""
    policy = ReconnectPolicy(options)
    if not first_connection:
        policy.connected()
    waits: list[float] = []
    carried = 0.0
    for _ in range(passes):
        waits.append(carried + policy.wait_before_pass())
        outcome = policy.pass_failed()
        if outcome.give_up:
            break
        carried = outcome.delay_ms
    return waits


def connect_order(
    configured: Sequence[TcpURI],
    updated: Sequence[TcpURI] = (),
    *,
    failed: TcpURI | None = None,
    randomize: bool = False,
    rng: random.Random | None = None,
) -> list[TcpURI]:
    """The URIs of one pass, like ActiveMQ ``getConnectList``.

    URIs pushed by the broker or read from ``updateURIsURL`` (``updated``) come first in
    their given order (ActiveMQ uses them as given). Then the configured URIs, shuffled per
    pass when ``randomize``; ActiveMQ uses *only* the updated list when it has one, we keep
    the configured ones after it so a stale update can never strand the client. The URI
    whose connection just failed goes last.
    """
    order: list[TcpURI] = [u for i, u in enumerate(updated) if u not in updated[:i]]
    rest = [u for u in dict.fromkeys(configured) if u not in order]
    if randomize:
        (rng or random).shuffle(rest)
    order += rest
    if failed is not None and failed in order:
        order.remove(failed)
        order.append(failed)
    return order


def is_priority(uri: TcpURI, options: FailoverOptions, configured: Sequence[TcpURI]) -> bool:
    """ActiveMQ ``isPriority``: with priorityBackup, a URI in priorityURIs, or the first
    configured URI when priorityURIs is empty."""
    if not options.priority_backup:
        return False
    if options.priority_uris:
        return uri in options.priority_uris
    return bool(configured) and configured[0] == uri


def attempt_timeout_s(uri: TcpURI, kind: str) -> float:
    """How long one connect attempt to ``uri`` may take (s): its ``connectionTimeout`` for a
    ``tcp://`` URL (one broker, no failover), else at most ``ATTEMPT_DEADLINE_S``."""
    connect = uri.options.connection_timeout_ms / 1000
    return connect if kind == "tcp" else min(connect, ATTEMPT_DEADLINE_S)


def preference(
    uris: Sequence[TcpURI], options: FailoverOptions, configured: Sequence[TcpURI]
) -> dict[TcpURI, int]:
    """Rank of each URI of a pass (0 is best) for when several attempts succeed together:
    priority URIs (``priorityBackup``) first, then the pass's order (``connect_order``)."""
    ordered = sorted(range(len(uris)),
                     key=lambda i: (not is_priority(uris[i], options, configured), i))
    return {uris[i]: rank for rank, i in enumerate(ordered)}
