"""A master's own VACUUM of the message table, every ``VACUUM_INTERVAL`` seconds.

Every persistent message is a row inserted and deleted, and PostgreSQL reuses a
deleted row's space only once a vacuum has passed. Autovacuum looks at a database
once a minute (``autovacuum_naptime``, server-wide) and throttles itself: under W1
the table grew by 19 MB a second, to 2.8 GB in 150 s before autovacuum's first pass
ended (bench/README.md, "Issue 25, session 15"). Vacuumed every second it stays
small enough for PostgreSQL's buffers, at no measurable cost to W1.

The pass runs on a daemon thread (``run_blocking``, not the loop's executor, which
a stopping loop waits for) and a store session of its own (``Store.vacuum_messages``):
it takes as long as the table is big, and neither the event loop, a commit, nor a
stopping broker waits for it.
"""

from __future__ import annotations

import asyncio
import logging

from lockers.connections.blocking import run_blocking
from store import Store, StoreError

log = logging.getLogger(__name__)

#: Seconds between two passes. W1 deletes ~20 MB of rows a second, and a pass costs
#: about the same per deleted row whenever it comes (~2 us: 0.24 s of CPU for 140,000
#: rows, VACUUM VERBOSE): what a longer interval changes is the table's size. At 10 s
#: (200 MB) the reused pages no longer fit PostgreSQL's default shared_buffers (128 MB)
#: and W1's store CPU per message went from 27 to 47 us; at 2 s 28-31, at 1 s 27.3-27.5,
#: no more than without any vacuum (bench/README.md). A store with no acknowledgement
#: since the last pass is not vacuumed (``Store.vacuum_messages``).
VACUUM_INTERVAL = 1.0


async def every_interval(store: Store) -> None:
    """Vacuum ``store``'s message table every ``VACUUM_INTERVAL`` while the task runs
    (a master's term). A failure is logged and tried again next time: losing the
    store is the commits' business."""
    while True:
        await asyncio.sleep(VACUUM_INTERVAL)
        try:
            await run_blocking(store.vacuum_messages, name="amqlite-vacuum")
        except StoreError as exc:
            log.warning("vacuum of the message table: %s", exc)
