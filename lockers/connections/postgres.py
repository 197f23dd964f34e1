"""libpq connection tuning for amqlite's two kinds of PostgreSQL session, side by side.

Both the lock session (lockers.postgres, lockers.pg_lease) and the store's pool
(store.engine) must notice a dead server or a dead network long before the kernel
does (2 h keepalive, ~15 min of retransmissions). They tune for different jobs:

=====================  ==========================  ==========================
setting                lock session                store pool
=====================  ==========================  ==========================
dead peer noticed in   ``dead_peer_timeout`` (5 s)  ~11 s (5 s idle + 3 x 2 s)
keepalives_idle        40 % of it (2 s)            5 s
keepalives_interval    20 % of it (1 s)            2 s
keepalives_count       3                           3
tcp_user_timeout       ``dead_peer_timeout`` (5 s)  10 s
connect_timeout        5 s                         5 s
statement_timeout      2 s (catalog reads)         15 s (group commits)
=====================  ==========================  ==========================

Why they differ: the lock session decides who is master. It is idle between
keepalive queries and a half-open session blocks the slave's takeover, so a dead
peer must be noticed within one failover budget. The store pool carries group
commits and recovery scans that a loaded server may legitimately answer slowly;
cutting those at 5 s would demote a healthy master on a busy database, and a
master whose store session hangs is still fenced by the lock (its epoch), so the
store can afford to wait about twice as long.

This module is pure arithmetic (no psycopg, no amqlite) so that both the
``lockers`` and the ``store`` package can import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# --- the lock session ------------------------------------------------------------------------

#: How long a dead peer or a dead network may go unnoticed, in seconds, on
#: either side. ActiveMQ's JDBC locker leaned on the OS default (2 h keepalive,
#: ~15 min retransmissions) and failed over after minutes; 5 s is well above a
#: loaded LAN's round trip and short enough that a half-open master session
#: stops blocking the slave quickly. ``PostgresLocker(dead_peer_timeout=)``
#: overrides it (``open_locker``'s ``session_timeout`` is ZooKeeper's alone).
PG_DEAD_PEER_TIMEOUT = 5.0

#: Unanswered keepalive probes before the connection is declared dead. With
#: idle = 40 % and interval = 20 % of the session timeout, three probes add up
#: to exactly the session timeout (libpq and the server take whole seconds).
PG_KEEPALIVES_COUNT = 3
PG_KEEPALIVES_IDLE_SHARE = 0.4
PG_KEEPALIVES_INTERVAL_SHARE = 0.2

#: The kernel's keepalive knobs take whole seconds, tcp_user_timeout milliseconds;
#: below one second a loaded host's scheduling hiccup would kill the session.
PG_MIN_TCP_SECONDS = 1

#: libpq ``connect_timeout`` in seconds (libpq rounds anything below 2 up to 2).
PG_CONNECT_TIMEOUT = 5

#: ``statement_timeout`` for the keepalive, try-lock and unlock queries: each is
#: one in-memory catalog read that takes well under a millisecond, so 2 s only
#: trips on a server that is in real trouble.
PG_STATEMENT_TIMEOUT = 2.0

# --- the store pool --------------------------------------------------------------------------

#: libpq connect_timeout (s): a dead host must fail the connect quickly.
STORE_CONNECT_TIMEOUT_S = PG_CONNECT_TIMEOUT
#: libpq TCP keepalives: idle 5 s, then 3 probes 2 s apart, so a silent peer is
#: declared dead after ~11 s instead of the kernel's default 2 h.
STORE_KEEPALIVES_IDLE_S = 5
STORE_KEEPALIVES_INTERVAL_S = 2
STORE_KEEPALIVES_COUNT = 3
#: libpq tcp_user_timeout (ms): unacknowledged writes fail after 10 s too.
STORE_TCP_USER_TIMEOUT_MS = 10_000
#: Server-side statement_timeout for store statements (ms). A group commit
#: takes milliseconds; 15 s only trips on a wedged server or a lock held by a
#: paused peer, and then the master should demote rather than wait.
STORE_STATEMENT_TIMEOUT_MS = 15_000
#: A paused process must not keep the group row locked forever: PostgreSQL
#: ends a session idle inside a transaction for this long (ms).
STORE_IDLE_IN_TRANSACTION_TIMEOUT_MS = 30_000


@dataclass(frozen=True)
class TcpTuning:
    """libpq's keepalive and timeout parameters for one kind of session."""

    keepalives_idle: int
    keepalives_interval: int
    keepalives_count: int
    tcp_user_timeout_ms: int
    connect_timeout: int

    def libpq(self) -> dict[str, int]:
        """The libpq connection parameters (conninfo keywords)."""
        return {
            "keepalives": 1,
            "keepalives_idle": self.keepalives_idle,
            "keepalives_interval": self.keepalives_interval,
            "keepalives_count": self.keepalives_count,
            "tcp_user_timeout": self.tcp_user_timeout_ms,
            "connect_timeout": self.connect_timeout,
        }


def lock_session_tuning(dead_peer_timeout: float = PG_DEAD_PEER_TIMEOUT) -> TcpTuning:
    """The lock session's tuning: a dead peer is noticed in ``dead_peer_timeout``."""
    return TcpTuning(
        keepalives_idle=max(
            PG_MIN_TCP_SECONDS, round(dead_peer_timeout * PG_KEEPALIVES_IDLE_SHARE)
        ),
        keepalives_interval=max(
            PG_MIN_TCP_SECONDS, round(dead_peer_timeout * PG_KEEPALIVES_INTERVAL_SHARE)
        ),
        keepalives_count=PG_KEEPALIVES_COUNT,
        tcp_user_timeout_ms=round(max(PG_MIN_TCP_SECONDS, dead_peer_timeout) * 1000),
        connect_timeout=PG_CONNECT_TIMEOUT,
    )


#: The store pool's tuning (see the module docstring for why it is looser).
STORE_POOL_TUNING = TcpTuning(
    keepalives_idle=STORE_KEEPALIVES_IDLE_S,
    keepalives_interval=STORE_KEEPALIVES_INTERVAL_S,
    keepalives_count=STORE_KEEPALIVES_COUNT,
    tcp_user_timeout_ms=STORE_TCP_USER_TIMEOUT_MS,
    connect_timeout=STORE_CONNECT_TIMEOUT_S,
)


def tcp_settings(dead_peer_timeout: float) -> dict[str, int]:
    """libpq keepalive/timeout parameters that notice a dead peer in ``dead_peer_timeout``."""
    return lock_session_tuning(dead_peer_timeout).libpq()


def server_tcp_settings(params: dict[str, Any]) -> dict[str, int]:
    """The server-side twins of libpq's keepalive parameters in ``params``, so both ends
    of the session give up together. Raises ValueError on a value that is not a whole number."""
    return {
        "tcp_keepalives_idle": int(params["keepalives_idle"]),
        "tcp_keepalives_interval": int(params["keepalives_interval"]),
        "tcp_keepalives_count": int(params["keepalives_count"]),
        "tcp_user_timeout": int(params["tcp_user_timeout"]),
    }


def server_options(statement_timeout_ms: int, idle_in_transaction_timeout_ms: int) -> str:
    """libpq ``options`` that set the server-side timeouts when the session starts."""
    return (
        f"-c statement_timeout={statement_timeout_ms} "
        f"-c idle_in_transaction_session_timeout={idle_in_transaction_timeout_ms}"
    )


#: PostgreSQL 14 added ``idle_session_timeout``; older servers reject the SET.
IDLE_SESSION_TIMEOUT_SINCE = 140000


def idle_session_unlimited(server_version: int) -> list[str]:
    """SETs that keep a role's or database's idle-session limit from ending a lock or lease
    session between two of its queries (those sessions are idle by design)."""
    if server_version >= IDLE_SESSION_TIMEOUT_SINCE:
        return ["SET idle_session_timeout = 0"]
    return []
