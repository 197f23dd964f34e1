"""One ``Store`` for SQLite and PostgreSQL on SQLAlchemy 2 Core: ``SqlStore``.

``SqlStore`` joins the parts of the store, each in a module of its own:

=========================  ==========================================================
``store.fencing``          ``FencedStore``, the core: engine lifecycle, transactions,
                           ``claim_epoch`` and the fence every write starts with
``store.batch_commit``     ``commit_batch``: pipelined (``store.pg_batch``) or stepwise
``store.recovery``         ``recover``, message pages, ``check_integrity``, activation end
``store.housekeeping``     ``reap_expired``, ``delete_destination``, ``prune_dedup``
``store.scheduling``       scheduled delivery: ``next_scheduled``, ``due_scheduled``,
                           ``cancel_scheduled``
``store.registry_sql``     registry rows: ``register``, ``unregister``, ``read_registry``
=========================  ==========================================================

beneath them ``store.engine`` (pool, session settings, SQLite pragmas),
``store.errors`` (what a database error means: rejected data, settings no retry
fixes), ``store.statements`` (the statements, built once) and ``store.migrations``
(schema creation and upgrades).
"""

from __future__ import annotations

from store.batch_commit import BatchCommitting
from store.housekeeping import Housekeeping
from store.recovery import Recovering
from store.registry_sql import RegistryRows
from store.scheduling import Scheduling


class SqlStore(BatchCommitting, Recovering, Housekeeping, Scheduling, RegistryRows):
    """The store on SQLite or PostgreSQL. Driven by one thread (the group
    committer); ``check_integrity`` and the registry methods may run on another
    thread because each operation checks its own connection out of the pool."""


__all__ = ["SqlStore"]
