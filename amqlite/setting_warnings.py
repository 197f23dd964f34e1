"""Warnings for settings that were given but do not apply to this node (``unused``):
set apart from ``amqlite.settings``, which reads and checks them."""

from __future__ import annotations

from collections.abc import Mapping

from amqlite.settings import HTTP_OFF, Settings


def _scheme(url: str) -> str:
    scheme = url.split("://", 1)[0].lower()
    return "postgresql" if scheme.startswith("postgres") else scheme


def unused(s: Settings, given: Mapping[str, str]) -> list[str]:
    """Warnings for the settings in ``given`` (name -> where it was set) that do not apply
    to this node's store, locker or other settings and are ignored."""
    locker, store = _scheme(s.locker), _scheme(s.store)
    not_cluster = None if s.update_cluster_clients else "update_cluster_clients is off"
    why = {
        "lock_lease": None if locker == "postgresql"
        else f"only the PostgreSQL locker has a lease, the locker is {locker}://",
        "zk_session_timeout": None if locker == "zk"
        else f"only the ZooKeeper locker has a session, the locker is {locker}://",
        "lock_poll_interval": None if locker == "file"
        else f"only the file locker polls, the {locker}:// locker waits on its server",
        "allow_fsync_off": None if store == "postgresql"
        else f"only a PostgreSQL store's fsync is checked, the store is {store}://",
        "allow_async_replication": None if store == "postgresql"
        else f"only a PostgreSQL store's replication is checked, the store is {store}://",
        "http_ssl": None if s.ssl_cert else "without ssl_cert the management API is HTTP",
        "ws_allowed_origins": None if s.ws_bind or s.wss_bind
        else "there is no WebSocket listener (ws_bind, wss_bind)",
        "rebalance_cluster_clients": not_cluster,
        "update_cluster_clients_on_remove": not_cluster,
        "update_cluster_filter": not_cluster,
    }
    warnings = [f"{name} ({given[name]}) does not apply and is ignored: {reason}"
                for name, reason in why.items() if reason and name in given]
    if s.ssl_cert and not s.ssl_bind:
        https = s.http_bind.lower() != HTTP_OFF and s.http_ssl
        warnings.append(f"ssl_cert is set but there is no TLS STOMP listener (ssl_bind): "
                        f"STOMP clients connect in plain text on {s.bind}; "
                        + ("only the management API uses it" if https else "nothing uses it"))
    return warnings
