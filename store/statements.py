"""The store's statements, built once per store (SQLAlchemy caches their compiled
form), and the small helpers that run them: id lists in chunks, headers as JSON, now.

One ``Statements`` per dialect flavour: SQLite gets expanding ``IN`` lists and ``?``
placeholders, PostgreSQL ``= ANY`` of one array parameter and ``%s``. Every statement
is scoped to the group (``grp = :g``); the ones that write are run inside a fenced
transaction (``store.fencing``).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from sqlalchemy import (
    ARRAY,
    JSON,
    BigInteger,
    BindParameter,
    ColumnElement,
    Select,
    all_,
    and_,
    any_,
    bindparam,
    case,
    cast,
    delete,
    exists,
    func,
    literal_column,
    or_,
    select,
    update,
)

from store import schema

T = TypeVar("T")

#: Ids per ``IN (...)`` list on SQLite: before 3.32 it allowed 999 host
#: parameters per statement; 500 leaves room for the others.
IN_CHUNK = 500
#: Ids per ``= ANY(:array)`` on PostgreSQL. One array parameter keeps one
#: statement shape (psycopg prepares it once, and the planner uses the primary
#: key; a long IN list of parameters got a worse plan, 4 ms for 64 keys). The
#: bound only caps a statement's size: the committer's MAX_BATCH_OPS fits.
ARRAY_CHUNK = 5000


def now_ms() -> int:
    return int(time.time() * 1000)


def chunks(seq: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for i in range(0, len(seq), size):
        yield seq[i : i + size]


def _headers_encoder() -> Callable[[Mapping[str, str]], str]:
    """Headers as compact JSON, non-ASCII kept: what ``json.dumps(h, ensure_ascii=False,
    separators=(",", ":"))`` writes. ``JSONEncoder.encode`` makes a new C encoder on
    every call (``iterencode``); the group committer encodes one message's headers per
    row, so the C encoder is made once here (6 headers: 3.8 µs instead of 6.3, bench/
    README.md session 9). Without the C encoder (not CPython), the plain method."""
    plain = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return plain.encode
    try:  # JSONEncoder.iterencode's own call, for check_circular=False
        encoder = make(None, plain.default, json.encoder.encode_basestring, None, ":", ",",
                       False, False, True)
    except TypeError:  # another signature in another Python
        return plain.encode

    def encode(headers: Mapping[str, str]) -> str:
        return "".join(encoder(headers, 0))

    return encode


encode_headers = _headers_encoder()


def deliverable() -> ColumnElement[bool]:
    """An ordinary message row, not a scheduled one still waiting (``deliver_at``)."""
    m = schema.messages
    return or_(m.c.deliver_at.is_(None), m.c.deliver_at == literal_column("0"))


def greatest(col: Any, value: Any) -> Any:
    """greatest() that both dialects understand."""
    return case((col > value, col), else_=value)


#: Header names a page filter may look into (``PageFilter``): plain names only, so a
#: name is never spliced into a JSON path it could break out of.
FILTERABLE_HEADER = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]{0,99}")
#: The message columns a page filter may compare.
FILTERABLE_COLUMNS = ("priority", "enqueued_at", "expires_at", "message_id")
_COMPARE = {"=": "__eq__", "<>": "__ne__", "<": "__lt__", ">": "__gt__", "<=": "__le__",
            ">=": "__ge__"}


class Statements:
    """A store's statements (``sqlite``: built for SQLite, else for PostgreSQL).
    ``ins_*`` are driver-level INSERTs (``exec_driver_sql``), the rest SQLAlchemy Core."""

    def __init__(self, sqlite: bool) -> None:
        self.sqlite = sqlite
        g, m, d, s = schema.groups, schema.messages, schema.destinations, schema.subscriptions
        p, dd = schema.sub_pending, schema.dedup
        p2 = p.alias("p2")
        self.ins_msg = self._driver_insert(
            m,
            ("grp", "id", "destination_id", "message_id", "producer_id", "producer_seq",
             "dedup_key", "priority", "expires_at", "enqueued_at", "delivery_count",
             "inflight_epoch", "headers", "body", "deliver_at", "schedule"),
        )
        self.ins_dedup = self._driver_insert(
            dd, ("grp", "dedup_key", "producer_id", "producer_seq", "msg_id", "created_at")
        )
        self.ins_pending = self._driver_insert(
            p, ("grp", "sub_id", "msg_id"), {"delivery_count": "0", "inflight_epoch": "NULL"}
        )
        kinds = schema.COUNTER_KINDS
        self.add_counts = (
            self._driver_insert(schema.counters, ("grp", "destination_id", *kinds))
            + " ON CONFLICT (grp, destination_id) DO UPDATE SET "
            + ", ".join(f"{k} = amq_counters.{k} + excluded.{k}" for k in kinds)
        )
        grp: BindParameter[str] = bindparam("g")
        in_ = self._in
        max_id = bindparam("max_id", type_=BigInteger)
        self.fence = (
            update(g)
            .where(g.c.grp == grp, g.c.epoch == bindparam("e"))
            .values(
                msg_count=g.c.msg_count + bindparam("delta", type_=BigInteger),
                max_msg_id=greatest(g.c.max_msg_id, max_id),
                checkpoint_at=bindparam("now", type_=BigInteger),
            )
        )
        self.count_fix = (
            update(g)
            .where(g.c.grp == grp)
            .values(msg_count=g.c.msg_count + bindparam("delta", type_=BigInteger))
        )
        self.dedup_lookup = select(dd.c.dedup_key).where(
            dd.c.grp == grp, in_(dd.c.dedup_key, "keys")
        )
        self.deliver_q = (
            update(m)
            .where(m.c.grp == grp, in_(m.c.id, "ids"))
            .values(
                delivery_count=m.c.delivery_count + bindparam("n"),
                inflight_epoch=bindparam("e"),
            )
        )
        self.deliver_s = (
            update(p)
            .where(p.c.grp == grp, p.c.sub_id == bindparam("s"), in_(p.c.msg_id, "ids"))
            .values(
                delivery_count=p.c.delivery_count + bindparam("n"),
                inflight_epoch=bindparam("e"),
            )
        )
        self.undeliver_q = (
            update(m)
            .where(m.c.grp == grp, in_(m.c.id, "ids"))
            .values(delivery_count=m.c.delivery_count - 1, inflight_epoch=None)
        )
        self.release_q = (
            update(m).where(m.c.grp == grp, in_(m.c.id, "ids")).values(inflight_epoch=None)
        )
        self.release_s = (
            update(p)
            .where(p.c.grp == grp, p.c.sub_id == bindparam("s"), in_(p.c.msg_id, "ids"))
            .values(inflight_epoch=None)
        )
        self.move_lookup = select(m.c.id, m.c.destination_id).where(
            m.c.grp == grp, in_(m.c.id, "ids")
        )
        self.move = (
            update(m)
            .where(m.c.grp == grp, m.c.id == bindparam("i"))
            .values(destination_id=bindparam("d"), inflight_epoch=None)
        )
        self.ack_q = (
            delete(m).where(m.c.grp == grp, in_(m.c.id, "ids")).returning(m.c.destination_id)
        )
        self.ack_s = delete(p).where(
            p.c.grp == grp, p.c.sub_id == bindparam("s"), in_(p.c.msg_id, "ids")
        )
        no_pending = ~exists().where(p2.c.grp == m.c.grp, p2.c.msg_id == m.c.id)
        self.delete_orphans = (
            delete(m)
            .where(m.c.grp == grp, in_(m.c.id, "ids"), no_pending)
            .returning(m.c.destination_id)
        )
        self.delete_sub_orphans = (
            delete(m)
            .where(
                m.c.grp == grp,
                m.c.id.in_(select(p.c.msg_id).where(p.c.grp == grp, in_(p.c.sub_id, "subs"))),
                ~exists().where(
                    p2.c.grp == m.c.grp,
                    p2.c.msg_id == m.c.id,
                    in_(p2.c.sub_id, "subs", negate=True),
                ),
            )
            .returning(m.c.destination_id)
        )
        self.delete_sub_pending = delete(p).where(p.c.grp == grp, in_(p.c.sub_id, "subs"))
        self.delete_subs = delete(s).where(s.c.grp == grp, in_(s.c.id, "subs"))
        dest = bindparam("d", type_=BigInteger)
        self.delete_destination = delete(d).where(d.c.grp == grp, d.c.id == dest)
        c = schema.counters
        self.delete_counters = delete(c).where(c.c.grp == grp, c.c.destination_id == dest)
        self.destination_subs = select(s.c.id).where(s.c.grp == grp,
                                                     s.c.destination_id == dest)
        self.delete_destination_messages = delete(m).where(m.c.grp == grp,
                                                           m.c.destination_id == dest)
        self.depth = (
            update(d)
            .where(d.c.grp == grp, d.c.id == bindparam("i"))
            .values(depth=d.c.depth + bindparam("n"))
        )
        self.claim_sub = (
            update(s)
            .where(s.c.grp == grp, s.c.id == bindparam("i"), s.c.owner.is_(None))
            .values(owner=bindparam("o"))
        )
        self.pending = (
            update(s)
            .where(s.c.grp == grp, s.c.id == bindparam("i"))
            .values(pending=s.c.pending + bindparam("n"))
        )
        msg_cols = (
            m.c.id, m.c.destination_id, m.c.message_id, m.c.headers, m.c.body, m.c.priority,
            m.c.expires_at, m.c.enqueued_at,
        )
        tail_cols = (m.c.producer_id, m.c.producer_seq, m.c.dedup_key)
        self.page = (
            select(*msg_cols, m.c.delivery_count, *tail_cols)
            .where(
                m.c.grp == grp,
                m.c.destination_id == bindparam("d"),
                m.c.id > bindparam("after"),
                deliverable(),
            )
            .order_by(m.c.id)
            .limit(bindparam("n"))
        )
        #: Any row of a destination at all, in flight or scheduled (``holds_messages``).
        self.any_message = (
            select(m.c.id)
            .where(m.c.grp == grp, m.c.destination_id == bindparam("d"))
            .limit(1)
        )
        self.sub_page = (
            select(*msg_cols, p.c.delivery_count, *tail_cols)
            .select_from(p.join(m, and_(m.c.grp == p.c.grp, m.c.id == p.c.msg_id)))
            .where(p.c.grp == grp, p.c.sub_id == bindparam("s"), p.c.msg_id > bindparam("after"))
            .order_by(p.c.msg_id)
            .limit(bindparam("n"))
        )
        self.expired = (
            select(m.c.id)
            .where(m.c.grp == grp, m.c.expires_at > 0, m.c.expires_at <= bindparam("now"))
            .order_by(m.c.expires_at)  # the partial expiry index's order
            .limit(bindparam("n"))
        )
        self.reap_pending = (
            delete(p)
            .where(p.c.grp == grp, in_(p.c.msg_id, "ids"))
            .returning(p.c.sub_id, p.c.msg_id)
        )
        self.reap_messages = (
            delete(m)
            .where(m.c.grp == grp, in_(m.c.id, "ids"))
            .returning(m.c.id, m.c.destination_id)
        )
        # Scheduled delivery: every lookup of scheduled rows goes through the partial
        # index ix_amq_messages_due, whose condition the query repeats as a literal.
        scheduled = m.c.deliver_at > literal_column("0")
        self.next_due = select(func.min(m.c.deliver_at)).where(m.c.grp == grp, scheduled)
        self.due = (
            select(m.c.id, m.c.destination_id, d.c.name, d.c.kind, m.c.message_id,
                   m.c.headers, m.c.body, m.c.priority, m.c.enqueued_at, m.c.deliver_at,
                   m.c.schedule, m.c.delivery_count, m.c.expires_at, m.c.producer_id,
                   m.c.producer_seq)
            .select_from(m.outerjoin(d, and_(d.c.grp == m.c.grp,
                                             d.c.id == m.c.destination_id)))
            .where(m.c.grp == grp, scheduled, m.c.deliver_at <= bindparam("now"))
            .order_by(m.c.deliver_at, m.c.id)
            .limit(bindparam("n"))
        )
        self.step_schedule = (
            update(m)
            .where(m.c.grp == grp, m.c.id == bindparam("i"), scheduled)
            .values(deliver_at=bindparam("at"), schedule=bindparam("plan"))
        )
        self.delete_scheduled = (
            delete(m).where(m.c.grp == grp, in_(m.c.id, "ids"), scheduled).returning(m.c.id)
        )
        # Delayed redelivery (``Batch.delays``/``redeliveries``): the row itself waits,
        # out of flight, and comes back with its delivery count.
        self.delay = (
            update(m)
            .where(m.c.grp == grp, m.c.id == bindparam("i"))
            .values(inflight_epoch=None, deliver_at=bindparam("at"), schedule=bindparam("plan"))
        )
        self.redeliver = (
            update(m)
            .where(m.c.grp == grp, in_(m.c.id, "ids"), scheduled)
            .values(deliver_at=None, schedule=None)
        )

    def _driver_insert(
        self, table: Any, columns: Sequence[str], constants: dict[str, str] | None = None
    ) -> str:
        """Driver-level INSERT for the hot path: rows go to the DBAPI's
        executemany as tuples (psycopg pipelines them), skipping SQLAlchemy's
        per-row parameter processing, which cost more than building the rows."""
        constants = constants or {}
        names = [*columns, *constants]
        missing = [n for n in names if n not in table.c]
        assert not missing, f"{table.name} has no column {missing}"
        ph = "?" if self.sqlite else "%s"
        values = [ph] * len(columns) + list(constants.values())
        return f"INSERT INTO {table.name} ({', '.join(names)}) VALUES ({', '.join(values)})"

    def _in(self, col: Any, name: str, negate: bool = False) -> Any:
        """``col IN :name`` for a list: an expanding IN on SQLite, ``= ANY`` of
        one array parameter on PostgreSQL (see ARRAY_CHUNK)."""
        if self.sqlite:
            values: BindParameter[Any] = bindparam(name, expanding=True)
            return col.not_in(values) if negate else col.in_(values)
        array = bindparam(name, type_=ARRAY(col.type))
        return col != all_(array) if negate else col == any_(array)

    # -- a selective consumer's scan (store.api.PageFilter) ------------------------------
    def filtered_page(self, terms: Sequence[tuple[str, str, str, object]]) -> Select[Any]:
        """``page`` narrowed by the terms the database can check; a term it cannot
        (a number compared with a header, an unusual header name) is left out, so the
        rows are candidates the caller still checks (the broker's selector)."""
        m = schema.messages
        where: list[ColumnElement[bool]] = [
            m.c.grp == bindparam("g"), m.c.destination_id == bindparam("d"),
            m.c.id > bindparam("after"), deliverable(),
        ]
        for kind, field, op, value in terms:
            cond = self._term(kind, field, op, value)
            if cond is not None:
                where.append(cond)
        msg_cols = (m.c.id, m.c.destination_id, m.c.message_id, m.c.headers, m.c.body,
                    m.c.priority, m.c.expires_at, m.c.enqueued_at, m.c.delivery_count,
                    m.c.producer_id, m.c.producer_seq, m.c.dedup_key)
        return (select(*msg_cols).where(*where).order_by(m.c.id)
                .limit(bindparam("n")))

    def _term(self, kind: str, field: str, op: str, value: object
              ) -> ColumnElement[bool] | None:
        m = schema.messages
        if kind == "column":
            if field not in FILTERABLE_COLUMNS:
                return None
            col: Any = m.c[field]
            text = field == "message_id"
        else:
            if not FILTERABLE_HEADER.fullmatch(field):
                return None
            col = (func.json_extract(m.c.headers, f'$."{field}"') if self.sqlite
                   else cast(m.c.headers, JSON)[field].as_string())
            text = True
        if op == "is null":
            return col.is_(None)  # type: ignore[no-any-return]
        if op == "is not null":
            return col.is_not(None)  # type: ignore[no-any-return]
        if op in ("in", "not in") and isinstance(value, tuple) and text:
            values = [v for v in value if isinstance(v, str)]
            return col.in_(values) if op == "in" else col.not_in(values)  # type: ignore[no-any-return]
        if op not in _COMPARE or isinstance(value, bool):
            return None
        if text and isinstance(value, str) and op in ("=", "<>"):
            return getattr(col, _COMPARE[op])(value)  # type: ignore[no-any-return]
        if not text and isinstance(value, int | float):
            return getattr(col, _COMPARE[op])(value)  # type: ignore[no-any-return]
        return None
