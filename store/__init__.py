"""amqlite: store — the shared persistence store (SQLite or PostgreSQL) and its
group committer. The broker talks to ``Store`` through a ``GroupCommitter``."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

#: Where each name of the package lives. Loaded on first use (PEP 562), so that a
#: module that needs only ``store.limits`` or ``store.api`` (a frame's checks, a CLI
#: command that never opens the store) does not load SQLAlchemy and the drivers.
_HOMES = {
    **dict.fromkeys(
        ("OUTSIDE_UNITS", "Batch", "BatchResult", "DeletedDestination", "DestinationRow",
         "Fenced", "Integrity", "NewMessage", "Recovery", "Ref", "ScheduledRow",
         "ScheduleStep", "Store", "StoredMessage", "StoreError", "StoreRejected",
         "StoreUnusable", "SubscriptionRow", "UnitSpan"), "store.api"),
    "GroupCommitter": "store.group_commit",
    "REGISTRY_MAX_AGE_MS": "store.registry_sql",
    "read_registry": "store.registry_sql",
    "SCHEMA_VERSION": "store.schema",
    "SqlStore": "store.sql",
    "parse_store_url": "store.url",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'store' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def open_store(url: str, group: str, **opts: Any) -> Store:
    """The store at ``url`` for ``group``, not yet connected: call ``open()``
    (blocking: connects, creates/upgrades the schema) where blocking is fine,
    and retry it while the database is unreachable.

    ``opts`` override store.engine's defaults (pool_size, statement_timeout_ms,
    busy_timeout_ms, connect_timeout_s, application_name, ...). A bad URL
    raises ``StoreError`` here, with one clear line.
    """
    from store.sql import SqlStore

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
