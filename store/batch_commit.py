"""``commit_batch``: one batch of the group committer in one fenced transaction —
in one round trip on PostgreSQL for the usual shapes (``store.pg_batch``), one
statement at a time otherwise (SQLite; rare shapes on PostgreSQL).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, insert, text

from store import pg_batch, schema, sqlite_batch
from store.api import (
    Batch,
    BatchResult,
    DestinationRow,
    Fenced,
    NewMessage,
    Ref,
    ScheduleStep,
    StoreError,
    SubscriptionRow,
)
from store.errors import store_error
from store.fencing import Changes, FencedStore
from store.pg_pipeline import Pipeline, Statement
from store.rows import deliveries_by_times, fresh_only, message_row
from store.statements import chunks, encode_headers, now_ms

#: The store's log lines keep the logger name they always had (``store.sql``),
#: whichever of its modules writes them.
log = logging.getLogger("store.sql")

#: PostgreSQL plans a never-analyzed table as if it held a row or two: the
#: dedup lookup then filters the group's whole window instead of probing the
#: primary key (5 ms instead of 0.3 ms per batch of 64 keys, growing with the
#: window). Autovacuum analyzes a new table only a minute or more later, so we
#: ANALYZE the hot tables once ourselves, after this many inserts, if nobody has.
ANALYZE_AFTER_ROWS = 1000
HOT_TABLES = ("amq_messages", "amq_dedup", "amq_sub_pending")


class BatchCommitting(FencedStore):
    """``SqlStore``'s write path: ``commit_batch`` and the steps of a batch."""

    def commit_batch(self, epoch: int, batch: Batch) -> BatchResult:
        if self.after_fence is None and pg_batch.fits(batch):
            result = (self._commit_sqlite(epoch, batch) if self._sqlite
                      else self._commit_pipelined(epoch, batch))
        else:
            result = self._commit_stepwise(epoch, batch)
        self._committed(batch)
        if self._analyze_pending and self._inserted_since_open >= ANALYZE_AFTER_ROWS:
            self._analyze_once()
        return result

    def _committed(self, batch: Batch) -> None:
        """A batch's count of what the store did (vacuum, the first ANALYZE)."""
        if batch.acks or batch.moves:
            self.deleting_commits += 1
        if self._analyze_pending:
            self._inserted_since_open += len(batch.inserts)

    def loop_fits(self, batch: Batch) -> bool:
        return self.loop_commits and pg_batch.fits(batch)

    def start_commit(self, epoch: int, batch: Batch) -> PipelinedCommit | None:
        """The hot shapes' one round trip, sent on the pipeline's connection once a
        ``commit_batch`` on the store thread opened it (a connect blocks: never on
        the loop). Not the commit that reaches the first ANALYZE: that one is
        ``commit_batch``'s, which runs it."""
        pipeline = self._pipeline
        if (pipeline is None or self.after_fence is not None or not pg_batch.fits(batch)
                or (self._analyze_pending and self._inserted_since_open + len(batch.inserts)
                    >= ANALYZE_AFTER_ROWS)):
            return None
        try:
            steps, answer = pg_batch.prepare(self.group, epoch, batch, now_ms(),
                                             encode_headers)
            sent = pipeline.send(steps)
        except Exception as e:
            err = self._pipeline_failed(epoch, e)
            raise err from err.__cause__  # Fenced: no cause, as the fence says it all
        return PipelinedCommit(self, epoch, batch, pipeline, answer, sent)

    def _commit_pipelined(self, epoch: int, batch: Batch) -> BatchResult:
        """The hot shapes in one round trip (see ``store.pg_batch``)."""
        try:
            if self._writer is None:
                writer = self._own_connection()
                self._writer = writer
                self._pipeline = Pipeline(writer, pg_batch.PLANNER_SETTINGS)
            pipeline = self._pipeline
            assert pipeline is not None
            try:
                result = pg_batch.commit(pipeline, self.group, epoch, batch, now_ms(),
                                         encode_headers)
            except Exception as e:
                if not pg_batch.held_key(e):
                    raise
                steps, answer = self._careful(epoch, batch)
                result = answer.result(pipeline, pipeline.transaction(steps))
        except Exception as e:  # a database error, or e.g. a value it cannot encode
            err = self._pipeline_failed(epoch, e)
            raise err from err.__cause__  # Fenced: no cause, as the fence says it all
        self.fast_commits += 1
        return result

    def _careful(self, epoch: int, batch: Batch
                 ) -> tuple[list[tuple[Statement, dict[str, bytes | None]]], pg_batch.Answer]:
        """The statements to send ``batch`` again with after the plain INSERT met a
        dedup key the store holds (``pg_batch.held_key``), on either path; counted."""
        self.careful_retries += 1
        return pg_batch.prepare(self.group, epoch, batch, now_ms(), encode_headers,
                                careful=True)

    def _pipeline_failed(self, epoch: int, e: BaseException) -> StoreError:
        """The error a failed pipelined commit raises (with its cause, but for the
        fence). Whatever failed, the connection's state is unknown (the fence may
        hold the group row): it is closed, and the next commit opens another."""
        self._discard_writer()
        if getattr(e, "sqlstate", None) == pg_batch.FENCED_SQLSTATE:
            return Fenced(f"{self.description}: group {self.group!r} is no longer at "
                          f"epoch {epoch}")
        return store_error(self.description, "commit", e)

    def _commit_sqlite(self, epoch: int, batch: Batch) -> BatchResult:
        """The hot shapes on SQLite's own connection (see ``store.sqlite_batch``)."""
        try:
            if self._sqlite_writer is None:
                self._sqlite_writer = self._own_connection()
            result = sqlite_batch.commit(self._sqlite_writer, self._st, self.description,
                                         self.group, epoch, batch, now_ms())
        except Fenced:
            raise
        except Exception as e:  # rolled back: a refused value, or the file's trouble
            self._discard_writer()
            raise store_error(self.description, "commit", e) from e
        self.fast_commits += 1
        return result

    def _own_connection(self) -> Any:
        """A DB-API connection of the engine's (its session settings made), outside
        the pool: the store thread's for good, no pool reset between batches."""
        proxy = self.engine.raw_connection()
        conn = proxy.driver_connection
        proxy.detach()
        return conn

    def _commit_stepwise(self, epoch: int, batch: Batch) -> BatchResult:
        """Any batch, one statement at a time (SQLite; rare shapes on PostgreSQL)."""
        now = now_ms()
        inserts = batch.inserts
        # The fence carries the expected change of msg_count; what really
        # happened (dedup drops, topic rows, missing rows) is corrected at the
        # end in the same transaction, only when it differs.
        queue_acks = [mid for sid, mid in batch.acks if sid is None]
        predicted = len(inserts) - len(queue_acks)
        # max_msg_id is a high-water mark of allocated ids (it may name an
        # insert dropped as a duplicate): recover() never hands one out twice.
        max_id = max((x.id for x in inserts), default=0)
        result = BatchResult()
        ch = Changes()
        with self._tx("commit") as conn:
            self._fence(conn, epoch, predicted, max_id, now)
            if self.after_fence is not None:
                self.after_fence()
            if batch.destinations:
                self._create_destinations(conn, batch.destinations, now)
            if batch.subscriptions:
                self._create_subscriptions(conn, batch.subscriptions, now)
            if batch.claimed_subscriptions:
                self._claim_subscriptions(conn, batch.claimed_subscriptions)
            if inserts or batch.identities:
                self._insert(conn, epoch, inserts, batch.identities, now, result, ch)
            if batch.schedule_steps:
                self._step_schedules(conn, batch.schedule_steps, ch)
            for chunk in chunks(batch.redeliveries, self._chunk):
                conn.execute(self._st.redeliver, {"g": self.group, "ids": chunk})
            for chunk in chunks(batch.undeliveries, self._chunk):
                conn.execute(self._st.undeliver_q, {"g": self.group, "ids": chunk})
            if batch.deliveries:
                self._deliver(conn, epoch, batch, ch)
            if batch.releases:
                self._release(conn, batch.releases)
            if batch.delays:
                conn.execute(self._st.delay, [{"g": self.group, "i": i, "at": at, "plan": plan}
                                              for i, at, plan in batch.delays])
            if batch.moves:
                self._move(conn, batch.moves, ch)
            if queue_acks:
                self._ack_queue(conn, queue_acks, ch)
            if len(queue_acks) != len(batch.acks):
                self._ack_subscriptions(conn, batch.acks, ch)
            if batch.removed_subscriptions:
                self._remove_subscriptions(conn, batch.removed_subscriptions, ch)
            if batch.counters:
                self._add_counts(conn, batch.counters)
            self._write_counters(conn, ch, predicted, batch.removed_subscriptions)
        return result

    def _add_counts(self, conn: Connection, counts: dict[int, list[int]]) -> None:
        """One upsert per destination touched (``schema.counters``)."""
        g = self.group
        conn.exec_driver_sql(self._st.add_counts,
                             [(g, did, *deltas) for did, deltas in counts.items()])

    def _analyze_once(self) -> None:
        """See ANALYZE_AFTER_ROWS. Best effort: plans, not correctness, depend on it."""
        self._analyze_pending = False
        try:
            with self._tx("analyze") as conn:
                never = conn.scalars(
                    text("SELECT relname FROM pg_stat_user_tables WHERE relname = ANY(:t) "
                         "AND last_analyze IS NULL AND last_autoanalyze IS NULL"),
                    {"t": list(HOT_TABLES)},
                ).all()
                if never:
                    conn.execute(text(f"ANALYZE {', '.join(sorted(never))}"))
        except StoreError as exc:
            log.warning("%s: could not ANALYZE the store tables: %s", self.description, exc)

    def _create_destinations(
        self, conn: Connection, rows: Sequence[DestinationRow], now: int
    ) -> None:
        """Idempotent: the broker stages a destination's row with every write
        that needs it until one of them committed (another one may be refused
        by the store), so a row may come twice in a batch or be there already."""
        unique = {r.id: r for r in rows}
        conn.execute(
            self._dinsert(schema.destinations).on_conflict_do_nothing(),
            [
                {"grp": self.group, "id": r.id, "name": r.name, "kind": r.kind,
                 "created_at": now, "depth": 0}
                for r in unique.values()
            ],
        )

    def _create_subscriptions(
        self, conn: Connection, rows: Sequence[SubscriptionRow], now: int
    ) -> None:
        conn.execute(
            insert(schema.subscriptions),
            [
                {"grp": self.group, "id": r.id, "client_id": r.client_id, "name": r.name,
                 "destination_id": r.destination_id, "selector": r.selector,
                 "created_at": now, "pending": 0, "owner": r.owner}
                for r in rows
            ],
        )

    def _claim_subscriptions(self, conn: Connection, claims: Sequence[tuple[int, str]]) -> None:
        conn.execute(self._st.claim_sub, [{"g": self.group, "i": i, "o": o} for i, o in claims])

    def _insert(
        self,
        conn: Connection,
        epoch: int,
        inserts: Sequence[NewMessage],
        identities: Sequence[NewMessage],
        now: int,
        result: BatchResult,
        ch: Changes,
    ) -> None:
        g = self.group
        # (grp, dedup_key, producer_id, producer_seq, msg_id, created_at)
        dedup_rows: list[tuple[str, str | None, str | None, int | None, int | None, int]] = []
        keys = {x.dedup_key for x in (*inserts, *identities) if x.dedup_key is not None}
        if keys:
            stored: set[str] = set()
            for chunk in chunks(list(keys), self._chunk):
                stored.update(conn.scalars(self._st.dedup_lookup, {"g": g, "keys": chunk}))
            inserts, fresh = fresh_only(inserts, identities, stored, result)
            # An identity without a message: msg_id NULL in the dedup window.
            dedup_rows = [(g, x.dedup_key, x.producer_id, x.producer_seq, None, now)
                          for x in fresh]
        if not inserts:
            if dedup_rows:
                conn.exec_driver_sql(self._st.ins_dedup, dedup_rows)
            return
        rows = []
        pending_rows = []
        depth = ch.depth
        pending = ch.pending
        for x in inserts:
            rows.append(message_row(g, epoch, x, now, encode_headers))
            if not x.deliver_at:  # scheduled: in no queue's depth until a copy is due
                depth[x.destination_id] += 1
            if x.dedup_key is not None:
                dedup_rows.append((g, x.dedup_key, x.producer_id, x.producer_seq, x.id, now))
            for sub in x.subscriber_ids:
                pending_rows.append((g, sub, x.id))
                pending[sub] += 1
        ch.msgs += len(rows)
        conn.exec_driver_sql(self._st.ins_msg, rows)
        if dedup_rows:
            conn.exec_driver_sql(self._st.ins_dedup, dedup_rows)
        if pending_rows:
            conn.exec_driver_sql(self._st.ins_pending, pending_rows)

    def _step_schedules(self, conn: Connection, steps: Sequence[ScheduleStep],
                        ch: Changes) -> None:
        """Scheduled rows move to their next occurrence or go (no queue depth: they
        were never counted in one)."""
        moves = [{"g": self.group, "i": x.id, "at": x.next_due, "plan": x.schedule}
                 for x in steps if x.next_due is not None]
        if moves:
            conn.execute(self._st.step_schedule, moves)
        gone = [x.id for x in steps if x.next_due is None]
        for chunk in chunks(gone, self._chunk):
            ch.msgs -= len(conn.scalars(self._st.delete_scheduled,
                                        {"g": self.group, "ids": chunk}).all())

    def _deliver(self, conn: Connection, epoch: int, batch: Batch, ch: Changes) -> None:
        for (sid, n), mids in deliveries_by_times(batch).items():
            for chunk in chunks(mids, self._chunk):
                if sid is None:
                    conn.execute(self._st.deliver_q,
                                 {"g": self.group, "e": epoch, "n": n, "ids": chunk})
                else:
                    conn.execute(self._st.deliver_s,
                                 {"g": self.group, "e": epoch, "n": n, "s": sid, "ids": chunk})

    def _release(self, conn: Connection, refs: Sequence[Ref]) -> None:
        by_sub: defaultdict[int | None, list[int]] = defaultdict(list)
        for sid, mid in refs:
            by_sub[sid].append(mid)
        for sid, mids in by_sub.items():
            for chunk in chunks(mids, self._chunk):
                if sid is None:
                    conn.execute(self._st.release_q, {"g": self.group, "ids": chunk})
                else:
                    conn.execute(self._st.release_s, {"g": self.group, "s": sid, "ids": chunk})

    def _move(self, conn: Connection, moves: Sequence[tuple[int, int]], ch: Changes) -> None:
        final: dict[int, int] = {}
        for mid, dest in moves:  # a later move of the same message wins
            final[mid] = dest
        ids = list(final)
        origin: dict[int, int] = {}
        for chunk in chunks(ids, self._chunk):
            for mid, src in conn.execute(self._st.move_lookup, {"g": self.group, "ids": chunk}):
                origin[mid] = src
        params = []
        for mid, dest in final.items():
            src = origin.get(mid)
            if src is None:  # already gone: nothing to move
                continue
            params.append({"g": self.group, "i": mid, "d": dest})
            ch.depth[src] -= 1
            ch.depth[dest] += 1
        if params:
            conn.execute(self._st.move, params)

    def _ack_queue(self, conn: Connection, mids: Sequence[int], ch: Changes) -> None:
        for chunk in chunks(mids, self._chunk):
            ch.deleted_messages(
                conn.scalars(self._st.ack_q, {"g": self.group, "ids": chunk}).all()
            )

    def _ack_subscriptions(self, conn: Connection, acks: Sequence[Ref], ch: Changes) -> None:
        by_sub: defaultdict[int, list[int]] = defaultdict(list)
        for sid, mid in acks:
            if sid is not None:
                by_sub[sid].append(mid)
        candidates: set[int] = set()
        for sid, mids in by_sub.items():
            for chunk in chunks(mids, self._chunk):
                n = conn.execute(self._st.ack_s, {"g": self.group, "s": sid, "ids": chunk}).rowcount
                ch.pending[sid] -= n
            candidates.update(mids)
        self._delete_orphans(conn, list(candidates), ch)

    def _delete_orphans(self, conn: Connection, mids: Sequence[int], ch: Changes) -> None:
        """Delete the message rows among ``mids`` that no subscription is owed."""
        for chunk in chunks(mids, self._chunk):
            ch.deleted_messages(
                conn.scalars(self._st.delete_orphans, {"g": self.group, "ids": chunk}).all()
            )

    def _remove_subscriptions(self, conn: Connection, sids: Sequence[int], ch: Changes) -> None:
        for chunk in chunks(list(dict.fromkeys(sids)), self._chunk):
            params = {"g": self.group, "subs": chunk}
            ch.deleted_messages(conn.scalars(self._st.delete_sub_orphans, params).all())
            conn.execute(self._st.delete_sub_pending, params)
            conn.execute(self._st.delete_subs, params)


class PipelinedCommit:
    """A batch's transaction sent on the store's pipeline connection and read by
    the group committer's event loop (``Store.start_commit``, ``LoopCommit``)."""

    def __init__(self, store: BatchCommitting, epoch: int, batch: Batch,
                 pipeline: Pipeline, answer: pg_batch.Answer, sent: bool) -> None:
        self._store, self._epoch, self._batch = store, epoch, batch
        self._pipeline, self._answer = pipeline, answer
        self._careful = False
        self.sent = sent

    @property
    def fd(self) -> int:
        return self._pipeline.fd

    def flush(self) -> bool:
        self.sent = self._pipeline.flush()
        return self.sent

    def receive(self) -> BatchResult | None:
        """The commit's result once answered; None until then, and after a refused
        dedup key, when the commit is sent again, careful (``store.pg_batch.held_key``;
        ``flush`` when ``sent`` is False)."""
        try:
            results = self._pipeline.receive()
        except Exception as e:
            if self._careful or not pg_batch.held_key(e):
                raise
            self._careful = True
            steps, self._answer = self._store._careful(self._epoch, self._batch)
            self.sent = self._pipeline.send(steps)
            return None
        if results is None:
            return None
        result = self._answer.result(self._pipeline, results)
        self._store.fast_commits += 1
        self._store._committed(self._batch)
        return result

    def failed(self, exc: BaseException) -> StoreError:
        return self._store._pipeline_failed(self._epoch, exc)
