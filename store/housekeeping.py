"""Housekeeping of a master, each in one fenced transaction: expired messages
reaped, a destination deleted for good, the dedup window pruned."""

from __future__ import annotations

from collections import defaultdict

from store.api import DeletedDestination, Ref
from store.fencing import Changes, FencedStore
from store.statements import chunks


class Housekeeping(FencedStore):
    """``SqlStore``'s ``reap_expired``, ``delete_destination`` and ``prune_dedup``."""

    def reap_expired(self, epoch: int, now_ms: int, limit: int) -> list[Ref]:
        """Expired messages go whether in flight or not; a later ACK of one is a no-op."""
        ch = Changes()
        refs: list[Ref] = []
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
                    subs = owed.get(mid)
                    if subs:
                        refs.extend((sid, mid) for sid in subs)
                    else:
                        refs.append((None, mid))
            self._write_counters(conn, ch, 0)
        return refs

    def delete_destination(self, epoch: int, destination_id: int) -> DeletedDestination:
        """One statement per table (the destination index finds the messages); the
        management action purges a big queue in chunks first, so what is left here
        is what arrived meanwhile (see ``amqlite.management.actions``)."""
        params = {"g": self.group, "d": destination_id}
        with self._tx("delete_destination") as conn:
            self._fence(conn, epoch)
            if conn.execute(self._st.delete_destination, params).rowcount == 0:
                return DeletedDestination(existed=False)
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
        with self._tx("prune_dedup") as conn:
            self._fence(conn, epoch)
            params = {"g": self.group, "before": older_than_ms, "n": limit}
            return int(conn.execute(self._st.prune, params).rowcount)
