"""The group registry's rows in the store (when ZooKeeper is not the registry):
a node's own row (``register``, ``unregister``) and the CLI's read of everyone's
(``read_registry``, which needs no lock and creates nothing). Not fenced: slaves
write their rows too."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, case, delete, inspect, select, text
from sqlalchemy.exc import SQLAlchemyError

from lockers.connections.errors import one_line
from store import schema
from store.api import StoreError
from store.engine import make_engine, retry_while_locked
from store.fencing import FencedStore
from store.statements import now_ms
from store.url import parse_store_url

#: Registry rows older than this are left out by ``read_registry`` (ms): a
#: node heartbeats every few seconds, so 30 s means it is gone.
REGISTRY_MAX_AGE_MS = 30_000


class RegistryRows(FencedStore):
    """``SqlStore``'s registry rows: ``register`` and ``unregister``."""

    def register(
        self,
        name: str,
        role: str,
        services: str | list[str] | tuple[str, ...],
        host: str | None,
        pid: int | None,
        epoch: int | None,
    ) -> None:
        r = schema.registry
        now = now_ms()
        if not isinstance(services, str):
            services = ",".join(services)
        stmt = self._dinsert(r)
        stmt = stmt.on_conflict_do_update(
            index_elements=[r.c.grp, r.c.name],
            set_={
                "role": stmt.excluded.role,
                "services": stmt.excluded.services,
                "host": stmt.excluded.host,
                "pid": stmt.excluded.pid,
                "epoch": stmt.excluded.epoch,
                "heartbeat_at": stmt.excluded.heartbeat_at,
                # A new process under the same name is a new start.
                "started_at": case(
                    (r.c.pid == stmt.excluded.pid, r.c.started_at),
                    else_=stmt.excluded.started_at,
                ),
            },
        )
        with self._tx("register") as conn:
            self._heartbeat_commit(conn)
            conn.execute(
                stmt,
                {"grp": self.group, "name": name, "role": role, "services": services,
                 "host": host, "pid": pid, "epoch": epoch, "started_at": now,
                 "heartbeat_at": now},
            )

    def unregister(self, name: str) -> None:
        r = schema.registry
        with self._tx("unregister") as conn:
            self._heartbeat_commit(conn)
            conn.execute(delete(r).where(r.c.grp == self.group, r.c.name == name))

    def _heartbeat_commit(self, conn: Connection) -> None:
        """A registry row is rewritten every heartbeat and means nothing after a failover
        of the database: its commit does not wait for a synchronous standby, so a master
        whose message commits wait for a missing one still shows live in cluster-list."""
        if not self._sqlite:
            conn.execute(text("SET LOCAL synchronous_commit = local"))


def read_registry(
    url: str, group: str | None = None, max_age_ms: int | None = REGISTRY_MAX_AGE_MS
) -> list[dict[str, Any]]:
    """Registry rows (one dict per node, columns as keys), freshest heartbeats
    only unless ``max_age_ms`` is None. For the CLI: needs no lock and creates
    nothing; a store that does not exist yet has no rows."""
    parsed = parse_store_url(url)
    if parsed.path is not None and not parsed.path.exists():
        return []
    engine = make_engine(parsed, {"pool_size": 1, "max_overflow": 0})
    r = schema.registry
    query = select(r).order_by(r.c.grp, r.c.name)
    if group is not None:
        query = query.where(r.c.grp == group)
    if max_age_ms is not None:
        query = query.where(r.c.heartbeat_at >= now_ms() - max_age_ms)

    def read() -> list[dict[str, Any]]:
        try:
            with engine.connect() as conn:
                if not inspect(conn).has_table(r.name):
                    return []
                return [dict(row._mapping) for row in conn.execute(query)]
        except SQLAlchemyError as e:
            raise StoreError(f"{parsed.description}: reading the registry failed: "
                             f"{one_line(e)}") from e

    try:
        return retry_while_locked(engine, parsed.dialect == "sqlite", read)
    finally:
        engine.dispose()
