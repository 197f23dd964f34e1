"""Limits, the findings' vocabulary and the store columns the audit reads.

One place for the numbers and names every room of the audit shares;
tests/unit/test_audit_schema.py and test_wire.py read them here without importing
pyspark.
"""

from __future__ import annotations

# --------------------------------------------------------------------------- limits

#: Where Debian's libpostgresql-jdbc-java / libxerial-sqlite-jdbc-java put their jars.
DEFAULT_PG_JAR = "/usr/share/java/postgresql.jar"
DEFAULT_SQLITE_JAR = "/usr/share/java/sqlite-jdbc.jar"
PG_DRIVER = "org.postgresql.Driver"
SQLITE_DRIVER = "org.sqlite.JDBC"
#: The Debian/Ubuntu package that provides each default jar (named in the error when
#: the jar is missing, so the fix is one apt-get away).
PG_JAR_PACKAGE = "libpostgresql-jdbc-java"
SQLITE_JAR_PACKAGE = "libxerial-sqlite-jdbc-java"
#: Seconds between progress lines while a Spark stage runs (a person watching should
#: see it move; a log should not fill up).
PROGRESS_INTERVAL_S = 5.0

#: Rows per JDBC partition (one task, one connection). bench/audit_bench.py reads
#: ~50k message rows/s per connection (two shared cores): about two seconds a task.
ROWS_PER_PARTITION = 100_000
#: Upper bound on partitions per table: each is a task and a connection; past a
#: few hundred the per-task overhead dominates and the store sees a connection storm.
MAX_READ_PARTITIONS = 256
#: A single group's duplicate checks (identity, content) are split into hash classes
#: of about this many rows, a statement each, so that a big group is several tasks
#: in parallel instead of one long one (bench/audit_bench.py: at a million messages
#: in one group, content took 3-4 s and identity 1.6-3 s as one statement each).
DUPLICATE_ROWS_PER_STATEMENT = 250_000
#: Connections the driver runs the pushed statements on (``spark.audit.pool``), each
#: importing the snapshot: one per core of this machine and one more (``run``), at
#: least this many. bench/audit_bench.py's store alone, two cores, load 9-10: 17-21 s
#: of statements on two connections, 14.6-15.6 s on three.
MIN_SQL_CONNECTIONS = 2
#: Rows one pushed read may bring back to the driver's memory (a healthy store's
#: reads return a few thousand: the runs and the rows at fault). A read that returns
#: more is left to Spark's partitions, in the same snapshot, whose rows never pass
#: through the driver: its memory stays bounded whatever the store holds.
DRIVER_READ_MAX_ROWS = 100_000
#: Rows a server-side cursor of the pool fetches per round trip.
POOL_FETCH_ROWS = 10_000
#: Rows per JDBC round trip. The PostgreSQL driver's default (0) buffers a whole
#: result in the executor; 10k narrow rows are about 1-2 MB per fetch.
JDBC_FETCH_SIZE = 10_000
#: Seconds to wait for a TCP connection to the store (PostgreSQL JDBC default: 10).
JDBC_CONNECT_TIMEOUT_S = 10
#: Server-side guards for every audit connection: one fetch may run this long...
PG_STATEMENT_TIMEOUT_MS = 300_000
#: ...and a transaction whose reader stalls (GC, lost executor) is ended by the
#: server after this long, so the audit can never pin the broker's xmin for long.
PG_IDLE_IN_TRANSACTION_TIMEOUT_MS = 60_000
#: Sort and hash memory of each audit connection: a slice of ROWS_PER_PARTITION rows
#: (about 40 bytes a row in the runs' sort) sorts in memory, and a group's hash of a
#: million identities mostly does (PostgreSQL's 4 MB default spills both to disk).
#: Per connection, and the audit runs one per Spark task slot; bench/audit_bench.py
#: gives the SQL lower bound the same.
PG_WORK_MEM = "64MB"
#: SQLite: wait this long for a writer's lock (the broker commits in short batches).
SQLITE_BUSY_TIMEOUT_MS = 10_000
#: Seconds between the keep-alive statements of the snapshot-exporting transaction:
#: a third of PG_IDLE_IN_TRANSACTION_TIMEOUT_MS, so two may be late.
SNAPSHOT_KEEPALIVE_S = PG_IDLE_IN_TRANSACTION_TIMEOUT_MS / 1000 / 3
#: A group's key quantiles are exact (ntile over its index range) up to this many rows:
#: about 0.1 s of an index-only scan and sort (0.8 s for a million bigints, 1 s for
#: a million dedup keys, bench/audit_bench.py); a sample of a few thousand rows is
#: good enough to balance partitions, which is all the cuts are for.
QUANTILE_EXACT_MAX_ROWS = 200_000
#: Above that, PostgreSQL estimates them from a block sample of about this many rows
#: per partition: a cut is then off by ~1/sqrt(1000) = 3 % of a partition.
QUANTILE_SAMPLE_ROWS_PER_PART = 1_000
#: ``amq_meta`` keys of the groups' last dedup prunes (store/housekeeping.py
#: ``dedup_pruned_key``; tests/unit/test_audit_schema.py checks the two agree).
DEDUP_PRUNED_PREFIX = "dedup_pruned:"

#: The broker reaps expired rows every housekeeping interval (5 s by default,
#: amqlite/settings.py); a minute of slack before an expired row is a finding.
EXPIRY_GRACE_MS = 60_000
#: Same slack for dedup entries older than the group's dedup window.
DEDUP_GRACE_MS = 60_000
#: A new master pages in and redelivers rows in flight under the old epoch (the
#: store does not rewrite them at activation, store/api.py ``recover``); rows it
#: has not re-taken this long after it took over are reported.
STALE_INFLIGHT_GRACE_MS = 300_000
#: A registry row is a live master when its heartbeat is this recent.
REGISTRY_LIVE_MS = 30_000
#: The same body and headers from one producer within this window, under a
#: different identity, is a content duplicate: a client that re-sent without
#: its identity after a failover does so within seconds.
DUPLICATE_CONTENT_WINDOW_MS = 60_000

#: Headers every amqlite client send carries with new values (amqlite/client/asyncclient.py):
#: left out when comparing the headers of two sends.
IDENTITY_HEADERS = ("amqlite.producerId", "amqlite.producerSeq")

#: Sequence numbers per bucket of the gap check: a producer of 100 M sends is 1,000
#: tasks of about 2 MB of numbers each, not one.
GAP_BUCKET_SEQS = 100_000

#: Sample rows per finding type in the summary and the table.
SAMPLE_ROWS = 5
#: Local runs: shuffle partitions per core (the 200 default is for clusters).
LOCAL_SHUFFLE_PARTITIONS_PER_CORE = 2
#: JVM options of the driver this process starts and of the executors (see
#: ``build_session``): the store does the heavy work, the JVMs live for one short
#: job, so the JIT's first tier only (its second compiles for minutes of steady
#: state) and one GC thread. bench/audit_bench.py: at 200,000 messages on local[*]
#: the session starts in about half the time, the audit too; at 1,000,000 on a
#: standalone master with two workers, 3.0x the SQL lower bound without, 1.7x with.
AUDIT_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
#: Cores a standalone cluster gives the audit when the store runs the statements
#: (``spark.cores.max``): Spark checks the few thousand rows they return, which one
#: task of one executor does in milliseconds, while every executor more is a JVM
#: starting on the machine. Reads the store leaves to Spark (over
#: DRIVER_READ_MAX_ROWS) then run on this one core too.
PUSHED_CLUSTER_CORES = 1
#: Rows of check input per task and per shuffle partition: Spark's per-task cost
#: (milliseconds) dwarfs a few thousand narrow rows, and half a million of them
#: (SQLite's full reads) are seconds of work in a few MB.
CHECK_ROWS_PER_TASK = 500_000

#: Set to see the traceback behind an error line.
DEBUG_ENV = "AMQLITE_AUDIT_DEBUG"

EXIT_CLEAN = 0
EXIT_FINDINGS = 1
EXIT_ERROR = 2

#: Every finding type, in report order, with what it means.
FINDINGS: dict[str, str] = {
    "duplicate_identity": "one producer message identity stored more than once",
    "duplicate_content": "same body and headers from one producer within the window, "
    "under another identity",
    "orphan_destination": "message whose destination no longer exists",
    "orphan_subscription": "pending row of a durable subscription that no longer exists",
    "orphan_topic_message": "topic message owed to no durable subscription",
    "ack_without_message": "pending (acknowledgement) row that points at no message",
    "stale_inflight": "in flight under an epoch older than the group's current one",
    "expired_unreaped": "expired message never reaped",
    "dedup_expired": "dedup entry past the group's window that its last prune left behind",
    "sequence_gap": "producer sequence numbers the store never got",
}


# --------------------------------------------------------------------------- the store's schema

#: The store tables the audit reads, the columns it reads from each, and the Spark
#: SQL type each column is read as (every read casts to it, see ``_typed``: JDBC
#: reports types per backend). A copy of ``store/schema.py``, kept here because
#: the job needs only pyspark (no SQLAlchemy); tests/unit/test_audit_schema.py checks
#: that the two agree. A plain literal, so that the test reads it without pyspark.
STORE_COLUMNS: dict[str, dict[str, str]] = {
    "amq_meta": {"key": "string", "value": "string"},
    "amq_groups": {
        "grp": "string",
        "epoch": "bigint",
        "epoch_started_at": "bigint",
        "dedup_window_ms": "bigint",
    },
    "amq_registry": {
        "grp": "string",
        "name": "string",
        "role": "string",
        "epoch": "bigint",
        "heartbeat_at": "bigint",
    },
    "amq_destinations": {"grp": "string", "id": "bigint", "name": "string", "kind": "string"},
    "amq_subscriptions": {"grp": "string", "id": "bigint", "destination_id": "bigint"},
    "amq_messages": {
        "grp": "string",
        "id": "bigint",
        "destination_id": "bigint",
        "producer_id": "string",
        "producer_seq": "bigint",
        "dedup_key": "string",
        "expires_at": "bigint",
        "enqueued_at": "bigint",
        "inflight_epoch": "bigint",
        # > 0: a scheduled message not yet due (schema v3): owed to nobody yet.
        "deliver_at": "bigint",
        # Content, read only for rows with a producer (``message_select``):
        "headers": "string",
        "body": "binary",
    },
    "amq_sub_pending": {
        "grp": "string",
        "sub_id": "bigint",
        "msg_id": "bigint",
        "inflight_epoch": "bigint",
    },
    "amq_dedup": {
        "grp": "string",
        "dedup_key": "string",
        "producer_id": "string",
        "producer_seq": "bigint",
        "msg_id": "bigint",
        "created_at": "bigint",
    },
}


class AuditError(Exception):
    """A problem we can explain in one line: exit code 2, no traceback."""
