"""Seed a healthy store with N messages and time the Spark audit over it.

    .venv/bin/python bench/audit_bench.py [--count 1000000] [--store URL] [--master local[2]]

Without ``--store`` a throwaway PostgreSQL is started (tests/helpers/servers.py).
PostgreSQL is seeded with COPY, SQLite (``--store sqlite:///path``) with
executemany in one transaction. The store is what a healthy broker leaves:
100 producers with gap-free sequences, 10 % topic messages owed to two
durable subscriptions each, 1 % in flight under the live epoch, a dedup entry
per message inside the window, so the audit must exit 0. Prints one JSON line.

On PostgreSQL the same run also measures the SQL lower bound: every check of the
audit written as SQL (``SQL_CHECKS``) and run in one REPEATABLE READ READ ONLY
transaction on the same store, with the audit connections' ``work_mem``.
The audit is timed as ``amqlite audit`` runs it: the job's ``main`` from its
command line in this process, the JVM's start included (``audit_wall_s``);
``audit_wall_vs_sql`` is that over the bound, ``driver_jvm_peak_rss_mb`` the peak
resident memory of the JVM it starts (driver and, on local[*], executors) and
``driver_python_peak_rss_mb`` this process's. The load average before and after
is printed: the machine may be shared, and only timings of one run compare.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import resource
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
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


#: The audit's checks as SQL, each counting its findings (the lower bound: what the
#: database alone needs to answer the same questions in one snapshot).
SQL_CHECKS: dict[str, str] = {
    "duplicate_identity": """
        SELECT (SELECT COALESCE(SUM(n - 1), 0) FROM (
            SELECT COUNT(*) AS n FROM amq_messages
            WHERE COALESCE(dedup_key, producer_id || ':' || producer_seq) IS NOT NULL
            GROUP BY grp, COALESCE(dedup_key, producer_id || ':' || producer_seq)
            HAVING COUNT(*) > 1) x)
         + (SELECT COUNT(*) FROM amq_messages m JOIN amq_dedup d
            ON d.grp = m.grp AND d.dedup_key = m.dedup_key
            WHERE d.msg_id IS NOT NULL AND d.msg_id <> m.id AND NOT EXISTS (
                SELECT 1 FROM amq_messages o WHERE o.grp = m.grp AND o.id = d.msg_id))""",
    "duplicate_content": """
        SELECT COUNT(*) FROM (
            SELECT enqueued_at - LAG(enqueued_at) OVER w AS apart, dedup_key,
                   LAG(dedup_key) OVER w AS prev_key
            FROM amq_messages WHERE producer_id IS NOT NULL
            WINDOW w AS (PARTITION BY grp, producer_id, sha256(body),
                sha256(convert_to((headers::jsonb - 'amqlite.producerId'
                                   - 'amqlite.producerSeq')::text, 'UTF8'))
                ORDER BY enqueued_at, id)) x
        WHERE apart <= %(content_window)s
          AND NOT (dedup_key IS NOT NULL AND dedup_key IS NOT DISTINCT FROM prev_key)""",
    "orphan_destination": """
        SELECT COUNT(*) FROM amq_messages m WHERE NOT EXISTS (
            SELECT 1 FROM amq_destinations d WHERE d.grp = m.grp AND d.id = m.destination_id)""",
    "orphan_subscription": """
        SELECT COUNT(*) FROM amq_sub_pending p WHERE NOT EXISTS (
            SELECT 1 FROM amq_subscriptions s WHERE s.grp = p.grp AND s.id = p.sub_id)""",
    "orphan_topic_message": """
        SELECT COUNT(*) FROM amq_messages m JOIN amq_destinations d
            ON d.grp = m.grp AND d.id = m.destination_id AND d.kind = 'topic'
        WHERE NOT EXISTS (
            SELECT 1 FROM amq_sub_pending p WHERE p.grp = m.grp AND p.msg_id = m.id)""",
    "ack_without_message": """
        SELECT COUNT(*) FROM amq_sub_pending p WHERE NOT EXISTS (
            SELECT 1 FROM amq_messages m WHERE m.grp = p.grp AND m.id = p.msg_id)""",
    "stale_inflight": """
        SELECT (SELECT COUNT(*) FROM amq_messages m JOIN amq_groups g ON g.grp = m.grp
                WHERE m.inflight_epoch < g.epoch AND g.epoch_started_at <= %(settled)s)
             + (SELECT COUNT(*) FROM amq_sub_pending p JOIN amq_groups g ON g.grp = p.grp
                WHERE p.inflight_epoch < g.epoch AND g.epoch_started_at <= %(settled)s)""",
    "expired_unreaped": """
        SELECT COUNT(*) FROM amq_messages WHERE expires_at > 0 AND expires_at < %(expired)s""",
    "dedup_expired": """
        SELECT COUNT(*) FROM amq_dedup d JOIN amq_groups g ON g.grp = d.grp
        WHERE g.dedup_window_ms > 0 AND d.created_at < %(dedup)s - g.dedup_window_ms""",
    "sequence_gap": """
        SELECT COALESCE(SUM(seq - prev - 1), 0) FROM (
            SELECT seq, LAG(seq) OVER (PARTITION BY grp, producer_id ORDER BY seq) AS prev,
                   MIN(CASE WHEN dd THEN seq END) OVER (PARTITION BY grp, producer_id) AS floor
            FROM (SELECT grp, producer_id, producer_seq AS seq, false AS dd FROM amq_messages
                  WHERE producer_id IS NOT NULL AND producer_seq IS NOT NULL
                  UNION ALL
                  SELECT grp, producer_id, producer_seq, true FROM amq_dedup
                  WHERE producer_id IS NOT NULL AND producer_seq IS NOT NULL) u) x
        WHERE prev >= floor AND seq - prev > 1""",
}


def plant(url: str, now: int) -> int:
    """tests/spark/seed.py's damaged groups beside the bench's: how many findings
    (missing numbers for gaps) they hold."""
    from tests.spark.seed import DAMAGE, engine_url, seed_damaged

    engine = create_engine(engine_url(url))
    try:
        with engine.begin() as conn:
            seed_damaged(conn, now)
    finally:
        engine.dispose()
    return sum(d.count for _, d in DAMAGE.values())


def sql_lower_bound(url: str, now: int) -> tuple[float, dict[str, int]]:
    """Every check as SQL in one REPEATABLE READ snapshot: (seconds, counts)."""
    import psycopg

    params = {
        "content_window": audit_job.DUPLICATE_CONTENT_WINDOW_MS,
        "settled": now - audit_job.STALE_INFLIGHT_GRACE_MS,
        "expired": now - audit_job.EXPIRY_GRACE_MS,
        "dedup": now - audit_job.DEDUP_GRACE_MS,
    }
    counts: dict[str, int] = {}
    with psycopg.connect(url) as conn:
        t0 = time.monotonic()
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        # The audit's connections' sort and hash memory: the same footing for both.
        conn.execute(f"SET LOCAL work_mem = '{audit_job.PG_WORK_MEM}'")
        for name, sql in SQL_CHECKS.items():
            row = conn.execute(sql, params).fetchone()
            counts[name] = int(row[0]) if row else 0
        elapsed = time.monotonic() - t0
        conn.rollback()
    return elapsed, counts


class PeakRss:
    """Peak resident memory (VmHWM) of the JVMs this process starts (the audit's
    driver; on local[*] its executors too), sampled until ``stop``: the JVM is gone
    when the audit returns, and VmHWM is already a peak, so the last sample is it."""

    def __init__(self, interval: float = 0.2) -> None:
        self.peaks: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval,), daemon=True)
        self._thread.start()

    def _children(self) -> list[int]:
        pids: list[int] = []
        for task in Path(f"/proc/{os.getpid()}/task").iterdir():
            with contextlib.suppress(OSError):
                pids += [int(p) for p in (task / "children").read_text().split()]
        return pids

    def _run(self, interval: float) -> None:
        while not self._stop.wait(interval):
            for pid in self._children():
                with contextlib.suppress(OSError, ValueError):
                    status = Path(f"/proc/{pid}/status").read_text()
                    if "java" not in Path(f"/proc/{pid}/cmdline").read_text():
                        continue
                    for line in status.splitlines():
                        if line.startswith("VmHWM:"):
                            self.peaks[pid] = round(int(line.split()[1]) / 1024, 1)

    def stop(self) -> float | None:
        self._stop.set()
        self._thread.join()
        return max(self.peaks.values()) if self.peaks else None


@contextlib.contextmanager
def _spark_conf(conf: dict[str, str]) -> Iterator[None]:
    """Spark settings for the session the job starts (``--conf``), as spark-submit
    would give them: pyspark passes ``PYSPARK_SUBMIT_ARGS`` to the JVM it launches."""
    if not conf:
        yield
        return
    before = os.environ.get("PYSPARK_SUBMIT_ARGS")
    confs = " ".join(f"--conf {k}={v}" for k, v in conf.items())
    os.environ["PYSPARK_SUBMIT_ARGS"] = f"{confs} pyspark-shell"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("PYSPARK_SUBMIT_ARGS", None)
        else:
            os.environ["PYSPARK_SUBMIT_ARGS"] = before


def _cpu_of_tree(pid: int) -> float:
    """CPU seconds of ``pid`` (user + system, its reaped children's included) and
    of its live children: a PostgreSQL postmaster's is all its backends' and
    parallel workers' CPU, the ended ones too (the postmaster reaps them)."""
    tick = os.sysconf("SC_CLK_TCK")

    def fields(p: int | str) -> list[str]:
        return Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()

    total = sum(int(v) for v in fields(pid)[11:15])  # utime stime cutime cstime
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            for child in (task / "children").read_text().split():
                with contextlib.suppress(OSError):
                    total += sum(int(v) for v in fields(child)[11:13])
    return total / tick


def _audit_child(argv_job: list[str], conf: dict[str, str]) -> None:
    """One audit as ``amqlite audit`` runs it, in a process of its own (so that each
    run starts its JVM cold): prints wall and CPU seconds as one JSON line. The JVM
    is made to exit and reaped after the audit, so its CPU (and the launcher JVM's
    before it) is in this process's children's usage."""
    from pyspark import SparkContext

    from spark.audit.jvm import plan_archive

    archive = plan_archive().state.value  # what this run's JVM does: used, making, none
    rss = PeakRss()
    t0 = time.monotonic()
    with contextlib.redirect_stdout(io.StringIO()), _spark_conf(conf):
        code = audit_job.main(argv_job)
    wall = time.monotonic() - t0
    peak_mb = rss.stop()
    gateway = SparkContext._gateway
    proc = getattr(gateway, "proc", None)
    if proc is not None and proc.poll() is None:
        gateway.shutdown()
        proc.stdin.close()  # the JVM exits when its stdin closes
        proc.wait(timeout=120)
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(json.dumps({
        "exit_code": code, "audit_wall_s": round(wall, 2), "jvm_class_archive": archive,
        "jvm_cpu_s": round(kids.ru_utime + kids.ru_stime, 2),
        "python_cpu_s": round(own.ru_utime + own.ru_stime, 2),
        "driver_jvm_peak_rss_mb": peak_mb,
        "driver_python_peak_rss_mb": round(own.ru_maxrss / 1024, 1),
    }))  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--audit-child"]:
        _audit_child(json.loads(argv[1]), json.loads(argv[2]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=DEFAULT_COUNT, help="messages to seed")
    ap.add_argument("--store", default=None, help="empty PostgreSQL database or sqlite:///path")
    ap.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    ap.add_argument("--rows-per-partition", type=int, default=audit_job.ROWS_PER_PARTITION)
    ap.add_argument(
        "--conf", action="append", default=[], metavar="KEY=VALUE",
        help="a Spark setting (repeatable), e.g. spark.sql.shuffle.partitions=4 on a cluster",
    )  # fmt: skip
    ap.add_argument(
        "--plant", action="store_true",
        help="also seed tests/spark/seed.py's groups: one per finding type, each with its "
        "damage, and healthy borderline ones; the audit must find exactly that",
    )  # fmt: skip
    ap.add_argument(
        "--repeat", type=int, default=1,
        help="audits (each followed by the SQL bound) on the one seeded store: a JSON "
        "line each",
    )  # fmt: skip
    ap.add_argument(
        "--ab-env", action="append", default=[], metavar="KEY=VALUE",
        help="set in the audit's environment on even runs only (with --repeat: A/B on one "
        "store), e.g. AMQLITE_AUDIT_JVM_NICE=0",
    )  # fmt: skip
    ap.add_argument(
        "--ab-conf", action="append", default=[], metavar="KEY=VALUE",
        help="a Spark setting on even runs only, e.g. spark.cores.max=2",
    )  # fmt: skip
    ap.add_argument(
        "--cluster-pids", default="",
        help="comma-separated pids of a standalone master and workers: their CPU seconds "
        "(the executors' too, which the workers reap) are counted as the audit's",
    )  # fmt: skip
    args = ap.parse_args(argv)
    cluster = [int(p) for p in args.cluster_pids.split(",") if p]

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
        planted = plant(store, now) if args.plant else 0
        seed_s = time.monotonic() - t0
        postmaster = server.postmaster_pid() if server is not None else None
        conf = dict(c.split("=", 1) for c in args.conf)
        failed = 0
        lines: list[str] = []
        for run in range(1, args.repeat + 1):
            out = os.path.join(tmp, f"out{run}")
            # What `amqlite audit` costs the user: the job from its command line, the
            # JVM's (and a cluster's executors') start included.
            argv_job = ["--store", store, "--output", out, "--json", "--now", str(now),
                        "--rows-per-partition", str(args.rows_per_partition),
                        "--master", args.master, "--progress"]  # fmt: skip
            load_before = os.getloadavg()
            pg0 = _cpu_of_tree(postmaster) if postmaster else None
            cl0 = sum(_cpu_of_tree(p) for p in cluster)
            b_side = run % 2 == 0 and bool(args.ab_env or args.ab_conf)
            env = dict(os.environ)
            run_conf = dict(conf)
            if b_side:
                env.update(dict(c.split("=", 1) for c in args.ab_env))
                run_conf.update(dict(c.split("=", 1) for c in args.ab_conf))
            child = subprocess.run(
                [sys.executable, __file__, "--audit-child", json.dumps(argv_job),
                 json.dumps(run_conf)],
                stdout=subprocess.PIPE, text=True, check=True, env=env,
            )  # fmt: skip
            measured = json.loads(child.stdout.strip().splitlines()[-1])
            pg1 = _cpu_of_tree(postmaster) if postmaster else None
            cluster_cpu = sum(_cpu_of_tree(p) for p in cluster) - cl0
            sql_s, sql_counts = (None, None)
            if not store.startswith("sqlite"):
                sql_s, sql_counts = sql_lower_bound(store, now)
            pg2 = _cpu_of_tree(postmaster) if postmaster else None
            load_after = os.getloadavg()
            code = measured["exit_code"]
            audit_s = measured["audit_wall_s"]
            summary = json.loads(Path(out, "summary.json").read_text()) if code in (0, 1) else {}
            rows = summary.get("rows_read", 0)
            cpu = None
            if pg0 is not None and pg1 is not None and pg2 is not None:
                audit_cpu = (measured["jvm_cpu_s"] + measured["python_cpu_s"] + pg1 - pg0
                             + cluster_cpu)  # fmt: skip
                cpu = {
                    "audit_cluster_cpu_s": round(cluster_cpu, 2) if cluster else None,
                    "audit_postgres_cpu_s": round(pg1 - pg0, 2),
                    "audit_jvm_cpu_s": measured["jvm_cpu_s"],
                    "audit_python_cpu_s": measured["python_cpu_s"],
                    "audit_cpu_s": round(audit_cpu, 2),
                    "sql_bound_postgres_cpu_s": round(pg2 - pg1, 2),
                    "audit_cpu_vs_sql": round(audit_cpu / (pg2 - pg1), 2),
                }
            print(
                json.dumps(
                    {
                        "bench": "audit",
                        "run": run,
                        "backend": "sqlite" if store.startswith("sqlite") else "postgresql",
                        "messages": args.count,
                        "rows_read": rows,
                        "reads": summary.get("reads"),
                        "timings": summary.get("timings"),
                        "pushed": summary.get("pushed"),
                        "seed_s": round(seed_s, 2),
                        "audit_wall_s": audit_s,
                        "sql_lower_bound_s": round(sql_s, 2) if sql_s is not None else None,
                        # The whole command (JVM start included) over the SQL bound.
                        "audit_wall_vs_sql": round(audit_s / sql_s, 2) if sql_s else None,
                        # CPU seconds (PostgreSQL's only when this bench started it).
                        "cpu": cpu,
                        "jvm_class_archive": measured["jvm_class_archive"],
                        "load_avg_1m_before_after": [round(load_before[0], 2),
                                                     round(load_after[0], 2)],
                        "returned": summary.get("returned"),
                        "sql_findings": sql_counts,
                        "driver_jvm_peak_rss_mb": measured["driver_jvm_peak_rss_mb"],
                        "driver_python_peak_rss_mb": measured["driver_python_peak_rss_mb"],
                        "messages_per_s": round(args.count / audit_s),
                        "conf": run_conf,
                        "ab": ("B: " + " ".join(args.ab_env + args.ab_conf)) if b_side else "A",
                        "rows_per_s": round(rows / audit_s),
                        "exit_code": code,
                        "planted": planted,
                        "findings": summary.get("total"),
                        "findings_by_type": {
                            k: v for k, v in summary.get("counts", {}).items() if v
                        },
                        "master": args.master,
                        "cpus": os.cpu_count(),
                    }
                ),
                flush=True,
            )
            failed += code != (1 if args.plant else 0)
            c = cpu or {}
            lines.append(
                f"run {run} {'B' if b_side else 'A'} archive={measured['jvm_class_archive']}: "
                f"audit {audit_s} s / SQL {sql_s and round(sql_s, 2)} s = "
                f"{sql_s and round(audit_s / sql_s, 2)}x wall; CPU audit "
                f"{c.get('audit_cpu_s')} s (JVM {c.get('audit_jvm_cpu_s')}, cluster "
                f"{c.get('audit_cluster_cpu_s')}, PostgreSQL "
                f"{c.get('audit_postgres_cpu_s')}) / SQL {c.get('sql_bound_postgres_cpu_s')} s = "
                f"{c.get('audit_cpu_vs_sql')}x; load {load_before[0]:.2f} -> {load_after[0]:.2f}; "
                f"found {summary.get('total')} of {planted} planted"
            )
        # The runs at a glance (stderr: stdout stays one JSON line a run).
        print("\n".join(lines), file=sys.stderr)
        return 1 if failed else 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if server is not None:
            server.cleanup()


if __name__ == "__main__":
    sys.exit(main())
