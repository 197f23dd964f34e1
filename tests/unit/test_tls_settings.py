"""TLS settings and ssl:// URIs: what is refused, what is advertised (no sockets)."""

from __future__ import annotations

import pytest

from amqlite.client.uri import parse_broker_url
from amqlite.settings import Settings, SettingsError


def test_bind_off_needs_an_ssl_listener() -> None:
    with pytest.raises(SettingsError, match="bind = off needs ssl_bind"):
        Settings(bind="off", data_dir="/tmp/x").resolved()


def test_ssl_bind_needs_certificate_and_key() -> None:
    with pytest.raises(SettingsError, match="ssl_cert and ssl_key"):
        Settings(ssl_bind="127.0.0.1:61612", data_dir="/tmp/x").resolved()


def test_unreadable_certificate_is_one_line() -> None:
    with pytest.raises(SettingsError, match=r"cannot read /nonexistent/cert\.pem") as info:
        Settings(ssl_bind="127.0.0.1:61612", ssl_cert="/nonexistent/cert.pem",
                 ssl_key="/nonexistent/key.pem", data_dir="/tmp/x").resolved()
    assert "\n" not in str(info.value)


def test_plain_only_advertises_tcp() -> None:
    s = Settings(bind="127.0.0.1:61613", data_dir="/tmp/x").resolved()
    assert s.advertise_uris == ["tcp://127.0.0.1:61613"]


def test_ssl_uris_parse_inside_failover() -> None:
    url = parse_broker_url("failover:(ssl://a:61612,tcp://b:61613,stomp+ssl://c)")
    assert [(u.scheme, u.tls) for u in url.uris] == [("ssl", True), ("tcp", False),
                                                      ("stomp+ssl", True)]
    assert str(url.uris[0]) == "ssl://a:61612"


@pytest.mark.parametrize(("cert", "key", "given"), [("/x/c.pem", "", "ssl_cert"),
                                                    ("", "/x/k.pem", "ssl_key")])
def test_half_a_pair_is_refused_even_without_a_tls_listener(cert: str, key: str,
                                                            given: str) -> None:
    """The same rule as every client command's (tls.check_pair), and before any file is
    read: a key without its certificate is not silently ignored."""
    with pytest.raises(SettingsError, match=rf"\({given}\) is given without .*go together"):
        Settings(ssl_cert=cert, ssl_key=key, data_dir="/tmp/x").resolved()
