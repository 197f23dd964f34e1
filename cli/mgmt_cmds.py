"""``amqlite queue|scheduled|connection|status``: the management API from the command
line.

ActiveMQ's ``activemq query|browse|purge|dstat`` and ``rabbitmqctl list_queues`` for
amqlite, on the same HTTP API as the console (no second way into the broker). A node
is found with ``--url http://HOST:PORT``, or through the registry with ``--group``
(and ``--registry`` when it is not the one ``amqlite start`` would use here): the
group's master for queue and connection commands, every node for ``status``.

Readable tables by default, ``--json`` for scripts; errors are one line on stderr and
exit 1. With a users file on the broker, give ``--user`` (``AMQLITE_USER``) and the
password in ``AMQLITE_PASSWORD`` or at the prompt.
"""

from __future__ import annotations

import base64
import json
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import click

from amqlite.registry import (
    Member,
    RegistryError,
    current_master,
    read_members,
    registry_url,
)
from amqlite.settings import SettingsError, load_settings
from amqlite.wire import CSRF_HEADER, DEFAULT_HTTP_PORT

#: What ``--url`` is without one: the first node's default listener.
DEFAULT_URL = f"http://127.0.0.1:{DEFAULT_HTTP_PORT}"
#: Per-request timeout (s): a purge of a big queue commits in chunks and may take a while.
HTTP_TIMEOUT = 60.0
EXIT_FAILED = 1


class ApiError(Exception):
    pass


def _fail(message: str) -> NoReturn:
    click.echo(f"amqlite: error: {message}", err=True)
    sys.exit(EXIT_FAILED)


@dataclass
class Target:
    url: str | None
    group: str | None
    registry: str | None
    user: str | None
    password: str | None
    #: For https:// URLs (--ssl-ca, --ssl-cert, --ssl-key); None: the system's CAs.
    ssl_context: ssl.SSLContext | None = None

    def members(self) -> list[Member]:
        try:
            settings = load_settings({"group": self.group} if self.group else {})
        except SettingsError as e:
            _fail(str(e))
        url = self.registry or registry_url(settings)
        try:
            return read_members(url, settings.group)
        except RegistryError as e:
            _fail(str(e))

    def master_url(self) -> str:
        if self.url:
            return self.url.rstrip("/")
        if not self.group and not self.registry:
            return DEFAULT_URL
        master = current_master(self.members())
        if master is None:
            _fail(f"no master registered in group {self.group or 'default'}")
        if not master.http:
            _fail(f"the master {master.name} of group {self.group or 'default'} has no "
                  "management API")
        return master.http.rstrip("/")

    def call(self, method: str, path: str, body: Any = None, base: str | None = None) -> Any:
        base = base or self.master_url()
        headers = {"Accept": "application/json"}
        if self.user is not None:
            token = base64.b64encode(f"{self.user}:{self.password or ''}".encode()).decode()
            headers["Authorization"] = f"Basic {token}"
        data = None
        if method != "GET":
            headers[CSRF_HEADER] = "amqlite-cli"
            headers["Origin"] = base  # the API refuses state changes from other origins
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        req = urllib.request.Request(base + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=HTTP_TIMEOUT,
                                        context=self.ssl_context) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as e:
            try:
                message = json.loads(e.read()).get("error") or e.reason
            except (ValueError, AttributeError):
                message = e.reason
            raise ApiError(f"{base}: {e.code} {message}") from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise ApiError(f"{base}: cannot connect: {reason}") from None


def _run(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except ApiError as e:
        _fail(str(e))


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Left-aligned columns, numbers right-aligned, like ``rabbitmqctl list_queues``."""
    cells = [[("" if v is None else str(v)) for v in r] for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    numeric = [all(isinstance(r[i], int) for r in rows) and bool(rows)
               for i in range(len(headers))]

    def line(values: Sequence[str]) -> str:
        return "  ".join(v.rjust(w) if n else v.ljust(w)
                         for v, w, n in zip(values, widths, numeric, strict=True)).rstrip()

    return "\n".join([line(list(headers)), *(line(r) for r in cells)])


def _dest_path(destination: str) -> str:
    if not destination.startswith(("/queue/", "/topic/")):
        destination = f"/queue/{destination}"  # `amqlite queue browse orders`
    return urllib.parse.quote(destination, safe="/")


def _emit(as_json: bool, data: Any, text: Callable[[], str]) -> None:
    click.echo(json.dumps(data, indent=2) if as_json else text())


def _remember(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """TLS options go to ctx.meta rather than to every command's signature."""
    ctx.meta[f"amqlite.{param.name}"] = value
    return value


def _client_tls() -> ssl.SSLContext | None:
    meta = click.get_current_context().meta
    ca, cert, key = (meta.get(f"amqlite.ssl_{n}") or "" for n in ("ca", "cert", "key"))
    if not (ca or cert or key):
        return None
    from amqlite.tls import TlsError, client_context

    try:
        return client_context(ca, cert, key)
    except TlsError as e:
        _fail(str(e))


def target_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    options = [
        click.option("--url", envvar="AMQLITE_URL", metavar="http://HOST:PORT",
                     help=f"A node's management API (default {DEFAULT_URL}, or the master "
                          "found with --group/--registry)."),
        click.option("--group", help="Find the group's nodes through the registry."),
        click.option("--registry", metavar="URL",
                     help="Registry to read (zk://... or a store URL); default: the one "
                          "`amqlite start` would use."),
        click.option("--user", envvar="AMQLITE_USER", help="Login (users file)."),
        click.option("--json", "as_json", is_flag=True, help="Print JSON, not a table."),
        click.option("--ssl-ca", envvar="AMQLITE_SSL_CA", metavar="FILE", expose_value=False,
                     callback=_remember, help="PEM CA file to verify an https:// API."),
        click.option("--ssl-cert", envvar="AMQLITE_SSL_CERT", metavar="FILE",
                     expose_value=False, callback=_remember,
                     help="Client certificate, when the API requires one."),
        click.option("--ssl-key", envvar="AMQLITE_SSL_KEY", metavar="FILE",
                     expose_value=False, callback=_remember, help="Private key of --ssl-cert."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _target(url: str | None, group: str | None, registry: str | None,
            user: str | None) -> Target:
    password = None
    if user is not None:
        import os

        password = os.environ.get("AMQLITE_PASSWORD")
        if password is None:
            password = click.prompt(f"password for {user}", hide_input=True, err=True)
    return Target(url, group, registry, user, password, _client_tls())


# --------------------------------------------------------------------------- queue

@click.group("queue")
def queue() -> None:
    """List, browse, purge, move and delete queue messages."""


@queue.command("list")
@target_options
def queue_list(url: str | None, group: str | None, registry: str | None, user: str | None,
               as_json: bool) -> None:
    """Every destination: waiting, in flight, consumers, totals."""
    t = _target(url, group, registry, user)
    data = _run(lambda: t.call("GET", "/api/v1/destinations"))["destinations"]
    _emit(as_json, data, lambda: table(
        ("destination", "waiting", "in-flight", "consumers", "enqueued", "dequeued",
         "dead-lettered"),
        [(d["name"], d["waiting"], d["in_flight"], d["consumers"], d["enqueued"],
          d["dequeued"], d["dead_lettered"]) for d in data]))


@queue.command("browse")
@click.argument("destination")
@click.option("--after", default=0, type=click.IntRange(min=0),
              help="Show messages with an id above this (paging).")
@click.option("--limit", default=50, type=click.IntRange(1, 500), help="Messages per page.")
@target_options
def queue_browse(destination: str, after: int, limit: int, url: str | None,
                 group: str | None, registry: str | None, user: str | None,
                 as_json: bool) -> None:
    """Show a queue's messages without consuming them."""
    t = _target(url, group, registry, user)
    data = _run(lambda: t.call(
        "GET", f"/api/v1/messages{_dest_path(destination)}?after={after}&limit={limit}"))

    def text() -> str:
        rows = [(m["id"], m["message_id"], m["priority"], m["delivery_count"],
                 "yes" if m["in_flight"] else "", m["size"],
                 _preview(m)) for m in data["messages"]]
        out = table(("id", "message-id", "prio", "deliveries", "in-flight", "bytes", "body"),
                    rows)
        if data["next_after"] is not None:
            out += f"\n(more: --after {data['next_after']})"
        return out

    _emit(as_json, data, text)


def _preview(m: dict[str, Any], width: int = 40) -> str:
    body = m["body"] if m["body"] is not None else "<binary>"
    body = body.replace("\n", " ")
    return body if len(body) <= width else body[: width - 1] + "…"


@queue.command("purge")
@click.argument("destination")
@target_options
def queue_purge(destination: str, url: str | None, group: str | None, registry: str | None,
                user: str | None, as_json: bool) -> None:
    """Remove every waiting message (in-flight ones stay with their consumers)."""
    t = _target(url, group, registry, user)
    data = _run(lambda: t.call("POST", f"/api/v1/purge{_dest_path(destination)}"))
    _emit(as_json, data, lambda: f"purged {data['purged']} messages from "
                                 f"{data['destination']} ({data['in_flight_kept']} in flight "
                                 "kept)")


@queue.command("move")
@click.argument("source")
@click.argument("target")
@click.option("--id", "ids", multiple=True, type=int,
              help="A message id to move (repeat); default: every waiting message.")
@target_options
def queue_move(source: str, target: str, ids: tuple[int, ...], url: str | None,
               group: str | None, registry: str | None, user: str | None,
               as_json: bool) -> None:
    """Move messages from SOURCE to TARGET (another queue)."""
    t = _target(url, group, registry, user)
    body: dict[str, Any] = {"to": target if target.startswith("/") else f"/queue/{target}"}
    if ids:
        body["ids"] = list(ids)
    data = _run(lambda: t.call("POST", f"/api/v1/move{_dest_path(source)}", body))
    _emit(as_json, data, lambda: f"moved {data['moved']} messages from {data['source']} to "
                                 f"{data['target']} ({data['in_flight_kept']} in flight kept, "
                                 f"{data['not_found']} not found)")


@queue.command("retry")
@click.argument("destination", default="/queue/DLQ")
@click.option("--id", "ids", multiple=True, type=int,
              help="A message id to retry (repeat); default: every waiting message.")
@target_options
def queue_retry(destination: str, ids: tuple[int, ...], url: str | None, group: str | None,
                registry: str | None, user: str | None, as_json: bool) -> None:
    """Send dead letters back to their original-destination (default queue /queue/DLQ)."""
    t = _target(url, group, registry, user)
    body = {"ids": list(ids)} if ids else {}
    data = _run(lambda: t.call("POST", f"/api/v1/retry{_dest_path(destination)}", body))
    _emit(as_json, data, lambda: f"retried {data['moved']} messages: " + (", ".join(
        f"{n} to {d}" for d, n in data["targets"].items()) or "none") +
        (f"; {data['skipped_no_original']} without a queue to go back to"
         if data["skipped_no_original"] else ""))


@queue.command("delete")
@click.argument("destination")
@click.option("--message", "message_id", type=int,
              help="Delete only this message (its id from browse).")
@target_options
def queue_delete(destination: str, message_id: int | None, url: str | None,
                 group: str | None, registry: str | None, user: str | None,
                 as_json: bool) -> None:
    """Delete a destination for good (its messages too; a topic's durable
    subscriptions too), or one message with --message."""
    t = _target(url, group, registry, user)
    if message_id is not None:
        data = _run(lambda: t.call("DELETE", f"/api/v1/message/{message_id}"))
        _emit(as_json, data, lambda: f"deleted message {message_id} from "
                                     f"{data['destination']}")
        return
    data = _run(lambda: t.call("DELETE", f"/api/v1/destinations{_dest_path(destination)}"))
    _emit(as_json, data, lambda: f"deleted {data['destination']}: {data['messages']} messages"
                                 + (f", {data['subscriptions']} durable subscriptions"
                                    if data["subscriptions"] else "") + " removed")


# --------------------------------------------------------------------------- scheduled

@click.group("scheduled")
def scheduled() -> None:
    """List and cancel scheduled messages (AMQ_SCHEDULED_* SENDs not yet delivered)."""


@scheduled.command("list")
@click.argument("destination", required=False)
@click.option("--limit", default=50, type=click.IntRange(1, 500),
              help="Messages to show, earliest due first.")
@target_options
def scheduled_list(destination: str | None, limit: int, url: str | None,
                   group: str | None, registry: str | None, user: str | None,
                   as_json: bool) -> None:
    """Scheduled messages (of DESTINATION only, when given), earliest due first."""
    t = _target(url, group, registry, user)
    query = {"limit": str(limit)}
    if destination:
        query["destination"] = urllib.parse.unquote(_dest_path(destination))
    data = _run(lambda: t.call("GET", "/api/v1/scheduled?" + urllib.parse.urlencode(query)))

    def text() -> str:
        rows = [(m["id"], m["destination"], _when(m["deliver_at"]), _plan(m["schedule"]),
                 m["schedule"]["fired"] if m["schedule"] else 0, m["size"], _preview(m))
                for m in data["scheduled"]]
        out = table(("id", "destination", "due", "schedule", "delivered", "bytes", "body"),
                    rows)
        if data["total"] > len(rows):
            out += f"\n({len(rows)} of {data['total']}: --limit for more)"
        return out

    _emit(as_json, data, text)


def _when(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000))


def _plan(plan: dict[str, Any] | None) -> str:
    """``delay 30000 ms, every 10000 ms, 9 repeats, cron '0 * * * *'`` (what was asked)."""
    if not plan:
        return "-"
    parts = [f"delay {plan['delay']} ms"] if plan["delay"] else []
    if plan["period"]:
        parts.append(f"every {plan['period']} ms")
    if plan["repeat"]:
        parts.append(f"{plan['repeat']} repeats")
    if plan["cron"]:
        parts.append(f"cron '{plan['cron']}'")
    return ", ".join(parts) or "-"


@scheduled.command("cancel")
@click.argument("message_id", type=int)
@target_options
def scheduled_cancel(message_id: int, url: str | None, group: str | None,
                     registry: str | None, user: str | None, as_json: bool) -> None:
    """Cancel the scheduled message MESSAGE_ID (its id from `scheduled list`): no more
    copies of it are delivered."""
    t = _target(url, group, registry, user)
    data = _run(lambda: t.call("DELETE", f"/api/v1/scheduled/{message_id}"))
    _emit(as_json, data, lambda: f"cancelled scheduled message {data['id']} "
                                 f"({data['message_id']}) of {data['destination']}")


# --------------------------------------------------------------------------- connections

@click.group("connection")
def connection() -> None:
    """List and close client connections."""


@connection.command("list")
@target_options
def connection_list(url: str | None, group: str | None, registry: str | None,
                    user: str | None, as_json: bool) -> None:
    """Every STOMP connection of the master."""
    t = _target(url, group, registry, user)
    data = _run(lambda: t.call("GET", "/api/v1/connections"))["connections"]

    def since(c: dict[str, Any]) -> str:
        at = c.get("connected_since")
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at)) if at else "-"

    _emit(as_json, data, lambda: table(
        ("address", "login", "client-id", "stomp", "subscriptions", "unacked", "since"),
        [(c["address"], c["login"] or "-", c["client_id"] or "-", c["version"],
          len(c["subscriptions"]), c["unacked"], since(c)) for c in data]))


@connection.command("close")
@click.argument("address")
@target_options
def connection_close(address: str, url: str | None, group: str | None, registry: str | None,
                     user: str | None, as_json: bool) -> None:
    """Close the connection from ADDRESS (host:port, as `connection list` shows it)."""
    t = _target(url, group, registry, user)
    data = _run(lambda: t.call("DELETE",
                               f"/api/v1/connections/{urllib.parse.quote(address)}"))
    _emit(as_json, data, lambda: f"closed the connection from {data['address']}")


# --------------------------------------------------------------------------- status

def _local_nodes(group: str | None, data_dir: str | None) -> list[Any]:
    """Running foreground nodes of this host, from the pid files ``amqlite start``
    writes in its data directory (``amqlite stop`` reads the same)."""
    from amqlite import pidfile

    try:
        directory = load_settings({"group": group, "data_dir": data_dir}).data_dir
    except SettingsError as e:
        _fail(str(e))
    return [n for n in pidfile.read_all(directory) if n.alive]


@click.command("status")
@target_options
@click.option("--data-dir", help="Also look for nodes through the pid files in this data "
                                 "directory (default: the group's).")
def status(url: str | None, group: str | None, registry: str | None, user: str | None,
           as_json: bool, data_dir: str | None) -> None:
    """One node's role and readiness (--url), or every node of a group (--group).
    Without either, the nodes this host runs (pid files), else the default URL.
    Exit 0 when a ready master was seen, 1 otherwise."""
    t = _target(url, group, registry, user)
    local = [] if url or registry else _local_nodes(group, data_dir)
    if url or not (group or registry):
        bases = [t.master_url()]
        if not url and local:
            bases = list(dict.fromkeys(n.http.rstrip("/") for n in local if n.http)) or bases
    else:
        bases = [m.http.rstrip("/") for m in sorted(t.members(), key=lambda m: m.name)
                 if m.http]
        if not bases and not local:
            _fail(f"no node of group {group or 'default'} has a management API registered")
    nodes = []
    for base in bases:
        try:
            nodes.append(t.call("GET", "/api/v1/node", base=base))
        except ApiError as e:
            nodes.append({"http": base, "role": "unreachable", "ready": False,
                          "error": str(e)})
    # A running node that no management API answered for (http off, or not up yet):
    # its pid file still says it runs.
    answered = {n.get("name") for n in nodes if n["role"] != "unreachable"}
    for n in local:
        if n.name not in answered:
            nodes.append({"name": n.name, "group": n.group, "role": f"running (pid {n.pid})",
                          "ready": False, "stomp": n.stomp, "http": n.http or "-"})
    _emit(as_json, nodes, lambda: table(
        ("name", "group", "role", "ready", "epoch", "stomp", "http"),
        [(n.get("name", "-"), n.get("group", "-"), n["role"], "yes" if n["ready"] else "no",
          n.get("epoch") if n.get("epoch") is not None else "-", n.get("stomp", "-"),
          n["http"]) for n in nodes]))
    if not any(n["ready"] for n in nodes):
        sys.exit(EXIT_FAILED)


def register(cli_group: click.Group) -> None:
    cli_group.add_command(queue)
    cli_group.add_command(scheduled)
    cli_group.add_command(connection)
    cli_group.add_command(status)
