"""``amqlite queue|scheduled|connection|status``: the management API from the command
line.

ActiveMQ's ``activemq query|browse|purge|dstat`` and ``rabbitmqctl list_queues`` for
amqlite, on the same HTTP API as the console (no second way into the broker). A node
is found with ``--url http://HOST:PORT``, or through the registry as ``cluster-list``
reads it (``--registry``, else the settings ``amqlite start`` would use here and every
container under AMQLITE_HOME), for ``--group`` or the settings' group: the group's
current master for queue and connection commands (so they follow a takeover), every
node for ``status``. The default URL is used only when the registry names no master,
and only if the node that answers there is of the group asked about.

Readable tables by default, ``--json`` for scripts; errors are one line on stderr and
exit 1 (a 401 says whether a login is missing or refused). With a users file on the
broker, give ``--user`` (``AMQLITE_USER``) and the password in ``AMQLITE_PASSWORD`` or
at the prompt.
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
    display_url,
    read_members,
    registry_url,
)
from amqlite.settings import Settings, SettingsError, load_settings
from amqlite.wire import CSRF_HEADER, DEFAULT_HTTP_PORT

#: What ``--url`` is without one: the first node's default listener.
DEFAULT_URL = f"http://127.0.0.1:{DEFAULT_HTTP_PORT}"
#: Per-request timeout (s): a purge of a big queue commits in chunks and may take a while.
HTTP_TIMEOUT = 60.0
EXIT_FAILED = 1


class ApiError(Exception):
    pass


class AuthError(ApiError):
    """A 401: the API wants a login, or refused the one given."""


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

    def settings(self) -> Settings:
        try:
            return load_settings({"group": self.group} if self.group else {})
        except SettingsError as e:
            _fail(str(e))

    @property
    def group_name(self) -> str:
        """The group asked about: --group, else the one `amqlite start` would join."""
        return self.group or self.settings().group

    def members(self) -> list[Member]:
        """The group's live registry entries, read as `cluster-list` reads them: --registry,
        else the registry of the settings `amqlite start` would use here and those of every
        container under AMQLITE_HOME (the same entry from two of them counts once)."""
        settings = self.settings()
        sources = [self.registry] if self.registry else registry_sources(settings)
        found: dict[tuple[str, str | None, int | None], Member] = {}
        errors: list[str] = []
        seen: set[str] = set()
        for url in sources:
            where = display_url(url)
            if where in seen:
                continue
            seen.add(where)
            try:
                for m in read_members(url, settings.group):
                    found.setdefault((m.name, m.host, m.pid), m)
            except RegistryError as e:
                errors.append(str(e))
        if errors and len(errors) == len(seen) and (self.registry or self.group):
            _fail(errors[0])
        return list(found.values())

    def master_url(self) -> str:
        if self.url:
            return self.url.rstrip("/")
        group = self.group_name
        master = current_master(self.members())
        if master is None:
            if self.group or self.registry:
                _fail(f"no master registered in group {group}")
            # Nothing registered where this shell's settings point: the default listener,
            # if what answers there is a node of the group asked about.
            self.check_identity(DEFAULT_URL, group)
            return DEFAULT_URL
        if not master.http:
            _fail(f"the master {master.name} of group {group} has no management API")
        return master.http.rstrip("/")

    def check_identity(self, base: str, group: str) -> None:
        try:
            node = self.call("GET", "/api/v1/node", base=base)
        except ApiError as e:
            _fail(str(e))
        wrong = mismatch(node, group, None)
        if wrong:
            _fail(wrong)

    def call(self, method: str, path: str, body: Any = None, base: str | None = None) -> Any:
        base = base or self.master_url()
        headers = {"Accept": "application/json"}
        if self.user is not None:
            token = base64.b64encode(f"{self.user}:{self.password or ''}".encode()).decode()
            headers["Authorization"] = f"Basic {token}"
        data = None
        if method != "GET":
            headers[CSRF_HEADER] = "amqlite-cli"
            # the API refuses state changes from other origins: scheme://host:port only
            parts = urllib.parse.urlsplit(base)
            headers["Origin"] = f"{parts.scheme}://{parts.netloc}"
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
            if e.code == 401:
                raise AuthError(f"{base}: {self.auth_problem()} ({message})") from None
            raise ApiError(f"{base}: {e.code} {message}") from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise ApiError(f"{base}: cannot connect: {reason}") from None

    def auth_problem(self) -> str:
        if self.user is None:
            return "authentication required: give --user (AMQLITE_USER)"
        return f"authentication failed for {self.user}"


def registry_sources(settings: Settings) -> list[str]:
    """What ``cluster-list`` reads without --registry: the registry of these settings,
    then that of every container under AMQLITE_HOME."""
    from cli.containers import container_home, container_registries

    sources = [registry_url(settings)]
    return sources + [u for u in container_registries(container_home()) if u not in sources]


def mismatch(node: dict[str, Any], group: str | None, name: str | None) -> str | None:
    """Why the node that answered is not the one asked about, or None."""
    who = f"{node.get('http', '?')} is {node.get('name')} of group {node.get('group')}"
    if group is not None and node.get("group") != group:
        return f"the node at {who}, not of group {group}"
    if name is not None and node.get("name") != name:
        return f"the node at {who}, not {name}"
    return None


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
                     help="A node's management API (default: the group's master in the "
                          f"registry, else {DEFAULT_URL} if it is a node of the group)."),
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
    """Every destination: waiting, in flight, consumers, totals, and the policy that
    applies (its pattern; --json has every value)."""
    t = _target(url, group, registry, user)
    data = _run(lambda: t.call("GET", "/api/v1/destinations"))["destinations"]
    _emit(as_json, data, lambda: table(
        ("destination", "waiting", "in-flight", "consumers", "enqueued", "dequeued",
         "expired", "dead-lettered", "moved", "purged", "dropped", "policy"),
        [(d["name"], d["waiting"], d["in_flight"], d["consumers"], d["enqueued"],
          d["dequeued"], d["expired"], d["dead_lettered"], d["moved"], d["purged"],
          d["overflow_dropped"], _policy_cell(d.get("policy"))) for d in data]))


def _policy_cell(policy: dict[str, Any] | None) -> str:
    """``queue list``'s policy column: the matching pattern and what it sets."""
    if not policy or not policy.get("pattern"):
        return "-"
    return f"{policy['pattern']}: {policy.get('summary', '')}"


@queue.command("browse")
@click.argument("destination")
@click.option("--after", default=0, type=click.IntRange(min=0),
              help="Show messages with an id above this (paging).")
@click.option("--limit", default=50, type=click.IntRange(1, 500), help="Messages per page.")
@target_options
def queue_browse(destination: str, after: int, limit: int, url: str | None,
                 group: str | None, registry: str | None, user: str | None,
                 as_json: bool) -> None:
    """Show a queue's messages without consuming them (of a topic: its durable
    subscriptions, which hold what `queue list` counts as its waiting messages)."""
    t = _target(url, group, registry, user)
    if destination.startswith("/topic/"):
        from cli.subscription_cmds import browse_topic

        browse_topic(t, destination, as_json)
        return
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


@dataclass
class Asked:
    """A node ``status`` is asked about: where its API is and who should answer there."""
    http: str | None
    group: str | None
    name: str | None = None
    pid: int | None = None
    stomp: str = "-"


def _asked(t: Target, url: str | None, group: str | None, registry: str | None,
           data_dir: str | None) -> list[Asked]:
    if url:  # that URL; with --group, it must be a node of that group
        return [Asked(url.rstrip("/"), group)]
    local = [] if registry else _local_nodes(group, data_dir)
    asked = [Asked(n.http.rstrip("/") if n.http else None, n.group, n.name, n.pid, n.stomp)
             for n in local]
    if data_dir:
        if not asked:
            _fail(f"no node is running with data directory {data_dir}")
        return asked
    expected = t.group_name
    if group or registry or not asked:
        names = {a.name for a in asked}
        asked += [Asked(m.http.rstrip("/") if m.http else None, m.group, m.name,
                        stomp=m.services[0] if m.services else "-")
                  for m in sorted(t.members(), key=lambda m: m.name) if m.name not in names]
    if not asked:
        if group or registry:
            _fail(f"no node of group {expected} is registered or running here")
        asked = [Asked(DEFAULT_URL, expected)]  # the default listener, if it is one of ours
    return asked


def _probe(t: Target, a: Asked) -> tuple[dict[str, Any], str | None]:
    """What the node says about itself (a row of the table), and an error line when it
    is not the node asked about."""
    row: dict[str, Any] = {"name": a.name or "-", "group": a.group or "-", "ready": False,
                           "stomp": a.stomp, "http": a.http or "-"}
    if a.http is None:
        running = f"running (pid {a.pid})" if a.pid else "no management API"
        return {**row, "role": running}, None
    try:
        node = t.call("GET", "/api/v1/node", base=a.http)
    except AuthError as e:
        return {**row, "role": "unauthorized", "error": str(e)}, str(e)
    except ApiError as e:
        role = f"running (pid {a.pid})" if a.pid else "unreachable"
        return {**row, "role": role, "error": str(e)}, None
    wrong = mismatch(node, a.group, a.name)
    if wrong:
        return {**row, "role": "wrong node", "error": wrong,
                "answered": {k: node.get(k) for k in ("name", "group", "role")}}, wrong
    return node, None


@click.command("status")
@target_options
@click.option("--data-dir", help="The nodes whose pid files are in this data directory "
                                 "(default: the group's, then the registry).")
def status(url: str | None, group: str | None, registry: str | None, user: str | None,
           as_json: bool, data_dir: str | None) -> None:
    """One node's role and readiness (--url), or every node of a group (--group).
    Without either, the nodes this host runs (pid files), else the group's nodes in the
    registry, else the default URL. What answers must be the node asked about (its
    name and group), or the line says so. Exit 0 when a ready master of the group asked
    about was seen and every node asked about answered as itself, 1 otherwise."""
    t = _target(url, group, registry, user)
    rows, problems = [], []
    for a in _asked(t, url, group, registry, data_dir):
        row, problem = _probe(t, a)
        rows.append(row)
        if problem:
            problems.append(problem)
    _emit(as_json, rows, lambda: table(
        ("name", "group", "role", "ready", "epoch", "stomp", "http"),
        [(n.get("name", "-"), n.get("group", "-"), n["role"], "yes" if n["ready"] else "no",
          n.get("epoch") if n.get("epoch") is not None else "-", n.get("stomp", "-"),
          n["http"]) for n in rows]))
    for problem in problems:
        click.echo(f"amqlite: error: {problem}", err=True)
    if problems or not any(n["ready"] for n in rows):
        sys.exit(EXIT_FAILED)


def register(cli_group: click.Group) -> None:
    cli_group.add_command(queue)
    cli_group.add_command(scheduled)
    cli_group.add_command(connection)
    cli_group.add_command(status)
