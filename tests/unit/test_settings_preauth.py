"""Settings for the limits before authentication: defaults, derivation, validation."""

from __future__ import annotations

import pytest

from amqlite.settings import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_FRAME_TIMEOUT,
    DEFAULT_MAX_HANDSHAKE_BYTES,
    SettingsError,
    load_settings,
)


def test_defaults_and_unauthenticated_share_of_max_connections() -> None:
    s = load_settings(environ={})
    assert (s.connect_timeout, s.frame_timeout, s.max_handshake_bytes) == (
        DEFAULT_CONNECT_TIMEOUT, DEFAULT_FRAME_TIMEOUT, DEFAULT_MAX_HANDSHAKE_BYTES)
    assert s.max_unauthenticated == s.max_connections // 4
    assert load_settings(environ={"AMQLITE_MAX_CONNECTIONS": "3"}).max_unauthenticated == 1


def test_environment_sets_small_values_for_tests() -> None:
    s = load_settings(environ={"AMQLITE_FRAME_TIMEOUT": "0.5", "AMQLITE_CONNECT_TIMEOUT": "1",
                               "AMQLITE_MAX_HANDSHAKE_BYTES": "512",
                               "AMQLITE_MAX_UNAUTHENTICATED": "2"})
    assert (s.frame_timeout, s.connect_timeout, s.max_handshake_bytes,
            s.max_unauthenticated) == (0.5, 1.0, 512, 2)


@pytest.mark.parametrize("env", [
    {"AMQLITE_FRAME_TIMEOUT": "0"},
    {"AMQLITE_CONNECT_TIMEOUT": "-1"},
    {"AMQLITE_MAX_HANDSHAKE_BYTES": "0"},
    {"AMQLITE_MAX_UNAUTHENTICATED": "-1"},
    {"AMQLITE_MAX_CONNECTIONS": "10", "AMQLITE_MAX_UNAUTHENTICATED": "11"},
])
def test_unusable_values_are_refused(env: dict[str, str]) -> None:
    with pytest.raises(SettingsError):
        load_settings(environ=env)
