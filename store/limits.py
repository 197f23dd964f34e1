"""The store's column sizes that bound what a client may send, without SQLAlchemy:
the broker validates every frame against them (``amqlite.validation``) so that a value
the store cannot hold is refused at the edge instead of failing a group commit, and the
schema (``store.schema``) declares its columns with them, so the two cannot drift. A
module of its own so that checking a frame, or a CLI command that never opens the
store, does not load the store's machinery."""

from __future__ import annotations

#: Destination names ("/queue/orders").
DESTINATION_NAME_LENGTH = 512
#: Group and node names, durable subscriptions' client-id and name.
NAME_LENGTH = 200
CLIENT_ID_LENGTH = NAME_LENGTH
SUBSCRIPTION_NAME_LENGTH = NAME_LENGTH
#: The STOMP message-id and the producer's identity (``amqlite.producerId``).
MESSAGE_ID_LENGTH = 200
PRODUCER_ID_LENGTH = 200
#: ``producer_id:producer_seq`` (200 + 1 + 19 digits fit with room to spare).
DEDUP_KEY_LENGTH = 420
#: BIGINT columns (expires_at, producer_seq) hold a signed 64-bit integer.
BIGINT_MAX = 2**63 - 1
#: JMS priorities; the column is a SMALLINT.
PRIORITY_MIN = 0
PRIORITY_MAX = 9
