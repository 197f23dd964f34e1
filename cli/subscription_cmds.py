"""``amqlite subscription list|remove``: durable topic subscriptions from the command
line (ActiveMQ's ``activemq dstat`` of durable subscribers and JMX
``destroyDurableSubscriber``), on the management API's ``/api/v1/subscriptions``
routes, finding the group's master through the registry as ``amqlite queue`` does.

Also what ``amqlite queue browse`` says of a topic: a topic stores no messages of its
own, so its "waiting" (in ``queue list``) is what its durable subscriptions are owed;
browsing it lists those subscriptions instead of an empty page.
"""

from __future__ import annotations

import urllib.parse
from typing import Any

import click

from cli.mgmt_cmds import Target, _emit, _run, _target, table, target_options


@click.group("subscription")
def subscription() -> None:
    """List and remove durable topic subscriptions."""


def _subscriptions(t: Target, topic: str | None) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = _run(lambda: t.call("GET", "/api/v1/subscriptions"))[
        "subscriptions"]
    return [r for r in rows if topic is None or r["topic"] == topic]


def _topic(name: str) -> str:
    return name if name.startswith("/") else f"/topic/{name}"


def _rows_table(rows: list[dict[str, Any]]) -> str:
    return table(("client-id", "name", "topic", "pending", "owner", "online"),
                 [(r["client_id"], r["name"], r["topic"], r["pending"], r["owner"] or "",
                   "yes" if r["online"] else "no") for r in rows])


@subscription.command("list")
@click.option("--topic", help="Only the subscriptions of this topic.")
@target_options
def subscription_list(topic: str | None, url: str | None, group: str | None,
                      registry: str | None, user: str | None, as_json: bool) -> None:
    """Durable subscriptions, online or not: what each is owed (pending) and whose it is.
    With [[authorization]], a login that is not an administrator sees its own."""
    t = _target(url, group, registry, user)
    rows = _subscriptions(t, _topic(topic) if topic else None)
    _emit(as_json, rows, lambda: _rows_table(rows))


@subscription.command("remove")
@click.argument("client_id")
@click.argument("name")
@target_options
def subscription_remove(client_id: str, name: str, url: str | None, group: str | None,
                        registry: str | None, user: str | None, as_json: bool) -> None:
    """Remove the durable subscription NAME of CLIENT_ID with what it is owed (refused
    while a consumer is attached: close it first)."""
    t = _target(url, group, registry, user)
    path = "/api/v1/subscriptions/{}/{}".format(*(urllib.parse.quote(v, safe="")
                                                   for v in (client_id, name)))
    data = _run(lambda: t.call("DELETE", path))
    _emit(as_json, data, lambda: f"removed durable subscription {name} of {client_id}")


def browse_topic(t: Target, topic: str, as_json: bool) -> None:
    """``queue browse`` of a topic: what ``queue list`` counts as its waiting messages
    are owed to its durable subscriptions; say so, and list them."""
    quoted = urllib.parse.quote(topic, safe="/")
    row = _run(lambda: t.call("GET", f"/api/v1/destinations{quoted}"))
    subs = _subscriptions(t, topic)
    note = (f"{topic} is a topic: it keeps no messages of its own. Its {row['waiting']} "
            f"waiting are owed to its {len(subs)} durable subscriptions, and only their "
            "consumers read them (`amqlite subscription list --topic`; `amqlite "
            "subscription remove` drops one with what it is owed).")
    data = {"destination": topic, "messages": [], "next_after": None, "note": note,
            "subscriptions": subs}
    _emit(as_json, data, lambda: note + ("\n" + _rows_table(subs) if subs else ""))


def register(cli_group: click.Group) -> None:
    cli_group.add_command(subscription)
