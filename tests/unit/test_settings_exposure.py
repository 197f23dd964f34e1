"""Issue 27, silent acceptances: STOMP beyond loopback with no users file is refused
unless allow_anonymous_remote (as http_bind is without http_allow_remote); ssl_cert with
no TLS STOMP listener is warned about."""

from __future__ import annotations

from pathlib import Path

import pytest

from amqlite.settings import SettingsError, read_settings
from tests.helpers.cluster import amqlite
from tests.helpers.tls import make_pki


def settings(tmp_path: Path, **cli: str | bool) -> tuple[object, list[str]]:
    return read_settings({"data_dir": str(tmp_path), "http_bind": "off", **cli}, environ={})


@pytest.mark.parametrize("bind", ["0.0.0.0:61613", "[::]:61613", "10.1.2.3:61613"])
def test_stomp_beyond_loopback_without_users_is_refused(tmp_path: Path, bind: str) -> None:
    with pytest.raises(SettingsError, match="allow_anonymous_remote") as e:
        settings(tmp_path, bind=bind)
    assert e.value.setting == "bind" and bind in str(e.value)


@pytest.mark.parametrize("bind", ["127.0.0.1:61613", "localhost:61613", "127.0.0.2:61613"])
def test_stomp_on_loopback_needs_nothing(tmp_path: Path, bind: str) -> None:
    settings(tmp_path, bind=bind)


def test_allow_anonymous_remote_or_a_users_file_accepts_it(tmp_path: Path) -> None:
    settings(tmp_path, bind="0.0.0.0:61613", allow_anonymous_remote=True)
    users = tmp_path / "users.toml"
    users.write_text("[users]\n")
    settings(tmp_path, bind="0.0.0.0:61613", users_file=str(users))


def test_environment_allows_it_too(tmp_path: Path) -> None:
    read_settings({"data_dir": str(tmp_path), "http_bind": "off", "bind": "0.0.0.0:61613"},
                  environ={"AMQLITE_ALLOW_ANONYMOUS_REMOTE": "true"})


def test_tls_listener_beyond_loopback(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    tls = {"ssl_cert": str(pki.server_cert), "ssl_key": str(pki.server_key)}
    with pytest.raises(SettingsError, match="ssl_bind"):
        settings(tmp_path, bind="off", ssl_bind="0.0.0.0:61612", **tls)
    # client certificates (ssl_ca) are logins of their own
    settings(tmp_path, bind="off", ssl_bind="0.0.0.0:61612", ssl_ca=str(pki.ca), **tls)


def test_ssl_cert_without_ssl_bind_is_warned(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    tls = {"ssl_cert": str(pki.server_cert), "ssl_key": str(pki.server_key)}
    _, warnings = settings(tmp_path, **tls)
    [line] = [w for w in warnings if "ssl_bind" in w]
    assert "plain text" in line and "nothing uses it" in line
    _, warnings = read_settings({"data_dir": str(tmp_path), **tls}, environ={})
    assert any("only the management API uses it" in w for w in warnings)
    _, warnings = settings(tmp_path, ssl_bind="127.0.0.1:61612", **tls)
    assert not any("no TLS STOMP listener" in w for w in warnings)


def test_start_refuses_it_with_one_line_exit_2(tmp_path: Path) -> None:
    result = amqlite("start", "--data-dir", str(tmp_path), "--http", "off",
                     "--bind", "0.0.0.0:61613")
    assert result.returncode == 2, result.stderr
    errors = [ln for ln in result.stderr.splitlines() if ln.startswith("amqlite: error:")]
    assert len(errors) == 1 and "allow_anonymous_remote" in errors[0], result.stderr
    assert "Traceback" not in result.stderr
