"""Connect attempts that run side by side (``ConnectRace``), for the failover supervisor.

A reconnect pass starts the attempts to its URIs in order, each given
``ATTEMPT_HEAD_START_S`` before the next one starts alongside it, and the next at once when
one fails (RFC 8305's "Happy Eyeballs", with STOMP handshakes): a live first URI is all a
pass contacts, a hanging one costs the head start. Once every URI has its attempt, the pass
ends at its first outcome: a connection, or an attempt that failed (refused, reset, past its
deadline). An attempt still running then is not dropped: it goes on into the pause before
the next pass and into that pass (which does not start a second one to the same URI) until
it ends or its own deadline (``reconnect.attempt_timeout_s``) ends it. So a broker that
hangs on connect (frozen, partitioned) never holds the client back while another could
serve: the other URIs are tried again on the back-off schedule as if the hanging one were
not there, and the hanging one still wins if it answers.

When several attempts succeed at the same moment, the best-ranked wins
(``reconnect.preference``: priority URIs, then the pass's order); the others are closed with
DISCONNECT, the attempts still running are cancelled (whatever they opened is closed).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Coroutine, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any

from amqlite.client.connection import Connection, describe
from amqlite.client.uri import TcpURI

__all__ = ["ATTEMPT_HEAD_START_S", "ConnectRace", "Failure"]

log = logging.getLogger(__name__)

#: How long one attempt of a pass has before the next URI's attempt starts alongside it
#: (s). RFC 8305 (Happy Eyeballs v2) waits 250 ms before racing the next address; a STOMP
#: handshake also includes the broker's login check (scrypt, 20-50 ms) on possibly busy
#: cores, so twice that. A live broker answers well within it, so the URIs after it are
#: not contacted and the configured order holds.
ATTEMPT_HEAD_START_S = 0.5

Opener = Callable[[TcpURI], Coroutine[Any, Any, Connection]]


@dataclass(frozen=True, slots=True)
class Failure:
    """An attempt that ended without a connection."""

    uri: TcpURI
    error: BaseException


class ConnectRace:
    """The running connect attempts of one client, at most one per URI."""

    def __init__(self, opener: Opener, stop: asyncio.Event) -> None:
        #: Opens one connection (TCP connect + handshake, within the attempt's deadline).
        self._opener = opener
        #: Set when the client closes: every wait returns.
        self._stop = stop
        self._attempts: dict[TcpURI, asyncio.Task[Connection]] = {}

    @property
    def running(self) -> list[TcpURI]:
        """URIs with an attempt in progress."""
        return list(self._attempts)

    async def run_pass(self, uris: Sequence[TcpURI], rank: Mapping[TcpURI, int]
                       ) -> Connection | list[Failure] | None:
        """One pass over ``uris`` (module docstring): the winning connection, or the
        attempts that failed in it. None when the client closes, or when ``uris`` is
        empty. Attempts to URIs not in ``uris`` (a discovery or cluster update took them
        away) are dropped first."""
        for uri in [u for u in self._attempts if u not in uris]:
            self._drop(self._attempts.pop(uri))
        queue = [u for u in uris if u not in self._attempts]
        failed: list[Failure] = []
        stop = asyncio.get_running_loop().create_task(self._stop.wait())
        try:
            while not self._stop.is_set():
                if queue:
                    self._start(queue.pop(0))
                if not queue and failed:
                    return failed
                if not self._attempts:
                    return None
                done, _ = await asyncio.wait(
                    [*self._attempts.values(), stop],
                    timeout=ATTEMPT_HEAD_START_S if queue else None,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                won, lost = self._collect(done)
                if won:
                    return self._choose(won, rank)
                failed += lost
            return None
        finally:
            stop.cancel()

    async def next(self, rank: Mapping[TcpURI, int], until: float | None = None
                   ) -> Connection | list[Failure] | None:
        """Wait for the next outcome of the attempts running: the winning connection, or
        the attempts that failed at that moment (the rest run on). None when ``until``
        (loop time) comes, when the client closes, or, without ``until``, when nothing
        is running."""
        loop = asyncio.get_running_loop()
        stop = loop.create_task(self._stop.wait())
        try:
            while not self._stop.is_set():
                if not self._attempts and until is None:
                    return None
                timeout = None if until is None else until - loop.time()
                if timeout is not None and timeout <= 0:
                    return None
                done, _ = await asyncio.wait([*self._attempts.values(), stop],
                                             timeout=timeout,
                                             return_when=asyncio.FIRST_COMPLETED)
                won, failed = self._collect(done)
                if won:
                    return self._choose(won, rank)
                if failed:
                    return failed
            return None
        finally:
            stop.cancel()

    def cancel(self) -> None:
        """Drop every running attempt (what one of them opened is closed)."""
        tasks = list(self._attempts.values())
        self._attempts.clear()
        for task in tasks:
            self._drop(task)

    # -- internals -------------------------------------------------------------------

    def _start(self, uri: TcpURI) -> None:
        self._attempts[uri] = asyncio.get_running_loop().create_task(
            self._opener(uri), name=f"amqlite-connect-{uri}")

    def _collect(self, done: AbstractSet[asyncio.Future[Any]]
                 ) -> tuple[list[tuple[TcpURI, Connection]], list[Failure]]:
        """Take the ended attempts among ``done`` out of the race, split by outcome."""
        won: list[tuple[TcpURI, Connection]] = []
        failed: list[Failure] = []
        for uri, task in [(u, t) for u, t in self._attempts.items() if t in done]:
            del self._attempts[uri]
            if task.cancelled():
                continue
            error = task.exception()
            if error is None:
                won.append((uri, task.result()))
            else:
                log.debug("connect to %s failed: %s", uri, describe(error))
                failed.append(Failure(uri, error))
        return won, failed

    def _choose(self, won: list[tuple[TcpURI, Connection]], rank: Mapping[TcpURI, int]
                ) -> Connection:
        """The best-ranked of the connections made together; the others are closed and
        the attempts still running dropped."""
        _, best = min(won, key=lambda w: rank.get(w[0], math.inf))
        for _, conn in won:
            if conn is not best:
                conn.close(graceful=True)
        self.cancel()
        return best

    @staticmethod
    def _drop(task: asyncio.Task[Connection]) -> None:
        # No await: a caller being cancelled (disconnect()) must not have that swallowed.
        task.cancel()
        task.add_done_callback(_close_opened)


def _close_opened(task: asyncio.Task[Connection]) -> None:
    """A dropped attempt that still got its connection: close it."""
    if not task.cancelled() and task.exception() is None:
        task.result().close(graceful=True)
