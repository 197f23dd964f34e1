"""STOMP over WebSocket from a real browser (issue 24): a page served by the test loads
@stomp/stompjs (pinned in tests/browser/package-lock.json, installed by
scripts/install-test-deps) in Debian's headless Chromium, subscribes, sends persistent
messages with receipts and receives them; the test SIGKILLs the master of a two-node
group on a shared store, the page reconnects to the new master (stompjs'
``beforeConnect`` picking the next URL) and every receipted message arrives exactly
once. The same over wss://; a refused login and a refused Origin, each in the browser."""

from __future__ import annotations

import functools
import http.server
import json
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.broker_proc import (
    HOST,
    REPO_ROOT,
    BrokerFactory,
    BrokerProcess,
    password_hash,
    unique,
    wait_one_serving,
)
from tests.helpers.browser import require_browser, start_chromium
from tests.helpers.poll import poll
from tests.helpers.servers import free_port
from tests.helpers.tls import make_pki
from tests.helpers.ws import ws_url

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

BROWSER_DIR = REPO_ROOT / "tests" / "browser"
STOMPJS = BROWSER_DIR / "node_modules" / "@stomp" / "stompjs" / "bundles" / "stomp.umd.min.js"
LOGIN, PASSCODE = "webapp", "webapp-Secret-5"
#: Messages the page sends, and how often (ms): a steady stream across the takeover.
COUNT, INTERVAL_MS = 60, 25
#: Receipted messages before the master is killed (a third of them).
KILL_AFTER = COUNT // 3
#: A takeover (file lock polled every 0.1 s), the page's reconnect and the rest of the
#: stream, on a loaded two-core machine.
PAGE_WAIT = 60.0

require_browser()
if not STOMPJS.exists():
    pytest.skip("@stomp/stompjs is not installed: scripts/install-test-deps runs npm ci in "
                "tests/browser", allow_module_level=True)


class _PageHandler(http.server.SimpleHTTPRequestHandler):
    """Serves the page and the stompjs bundle, nothing else."""

    FILES = {"/page.html": (BROWSER_DIR / "page.html", "text/html; charset=utf-8"),
             "/stomp.umd.min.js": (STOMPJS, "text/javascript")}

    def do_GET(self) -> None:
        path, kind = self.FILES.get(urllib.parse.urlsplit(self.path).path, (None, ""))
        if path is None:
            self.send_error(404)
            return
        body = path.read_bytes()
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def page_port() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer((HOST, 0), functools.partial(_PageHandler))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    # --ignore-certificate-errors: this test's own browser trusts the test CA's
    # certificate for wss:// (tests/helpers/tls.py); nothing else runs in it.
    driver = start_chromium(("--ignore-certificate-errors",))
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def users(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("browser") / "users.toml"
    path.write_text(f'[users]\n{LOGIN} = "{password_hash(PASSCODE)}"\n')
    return path


def start_group(factory: BrokerFactory, users: Path, origin: str, scheme: str,
                tmp_path: Path) -> list[BrokerProcess]:
    """Two nodes of one group on one data dir (SQLite store, file lock), each with a
    WebSocket listener (wss:// with the test PKI) allowing pages of ``origin``."""
    shared = factory.data_dir("shared")
    tls: list[str] = []
    if scheme == "wss":
        pki = make_pki(tmp_path / "pki")
        tls = ["--ssl-cert", str(pki.server_cert), "--ssl-key", str(pki.server_key)]
    env = {"AMQLITE_LOCK_POLL_INTERVAL": "0.1", "AMQLITE_USERS_FILE": str(users),
           "AMQLITE_UPDATE_CLUSTER_CLIENTS": "true", "AMQLITE_WS_ALLOWED_ORIGINS": origin}
    nodes = []
    for name in ("web-a", "web-b"):
        port = free_port()
        node = factory.new(data_dir=shared, name=name, env=env, extra_args=[
            f"--{scheme}-bind", f"{HOST}:{port}", *tls])
        node.ws = ws_url(port, scheme)  # type: ignore[attr-defined]
        nodes.append(node.start())
    return nodes


def open_page(browser: Any, page_port: int, host: str = HOST, **cfg: Any) -> None:
    fragment = urllib.parse.quote(json.dumps(cfg))
    browser.get(f"http://{host}:{page_port}/page.html#{fragment}")


def page_state(browser: Any) -> dict[str, Any]:
    return browser.execute_script("return JSON.parse(JSON.stringify(window.amq || {}))")


@pytest.mark.parametrize("scheme", ["ws", "wss"])
def test_page_fails_over_and_gets_every_receipted_message_once(
        broker_factory: BrokerFactory, browser: Any, page_port: int, users: Path,
        tmp_path: Path, scheme: str) -> None:
    nodes = start_group(broker_factory, users, f"http://{HOST}:{page_port}", scheme, tmp_path)
    master, _ = wait_one_serving(nodes)
    slave = next(n for n in nodes if n is not master)
    urls = [master.ws, slave.ws]  # type: ignore[attr-defined]
    queue = f"/queue/{unique('browser')}"
    open_page(browser, page_port, urls=urls, login=LOGIN, passcode=PASSCODE, queue=queue,
              count=COUNT, interval=INTERVAL_MS, producer=unique("page"))

    state, _ = poll(lambda: page_state(browser),
                    lambda s: len(s.get("receipted", [])) >= KILL_AFTER, timeout=PAGE_WAIT,
                    what=f"{KILL_AFTER} receipts on the first master",
                    context=lambda: json.dumps(page_state(browser))[:2000])
    first = state["connects"][0]
    assert first["url"] == master.ws  # type: ignore[attr-defined]
    assert first["protocol"] == "v12.stomp" and first["version"] == "1.2"
    master.kill()  # SIGKILL: no goodbye
    slave.wait_serving(PAGE_WAIT)

    def finished(s: dict[str, Any]) -> bool:
        delivered = s.get("deliveries", {})
        return len(s.get("receipted", [])) == COUNT and all(
            f"m-{i}" in delivered for i in range(COUNT))
    state, _ = poll(lambda: page_state(browser), finished, timeout=PAGE_WAIT,
                    what="every message receipted and received after the takeover",
                    context=lambda: json.dumps(page_state(browser))[:3000])
    urls_connected = [c["url"] for c in state["connects"]]
    assert urls_connected[-1] == slave.ws, urls_connected  # type: ignore[attr-defined]
    assert sorted(state["receipted"]) == list(range(COUNT))
    # Exactly once: a second delivery only of a message whose ACK never got its
    # RECEIPT (the master died first), marked redelivered.
    for body, deliveries in state["deliveries"].items():
        assert len(deliveries) == 1 or (
            len(deliveries) == 2 and not deliveries[0]["acked"]
            and deliveries[1]["redelivered"]), f"{body} delivered {deliveries}"
    assert set(state["deliveries"]) == {f"m-{i}" for i in range(COUNT)}
    again = sum(len(d) - 1 for d in state["deliveries"].values())
    print(f"{scheme}: connects {urls_connected}, {COUNT} receipted and received once, "
          f"{again} redelivered after an ACK without RECEIPT; browser "
          f"{browser.capabilities.get('browserVersion')}")
    browser.get("about:blank")


def test_refused_login_in_the_browser(broker_factory: BrokerFactory, browser: Any,
                                      page_port: int, users: Path, tmp_path: Path) -> None:
    nodes = start_group(broker_factory, users, f"http://{HOST}:{page_port}", "ws", tmp_path)
    master, _ = wait_one_serving(nodes)
    open_page(browser, page_port, urls=[master.ws], login=LOGIN,  # type: ignore[attr-defined]
              passcode="wrong", queue="/queue/x", count=0, interval=1000, producer="p")
    state, _ = poll(lambda: page_state(browser), lambda s: bool(s.get("errors")),
                    timeout=PAGE_WAIT, what="the page's STOMP ERROR")
    assert state["errors"][0] == "authentication failed"
    assert state["connects"] == []
    browser.get("about:blank")


def test_refused_origin_in_the_browser(broker_factory: BrokerFactory, browser: Any,
                                       page_port: int, users: Path, tmp_path: Path) -> None:
    """The same page from another origin (``localhost`` is not ``127.0.0.1`` to a
    browser): the upgrade gets 403, the page never connects, the broker logs why."""
    nodes = start_group(broker_factory, users, f"http://{HOST}:{page_port}", "ws", tmp_path)
    master, _ = wait_one_serving(nodes)
    open_page(browser, page_port, host="localhost", urls=[master.ws],  # type: ignore[attr-defined]
              login=LOGIN, passcode=PASSCODE, queue="/queue/x", count=0, interval=1000,
              producer="p")
    state, _ = poll(lambda: page_state(browser), lambda s: len(s.get("closes", [])) >= 2,
                    timeout=PAGE_WAIT, what="the page's refused WebSockets")
    assert state["connects"] == [] and state["errors"] == []
    assert set(state["closes"]) == {1006}  # the browser's "handshake failed"
    refused = f"403 pages of origin 'http://localhost:{page_port}'"
    poll(lambda: refused in master.log_text(), timeout=PAGE_WAIT, what="the 403 in the log")
    browser.get("about:blank")
