"""Settings and registry pieces of the management API that need no broker process."""

from __future__ import annotations

import pytest

from amqlite.registry import Member
from amqlite.settings import SettingsError, load_settings


def test_http_bind_elsewhere_than_loopback_needs_a_users_file_or_an_explicit_setting(
        tmp_path) -> None:
    with pytest.raises(SettingsError, match="stays on loopback"):
        load_settings({"http_bind": "0.0.0.0:8161", "data_dir": str(tmp_path)}, environ={})
    s = load_settings({"http_bind": "0.0.0.0:8161", "data_dir": str(tmp_path),
                       "http_allow_remote": True}, environ={})
    assert s.http_bind == "0.0.0.0:8161"
    s = load_settings({"http_bind": "10.1.2.3:8161", "data_dir": str(tmp_path),
                       "users_file": str(tmp_path / "users.toml")}, environ={})
    assert s.http_bind == "10.1.2.3:8161"
    for loopback in ("127.0.0.1:9000", "[::1]:9000", "localhost:9000", "off", "OFF", ""):
        assert load_settings({"http_bind": loopback, "data_dir": str(tmp_path)},
                             environ={}).http_bind == loopback


def test_bad_http_bind_is_a_one_line_settings_error(tmp_path) -> None:
    for bad in ("127.0.0.1:http", "127.0.0.1", "127.0.0.1:70000"):
        with pytest.raises(SettingsError, match="http_bind"):
            load_settings({"http_bind": bad, "data_dir": str(tmp_path)}, environ={})


def test_store_registry_row_keeps_the_http_url_out_of_client_uris() -> None:
    """The store registry has one services column: an http:// entry there is the node's
    management URL, not a STOMP URI (discovery and cluster updates must not see it)."""
    m = Member.from_json({"group": "g", "name": "n", "role": "master",
                          "services": "tcp://h:61613,http://h:8161", "epoch": 3,
                          "heartbeat_at": 5})
    assert m.services == ("tcp://h:61613",) and m.http == "http://h:8161"
    assert m.heartbeat_at == 5
    zk = Member.from_json(m.to_json())  # ZooKeeper entries carry it as "http"
    assert zk == m
    old = Member.from_json({"group": "g", "name": "n", "role": "slave",
                            "services": ["tcp://h:1"]})
    assert old.http is None and old.services == ("tcp://h:1",)


def test_registry_keeps_websocket_urls_out_of_client_uris() -> None:
    """ws:// and wss:// entries of a store registry row are the node's WebSocket URLs
    (for pages), not URIs the TCP client could fail over to; ZooKeeper's JSON carries
    them as "websocket"."""
    m = Member.from_json({"group": "g", "name": "n", "role": "master",
                          "services": "tcp://h:61613,ws://h:15674/ws,wss://h:15673/ws,"
                                      "http://h:8161", "epoch": 1})
    assert m.services == ("tcp://h:61613",) and m.http == "http://h:8161"
    assert m.websocket == ("ws://h:15674/ws", "wss://h:15673/ws")
    assert Member.from_json(m.to_json()) == m
