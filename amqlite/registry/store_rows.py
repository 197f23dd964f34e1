"""The store registry: a heartbeat row per broker in the store's ``amq_registry``
table (``store.registry_sql``); a row older than ``STORE_MAX_AGE_MS`` counts as gone."""

from __future__ import annotations

import asyncio
from typing import Any

from amqlite.registry.model import STORE_HEARTBEAT_INTERVAL, STORE_MAX_AGE_MS, Member, RegistryError
from amqlite.registry.writer import BackgroundRegistry
from amqlite.settings import Settings


class StoreRegistry(BackgroundRegistry):
    """Heartbeat rows in the store's ``amq_registry`` table."""

    period = STORE_HEARTBEAT_INTERVAL

    def __init__(self, settings: Settings, store: Any | None = None) -> None:
        super().__init__(settings)
        from store import open_store

        self._own_store = store is None
        self.store = open_store(settings.store, settings.group) if store is None else store
        self.description = f"registry in {self.store.description}"
        self._opened = not self._own_store

    async def _apply(self, wanted: Member | None) -> None:
        await asyncio.to_thread(self._apply_blocking, wanted)

    def _apply_blocking(self, wanted: Member | None) -> None:
        if not self._opened:
            self.store.open()
            self._opened = True
        if wanted is None:
            self.store.unregister(self.name)
        else:
            services = [*wanted.services, *wanted.websocket, *([wanted.http] if wanted.http
                                                                 else [])]
            self.store.register(self.name, wanted.role, services, wanted.host,
                                wanted.pid, wanted.epoch)

    async def _close_backend(self) -> None:
        if self._own_store:
            await asyncio.to_thread(self.store.close)


def read_store(url: str, group: str | None) -> list[Member]:
    """The live rows of a store URL's registry, of one group or all (``read_members``)."""
    from store import StoreError, read_registry

    try:
        rows = read_registry(url, group, max_age_ms=STORE_MAX_AGE_MS)
    except StoreError as e:
        raise RegistryError(str(e)) from None
    members = []
    for row in rows:
        members.append(Member.from_json({**row, "group": row["grp"]}))
    return members
