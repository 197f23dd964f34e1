"""The group commit on PostgreSQL in one round trip.

A W1 commit (a few dozen SENDs, their deliveries, a few dozen ACKs) used to be
seven statements, each waiting for its answer before the next was sent; the
store thread spent most of its time waiting on the network, and every message
cost psycopg's per-row Python. Here the whole transaction is one pipeline
(``store.pg_pipeline``: libpq's pipeline mode, statements prepared once per
connection, parameters in binary): the fence, one set-based statement per kind
of write (arrays of values, ``unnest``) go out together, one transaction up to the
pipeline's Sync, and PostgreSQL answers once.

That needs two things the step-by-step path did in Python:

* The fence aborts the transaction by itself: ``SELECT 1 / count(*)`` over the
  guarded UPDATE of the group row divides by zero when the epoch is no longer
  ours, and a pipeline skips everything after an error up to the Sync, where the
  transaction is rolled back. It is still the first statement, so the fencing
  argument of ``store.fencing`` holds unchanged (the row lock is taken before any
  write).
* Duplicate detection happens in the INSERT, optimistically: the dedup rows go in
  with a plain INSERT, which PostgreSQL refuses on a key it already holds (the
  primary key's ``unique_violation``); that rare commit (a failover client's
  re-send of a message stored before the takeover) is sent again with the careful
  statement, ``ON CONFLICT DO NOTHING RETURNING``, which inserts only the messages
  whose key came back (``prepare``'s ``careful``). Counters (group ``msg_count``,
  destination ``depth``) are kept in the same statements from what they really
  inserted and deleted.

Only the hot shapes take this path: queue messages, producer identities, and
queue undeliveries, deliveries, releases and acks. A batch that also creates destinations
or subscriptions, moves to a DLQ, touches durable subscriptions or scheduled messages
goes the step-by-step way (``SqlStore``); those are rare.
"""

from __future__ import annotations

from typing import Any

from store import pg_arrays as arr
from store.api import Batch, BatchResult, NewMessage
from store.pg_arrays import byteas, int2s, int4s, int8s, texts
from store.pg_pipeline import Pipeline, Statement, int8
from store.schema import COUNTER_KINDS

#: The planner settings of the pipeline's session. Its statements are prepared once, and
#: after five runs PostgreSQL keeps a generic plan until the table's statistics change.
#: Planned while a churning queue's table looked empty (autovacuum truncates it when the
#: consumers keep up: relpages 0), the ACK's join became a hash join over a sequential
#: scan of amq_messages, and stayed the plan while dead rows grew the table to a
#: gigabyte: W1 fell from 15,800 to 3,000 msg/s, PostgreSQL spending 92 % of its CPU in
#: sequential scans (bench/README.md, "Issue 25, session 15"). Every statement here
#: reaches rows by key, so only nested loops over index scans are left, whatever the
#: statistics say when the plan is made, and the ids' bounds (below) keep even a range
#: scan to the batch's own span. (``enable_*`` settings only price a plan out; where no
#: other plan exists, PostgreSQL still uses it.)
PLANNER_SETTINGS = ("SET enable_seqscan = off", "SET enable_hashjoin = off",
                    "SET enable_mergejoin = off")
#: SQLSTATE division_by_zero: only the fence divides, so it means "fenced".
FENCED_SQLSTATE = "22012"
#: All bodies of a batch travel in one bytea[] parameter, and PostgreSQL
#: refuses a protocol message over 1 GB; a batch of big messages (the frame
#: limit is 10 MB) goes step by step instead. At 64 MB of bodies the round
#: trips saved no longer matter.
MAX_PIPELINED_BODY_BYTES = 64 * 2**20

FENCE = """\
WITH f AS (
  UPDATE amq_groups
  SET checkpoint_at = %(now)s, max_msg_id = greatest(max_msg_id, %(max_id)s)
  WHERE grp = %(g)s AND epoch = %(e)s
  RETURNING 1)
SELECT 1 / count(*) FROM f"""

#: SQLSTATE unique_violation: on the plain INSERT, a dedup key the store already holds
#: (amq_dedup's primary key, (grp, dedup_key)).
UNIQUE_VIOLATION = "23505"
#: ``ON CONFLICT`` makes every row a speculative insertion (a probe of the key before
#: the heap insert, which the unique index checks again as it inserts, and a WAL record
#: more to confirm it): with the key returned and joined, about a tenth of PostgreSQL's
#: CPU a W1 message (bench/README.md, "Issue 25, session 25"), paid for the one commit
#: in millions that meets a key it holds. So the usual statement inserts
#: plainly and the careful one (``prepare``'s ``careful``) runs only after a refusal.
_CAREFUL_RETURNING = "\n  ON CONFLICT DO NOTHING\n  RETURNING dedup_key"
#: The careful INSERT's message rows: those whose key went in (``d`` returned it).
_NEW_KEYS_ONLY = "\n  WHERE k IS NULL OR k IN (SELECT dedup_key FROM d)"


# Arrays go in binary (%b): a bytea[] in text form would be hex-escaped.
def _dedup(careful: bool) -> str:
    """The dedup rows (CTE ``d``) and the message rows (``m``) whose key is new: with
    ``careful``, the keys already held are skipped; without, they fail the statement."""
    return f"""\
d AS (
  INSERT INTO amq_dedup (grp, dedup_key, producer_id, producer_seq, msg_id, created_at)
  SELECT %(g)s, k, p, s, i, %(now)s
  FROM unnest(%(dk)b::text[], %(dp)b::text[], %(ds)b::int8[], %(di)b::int8[]) AS u(k, p, s, i)\
{_CAREFUL_RETURNING if careful else ""}
), m AS (
  INSERT INTO amq_messages (grp, id, destination_id, message_id, producer_id, producer_seq,
    dedup_key, priority, expires_at, enqueued_at, delivery_count, inflight_epoch, headers, body)
  SELECT %(g)s, id, dst, mid, pid, pseq, k, prio, exp, enq, dc,
    CASE WHEN dc > 0 THEN %(e)s::int8 END, h, b
  FROM unnest(%(id)b::int8[], %(dst)b::int8[], %(mid)b::text[], %(pid)b::text[],
    %(pseq)b::int8[], %(k)b::text[], %(prio)b::int2[], %(exp)b::int8[], %(enq)b::int8[],
    %(dc)b::int4[], %(h)b::text[], %(b)b::bytea[])
    AS u(id, dst, mid, pid, pseq, k, prio, exp, enq, dc, h, b)\
{_NEW_KEYS_ONLY if careful else ""}
  RETURNING destination_id
)"""

#: The careful INSERT's answer: the keys PostgreSQL already held (duplicates).
_HELD_KEYS = """
SELECT k FROM unnest(%(dk)b::text[]) AS k
WHERE k NOT IN (SELECT dedup_key FROM d)"""
#: The plain INSERT's: none (it fails on a held key). A WITH needs a query of its own.
_NO_ANSWER = "\nSELECT NULL WHERE false"


def _insert(careful: bool) -> str:
    """The inserts and their totals."""
    return f"""\
WITH {_dedup(careful)}, c AS (
  SELECT destination_id, count(*) AS n FROM m GROUP BY destination_id
), depth AS (
  UPDATE amq_destinations t SET depth = t.depth + c.n
  FROM c WHERE t.grp = %(g)s AND t.id = c.destination_id
), total AS (
  UPDATE amq_groups SET msg_count = msg_count + (SELECT count(*) FROM m) WHERE grp = %(g)s
){_HELD_KEYS if careful else _NO_ANSWER}"""


INSERT, CAREFUL_INSERT = _insert(False), _insert(True)

# Rows by id: a join with unnest, not ``id = ANY(array)``. With ANY, the
# planner may pick ix_amq_messages_dest (grp, destination_id, id) and filter
# on id over the group's whole range: cheap by the statistics of a small
# queue, 8 ms per batch in practice because a churning queue's index is full
# of dead entries. Joined per id, the primary key gives a full-key probe. But a
# plan made while the statistics say the table is empty (PLANNER_SETTINGS) may
# still scan the group's range once instead of probing: the ids' bounds (lo, hi)
# keep that scan to the batch's own span of ids, whichever plan runs.
UNDELIVER = """\
UPDATE amq_messages t SET delivery_count = t.delivery_count - 1, inflight_epoch = NULL
FROM unnest(%(id)b::int8[]) AS u(id)
WHERE t.grp = %(g)s AND t.id = u.id
  AND t.id BETWEEN %(lo)s AND %(hi)s"""

DELIVER = """\
UPDATE amq_messages t SET delivery_count = t.delivery_count + u.n, inflight_epoch = %(e)s
FROM unnest(%(id)b::int8[], %(n)b::int4[]) AS u(id, n)
WHERE t.grp = %(g)s AND t.id = u.id
  AND t.id BETWEEN %(lo)s AND %(hi)s"""

RELEASE = """\
UPDATE amq_messages t SET inflight_epoch = NULL
FROM unnest(%(id)b::int8[]) AS u(id)
WHERE t.grp = %(g)s AND t.id = u.id
  AND t.id BETWEEN %(lo)s AND %(hi)s"""



def _deleted(ids: str = "") -> str:
    """The acked rows deleted, as the CTE ``del``; ``ids``: the prefix of the names of
    the ids' array and bounds (INSERT_ACK_COUNT's ``id`` is the inserts')."""
    return f"""del AS (
  DELETE FROM amq_messages t USING unnest(%({ids}id)b::int8[]) AS u(id)
  WHERE t.grp = %(g)s AND t.id = u.id AND t.id BETWEEN %({ids}lo)s AND %({ids}hi)s
  RETURNING t.destination_id
)"""


ACK = f"""\
WITH {_deleted()}, c AS (
  SELECT destination_id, count(*) AS n FROM del GROUP BY destination_id
), depth AS (
  UPDATE amq_destinations t SET depth = t.depth - c.n
  FROM c WHERE t.grp = %(g)s AND t.id = c.destination_id
)
UPDATE amq_groups SET msg_count = msg_count - (SELECT count(*) FROM del) WHERE grp = %(g)s"""


#: The destinations' totals (``Batch.counters``): one row per destination touched.
COUNT = (
    f"INSERT INTO amq_counters (grp, destination_id, {', '.join(COUNTER_KINDS)})\n"
    f"SELECT %(g)s, u.* FROM unnest(%(d)b::int8[], "
    + ", ".join(f"%({k})b::int8[]" for k in COUNTER_KINDS)
    + ") AS u\nON CONFLICT (grp, destination_id) DO UPDATE SET "
    + ", ".join(f"{k} = amq_counters.{k} + excluded.{k}" for k in COUNTER_KINDS)
)
#: ACK and COUNT as one statement (a W1 commit has both): one statement less in the
#: pipeline saves the store thread most of what the totals cost (bench/counters_bench.py).
#: The fence ran before (its own statement), so the row locks come in the same order.
ACK_COUNT = ACK.replace("\nUPDATE amq_groups", f",\ncnt AS (\n{COUNT}\n)\nUPDATE amq_groups")
assert ACK_COUNT != ACK
#: INSERT and ACK_COUNT as one statement, for a commit that has both (every W1 commit):
#: the group's total and each destination's depth are updated once, from what was really
#: inserted and deleted, and not at all when that is as many as were deleted (W1's steady
#: state), instead of once per statement (each update of a row is a new row version and a
#: WAL record); and one statement less goes through the pipeline. All of it
#: runs on one snapshot, so the DELETE cannot see the INSERT's rows: right, because a
#: message is acked only after the commit that stored it (its MESSAGE goes out then), and
#: ``prepare`` keeps a batch that would ack its own insert on the separate statements.
def _insert_ack_count(careful: bool) -> str:
    return f"""\
WITH {_dedup(careful)}, {_deleted("a")}, c AS (
  SELECT destination_id, sum(n) AS n FROM (
    SELECT destination_id, 1 AS n FROM m UNION ALL SELECT destination_id, -1 FROM del) AS x
  GROUP BY destination_id
), depth AS (
  UPDATE amq_destinations t SET depth = t.depth + c.n
  FROM c WHERE t.grp = %(g)s AND t.id = c.destination_id AND c.n <> 0
), total AS (
  UPDATE amq_groups SET msg_count = msg_count + (SELECT count(*) FROM m)
    - (SELECT count(*) FROM del)
  WHERE grp = %(g)s AND (SELECT count(*) FROM m) <> (SELECT count(*) FROM del)
), cnt AS (
{COUNT}
){_HELD_KEYS if careful else _NO_ANSWER}"""


INSERT_ACK_COUNT, CAREFUL_INSERT_ACK_COUNT = _insert_ack_count(False), _insert_ack_count(True)


def fits(batch: Batch) -> bool:
    """True when every write of ``batch`` has a statement here."""
    if (batch.destinations or batch.subscriptions or batch.moves or batch.removed_subscriptions
            or batch.claimed_subscriptions or batch.schedule_steps or batch.delays
            or batch.redeliveries):
        return False
    size = 0
    for x in batch.inserts:
        if x.subscriber_ids or x.deliver_at:  # scheduled messages: step by step
            return False
        size += len(x.body)
    if size > MAX_PIPELINED_BODY_BYTES:
        return False
    for refs in (batch.deliveries, batch.releases, batch.acks):
        for sid, _ in refs:
            if sid is not None:
                return False
    return True


#: The type of each parameter of the statements above, by name.
TYPES = {
    "g": arr.TEXT_OID, "e": arr.INT8_OID, "now": arr.INT8_OID, "max_id": arr.INT8_OID,
    "lo": arr.INT8_OID, "hi": arr.INT8_OID, "alo": arr.INT8_OID, "ahi": arr.INT8_OID,
    **dict.fromkeys(("dk", "dp", "mid", "pid", "k", "h"), arr.TEXT_ARRAY_OID),
    **dict.fromkeys(("ds", "di", "id", "aid", "dst", "pseq", "exp", "enq", "d",
                     *COUNTER_KINDS),
                    arr.INT8_ARRAY_OID),
    "prio": arr.INT2_ARRAY_OID, "dc": arr.INT4_ARRAY_OID, "n": arr.INT4_ARRAY_OID,
    "b": arr.BYTEA_ARRAY_OID,
}
#: Prepared once per connection (``store.pg_pipeline``).
(S_FENCE, S_INSERT, S_UNDELIVER, S_DELIVER, S_RELEASE, S_ACK, S_ACK_COUNT, S_COUNT,
 S_INSERT_ACK_COUNT, S_CAREFUL_INSERT, S_CAREFUL_INSERT_ACK_COUNT) = (
    Statement(f"amqlite_{name}", sql, TYPES) for name, sql in (
        ("fence", FENCE), ("insert", INSERT), ("undeliver", UNDELIVER),
        ("deliver", DELIVER), ("release", RELEASE), ("ack", ACK), ("ack_count", ACK_COUNT),
        ("count", COUNT), ("insert_ack_count", INSERT_ACK_COUNT),
        ("careful_insert", CAREFUL_INSERT),
        ("careful_insert_ack_count", CAREFUL_INSERT_ACK_COUNT)))


def held_key(exc: BaseException) -> bool:
    """True when ``exc`` may be the plain INSERT refusing a dedup key the store already
    holds: the transaction was rolled back, the connection is fine, and the commit is
    to be sent again with ``careful``. By SQLSTATE alone, not the constraint's name (a
    store whose schema was made by hand may name it otherwise): any other unique
    violation fails the careful commit too, and is handled as it always was."""
    return getattr(exc, "sqlstate", None) == UNIQUE_VIOLATION


def commit(pipeline: Pipeline, group: str, epoch: int, batch: Batch, now: int,
           encode_headers: Any) -> BatchResult:
    """Run ``batch`` as one pipelined transaction. Raises psycopg errors as they are;
    the caller sends it again ``careful`` (``prepare``) after a ``held_key``, maps the
    rest (``FENCED_SQLSTATE`` = fenced) and closes the connection."""
    steps, answer = prepare(group, epoch, batch, now, encode_headers)
    return answer.result(pipeline, pipeline.transaction(steps))


class Answer:
    """What a commit's results are read into: the duplicates PostgreSQL found."""

    def __init__(self, result: BatchResult, careful_insert: bool,
                 ids_by_key: dict[str, int]) -> None:
        self._result = result  # with the duplicates found inside the batch already
        self._careful_insert = careful_insert
        self._ids_by_key = ids_by_key

    def result(self, pipeline: Pipeline, results: list[Any]) -> BatchResult:
        result = self._result
        if self._careful_insert:  # its rows: the keys PostgreSQL already held
            for key in pipeline.texts(results[1]):
                result.duplicates.add(key)
                result.duplicate_ids.add(self._ids_by_key[key])
        return result


def prepare(group: str, epoch: int, batch: Batch, now: int, encode_headers: Any,
            careful: bool = False
            ) -> tuple[list[tuple[Statement, dict[str, bytes | None]]], Answer]:
    """The statements of ``batch``'s transaction with their parameters, and how to
    read their results (``Answer.result``). ``careful``: skip the dedup keys the store
    already holds (as duplicates) instead of failing on them (``_CAREFUL_RETURNING``)."""
    result = BatchResult()
    inserts, identities, ids_by_key = _dedup_in_batch(batch.inserts, batch.identities, result)
    base: dict[str, bytes | None] = {"g": group.encode(), "e": int8(epoch), "now": int8(now)}
    acked = {mid for _, mid in batch.acks}
    deliveries: dict[int, int] = {}
    for _, mid in batch.deliveries:
        if mid not in acked:
            deliveries[mid] = deliveries.get(mid, 0) + 1
    max_id = max((x.id for x in batch.inserts), default=0)
    steps: list[tuple[Statement, dict[str, bytes | None]]] = [
        (S_FENCE, {**base, "max_id": int8(max_id)})]
    inserting = bool(inserts or identities)
    # One statement for the inserts, the acks and the totals (INSERT_ACK_COUNT), unless
    # the batch acks a message it inserts, which that statement's DELETE would not see.
    together = (inserting and bool(acked) and bool(batch.counters)
                and acked.isdisjoint([x.id for x in inserts]))
    if together:
        steps.append((S_CAREFUL_INSERT_ACK_COUNT if careful else S_INSERT_ACK_COUNT, {
            **base, **_insert_arrays(inserts, identities, now, encode_headers),
            **_ids(list(acked), "a"), **_count_arrays(batch.counters)}))
    elif inserting:
        steps.append((S_CAREFUL_INSERT if careful else S_INSERT,
                      {**base, **_insert_arrays(inserts, identities, now, encode_headers)}))
    if batch.undeliveries:
        steps.append((S_UNDELIVER, {**base, **_ids(batch.undeliveries)}))
    if deliveries:
        steps.append((S_DELIVER, {**base, **_ids(list(deliveries)),
                                  "n": int4s(list(deliveries.values()))}))
    if batch.releases:
        steps.append((S_RELEASE, {**base, **_ids([mid for _, mid in batch.releases])}))
    if not together:
        steps += _acks_and_totals(base, acked, batch.counters)
    return steps, Answer(result, inserting and careful, ids_by_key)


def _acks_and_totals(base: dict[str, bytes | None], acked: set[int],
                     counts: dict[int, list[int]]
                     ) -> list[tuple[Statement, dict[str, bytes | None]]]:
    """The last step when the inserts did not take the acks and totals along: one
    statement for both, for either, or none."""
    if acked and counts:
        return [(S_ACK_COUNT, {**base, **_ids(list(acked)), **_count_arrays(counts)})]
    if acked:
        return [(S_ACK, {**base, **_ids(list(acked))})]
    if counts:
        return [(S_COUNT, {**base, **_count_arrays(counts)})]
    return []


def _ids(ids: list[int], prefix: str = "") -> dict[str, bytes | None]:
    """Message ids as the probing statements take them: the array and its bounds
    (``prefix``: INSERT_ACK_COUNT's names for the acked ones)."""
    return {prefix + "id": int8s(ids), prefix + "lo": int8(min(ids)),
            prefix + "hi": int8(max(ids))}


def _count_arrays(counts: dict[int, list[int]]) -> dict[str, bytes | None]:
    """``Batch.counters`` as one array per column (``COUNT``, ``store.pg_arrays``)."""
    arrays: dict[str, bytes | None] = {"d": int8s(list(counts))}
    for k, kind in enumerate(COUNTER_KINDS):
        arrays[kind] = int8s([deltas[k] for deltas in counts.values()])
    return arrays


def _dedup_in_batch(
    inserts: list[NewMessage], identities: list[NewMessage], result: BatchResult
) -> tuple[list[NewMessage], list[NewMessage], dict[str, int]]:
    """Drop repeats of a key inside the batch (the first one wins, as in the
    step-by-step path: ON CONFLICT cannot tell two rows of one statement
    apart). Returns the inserts and identities kept, and the id of each key."""
    ids_by_key: dict[str, int] = {}
    kept: tuple[list[NewMessage], list[NewMessage]] = ([], [])
    for rows, out in ((inserts, kept[0]), (identities, kept[1])):
        for x in rows:
            k = x.dedup_key
            if k is not None:
                if k in ids_by_key:
                    result.duplicates.add(k)
                    result.duplicate_ids.add(x.id)
                    continue
                ids_by_key[k] = x.id
            elif out is kept[1]:
                continue  # an identity without a key identifies nothing
            out.append(x)
    return kept[0], kept[1], ids_by_key


def _insert_arrays(inserts: list[NewMessage], identities: list[NewMessage], now: int,
                   encode_headers: Any) -> dict[str, bytes | None]:
    """Column arrays for INSERT (``store.pg_arrays``): a dedup row per key (an
    identity's names no message), and the message rows."""
    keyed = [x for x in inserts if x.dedup_key is not None]
    keyed += identities
    n_keyed = len(keyed) - len(identities)
    return {
        "dk": texts([x.dedup_key for x in keyed]),
        "dp": texts([x.producer_id for x in keyed]),
        "ds": int8s([x.producer_seq for x in keyed]),
        "di": int8s([x.id if i < n_keyed else None for i, x in enumerate(keyed)]),
        "id": int8s([x.id for x in inserts]),
        "dst": int8s([x.destination_id for x in inserts]),
        "mid": texts([x.message_id for x in inserts]),
        "pid": texts([x.producer_id for x in inserts]),
        "pseq": int8s([x.producer_seq for x in inserts]),
        "k": texts([x.dedup_key for x in inserts]),
        "prio": int2s([x.priority for x in inserts]),
        "exp": int8s([x.expires_at for x in inserts]),
        "enq": int8s([x.enqueued_at or now for x in inserts]),
        "dc": int4s([x.delivery_count for x in inserts]),
        "h": texts([encode_headers(x.headers) for x in inserts]),
        "b": byteas([x.body for x in inserts]),
    }
