"""The pure parts of STOMP over WebSocket: subprotocol choice, the versions a subprotocol
allows, ws_allowed_origins, the Origin/Host/path policy, and the settings
(amqlite/websocket.py, amqlite/settings.py). The listener itself runs against real
brokers in tests/integration/test_websocket*.py."""

from __future__ import annotations

import pytest
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, BytesMessage, Request, TextMessage

from amqlite.hosts import HostGuard
from amqlite.settings import Settings, SettingsError, read_settings
from amqlite.websocket import (
    OPCODE_BINARY,
    OPCODE_TEXT,
    OriginError,
    WsPolicy,
    choose_subprotocol,
    console_origins,
    data_frame_header,
    parse_origins,
    versions_up_to,
)


@pytest.mark.parametrize(("offered", "chosen"), [
    (["v10.stomp", "v12.stomp", "v11.stomp"], "v12.stomp"),
    (["v11.stomp", "v10.stomp"], "v11.stomp"),
    (["mqtt", "v10.stomp"], "v10.stomp"),
    (["V12.STOMP"], None),  # subprotocol tokens are case-sensitive (RFC 6455)
    ([], None),
])
def test_best_offered_subprotocol(offered: list[str], chosen: str | None) -> None:
    assert choose_subprotocol(offered) == chosen


def test_subprotocol_caps_the_version() -> None:
    assert versions_up_to("v10.stomp") == ("1.0",)
    assert versions_up_to("v11.stomp") == ("1.0", "1.1")
    assert versions_up_to(None) == ("1.0", "1.1", "1.2")


def test_origins_parse_and_refuse_what_is_no_origin() -> None:
    assert parse_origins(" https://App.example.com , http://h:8080/ ,*") == [
        "https://app.example.com", "http://h:8080", "*"]
    for bad in ("app.example.com", "ftp://x", "https://x/path", "null"):
        with pytest.raises(OriginError):
            parse_origins(bad)


def test_console_origins_in_every_spelling() -> None:
    assert console_origins("http://127.0.0.1:8161", ["localhost", "::1"]) == [
        "http://127.0.0.1:8161", "http://[::1]:8161", "http://localhost:8161"]
    assert console_origins(None, ["localhost"]) == []


def request(origin: str | None = None, host: str = "127.0.0.1:15674",
            target: str = "/ws") -> Request:
    headers = [(b"origin", origin.encode())] if origin is not None else []
    return Request(host=host, target=target, extra_headers=headers)


def test_policy_refusals() -> None:
    policy = WsPolicy(HostGuard("127.0.0.1"), ["http://127.0.0.1:8161"], tls=False)
    assert policy.refusal(request("http://127.0.0.1:8161")) is None
    assert policy.refusal(request()) is None  # no Origin: not a browser
    assert policy.refusal(request("http://127.0.0.1:15674")) is None  # the listener's own
    assert policy.refusal(request("http://evil.example"))[0] == 403  # type: ignore[index]
    assert policy.refusal(request("null"))[0] == 403  # type: ignore[index]
    assert policy.refusal(request(host="evil.example:15674"))[0] == 421  # type: ignore[index]
    assert policy.refusal(request(target="/stomp"))[0] == 404  # type: ignore[index]
    assert policy.refusal(request(target="/ws?x=1")) is None
    anyone = WsPolicy(HostGuard("127.0.0.1"), ["*"], tls=False)
    assert anyone.refusal(request("http://evil.example")) is None


def test_settings_ports_urls_and_rules() -> None:
    s = Settings(ws_bind="127.0.0.1", data_dir="/tmp/x").resolved()
    assert s.websocket_uris == ["ws://127.0.0.1:15674/ws"]
    with pytest.raises(SettingsError, match="port 0"):
        Settings(ws_bind="127.0.0.1:0", data_dir="/tmp/x").resolved()
    with pytest.raises(SettingsError, match="allow_anonymous_remote"):
        Settings(ws_bind="0.0.0.0:15674", data_dir="/tmp/x").resolved()
    with pytest.raises(SettingsError, match="ssl_cert"):
        Settings(wss_bind="127.0.0.1", data_dir="/tmp/x").resolved()
    with pytest.raises(SettingsError, match="ws_allowed_origins"):
        Settings(ws_bind="127.0.0.1", ws_allowed_origins="evil", data_dir="/tmp/x").resolved()


def test_origins_without_a_listener_warn(tmp_path: object) -> None:
    _, warnings = read_settings({"ws_allowed_origins": "https://a.example",
                                 "data_dir": str(tmp_path)}, environ={})
    assert any(w.startswith("ws_allowed_origins") and "no WebSocket listener" in w
               for w in warnings)


@pytest.mark.parametrize("size", [0, 1, 125, 126, 65535, 65536, 200_000])
def test_data_frames_read_back_by_wsproto(size: int) -> None:
    """Our hand-made server frames, read by wsproto's client: every length form, text
    and binary."""
    client, server = WSConnection(ConnectionType.CLIENT), WSConnection(ConnectionType.SERVER)
    server.receive_data(client.send(Request(host="h", target="/ws")))
    list(server.events())
    client.receive_data(server.send(AcceptConnection()))
    list(client.events())
    payload = b"x" * size
    client.receive_data(data_frame_header(OPCODE_TEXT, size) + payload
                        + data_frame_header(OPCODE_BINARY, size) + payload)
    events = list(client.events())
    text = "".join(e.data for e in events if isinstance(e, TextMessage))
    binary = b"".join(bytes(e.data) for e in events if isinstance(e, BytesMessage))
    assert text == payload.decode() and binary == payload
    assert [e.message_finished for e in events][-1]
