"""The PostgreSQL tuning helper: the lock session's and the store pool's values, side by side."""

from __future__ import annotations

from lockers.connections.postgres import (
    PG_DEAD_PEER_TIMEOUT,
    STORE_POOL_TUNING,
    TcpTuning,
    lock_session_tuning,
    server_options,
    server_tcp_settings,
)


def test_lock_session_notices_a_dead_peer_faster_than_the_store_pool() -> None:
    lock = lock_session_tuning(PG_DEAD_PEER_TIMEOUT)
    store = STORE_POOL_TUNING

    def silent_peer_s(t: TcpTuning) -> int:
        return t.keepalives_idle + t.keepalives_interval * t.keepalives_count

    assert silent_peer_s(lock) <= PG_DEAD_PEER_TIMEOUT < silent_peer_s(store)
    assert lock.tcp_user_timeout_ms < store.tcp_user_timeout_ms


def test_server_side_settings_mirror_libpq() -> None:
    params = {k: str(v) for k, v in lock_session_tuning(5.0).libpq().items()}
    assert server_tcp_settings(params) == {
        "tcp_keepalives_idle": 2,
        "tcp_keepalives_interval": 1,
        "tcp_keepalives_count": 3,
        "tcp_user_timeout": 5000,
    }


def test_server_options_set_both_timeouts() -> None:
    assert server_options(15_000, 30_000) == (
        "-c statement_timeout=15000 -c idle_in_transaction_session_timeout=30000"
    )
