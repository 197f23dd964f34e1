"""Seed a healthy store with N messages and time the Spark audit over it.

    .venv/bin/python bench/audit_bench.py [--count 1000000] [--store URL] [--master local[2]]

Without ``--store`` a throwaway PostgreSQL is started (tests/helpers/servers.py).
PostgreSQL is seeded with COPY, SQLite (``--store sqlite:///path``) with
executemany in one transaction. The store is what a healthy broker leaves:
100 producers with gap-free sequences, 10 % topic messages owed to two
durable subscriptions each, 1 % in flight under the live epoch, a dedup entry
per message inside the window, so the audit must exit 0. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import sqlite3
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sqlalchemy import create_engine  # noqa: E402

from spark import audit_job  # noqa: E402
from store.schema import metadata  # noqa: E402

#: The issue's figure: a store of a million messages.
DEFAULT_COUNT = 1_000_000
#: Producers sharing the load; each numbers its own messages 1, 2, 3...
PRODUCERS = 100
QUEUES = 8
TOPICS = 2
SUBS_PER_TOPIC = 2
#: Rows per COPY chunk / executemany batch: bounds the seeder's memory.
CHUNK = 50_000
GROUP = "bench"
EPOCH = 2
#: Messages are spread over the last five minutes: inside the broker's default
#: 10-minute dedup window, so no dedup entry is overdue.
SPREAD_MS = 300_000
DEDUP_WINDOW_MS = 600_000


def _destination(i: int) -> int:
    """Every tenth message goes to a topic (ids QUEUES+1..), the rest to queues."""
    return QUEUES + 1 + (i // 10) % TOPICS if i % 10 == 0 else 1 + i % QUEUES


def _subs_of(topic: int) -> list[int]:
    first = (topic - QUEUES - 1) * SUBS_PER_TOPIC + 1
    return list(range(first, first + SUBS_PER_TOPIC))


def _rows(count: int, now: int) -> Iterator[tuple]:
    """(message row, pending rows, dedup row) per message id."""
    for i in range(1, count + 1):
        producer = f"prod-{i % PRODUCERS}"
        seq = (i - 1) // PRODUCERS + 1
        at = now - SPREAD_MS + (i * SPREAD_MS) // count
        dest = _destination(i)
        key = f"{producer}:{seq}"
        body = f"bench message {i} ".encode() * 4
        headers = json.dumps({"persistent": "true", "n": str(i)})
        expires = now + 3_600_000 if i % 10 == 3 else 0
        inflight = EPOCH if i % 100 == 7 else None
        msg = (GROUP, i, dest, f"ID:bench-{i}", producer, seq, key, 4, expires, at,
               1 if inflight else 0, inflight, headers, body)  # fmt: skip
        pending = [(GROUP, s, i, 0, None) for s in _subs_of(dest)] if dest > QUEUES else []
        yield msg, pending, (GROUP, key, producer, seq, i, at)


def _setup_rows(now: int) -> dict[str, list[tuple]]:
    dests = [(GROUP, d, f"/queue/bench{d}", "queue", now, 0) for d in range(1, QUEUES + 1)]
    dests += [
        (GROUP, QUEUES + t, f"/topic/bench{t}", "topic", now, 0) for t in range(1, TOPICS + 1)
    ]
    subs = []
    for t in range(QUEUES + 1, QUEUES + TOPICS + 1):
        subs += [(GROUP, s, f"client{s}", f"sub{s}", t, None, now, 0) for s in _subs_of(t)]
    return {
        "amq_groups": [(GROUP, EPOCH, "bench-node", now - 3_600_000, 0, 0, now, DEDUP_WINDOW_MS)],
        "amq_registry": [
            (GROUP, "bench-node", "master", "", "localhost", os.getpid(), EPOCH, now, now)
        ],
        "amq_destinations": dests,
        "amq_subscriptions": subs,
    }


COLUMNS = {
    "amq_groups": "grp, epoch, master, epoch_started_at, msg_count, max_msg_id, checkpoint_at,"
    " dedup_window_ms",
    "amq_registry": "grp, name, role, services, host, pid, epoch, started_at, heartbeat_at",
    "amq_destinations": "grp, id, name, kind, created_at, depth",
    "amq_subscriptions": "grp, id, client_id, name, destination_id, selector, created_at, pending",
    "amq_messages": "grp, id, destination_id, message_id, producer_id, producer_seq, dedup_key,"
    " priority, expires_at, enqueued_at, delivery_count, inflight_epoch, headers, body",
    "amq_sub_pending": "grp, sub_id, msg_id, delivery_count, inflight_epoch",
    "amq_dedup": "grp, dedup_key, producer_id, producer_seq, msg_id, created_at",
}


def _copy_text(row: tuple) -> str:
    """One line of COPY's text format (our values hold no tabs or newlines)."""
    out = []
    for v in row:
        if v is None:
            out.append("\\N")
        elif isinstance(v, bytes):
            out.append("\\\\x" + v.hex())
        else:
            out.append(str(v))
    return "\t".join(out) + "\n"


def seed_postgres(url: str, count: int, now: int) -> None:
    import psycopg

    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    metadata.create_all(engine)
    engine.dispose()
    with psycopg.connect(url) as conn, conn.cursor() as cur:
        for table, rows in _setup_rows(now).items():
            cur.executemany(
                f"INSERT INTO {table} ({COLUMNS[table]}) VALUES "
                f"({', '.join(['%s'] * len(rows[0]))})",
                rows,
            )
        bufs = {t: io.StringIO() for t in ("amq_messages", "amq_sub_pending", "amq_dedup")}

        def flush() -> None:
            for table, buf in bufs.items():
                with cur.copy(f"COPY {table} ({COLUMNS[table]}) FROM STDIN") as cp:
                    cp.write(buf.getvalue())
                buf.seek(0)
                buf.truncate()

        for n, (msg, pending, ded) in enumerate(_rows(count, now), start=1):
            bufs["amq_messages"].write(_copy_text(msg))
            for p in pending:
                bufs["amq_sub_pending"].write(_copy_text(p))
            bufs["amq_dedup"].write(_copy_text(ded))
            if n % CHUNK == 0:
                flush()
        flush()
        cur.execute(
            "UPDATE amq_groups SET msg_count = %s, max_msg_id = %s WHERE grp = %s",
            (count, count, GROUP),
        )
        conn.commit()
        conn.autocommit = True
        cur.execute("VACUUM ANALYZE")


def seed_sqlite(path: str, count: int, now: int) -> None:
    engine = create_engine(f"sqlite:///{path}")
    metadata.create_all(engine)
    engine.dispose()
    with contextlib.closing(sqlite3.connect(path)) as conn:
        for table, rows in _setup_rows(now).items():
            conn.executemany(
                f"INSERT INTO {table} ({COLUMNS[table]}) VALUES ({', '.join('?' * len(rows[0]))})",
                rows,
            )
        batch: dict[str, list[tuple]] = {"amq_messages": [], "amq_sub_pending": [], "amq_dedup": []}

        def flush() -> None:
            for table, rows in batch.items():
                if rows:
                    conn.executemany(
                        f"INSERT INTO {table} ({COLUMNS[table]}) VALUES "
                        f"({', '.join('?' * len(rows[0]))})",
                        rows,
                    )
                rows.clear()

        for n, (msg, pending, ded) in enumerate(_rows(count, now), start=1):
            batch["amq_messages"].append(msg)
            batch["amq_sub_pending"] += pending
            batch["amq_dedup"].append(ded)
            if n % CHUNK == 0:
                flush()
        flush()
        conn.commit()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=DEFAULT_COUNT, help="messages to seed")
    ap.add_argument("--store", default=None, help="empty PostgreSQL database or sqlite:///path")
    ap.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    ap.add_argument("--rows-per-partition", type=int, default=audit_job.ROWS_PER_PARTITION)
    args = ap.parse_args(argv)

    server = None
    tmp = tempfile.mkdtemp(prefix="amqlite-audit-bench-")
    store = args.store
    if store is None:
        from tests.helpers.servers import PostgresServer

        server = PostgresServer()
        server.init()
        server.start()
        store = server.create_database()
    try:
        now = int(time.time() * 1000)
        t0 = time.monotonic()
        if store.startswith("sqlite"):
            seed_sqlite(store.split("///", 1)[1], args.count, now)
        else:
            seed_postgres(store, args.count, now)
        seed_s = time.monotonic() - t0

        t0 = time.monotonic()
        spark = audit_job.build_session(
            args.master, [audit_job.DEFAULT_PG_JAR, audit_job.DEFAULT_SQLITE_JAR]
        )
        session_s = time.monotonic() - t0
        out = os.path.join(tmp, "out")
        argv_job = ["--store", store, "--output", out, "--json", "--now", str(now),
                    "--rows-per-partition", str(args.rows_per_partition)]  # fmt: skip
        t0 = time.monotonic()
        with contextlib.redirect_stdout(io.StringIO()):
            code = audit_job.main(argv_job)
        audit_s = time.monotonic() - t0
        spark.stop()
        summary = json.loads(Path(out, "summary.json").read_text()) if code in (0, 1) else {}
        rows = summary.get("rows_read", 0)
        print(
            json.dumps(
                {
                    "bench": "audit",
                    "backend": "sqlite" if store.startswith("sqlite") else "postgresql",
                    "messages": args.count,
                    "rows_read": rows,
                    "reads": summary.get("reads"),
                    "timings": summary.get("timings"),
                    "seed_s": round(seed_s, 2),
                    "session_start_s": round(session_s, 2),
                    "audit_s": round(audit_s, 2),
                    "messages_per_s": round(args.count / audit_s),
                    "rows_per_s": round(rows / audit_s),
                    "exit_code": code,
                    "findings": summary.get("total"),
                    "master": args.master,
                    "cpus": os.cpu_count(),
                }
            )
        )
        return 0 if code == 0 else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if server is not None:
            server.cleanup()


if __name__ == "__main__":
    sys.exit(main())
