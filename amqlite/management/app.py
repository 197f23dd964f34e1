"""The management HTTP listener: health, metrics, the JSON API and the console.

It runs in the node's own asyncio loop (aiohttp), from the node's start to its exit, so
a slave answers health, role and metrics too. Only a serving master answers the rest;
a slave or a demoting node says 503 and where the master is (from the registry).

Routes (``{kind}`` is ``queue`` or ``topic``, ``{name}`` the rest of the destination):

    GET    /healthz  /readyz  /metrics
    GET    /api/v1/openapi.json  /api/v1/openapi.yaml   this API, described (docs/openapi.yaml)
    GET    /api/v1/node                       this node: role, epoch, readiness
    GET    /api/v1/group                      every node of the group (registry)
    GET    /api/v1/destinations               name, kind, waiting, in flight, consumers...
    GET    /api/v1/destinations/{kind}/{name}
    DELETE /api/v1/destinations/{kind}/{name}  remove it for good (Operations.delete_destination)
    GET    /api/v1/messages/queue/{name}?after=ID&limit=N   browse without consuming
    GET    /api/v1/message/{id}               one whole message
    DELETE /api/v1/message/{id}
    POST   /api/v1/purge/queue/{name}
    POST   /api/v1/move/queue/{name}          {"to": "/queue/x", "ids": [..]} (no ids: all)
    POST   /api/v1/retry/queue/{name}         {"ids": [..]} (no ids: all) to original-destination
    GET    /api/v1/connections
    DELETE /api/v1/connections/{address}
    GET    /api/v1/subscriptions              durable subscriptions, online or not
    DELETE /api/v1/subscriptions/{client_id}/{name}
    GET    /api/v1/scheduled?destination=D&limit=N   scheduled messages, earliest due first
    DELETE /api/v1/scheduled/{id}             cancel one (Operations.cancel_scheduled)
    GET    /api/v1/rates                      the node's last minutes (``rates``), and
                                              each destination's last sample
    GET    /api/v1/rates/{kind}/{name}        one destination's last minutes
    POST   /api/v1/send/{kind}/{name}         {"body": "...", "headers": {..},
                                              "persistent": true} (Operations.send)

What an action does is the broker's operator API (``amqlite.broker.operations``);
here: parsing, logins and permissions, the HTTP status of its errors, and the log of
who asked.

Errors are JSON ``{"error": "..."}`` with the status: 400 malformed (``inputs``), 401
login, 403 not an administrator or a failed CSRF/origin check, 404 unknown, 408 a body
too slow, 409 conflict, 413 body too large, 421 a Host this node does not serve
(``origin``), 429 too many failed logins (with Retry-After), 503 not the master or the
login check queue full.

What a login sees (issue 23): with [[authorization]] entries, only the destinations it
may read; connections, other logins' durable subscriptions and ``/metrics`` need an
administrator (``/metrics`` also ``metrics_login`` or the ``metrics_token_file`` bearer
token).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import socket
import ssl
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web
from aiohttp.typedefs import Handler
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from amqlite.authz import Permission
from amqlite.broker.operations import Connection, OperationError, Operations
from amqlite.listen import HTTP_BACKLOG, listening_sockets
from amqlite.management import inputs
from amqlite.management.actions import ActionError
from amqlite.management.connections import KEEPALIVE_TIMEOUT, HttpConnections, HttpSite
from amqlite.management.document import YAML_TYPE, DocumentMissing, OpenApiDocument
from amqlite.management.httplog import server_logger
from amqlite.management.inputs import MAX_BODY_BYTES
from amqlite.management.metrics import Metrics
from amqlite.management.origin import HostGuard, MisdirectedRequest
from amqlite.management.rates import Sampler
from amqlite.management.security import (
    REALM,
    Access,
    Forbidden,
    Throttled,
    Unauthorized,
)
from amqlite.management.tls_gate import GatedHttpsSite
from amqlite.management.view import NodeView
from amqlite.registry import group_views
from amqlite.settings import HTTP_OFF, parse_bind
from amqlite.wire import DEFAULT_HTTP_PORT, DEFAULT_STOMP_PORT
from store import StoreError

if TYPE_CHECKING:
    from amqlite.node import Node

log = logging.getLogger("amqlite.management")

API = "/api/v1"
#: Without ``http_bind`` the port is 8161 + (STOMP port - 61613) when that lands in this
#: range (61614 -> 8162, the README's second node), else 8161; then the next free one.
AUTO_PORT_RANGE = 100
#: Ports tried after the derived one before giving up (the node then runs without HTTP).
AUTO_PORT_TRIES = 50
#: Default and largest page when browsing messages: 50 fits a console table; 500 is
#: the broker's own store page (broker.PAGE_SIZE).
DEFAULT_PAGE = 50
MAX_PAGE = 500
#: The OpenAPI document's paths (``document``): public, it is the one in docs/.
DOCUMENT_PATHS = frozenset({f"{API}/openapi.json", f"{API}/openapi.yaml"})
#: Paths a slave answers; the rest needs the master.
SLAVE_PATHS = frozenset({"/healthz", "/readyz", "/metrics", f"{API}/node", f"{API}/group",
                         *DOCUMENT_PATHS})
#: Paths anyone may read even with a users file: health checks carry no credentials, and
#: the API's description is the one published with the source.
OPEN_PATHS = frozenset({"/healthz", "/readyz", *DOCUMENT_PATHS})
STATIC = Path(__file__).with_name("static")


def _destination_scoped(request: web.Request) -> bool:
    """State changes on one destination (or one message or durable subscription of one):
    with [[authorization]] entries, admin on that destination decides, not [groups]."""
    info = request.match_info
    return ("kind" in info or "client_id" in info
            or request.path.startswith((f"{API}/message/", f"{API}/scheduled/")))


#: Headers of aiohttp's own errors kept in our JSON answer (405 lists what is allowed).
KEPT_ERROR_HEADERS = ("Allow",)


def _error(status: int, message: str, headers: Mapping[str, str] | None = None,
           **extra: Any) -> web.Response:
    out = dict(headers or {})
    if status == 401:
        out["WWW-Authenticate"] = f'Basic realm="{REALM}"'
    return web.json_response({"error": message, **extra}, status=status, headers=out or None)


class ManagementServer:
    """The aiohttp app and its listener, owned by the node."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.settings = node.settings
        self.view = NodeView(node)
        self.access = Access.from_users_file(node.users_file)
        self.metrics = Metrics(self.view)
        self.rates = Sampler(self.view)
        self.url: str | None = None
        self._runner: web.AppRunner | None = None
        self._ssl: ssl.SSLContext | None = None
        #: The listener's sockets, bounded (``connections``): one count for all its sites.
        self.sockets = HttpConnections()
        s = self.settings
        bind = s.http_bind if s.http_bind and s.http_bind.lower() != HTTP_OFF else ""
        self.hosts = HostGuard(parse_bind(bind)[0] if bind else "127.0.0.1",
                               s.http_allowed_hosts.split(","))
        self._scrape_token = self._read_token(s.metrics_token_file)
        self.document = OpenApiDocument()
        #: The console's files by name: only these are served (no path from a request
        #: ever reaches the file system).
        self.static = ({p.name: p for p in STATIC.iterdir() if p.is_file()}
                       if STATIC.is_dir() else {})
        self.app = self._make_app()

    @staticmethod
    def _read_token(path: str) -> bytes | None:
        """The bearer token of ``metrics_token_file`` (None: none, or unreadable)."""
        if not path:
            return None
        try:
            token = Path(path).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as e:
            log.error("management: metrics_token_file %s unreadable (%s); /metrics needs "
                      "an administrator", path, e)
            return None
        return token.encode() or None

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self) -> str | None:
        """Listen; the URL, or None when ``http_bind`` is off or no automatic port was
        free. An explicit ``http_bind`` that cannot be bound raises OSError."""
        s = self.settings
        if s.http_bind.lower() == HTTP_OFF:
            log.info("management API off (http_bind = off)")
            return None
        #: HTTPS with the STOMP listener's certificate settings (issue 16).
        self._ssl = s.ssl_context() if s.ssl_cert and s.http_ssl else None
        self._runner = web.AppRunner(self.app, access_log=None, handle_signals=False,
                                     logger=server_logger(),
                                     keepalive_timeout=KEEPALIVE_TIMEOUT)
        await self._runner.setup()
        if s.http_bind:
            host, port = parse_bind(s.http_bind)
            await self._listen(host, [port])
        else:
            host = "127.0.0.1"
            _, stomp_port = s.bind_address
            offset = stomp_port - DEFAULT_STOMP_PORT
            first = DEFAULT_HTTP_PORT + (offset if 0 <= offset < AUTO_PORT_RANGE else 0)
            if not await self._listen(host, list(range(first, first + AUTO_PORT_TRIES))):
                log.warning("management API: no free port in %d-%d; running without it "
                            "(set http_bind)", first, first + AUTO_PORT_TRIES - 1)
                await self.stop()
                return None
        port = self._runner.addresses[0][1] if self._runner and self._runner.addresses else 0
        shown = socket.getfqdn() if host in ("0.0.0.0", "::", "") else host
        self.hosts.allow(shown)
        self.url = f"{'https' if self._ssl else 'http'}://{shown}:{port}"
        self.rates.start()
        log.info("management API on %s (%s)", self.url,
                 "login required" if self.access.enabled else "no users file: no login")
        return self.url

    async def _listen(self, host: str, ports: list[int]) -> bool:
        """Listen on the first of ``ports`` that is free; False when none is. With one
        port (an explicit ``http_bind``), its OSError is raised."""
        assert self._runner is not None
        for port in ports:
            try:
                socks = await asyncio.to_thread(listening_sockets, host, port, HTTP_BACKLOG)
            except OSError:
                if len(ports) == 1:
                    await self.stop()
                    raise
                continue
            sites = [HttpSite(self._runner, sock, self.sockets, HTTP_BACKLOG)
                     if self._ssl is None
                     else GatedHttpsSite(self._runner, sock, self.sockets, self._ssl,
                                         self.settings.connect_timeout, HTTP_BACKLOG)
                     for sock in socks]
            for site in sites:
                await site.start()
            return True
        return False

    async def stop(self) -> None:
        await self.rates.stop()
        if self._runner is not None:
            runner, self._runner = self._runner, None
            with contextlib.suppress(Exception):
                await runner.cleanup()
        self.access.close()
        with contextlib.suppress(Exception):
            await asyncio.to_thread(self.view.reader.close)

    def observer(self) -> Callable[[float, float], None]:
        """The write buffer's observer: the latency histograms and the rates' sample."""
        histograms, sampled = self.metrics.observer(), self.rates.observe_commit

        def observe(commit_s: float, receipt_s: float) -> None:
            histograms(commit_s, receipt_s)
            sampled(commit_s)

        return observe

    # -- app ---------------------------------------------------------------------------
    def _make_app(self) -> web.Application:
        app = web.Application(middlewares=[self._handling, self._guard],
                              client_max_size=MAX_BODY_BYTES)
        r = app.router
        r.add_get("/", self.console)
        r.add_get("/static/{filename}", self.static_file)
        r.add_get("/healthz", self.healthz)
        r.add_get("/readyz", self.readyz)
        r.add_get("/metrics", self.metrics_page)
        r.add_get(f"{API}/openapi.json", self.openapi_json)
        r.add_get(f"{API}/openapi.yaml", self.openapi_yaml)
        r.add_get(f"{API}/node", self.node_info)
        r.add_get(f"{API}/group", self.group)
        r.add_get(f"{API}/destinations", self.destinations)
        r.add_get(API + "/destinations/{kind}/{name:.+}", self.destination)
        r.add_delete(API + "/destinations/{kind}/{name:.+}", self.delete_destination)
        r.add_get(API + "/messages/{kind}/{name:.+}", self.browse)
        r.add_get(API + "/message/{id}", self.message)
        r.add_delete(API + "/message/{id}", self.delete_message)
        r.add_post(API + "/purge/{kind}/{name:.+}", self.purge)
        r.add_post(API + "/move/{kind}/{name:.+}", self.move)
        r.add_post(API + "/retry/{kind}/{name:.+}", self.retry)
        r.add_get(f"{API}/connections", self.connections)
        r.add_delete(API + "/connections/{address}", self.close_connection)
        r.add_get(f"{API}/subscriptions", self.subscriptions)
        r.add_delete(API + "/subscriptions/{client_id}/{name:.+}", self.remove_subscription)
        r.add_get(f"{API}/scheduled", self.scheduled)
        r.add_delete(API + "/scheduled/{id}", self.cancel_scheduled)
        r.add_get(f"{API}/rates", self.rates_page)
        r.add_get(API + "/rates/{kind}/{name:.+}", self.destination_rates)
        r.add_post(API + "/send/{kind}/{name:.+}", self.send)
        return app

    @web.middleware
    async def _handling(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Its connection is busy while a request is handled: not closed to make room
        for a new one, nor for a late head (``connections``)."""
        self.sockets.begin(request.protocol)
        try:
            return await handler(request)
        finally:
            self.sockets.end(request.protocol)

    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Login, administrator and CSRF checks, 503 off the master, and no traceback
        ever: an unexpected failure is logged here and answered with a one-line 500."""
        path = request.path
        try:
            self.hosts.check_host(request)  # DNS rebinding: before routing and login
            login = None
            request["scrape"] = path == "/metrics" and self._scraper(request)
            if path not in OPEN_PATHS and not request["scrape"]:
                login = await self.access.login(request.headers.get("Authorization"),
                                                request.remote or "")
            request["login"] = login
            # An unknown path or method (404/405) changes nothing: it is not refused as
            # a state change (a TRACE is told what is allowed, not that it needs a CSRF
            # header), but an unknown path still needs the login any other does.
            routed = request.match_info.http_exception is None
            if request.method not in ("GET", "HEAD") and routed:
                if not (self.access.per_destination and _destination_scoped(request)):
                    self.access.require_admin(login)  # else the handler checks per destination
                self.hosts.check_origin(request)
            # A wrong path or method is 404/405 from any node, as the master would say.
            if (routed and path.startswith(API) and path not in SLAVE_PATHS
                    and not self.view.serving):
                return await self._not_master()
            return await handler(request)
        except MisdirectedRequest as e:
            return _error(421, str(e))
        except Unauthorized as e:
            return _error(401, str(e))
        except Throttled as e:
            response = _error(e.status, str(e))
            response.headers["Retry-After"] = str(e.retry_after)
            return response
        except Forbidden as e:
            return _error(403, str(e))
        except OperationError as e:
            return await self._failed(ActionError.of(e))
        except ActionError as e:
            return await self._failed(e)
        except web.HTTPException as e:
            if e.status >= 400:
                return _error(e.status, e.reason, {h: e.headers[h] for h in KEPT_ERROR_HEADERS
                                                   if h in e.headers})
            raise
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("management: %s %s failed", request.method, path)
            return _error(500, "internal error (logged on the broker)")

    def _scraper(self, request: web.Request) -> bool:
        """True when the request carries ``metrics_token_file``'s bearer token."""
        header = request.headers.get("Authorization", "")
        if self._scrape_token is None or not header.startswith("Bearer "):
            return False
        return hmac.compare_digest(header[7:].strip().encode(), self._scrape_token)

    async def _failed(self, e: ActionError) -> web.Response:
        if e.status == 503:
            return await self._not_master(str(e))
        return _error(e.status, str(e))

    async def _not_master(self, why: str | None = None) -> web.Response:
        node = self.node
        master = await self.view.master()
        where = (f"; the master is {master['name']} ({master['http'] or 'no API'})"
                 if master else "; no master is registered")
        return _error(503, (why or f"this node is {node.role}, not the serving master") + where,
                      role=node.role, master=master)

    @staticmethod
    def _destination(request: web.Request) -> str:
        kind = request.match_info["kind"]
        if kind not in ("queue", "topic"):
            raise ActionError(404, f"no such resource: {request.path}")
        return f"/{kind}/{request.match_info['name']}"

    def _logged(self, request: web.Request, what: str,
                result: Mapping[str, Any]) -> web.Response:
        self.view.reader.invalidate()
        log.info("management: %s by %s from %s: %s", what, request["login"] or "(no login)",
                 request.remote, json.dumps(result, sort_keys=True))
        return web.json_response(result)

    # -- console, health, metrics ------------------------------------------------------
    async def console(self, request: web.Request) -> web.StreamResponse:
        index = STATIC / "index.html"
        if not index.is_file():
            return web.Response(text="amqlite management API: see /api/v1/node\n")
        return web.FileResponse(index)

    async def static_file(self, request: web.Request) -> web.StreamResponse:
        path = self.static.get(request.match_info["filename"])
        if path is None:
            raise ActionError(404, f"no such file: {request.path[:100]}")
        return web.FileResponse(path)

    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "role": self.node.role,
                                  "name": self.settings.name})

    async def readyz(self, request: web.Request) -> web.Response:
        # What an operator accepted but should not forget (e.g. fsync = off), what the
        # store's replication is (a missing synchronous standby holds every commit).
        replication = self.node.replication
        w = [*self.node.warnings, *([replication.warning] if replication.warning else [])]
        warnings: dict[str, Any] = {"warnings": w} if w else {}
        if (state := replication.to_json()) is not None:
            warnings["replication"] = state
        broker = self.view.broker
        if self.view.serving and broker is not None:  # serving: there is a broker
            return web.json_response({"ready": True, "role": "master",
                                      "name": self.settings.name,
                                      "epoch": broker.epoch, **warnings})
        master = await self.view.master()
        return web.json_response({"ready": False, "role": self.node.role,
                                  "name": self.settings.name, "master": master, **warnings},
                                 status=503)

    async def metrics_page(self, request: web.Request) -> web.Response:
        login = request["login"]
        if not (request["scrape"] or not self.access.enabled or login in self.access.admins
                or (login and login == self.settings.metrics_login)):
            raise Forbidden(f"/metrics needs an administrator, metrics_login or the "
                            f"metrics token; {login} is none")
        await self.view.refresh_depths()
        body = generate_latest(self.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def openapi_json(self, request: web.Request) -> web.Response:
        try:
            text = await asyncio.to_thread(self.document.as_json)
        except DocumentMissing as e:
            raise ActionError(404, str(e)) from None
        return web.Response(text=text, content_type="application/json")

    async def openapi_yaml(self, request: web.Request) -> web.Response:
        try:
            body = await asyncio.to_thread(self.document.as_yaml)
        except DocumentMissing as e:
            raise ActionError(404, str(e)) from None
        return web.Response(body=body, content_type=YAML_TYPE, charset="utf-8")

    # -- reads ----------------------------------------------------------------------------
    async def node_info(self, request: web.Request) -> web.Response:
        node, broker = self.node, self.view.broker
        return web.json_response({
            "name": self.settings.name, "group": self.settings.group, "role": node.role,
            "ready": self.view.serving, "epoch": broker.epoch if broker is not None else None,
            "stomp": self.settings.advertise, "http": self.url,
            "websocket": self.settings.websocket_uris,
            "takeovers": node.takeovers, "master_since": node.master_since,
            "master": None if self.view.serving else await self.view.master(),
        })

    async def group(self, request: web.Request) -> web.Response:
        members = await self.view.group()
        replication = self.node.replication.to_json()  # as this node last read it
        now = int(time.time() * 1000)
        views = group_views(members, now_ms=now)  # who is master, which entry is stale
        view = views[0] if views else None
        stale = set(view.stale) if view is not None else set()
        nodes = [{**m.to_json(), "stale": m.name in stale,
                  "heartbeat_age_ms": None if m.heartbeat_at is None
                  else max(0, now - m.heartbeat_at)} for m in members]
        return web.json_response({"group": self.settings.group,
                                  "master": view.masters[0] if view and view.masters else None,
                                  "nodes": nodes,
                                  **({"replication": replication} if replication else {})})

    async def destinations(self, request: web.Request) -> web.Response:
        await self.view.refresh_depths()
        rows = self.view.destination_rows(self.view.depths)
        if self.access.per_destination:  # only what this login may read
            rows = [r for r in rows if self._may(request, r["name"], Permission.READ)]
        return web.json_response({"destinations": rows})

    async def _destination_row(self, name: str) -> dict[str, Any]:
        await self.view.refresh_depths(name)
        row = self.view.destination_row(name, self.view.depths)
        if row is None:
            raise ActionError(404, f"no destination {name}")
        return row

    async def destination(self, request: web.Request) -> web.Response:
        name = self._destination(request)
        self._require(request, name, Permission.READ)
        return web.json_response(await self._destination_row(name))

    async def browse(self, request: web.Request) -> web.Response:
        name = self._destination(request)
        self._require(request, name, Permission.READ)
        after = inputs.query_uint(request, "after", 0, 0, inputs.MAX_ID)
        limit = inputs.query_uint(request, "limit", DEFAULT_PAGE, 1, MAX_PAGE)
        await self._destination_row(name)  # 404 when unknown
        did = self.view.depths[name].id if name in self.view.depths else None
        if did is None or self.view.depths[name].kind != "queue":
            messages: list[dict[str, Any]] = []
        else:
            messages = await asyncio.to_thread(self.view.reader.browse, did, after, limit + 1)
        more = len(messages) > limit
        messages = messages[:limit]
        return web.json_response({
            "destination": name, "messages": messages,
            "next_after": messages[-1]["id"] if more else None,
        })

    async def message(self, request: web.Request) -> web.Response:
        row = await asyncio.to_thread(self.view.reader.message, inputs.message_id(request))
        if row is None:
            raise ActionError(404, f"no message {request.match_info['id']}")
        self._require(request, row["destination"], Permission.READ)
        row.pop("raw_body", None)
        return web.json_response(row)

    async def connections(self, request: web.Request) -> web.Response:
        self.access.require_admin(request["login"])  # logins, addresses, client-ids
        server, broker = self.view.server, self.view.broker
        out = []
        # Sockets still logging in (connected_at None) first, then by connection time; not
        # those closed after an ERROR that still linger (ClientConnection.close).
        for conn in sorted((c for c in (server.connections if server is not None else ())
                            if not c.closed), key=lambda c: c.connected_at or 0.0):
            session = broker.sessions.get(conn) if broker is not None else None
            subs = list(session.all_subscriptions()) if session is not None else []
            out.append({
                "address": conn.peer, "login": conn.login,
                "client_id": conn.client_id, "version": conn.version,
                "connected": conn.connected,
                "connected_since": conn.connected_at,
                "subscriptions": [{"id": s.id, "destination": s.destination,
                                   "ack": s.ack_mode, "unacked": len(s.inflight)}
                                  for s in subs],
                "unacked": sum(len(s.inflight) for s in subs),
            })
        return web.json_response({"connections": out})

    async def subscriptions(self, request: web.Request) -> web.Response:
        broker = self.view.broker
        if broker is None:  # not reached: _guard answers 503 off the serving master
            raise ActionError(503, "this node is no longer the serving master")
        try:
            rows = await asyncio.to_thread(self.view.reader.durables)
        except StoreError as e:
            raise ActionError(503, str(e)) from None
        out = []
        login = request["login"]
        admin = not self.access.enabled or login in self.access.admins
        for r in rows:
            durable = broker.durables.get((r.client_id, r.name))
            # The master's view first: an ownerless subscription just claimed by its
            # first login may not be committed yet.
            owner = durable.owner if durable is not None else r.owner
            if not admin and owner != login:  # others' need an administrator
                continue
            out.append({"client_id": r.client_id, "name": r.name, "topic": r.topic,
                        "pending": r.pending, "owner": owner,
                        "online": bool(durable is not None and durable.consumers)})
        return web.json_response({"subscriptions": out})

    # -- actions ------------------------------------------------------------------------------
    def _operations(self) -> Operations:
        broker = self.view.broker
        if broker is None:  # demoted while the request was read
            raise ActionError(503, "this node is no longer the serving master")
        return Operations(broker, self.view.reader, self._connections)

    def _connections(self) -> Iterable[Connection]:
        server = self.view.server
        return server.connections if server is not None else ()

    def _require(self, request: web.Request, destination: str,
                 permission: Permission = Permission.ADMIN) -> None:
        """[[authorization]] entries decide destination actions (Forbidden, 403)."""
        if self.access.per_destination:
            self.access.require(request["login"], destination, permission)

    async def purge(self, request: web.Request) -> web.Response:
        name = self._destination(request)
        self._require(request, name)
        result = await self._operations().purge(name)
        return self._logged(request, f"purge {name}", result)

    async def delete_destination(self, request: web.Request) -> web.Response:
        name = self._destination(request)
        self._require(request, name)
        result = await self._operations().delete_destination(name)
        return self._logged(request, f"delete {name}", result)

    async def delete_message(self, request: web.Request) -> web.Response:
        mid = inputs.message_id(request)
        result = await self._operations().delete_message(
            mid, lambda destination: self._require(request, destination))
        return self._logged(request, f"delete message {mid}", result)

    async def move(self, request: web.Request) -> web.Response:
        name = self._destination(request)
        body = await inputs.json_body(request)
        target = body.get("to")
        if not isinstance(target, str) or not target:
            raise ActionError(400, 'move needs "to": the target queue, e.g. "/queue/orders"')
        self._require(request, name)
        self._require(request, target)
        ids = inputs.ids(body)
        result = await self._operations().move(name, target, ids)
        return self._logged(request, f"move {name} -> {target}", result)

    async def retry(self, request: web.Request) -> web.Response:
        name = self._destination(request)
        self._require(request, name)
        ids = inputs.ids(await inputs.json_body(request))
        result = await self._operations().retry(name, ids)
        return self._logged(request, f"retry {name}", result)

    async def close_connection(self, request: web.Request) -> web.Response:
        address = request.match_info["address"]
        result = self._operations().close_connection(address, request["login"] or None)
        return self._logged(request, f"close connection {address}", result)

    async def remove_subscription(self, request: web.Request) -> web.Response:
        client_id, name = request.match_info["client_id"], request.match_info["name"]
        result = await self._operations().remove_durable(
            client_id, name, lambda topic: self._require(request, topic))
        return self._logged(request, f"remove durable subscription {client_id}/{name}", result)

    # -- scheduled messages --------------------------------------------------------------------
    async def scheduled(self, request: web.Request) -> web.Response:
        """Earliest due first; with [[authorization]] entries, of the destinations the
        login may read (like browsing)."""
        destination = request.query.get("destination") or None
        limit = inputs.query_uint(request, "limit", DEFAULT_PAGE, 1, MAX_PAGE)
        if destination is not None:
            self._require(request, destination, Permission.READ)
        result = await self._operations().scheduled(destination, limit)
        if self.access.per_destination:
            result["scheduled"] = [r for r in result["scheduled"] if self._may(
                request, r["destination"] or "", Permission.READ)]
        return web.json_response(result)

    def _may(self, request: web.Request, destination: str, permission: Permission) -> bool:
        try:
            self._require(request, destination, permission)
        except Forbidden:
            return False
        return True

    async def cancel_scheduled(self, request: web.Request) -> web.Response:
        mid = inputs.message_id(request)
        result = await self._operations().cancel_scheduled(
            mid, lambda destination: self._require(request, destination))
        return self._logged(request, f"cancel scheduled message {mid}", result)

    # -- the console's charts and its send form -------------------------------------------
    async def rates_page(self, request: web.Request) -> web.Response:
        """The node's history; with [[authorization]] entries a login that is not an
        administrator gets the sums over the destinations it may read, and only those."""
        login = request["login"]
        readable = None
        if self.access.per_destination and login not in self.access.admins:
            def readable(name: str) -> bool:
                return self._may(request, name, Permission.READ)
        return web.json_response(self.rates.node_json(readable))

    async def destination_rates(self, request: web.Request) -> web.Response:
        name = self._destination(request)
        self._require(request, name, Permission.READ)
        data = self.rates.destination_json(name)
        if data is None:
            raise ActionError(404, f"no rates of {name} (unknown, not sampled yet, or past "
                                   f"the {self.rates.max_destinations} charted destinations)")
        return web.json_response(data)

    async def send(self, request: web.Request) -> web.Response:
        """A message through the clients' SEND path (``Operations.send``): numbered,
        stored, fenced, counted. Needs write permission on the destination (with
        [[authorization]] entries; creating it, what a client would need too), else an
        administrator."""
        name = self._destination(request)
        body = await inputs.json_body(request)
        text, headers, persistent = inputs.message(body)
        if self.access.per_destination:
            self._require(request, name, Permission.WRITE)
            broker, login = self.view.broker, request["login"]
            if (broker is not None and not broker.exists(name)
                    and not self.access.policy.may_create(login, name, Permission.WRITE)):
                raise Forbidden(f"permission denied: login {login!r} may not create {name}")
        result = await self._operations().send(name, text.encode(), headers, persistent)
        return self._logged(request, f"send to {name}", result)
