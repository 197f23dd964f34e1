"""Housekeeping of a master, each in one fenced transaction: expired messages
reaped, a destination deleted for good, the dedup window pruned; and the one read the
idle-queue GC makes before a delete (``holds_messages``)."""

from __future__ import annotations

import hashlib
import json
import logging
from collections import defaultdict

from sqlalchemy import Connection, delete, insert, select, text, update
from sqlalchemy.exc import SQLAlchemyError

from store import schema
from store.api import DeletedDestination, Ref
from store.errors import store_error
from store.fencing import Changes, FencedStore
from store.statements import chunks, now_ms

#: The store's log lines keep the logger name they always had (as ``store.migrations``).
log = logging.getLogger("store.sql")

#: A master's own VACUUM of the message table (``vacuum_messages``, why: ``amqlite.vacuum``).
#: Without TRUNCATE: its exclusive lock would stall the commits, and the pages are
#: reused. statement_timeout off: a first pass over a table bloated before may take
#: minutes.
VACUUM_MESSAGES = "VACUUM (TRUNCATE false) amq_messages"
#: Whether the store's role may vacuum ``amq_messages``. PostgreSQL lets the table's
#: owner, the database's owner and superusers (members of either with their privileges:
#: ``pg_has_role ... USAGE``), and from version 17 a role granted MAINTAIN; anyone else's
#: VACUUM skips the table with a WARNING only the server's log shows.
MAY_VACUUM = """\
SELECT pg_has_role(c.relowner, 'USAGE') OR pg_has_role(d.datdba, 'USAGE'){maintain},
  current_user
FROM pg_class c JOIN pg_database d ON d.datname = current_database()
WHERE c.oid = 'amq_messages'::regclass"""
MAY_MAINTAIN = " OR has_table_privilege(c.oid, 'MAINTAIN')"
#: The first PostgreSQL with the MAINTAIN privilege (the dialect's server_version_info).
MAINTAIN_SINCE = (17,)

#: ``amq_meta`` key prefix of a group's last dedup prune (``dedup_pruned_key``).
DEDUP_PRUNED_PREFIX = "dedup_pruned:"
#: Hex digits of the group name's sha256 in that key: ``amq_meta.key`` is
#: String(64), a group name up to 200 characters; 13 + 48 = 61 fit.
DEDUP_PRUNED_DIGEST_CHARS = 48


def dedup_pruned_key(group: str) -> str:
    """The ``amq_meta`` key under which a group's last prune is recorded; its value
    is JSON ``{"grp": group, "before": ms, "at": ms}``: at ``at`` (the master's clock)
    every dedup entry of ``grp`` created before ``before`` was gone. The audit
    (spark/audit/) judges dedup expiry against it, not against its own clock,
    so that housekeeping that has not run yet (a stopped broker) is no defect."""
    digest = hashlib.sha256(group.encode("utf-8")).hexdigest()[:DEDUP_PRUNED_DIGEST_CHARS]
    return DEDUP_PRUNED_PREFIX + digest


class Housekeeping(FencedStore):
    """``SqlStore``'s ``reap_expired``, ``holds_messages``, ``delete_destination`` and
    ``prune_dedup``."""

    def reap_expired(self, epoch: int, now_ms: int, limit: int) -> list[Ref]:
        return [r for refs in self.reap_expired_counted(epoch, now_ms, limit).values()
                for r in refs]

    def reap_expired_counted(self, epoch: int, now_ms: int,
                             limit: int) -> dict[int, list[Ref]]:
        """Expired messages go whether in flight or not; a later ACK of one is a no-op.
        Each destination's ``expired`` total grows in the same transaction. What went,
        by destination id."""
        ch = Changes()
        by_dest: defaultdict[int, list[Ref]] = defaultdict(list)
        with self._tx("reap_expired") as conn:
            self._fence(conn, epoch)
            ids = conn.scalars(self._st.expired, {"g": self.group, "now": now_ms, "n": limit}).all()
            owed: defaultdict[int, list[int]] = defaultdict(list)
            for chunk in chunks(ids, self._chunk):
                for sid, mid in conn.execute(self._st.reap_pending,
                                             {"g": self.group, "ids": chunk}):
                    owed[mid].append(sid)
                    ch.pending[sid] -= 1
                for mid, dest in conn.execute(
                    self._st.reap_messages, {"g": self.group, "ids": chunk}
                ):
                    ch.deleted_messages((dest,))
                    refs = by_dest[dest]
                    subs = owed.get(mid)
                    if subs:
                        refs.extend((sid, mid) for sid in subs)
                    else:
                        refs.append((None, mid))
            self._write_counters(conn, ch, 0)
            if by_dest:  # the destinations' totals, in the same transaction
                kinds = schema.COUNTER_KINDS
                conn.exec_driver_sql(self._st.add_counts, [
                    (self.group, dest, *(len({m for _, m in refs}) if k == "expired" else 0
                                          for k in kinds))
                    for dest, refs in by_dest.items()])
        return dict(by_dest)

    def holds_messages(self, destination_id: int) -> bool:
        """One probe of the destination index: any row, in flight or scheduled."""
        with self._tx("holds_messages", write=False) as conn:
            params = {"g": self.group, "d": destination_id}
            return conn.execute(self._st.any_message, params).first() is not None

    def delete_destination(self, epoch: int, destination_id: int) -> DeletedDestination:
        """One statement per table (the destination index finds the messages); the
        management action purges a big queue in chunks first, so what is left here
        is what arrived meanwhile (see ``amqlite.management.actions``)."""
        params = {"g": self.group, "d": destination_id}
        with self._tx("delete_destination") as conn:
            self._fence(conn, epoch)
            if conn.execute(self._st.delete_destination, params).rowcount == 0:
                return DeletedDestination(existed=False)
            conn.execute(self._st.delete_counters, params)
            sids = conn.scalars(self._st.destination_subs, params).all()
            for chunk in chunks(sids, self._chunk):
                subs = {"g": self.group, "subs": list(chunk)}
                conn.execute(self._st.delete_sub_pending, subs)
                conn.execute(self._st.delete_subs, subs)
            gone = int(conn.execute(self._st.delete_destination_messages, params).rowcount)
            if gone:
                conn.execute(self._st.count_fix, {"g": self.group, "delta": -gone})
        return DeletedDestination(existed=True, messages=gone, subscriptions=len(sids))

    def prune_dedup(self, epoch: int, older_than_ms: int, limit: int) -> int:
        """Forget about ``limit`` of the oldest entries created before ``older_than_ms``,
        and record (``dedup_pruned_key``) the time below which none is left.

        Whole instants go: when the limit falls among entries of one ``created_at``
        (one batch), every entry of it goes too, so the entries left of a producer
        are always a suffix of its sequence (a hole in the middle would be a false
        sequence gap for the audit)."""
        dd = schema.dedup
        with self._tx("prune_dedup") as conn:
            self._fence(conn, epoch)
            edge = conn.scalar(
                select(dd.c.created_at)
                .where(dd.c.grp == self.group, dd.c.created_at < older_than_ms)
                .order_by(dd.c.created_at)  # the ix_amq_dedup_age index's order
                .offset(max(0, limit - 1))
                .limit(1)
            )
            before = older_than_ms if edge is None else int(edge) + 1
            gone = conn.execute(
                delete(dd).where(dd.c.grp == self.group, dd.c.created_at < before)
            ).rowcount
            self._record_prune(conn, before)
            return int(gone)

    def vacuum_messages(self) -> None:
        deleting = self.deleting_commits
        if (self._sqlite or self.may_vacuum is False
                or deleting == self._deleting_commits_vacuumed):
            return
        try:
            with self.engine.connect() as conn:
                conn = conn.execution_options(isolation_level="AUTOCOMMIT")
                if self.may_vacuum is None and not self._check_may_vacuum(conn):
                    return
                conn.execute(text("SET statement_timeout = 0"))
                try:
                    conn.execute(text(VACUUM_MESSAGES))
                finally:
                    conn.execute(text("RESET statement_timeout"))
        except SQLAlchemyError as e:
            raise store_error(self.description, "vacuum of amq_messages", e) from e
        self._deleting_commits_vacuumed = deleting

    def _check_may_vacuum(self, conn: Connection) -> bool:
        """Ask once whether this role's VACUUM would do anything, and say so when not:
        PostgreSQL's own warning reaches only its server log."""
        version = conn.dialect.server_version_info or ()
        maintain = MAY_MAINTAIN if version >= MAINTAIN_SINCE else ""
        may, role = conn.execute(text(MAY_VACUUM.format(maintain=maintain))).one()
        self.may_vacuum = bool(may)
        if not self.may_vacuum:
            log.warning("%s: role %s may not VACUUM amq_messages (neither the table's nor "
                        "the database's owner): acknowledged messages' rows are reclaimed "
                        "only by autovacuum, and a busy queue's table grows meanwhile; "
                        "make %s the table's owner (ALTER TABLE amq_messages OWNER TO %s)",
                        self.description, role, role, role)
        return self.may_vacuum

    def _record_prune(self, conn: Connection, before: int) -> None:
        """Upsert the group's ``amq_meta`` row; the fence holds the group's row lock,
        so no other transaction writes this key meanwhile."""
        meta = schema.meta
        key = dedup_pruned_key(self.group)
        value = json.dumps({"grp": self.group, "before": before, "at": now_ms()})
        if conn.execute(update(meta).where(meta.c.key == key).values(value=value)).rowcount == 0:
            conn.execute(insert(meta).values(key=key, value=value))
