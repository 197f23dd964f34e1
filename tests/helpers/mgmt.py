"""HTTP helpers for the management API tests: urllib from the standard library, so the
tests exercise the broker's listener with a client that shares no code with it."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tests.helpers.broker_proc import HOST, BrokerFactory, BrokerProcess, wait_one_serving
from tests.helpers.poll import poll
from tests.helpers.servers import free_port

#: Per-request timeout: generous for a loaded 2-core machine.
HTTP_TIMEOUT = 10.0
#: Deadline for conditions polled over HTTP (depths after a commit, a role change).
WAIT = 15.0


class Api:
    """One broker's management API."""

    def __init__(self, base: str, login: str | None = None, password: str | None = None):
        self.base = base.rstrip("/")
        self.auth = None
        if login is not None:
            token = base64.b64encode(f"{login}:{password}".encode()).decode()
            self.auth = f"Basic {token}"

    def call(self, method: str, path: str, body: Any = None, *, raw: bytes | None = None,
             headers: dict[str, str] | None = None, csrf: bool = True,
             ) -> tuple[int, Any, dict[str, str]]:
        """(status, decoded JSON or text, headers); never raises for an HTTP status."""
        hdrs = dict(headers or {})
        if self.auth:
            hdrs.setdefault("Authorization", self.auth)
        if method not in ("GET", "HEAD") and csrf:
            hdrs.setdefault("X-Requested-By", "tests")
            if "Referer" not in hdrs:  # as a browser on the console sends it
                parts = urllib.parse.urlsplit(self.base)
                hdrs.setdefault("Origin", f"{parts.scheme}://{parts.netloc}")
        data = raw
        if body is not None:
            data = json.dumps(body).encode()
            hdrs.setdefault("Content-Type", "application/json")
        req = urllib.request.Request(self.base + path, data=data, method=method, headers=hdrs)
        try:
            with urllib.request.urlopen(req, timeout=HTTP_TIMEOUT) as resp:
                status, payload, rh = resp.status, resp.read(), dict(resp.headers)
        except urllib.error.HTTPError as e:
            status, payload, rh = e.code, e.read(), dict(e.headers)
        text = payload.decode("utf-8", "replace")
        if rh.get("Content-Type", "").startswith("application/json"):
            return status, json.loads(text), rh
        return status, text, rh

    def get(self, path: str, **kw: Any) -> tuple[int, Any]:
        status, data, _ = self.call("GET", path, **kw)
        return status, data

    def post(self, path: str, body: Any = None, **kw: Any) -> tuple[int, Any]:
        status, data, _ = self.call("POST", path, body, **kw)
        return status, data

    def delete(self, path: str, **kw: Any) -> tuple[int, Any]:
        status, data, _ = self.call("DELETE", path, **kw)
        return status, data

    def ok(self, method: str, path: str, body: Any = None) -> Any:
        status, data, _ = self.call(method, path, body)
        assert status == 200, f"{method} {path}: {status} {data}"
        return data

    def up(self) -> bool:
        """True once the listener answers /healthz (a process starting is refused)."""
        try:
            return self.get("/healthz")[0] == 200
        except urllib.error.URLError:
            return False

    def destination(self, name: str) -> dict[str, Any] | None:
        kind, _, rest = name.lstrip("/").partition("/")
        status, data = self.get(f"/api/v1/destinations/{kind}/{rest}")
        return data if status == 200 else None


def wait_until(predicate: Callable[[], Any], timeout: float = WAIT,
               what: str = "condition") -> Any:
    """Poll ``predicate`` until it returns something truthy; that value."""
    return poll(predicate, timeout=timeout, what=what, interval=0.05)[0]


def start_with_http(factory: BrokerFactory, name: str, users_file: Path | None = None,
                    **kwargs: Any) -> BrokerProcess:
    """A serving broker with its management API on a free loopback port (its URL in
    ``broker.http``), logins checked against ``users_file`` when given."""
    http = free_port()
    env = dict(kwargs.pop("env", None) or {})
    if users_file is not None:
        env["AMQLITE_USERS_FILE"] = str(users_file)
    extra = [*kwargs.pop("extra_args", []), "--http", f"{HOST}:{http}"]
    b = factory.start(name=name, extra_args=extra, env=env, **kwargs)
    b.http = f"http://{HOST}:{http}"  # type: ignore[attr-defined]
    return b


def pair_with_http(factory: BrokerFactory, names: tuple[str, str], env: dict[str, str],
                   store_args: list[str], extra_args: Sequence[str] = (),
                   ) -> tuple[BrokerProcess, BrokerProcess]:
    """Master and slave of one group, each with its management API (URL in ``.http``):
    on one data directory (embedded store), or with ``store_args`` (``--store`` and
    ``--locker`` of a shared server); ``extra_args`` for both."""
    shared = factory.data_dir("shared") if not store_args else None
    nodes = []
    for name in names:
        http = free_port()
        b = factory.new(name=name, data_dir=shared, env=env,
                        extra_args=[*store_args, *extra_args, "--http", f"{HOST}:{http}"])
        b.http = f"http://{HOST}:{http}"  # type: ignore[attr-defined]
        nodes.append(b.start())
    master, _ = wait_one_serving(nodes)
    return master, nodes[1] if master is nodes[0] else nodes[0]
