"""amqlite: store — the shared persistence store (SQLite or PostgreSQL) and its
group committer. The broker talks to ``Store`` through a ``GroupCommitter``."""

from __future__ import annotations

from typing import Any

from store.api import (
    OUTSIDE_UNITS,
    Batch,
    BatchResult,
    DeletedDestination,
    DestinationRow,
    Fenced,
    Integrity,
    NewMessage,
    Recovery,
    Ref,
    ScheduledRow,
    ScheduleStep,
    Store,
    StoredMessage,
    StoreError,
    StoreRejected,
    StoreUnusable,
    SubscriptionRow,
    UnitSpan,
)
from store.group_commit import GroupCommitter
from store.registry_sql import REGISTRY_MAX_AGE_MS, read_registry
from store.schema import SCHEMA_VERSION
from store.sql import SqlStore
from store.url import parse_store_url


def open_store(url: str, group: str, **opts: Any) -> Store:
    """The store at ``url`` for ``group``, not yet connected: call ``open()``
    (blocking: connects, creates/upgrades the schema) where blocking is fine,
    and retry it while the database is unreachable.

    ``opts`` override store.engine's defaults (pool_size, statement_timeout_ms,
    busy_timeout_ms, connect_timeout_s, application_name, ...). A bad URL
    raises ``StoreError`` here, with one clear line.
    """
    return SqlStore(url, group, **opts)


__all__ = [
    "OUTSIDE_UNITS",
    "REGISTRY_MAX_AGE_MS",
    "SCHEMA_VERSION",
    "Batch",
    "BatchResult",
    "DeletedDestination",
    "DestinationRow",
    "Fenced",
    "GroupCommitter",
    "Integrity",
    "NewMessage",
    "Recovery",
    "Ref",
    "ScheduleStep",
    "ScheduledRow",
    "SqlStore",
    "Store",
    "StoreError",
    "StoreRejected",
    "StoreUnusable",
    "StoredMessage",
    "SubscriptionRow",
    "UnitSpan",
    "open_store",
    "parse_store_url",
    "read_registry",
]
