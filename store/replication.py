"""What a PostgreSQL store's server does with a commit beyond its own disk: which standbys
stream from it and which of them a commit waits for.

A RECEIPT promises that the message survives a crash. On a replicated PostgreSQL the
crash that matters is the primary's, after which a standby is promoted: the promise
holds only if every commit waited for that standby (a *synchronous* standby,
``synchronous_standby_names``, with ``synchronous_commit`` ``on`` or ``remote_apply``).
``read_replication`` reads what decides it in one round trip; ``ReplicationState`` says
whether the promise holds (``unsafe``), whether commits are waiting for a standby that
is not there (``waiting``), and describes it in one line for the log, ``/readyz`` and
``cluster-list``. ``sync_rep_waiters`` counts the store sessions a missing standby holds.

``pg_stat_replication`` shows its ``state`` and ``sync_state`` only to superusers and
roles with ``pg_read_all_stats``; for any other role the synchronous standbys are
inferred from ``synchronous_standby_names`` and the names of the connected standbys,
and the description says so.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from store.errors import store_error

#: ``synchronous_commit`` levels at which a commit returns only once the synchronous
#: standbys have flushed it (``on``) or applied it (``remote_apply``). ``remote_write``
#: waits for the standby's operating system only (a standby crash loses it), ``local``
#: and ``off`` not at all.
WAITING_LEVELS = ("on", "remote_apply")

#: ``sync_state`` of a standby that commits wait for (``quorum``: one of ANY n).
SYNCHRONOUS_STATES = ("sync", "quorum")

#: The wait event of a backend whose commit waits for a synchronous standby.
SYNC_REP_WAIT_EVENT = "SyncRep"

#: Physical standbys only: a logical replication subscriber (CDC, a subscription) and a
#: running ``pg_basebackup`` also have a WAL sender, but are never promoted.
_STATE = """
SELECT pg_is_in_recovery(), current_setting('synchronous_standby_names'),
       current_setting('synchronous_commit'),
       coalesce((SELECT json_agg(json_build_array(r.application_name, r.state, r.sync_state)
                                 ORDER BY r.application_name)
                 FROM pg_stat_replication r
                 WHERE r.state IS DISTINCT FROM 'backup' AND NOT EXISTS (
                     SELECT 1 FROM pg_replication_slots s
                     WHERE s.active_pid = r.pid AND s.slot_type = 'logical')), '[]')
"""

_WAITERS = f"""
SELECT count(*) FROM pg_stat_activity
WHERE application_name = :app AND wait_event = '{SYNC_REP_WAIT_EVENT}'
"""

#: ``[FIRST] n (a, b)`` or ``ANY n (a, b)``; anything else is a plain list (FIRST 1).
_COUNTED = re.compile(r"^\s*(?:(FIRST|ANY)\s+)?(\d+)\s*\((.*)\)\s*$", re.IGNORECASE | re.DOTALL)


@dataclass(frozen=True)
class SyncRule:
    """``synchronous_standby_names`` parsed: how many standbys a commit waits for
    (``count``), chosen by priority or by quorum (``method``), among ``names``."""

    method: str  # "FIRST" | "ANY"
    count: int
    names: tuple[str, ...]

    def matches(self, standby: str) -> bool:
        """PostgreSQL compares standby names case-insensitively; ``*`` is any name."""
        return any(n == "*" or n.lower() == standby.lower() for n in self.names)


def parse_sync_rule(setting: str) -> SyncRule | None:
    """``synchronous_standby_names`` as a rule; None when it is empty (no synchronous
    replication)."""
    if not setting.strip():
        return None
    m = _COUNTED.match(setting)
    method, count, names = ("FIRST", 1, setting) if m is None else (
        (m.group(1) or "FIRST").upper(), int(m.group(2)), m.group(3))
    listed = tuple(_unquote(n) for n in names.split(",") if n.strip())
    return SyncRule(method, count, listed)


def _unquote(name: str) -> str:
    name = name.strip()
    if len(name) >= 2 and name[0] == name[-1] == '"':
        return name[1:-1].replace('""', '"')
    return name


@dataclass(frozen=True)
class Standby:
    """One connected physical standby as the primary sees it (``pg_stat_replication``);
    ``state`` and ``sync_state`` are None when hidden from the store's role."""

    name: str
    state: str | None
    sync_state: str | None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "state": self.state, "sync_state": self.sync_state}


@dataclass(frozen=True)
class ReplicationState:
    """The store server's replication, as one read saw it."""

    in_recovery: bool
    standby_names: str  # synchronous_standby_names
    synchronous_commit: str  # as the store's own sessions have it
    standbys: tuple[Standby, ...]

    @property
    def rule(self) -> SyncRule | None:
        return parse_sync_rule(self.standby_names)

    @property
    def hidden(self) -> bool:
        """True when the role may not see which standbys are synchronous."""
        return any(s.sync_state is None for s in self.standbys)

    @property
    def synchronous(self) -> list[str]:
        """The connected standbys commits wait for (inferred from the names when hidden)."""
        rule = self.rule
        if rule is None:
            return []
        if self.hidden:
            return [s.name for s in self.standbys if rule.matches(s.name)]
        return [s.name for s in self.standbys if s.sync_state in SYNCHRONOUS_STATES]

    @property
    def unsafe(self) -> str | None:
        """Why a RECEIPT could be given for a commit a promoted standby lacks, or None."""
        rule = self.rule
        if rule is None:
            if not self.standbys:
                return None  # no replica: nothing can be promoted without it
            return (f"asynchronous replication: {_count(len(self.standbys), 'standby')} "
                    f"connected ({_names(s.name for s in self.standbys)}), none synchronous "
                    "(synchronous_standby_names is empty), so a standby promoted after a "
                    "crash can lack RECEIPTed messages")
        if self.synchronous_commit not in WAITING_LEVELS:
            return (f"synchronous_commit = {self.synchronous_commit}: commits do not wait "
                    f"for the synchronous standby ({' or '.join(WAITING_LEVELS)} would), so "
                    "a standby promoted after a crash can lack RECEIPTed messages")
        return None

    @property
    def waiting(self) -> str | None:
        """Why every commit waits (synchronous standbys asked for, too few connected)."""
        rule = self.rule
        if rule is None or len(self.synchronous) >= rule.count:
            return None
        return (f"synchronous_standby_names = '{self.standby_names}' asks for "
                f"{_count(rule.count, 'synchronous standby')}, {len(self.synchronous)} "
                "connected: every commit waits for a synchronous standby to confirm it")

    def describe_standbys(self) -> str:
        """``standby1 (sync, streaming), standby2 (async)``, or ``none``."""
        if not self.standbys:
            return "none"
        shown = []
        for s in self.standbys:
            what = ", ".join(x for x in (s.sync_state, s.state) if x)
            shown.append(f"{s.name} ({what})" if what else s.name)
        return ", ".join(shown)

    @property
    def summary(self) -> str:
        """One line: what a commit waits for, and who is connected."""
        if self.in_recovery:
            return "the server is a standby (in recovery): it takes no writes"
        rule = self.rule
        if rule is None and not self.standbys:
            return "no replication (no standby connected, synchronous_standby_names empty)"
        if rule is None:
            return (f"asynchronous replication only: standbys {self.describe_standbys()}, "
                    "synchronous_standby_names empty")
        sync = self.synchronous
        head = (f"synchronous {'standby' if len(sync) == 1 else 'standbys'} "
                f"{_names(sync)} connected" if sync else "no synchronous standby connected")
        note = (" (sync_state hidden from this role: inferred from the names; GRANT "
                "pg_read_all_stats to see it)" if self.hidden else "")
        return (f"{head}{note}; synchronous_standby_names = '{self.standby_names}', "
                f"synchronous_commit = {self.synchronous_commit}, connected standbys: "
                f"{self.describe_standbys()}")

    def to_json(self) -> dict[str, Any]:
        return {
            "summary": self.summary, "in_recovery": self.in_recovery,
            "synchronous_standby_names": self.standby_names,
            "synchronous_commit": self.synchronous_commit,
            "synchronous": self.synchronous,
            "standbys": [s.to_json() for s in self.standbys],
            "unsafe": self.unsafe, "waiting": self.waiting,
        }


def _count(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}s"  # "standbys", as PostgreSQL writes it


def _names(names: Any) -> str:
    return ", ".join(names) or "none"


def read_replication(engine: Engine, description: str) -> ReplicationState:
    """The store server's replication state, in one round trip on a pooled connection
    (read only: it never waits for a standby itself). Raises ``StoreError``.

    Read again once on a new connection when the pooled one had lost its server: a
    node taking over after its PostgreSQL failed over reads this first, on a
    connection it pooled before the failover (SQLAlchemy drops the pool's older
    connections when it sees one gone)."""
    for retry in (True, False):
        try:
            with engine.connect() as conn:
                row = conn.execute(text(_STATE)).one()
                conn.rollback()
            break
        except DBAPIError as e:
            if not (retry and e.connection_invalidated):
                raise store_error(description, "reading the replication state", e) from None
        except SQLAlchemyError as e:
            raise store_error(description, "reading the replication state", e) from None
    in_recovery, names, level, standbys = row
    rows = json.loads(standbys) if isinstance(standbys, str) else standbys
    return ReplicationState(
        bool(in_recovery), str(names), str(level),
        tuple(Standby(str(n), s, st) for n, s, st in rows or ()))


def sync_rep_waiters(engine: Engine, application_name: str, description: str) -> int:
    """How many of the store's sessions (``application_name``) wait for a synchronous
    standby to confirm their commit. Raises ``StoreError``."""
    try:
        with engine.connect() as conn:
            count = conn.execute(text(_WAITERS), {"app": application_name}).scalar_one()
            conn.rollback()
    except SQLAlchemyError as e:
        raise store_error(description, "reading pg_stat_activity", e) from None
    return int(count)

