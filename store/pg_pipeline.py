"""One transaction of prepared statements in one round trip, on libpq's pipeline mode
directly (psycopg's ``pq`` layer, its documented libpq wrapper).

psycopg's cursors, their parameter adaptation, pipeline bookkeeping and result
handling are Python run for every statement: under W1 they were most of the
group committer's CPU per commit (bench/README.md, issue 25 session 11). The
committer's statements are few and fixed, and their parameters are already in
PostgreSQL's binary format (``store.pg_arrays``), so here each is prepared once
per connection and every commit is: the prepared statements with their binary
parameters, one Sync, one flush, then the results read as they come. Without a
``BEGIN``, what comes before a Sync is one transaction of its own, committed at the
Sync (the extended query protocol's implicit transaction: PostgreSQL's protocol
documentation, "Pipelining"), so no ``BEGIN`` and ``COMMIT`` go with it: two statements
less for PostgreSQL to parse and run per commit. PostgreSQL runs them in order, and
after an error none of the rest until the Sync, when it rolls the transaction back, so
a failed statement leaves nothing written.
"""

from __future__ import annotations

import re
import select
import struct
from collections.abc import Mapping, Sequence
from typing import Any

from psycopg import OperationalError, errors, pq

_INT8 = struct.Struct(">q")
BINARY = 1
_STATUS = pq.ExecStatus
_FATAL = _STATUS.FATAL_ERROR
_SYNC = _STATUS.PIPELINE_SYNC
_ABORTED = _STATUS.PIPELINE_ABORTED
_OK = (_STATUS.COMMAND_OK, _STATUS.TUPLES_OK)
#: A placeholder as the statements spell them (psycopg's named style): %(name)s or %(name)b.
_PLACEHOLDER = re.compile(r"%\((\w+)\)[sb]")


class Statement:
    """A statement with psycopg-style named placeholders, in libpq's ``$n`` form."""

    def __init__(self, name: str, sql: str, types: Mapping[str, int]) -> None:
        names: list[str] = []

        def number(m: re.Match[str]) -> str:
            if m.group(1) not in names:
                names.append(m.group(1))
            return f"${names.index(m.group(1)) + 1}"

        self.name = name.encode()
        self.sql = _PLACEHOLDER.sub(number, sql).encode()
        #: Parameter names in ``$n`` order, and their type oids.
        self.params = tuple(names)
        self.oids = tuple(types[n] for n in names)
        self.formats = (BINARY,) * len(names)


def int8(value: int) -> bytes:
    """An int8 parameter in binary form."""
    return _INT8.pack(value)


class Pipeline:
    """Runs transactions of ``Statement``s on one psycopg connection, which it owns
    from then on (nothing else may use it: its state is libpq's, not psycopg's)."""

    def __init__(self, conn: Any, settings: Sequence[str] = ()) -> None:
        """``settings``: ``SET`` statements for the session, run (and committed) before
        the connection enters pipeline mode, so they hold for every plan made on it."""
        if settings:
            with conn.cursor() as cur:
                for setting in settings:
                    cur.execute(setting)
            conn.commit()
        self.conn = conn
        self._pg: Any = conn.pgconn
        self._pg.nonblocking = 1
        self._pg.enter_pipeline_mode()  # for good: the connection is only ours
        self._encoding = conn.info.encoding
        self._prepared: set[bytes] = set()
        self._poll = select.poll()
        self._fd = self._pg.socket
        #: The transaction sent and not yet answered: its statements, and those it
        #: prepares; the answers read so far, and the first error among them.
        self._underway: tuple[list[Statement], list[bytes]] | None = None
        self._answers: list[Any] = []
        self._error: Any = None

    def transaction(self, steps: Sequence[tuple[Statement, Mapping[str, bytes | None]]]
                    ) -> list[Any]:
        """Run ``steps`` (statement, parameters by name) as one transaction in one
        round trip, waiting for the answer. Returns each step's result (a
        ``pq.PGresult``); raises the first error as psycopg would (``psycopg.errors``),
        after reading the rest up to the Sync, where PostgreSQL rolled the transaction
        back (the store closes the connection all the same: ``store.batch_commit``)."""
        if not self.send(steps):
            self._flush()
        while (results := self.receive()) is None:
            self._wait(select.POLLIN)
        return results

    # -- the same transaction for an event loop that watches ``fd`` ----------------
    @property
    def fd(self) -> int:
        """The connection's socket: readable when an answer may have come."""
        return int(self._fd)

    def send(self, steps: Sequence[tuple[Statement, Mapping[str, bytes | None]]]) -> bool:
        """Queue ``steps`` and a Sync (one transaction: see the module docstring), and
        send what the socket takes now. True when all of it went; else ``flush`` when the
        socket is writable. Then ``receive`` when it is readable. One at a time."""
        if self._underway is not None:
            raise OperationalError("pipeline: a transaction is already underway")
        pg = self._pg
        parsed: list[bytes] = []  # statements prepared by this transaction
        for st, values in steps:
            name = st.name
            if name not in self._prepared and name not in parsed:
                pg.send_prepare(name, st.sql, st.oids)
                parsed.append(name)
            pg.send_query_prepared(name, [values[n] for n in st.params], st.formats)
        pg.pipeline_sync()
        self._underway = ([st for st, _ in steps], parsed)
        self._answers = []
        self._error = None
        return self.flush()

    def flush(self) -> bool:
        """Send what the socket takes of the transaction (never blocks); True when
        all of it went."""
        return not self._pg.flush()

    def receive(self) -> list[Any] | None:
        """Read what has come (never blocks): None until the Sync's answer is in,
        then each step's result, or the first error raised."""
        underway = self._underway
        if underway is None:
            raise OperationalError("pipeline: no transaction underway")
        pg = self._pg
        pg.consume_input()
        while not pg.is_busy():
            res = pg.get_result()
            if res is None:  # the end of one query's results
                continue
            status = res.status
            if status == _SYNC:
                self._underway = None
                return self._results(*underway)
            self._answers.append(res)
            if self._error is None and status not in _OK and status != _ABORTED:
                self._error = res
        return None

    def _results(self, steps: list[Statement], parsed: list[bytes]) -> list[Any]:
        """Each step's answer, from all of the transaction's (a Parse per statement
        prepared by it before its first use, each step's). A failed transaction raises
        its error, but the statements it did prepare stay prepared: a prepared
        statement is the session's, not the transaction's, so a commit sent again on
        this connection (``store.pg_batch.held_key``) must not Parse them again."""
        answers, self._answers = self._answers, []
        error = self._error
        expected = len(parsed) + len(steps)
        if len(answers) != expected:  # what it prepared is unknown: the store closes it
            raise OperationalError(f"pipeline: {len(answers)} answers to {expected} queries")
        results: list[Any] = []
        i = 0
        for st in steps:
            if parsed and st.name == parsed[0]:
                del parsed[0]
                if answers[i].status in _OK:  # its Parse's answer
                    self._prepared.add(st.name)
                i += 1
            results.append(answers[i])
            i += 1
        if error is not None:
            raise errors.error_from_result(error, encoding=self._encoding)
        return results

    def texts(self, result: Any) -> list[str]:
        """The first column of a result's rows (text format), as strings."""
        encoding = self._encoding
        return [result.get_value(i, 0).decode(encoding) for i in range(result.ntuples)]

    def _flush(self) -> None:
        """Send everything libpq holds; read meanwhile, so that a server blocked on
        sending its answers cannot block us (libpq's advice for pipeline mode)."""
        pg = self._pg
        while pg.flush():
            ready = self._wait(select.POLLIN | select.POLLOUT)
            if ready & select.POLLIN:
                pg.consume_input()

    def _wait(self, events: int) -> int:
        poll = self._poll
        poll.register(self._fd, events)
        while True:
            ready = poll.poll()
            if ready:
                return int(ready[0][1])
