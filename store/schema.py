"""The shared store's schema: one definition for SQLite and PostgreSQL.

Every table carries ``grp`` so several broker groups can share one database.
Ids (messages, destinations, subscriptions) are allocated by the master in
memory from ``max(id) + 1`` at activation: fencing guarantees that only one
master of a group can commit, so the ids are unique per group without a
sequence round trip per message, and plain multi-row INSERTs suffice.

Everything the Spark audit reads is a column, never a pickled blob.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    SmallInteger,
    String,
    Table,
    Text,
    UniqueConstraint,
)

from store.limits import (  # noqa: F401 (re-exported: the schema's sizes, one place)
    BIGINT_MAX,
    CLIENT_ID_LENGTH,
    DEDUP_KEY_LENGTH,
    DESTINATION_NAME_LENGTH,
    MESSAGE_ID_LENGTH,
    NAME_LENGTH,
    PRIORITY_MAX,
    PRIORITY_MIN,
    PRODUCER_ID_LENGTH,
    SUBSCRIPTION_NAME_LENGTH,
)

#: Bumped whenever a table or column changes; ``store`` upgrades older stores
#: (``store.migrations.UPGRADES``). v2: ``amq_subscriptions.owner``. v3:
#: ``amq_messages.deliver_at`` and ``schedule`` (scheduled delivery) and their index.
#: v4: ``amq_counters`` (per-destination totals that survive a takeover). v5: its
#: ``overflow_dropped`` (a bounded queue's drop-head).
SCHEMA_VERSION = 5

metadata = MetaData()

#: Key/value facts about the store itself (schema version).
meta = Table(
    "amq_meta",
    metadata,
    Column("key", String(64), primary_key=True),
    Column("value", Text, nullable=False),
)

#: One row per group: the fencing epoch and the transactional counters that
#: the activation integrity check compares with reality.
groups = Table(
    "amq_groups",
    metadata,
    Column("grp", String(200), primary_key=True),
    Column("epoch", BigInteger, nullable=False, default=0),
    Column("master", String(200)),  # node name that claimed ``epoch``
    Column("epoch_started_at", BigInteger),  # ms since the Unix epoch
    # Maintained by every fenced batch in the same transaction as its writes:
    Column("msg_count", BigInteger, nullable=False, default=0),
    Column("max_msg_id", BigInteger, nullable=False, default=0),
    Column("checkpoint_at", BigInteger),  # ms, last committed batch
    Column("dedup_window_ms", BigInteger, nullable=False, default=0),
)

#: One row per activation: who became master, what the store looked like.
activations = Table(
    "amq_activations",
    metadata,
    Column("grp", String(200), nullable=False),
    Column("epoch", BigInteger, nullable=False),
    Column("node", String(200), nullable=False),
    Column("activated_at", BigInteger, nullable=False),
    Column("ended_at", BigInteger),  # set by a graceful stop
    Column("expected_count", BigInteger),  # amq_groups.msg_count at activation
    Column("expected_max_id", BigInteger),
    Column("actual_count", BigInteger),  # filled by the background check
    Column("actual_max_id", BigInteger),
    Column("mismatch", Boolean),
    PrimaryKeyConstraint("grp", "epoch"),
)

destinations = Table(
    "amq_destinations",
    metadata,
    Column("grp", String(200), nullable=False),
    Column("id", BigInteger, nullable=False),
    # "/queue/orders", "/topic/prices"
    Column("name", String(DESTINATION_NAME_LENGTH), nullable=False),
    Column("kind", String(8), nullable=False),  # "queue" | "topic"
    Column("created_at", BigInteger, nullable=False),
    Column("depth", BigInteger, nullable=False, default=0),  # queue rows, kept per batch
    PrimaryKeyConstraint("grp", "id"),
    UniqueConstraint("grp", "name", name="uq_amq_destinations_name"),
)

messages = Table(
    "amq_messages",
    metadata,
    Column("grp", String(200), nullable=False),
    Column("id", BigInteger, nullable=False),
    Column("destination_id", BigInteger, nullable=False),
    # the STOMP message-id header
    Column("message_id", String(MESSAGE_ID_LENGTH), nullable=False),
    Column("producer_id", String(PRODUCER_ID_LENGTH)),  # the producer's identity, when it gave one
    Column("producer_seq", BigInteger),
    # producer_id:producer_seq, or the client's own id
    Column("dedup_key", String(DEDUP_KEY_LENGTH)),
    Column("priority", SmallInteger, nullable=False, default=4),
    Column("expires_at", BigInteger, nullable=False, default=0),  # ms; 0 = never
    Column("enqueued_at", BigInteger, nullable=False),  # ms
    Column("delivery_count", Integer, nullable=False, default=0),
    Column("inflight_epoch", BigInteger),  # epoch that delivered it and awaits its ack
    Column("headers", Text, nullable=False),  # JSON object of the user's headers
    Column("body", LargeBinary, nullable=False),
    # Scheduled delivery (v3): a row with deliver_at > 0 (ms) is a scheduled message
    # (ActiveMQ's AMQ_SCHEDULED_* headers), not deliverable: paging skips it, and at
    # deliver_at the master inserts a deliverable copy and moves deliver_at to the next
    # occurrence (or deletes the row) in one fenced transaction. NULL or 0: an ordinary
    # message. ``schedule`` is its JSON plan (``amqlite.broker.schedule.Plan``).
    Column("deliver_at", BigInteger),
    Column("schedule", Text),
    PrimaryKeyConstraint("grp", "id"),
)
Index("ix_amq_messages_dest", messages.c.grp, messages.c.destination_id, messages.c.id)
#: The next due scheduled message (MIN(deliver_at)) and the due ones, without reading
#: any other row: an activation's cost does not grow with the scheduled backlog.
DUE_INDEX = Index(
    "ix_amq_messages_due",
    messages.c.grp,
    messages.c.deliver_at,
    postgresql_where=messages.c.deliver_at > 0,
    sqlite_where=messages.c.deliver_at > 0,
)
Index(
    "ix_amq_messages_expiry",
    messages.c.grp,
    messages.c.expires_at,
    postgresql_where=messages.c.expires_at > 0,
    sqlite_where=messages.c.expires_at > 0,
)

#: The names of ``counters``' columns, in the order ``Batch.counters`` lists them.
COUNTER_KINDS = ("enqueued", "dequeued", "expired", "dead_lettered", "moved", "purged",
                 "overflow_dropped")

#: Per-destination totals since the destination was made (ActiveMQ's EnqueueCount,
#: DequeueCount, ExpiredCount...): every way a message enters or leaves it. Kept by
#: the same fenced transaction as the writes they count, one row per destination a
#: commit touched (``Batch.counters``), so a new master starts from them. Goes with
#: its destination's row (``delete_destination``).
counters = Table(
    "amq_counters",
    metadata,
    Column("grp", String(200), nullable=False),
    Column("destination_id", BigInteger, nullable=False),
    *(Column(kind, BigInteger, nullable=False, default=0) for kind in COUNTER_KINDS),
    PrimaryKeyConstraint("grp", "destination_id"),
)

#: Durable topic subscriptions.
subscriptions = Table(
    "amq_subscriptions",
    metadata,
    Column("grp", String(200), nullable=False),
    Column("id", BigInteger, nullable=False),
    Column("client_id", String(CLIENT_ID_LENGTH), nullable=False),
    Column("name", String(SUBSCRIPTION_NAME_LENGTH), nullable=False),
    Column("destination_id", BigInteger, nullable=False),  # the topic
    Column("selector", Text),
    Column("created_at", BigInteger, nullable=False),
    Column("pending", BigInteger, nullable=False, default=0),  # kept per batch
    # The login that created it (only it may reattach, replace or remove it); NULL
    # when authentication was off or the row predates schema v2. Text: a login's
    # length is bounded by the users file, not by the store.
    Column("owner", Text),
    PrimaryKeyConstraint("grp", "id"),
    UniqueConstraint("grp", "client_id", "name", name="uq_amq_subscriptions_name"),
)

#: A topic message stored once, owed to each durable subscription: one row per
#: (subscription, message) until that subscription acknowledges it. The
#: message row goes when its last pending row goes.
sub_pending = Table(
    "amq_sub_pending",
    metadata,
    Column("grp", String(200), nullable=False),
    Column("sub_id", BigInteger, nullable=False),
    Column("msg_id", BigInteger, nullable=False),
    Column("delivery_count", Integer, nullable=False, default=0),
    Column("inflight_epoch", BigInteger),
    PrimaryKeyConstraint("grp", "sub_id", "msg_id"),
)
Index("ix_amq_sub_pending_msg", sub_pending.c.grp, sub_pending.c.msg_id)

#: The producer-identity dedup window. It outlives the message row (ActiveMQ's
#: JDBC store forgot a message's identity as soon as it was consumed, so a late
#: re-send was stored again). Pruned by age, ``amq_groups.dedup_window_ms``.
dedup = Table(
    "amq_dedup",
    metadata,
    Column("grp", String(200), nullable=False),
    Column("dedup_key", String(DEDUP_KEY_LENGTH), nullable=False),
    Column("producer_id", String(PRODUCER_ID_LENGTH)),
    Column("producer_seq", BigInteger),
    Column("msg_id", BigInteger),
    Column("created_at", BigInteger, nullable=False),
    PrimaryKeyConstraint("grp", "dedup_key"),
)
Index("ix_amq_dedup_age", dedup.c.grp, dedup.c.created_at)

#: Broker registry when ZooKeeper is not used: one heartbeat row per node.
registry = Table(
    "amq_registry",
    metadata,
    Column("grp", String(200), nullable=False),
    Column("name", String(200), nullable=False),
    Column("role", String(16), nullable=False),  # "master" | "slave"
    Column("services", Text, nullable=False, default=""),  # comma-separated client URIs
    Column("host", String(255)),
    Column("pid", Integer),
    Column("epoch", BigInteger),
    Column("started_at", BigInteger, nullable=False),
    Column("heartbeat_at", BigInteger, nullable=False),
    PrimaryKeyConstraint("grp", "name"),
)
