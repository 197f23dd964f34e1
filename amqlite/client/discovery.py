"""``discovery:`` URIs: find a group's brokers in the registry instead of naming them,
and the resolver hook that lets an application plug its own lookup.

    discovery:zk://127.0.0.1:2181/amqlite?group=default
    discovery:(zk://zk1:2181,zk2:2181/amqlite)?group=orders
    discovery:postgresql://amq@db/amqlite?group=default
    discovery:sqlite:///var/lib/amqlite/default/amqlite.db?group=default

``resolve`` reads the registry once and returns the group's client URIs with
the master first, then the slaves (which do not listen until they take over,
but are where the next master will be). A failover transport resolves again
whenever it has to reconnect, so it follows the master across failovers; a
query parameter other than ``group`` stays with the registry URL (e.g.
``sslmode`` of a PostgreSQL store).
"""

from __future__ import annotations

import inspect
import logging
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from urllib.parse import parse_qsl, urlencode

from amqlite.client.errors import ConnectionFailedError
from amqlite.client.uri import TcpURI, URIError, parse_tcp_uri
from amqlite.registry import (
    Member,
    RegistryError,
    Role,
    current_master,
    master_order,
    read_members,
)
from lockers.connections.blocking import run_blocking

log = logging.getLogger(__name__)

#: ``resolver(agent) -> [tcp URI, ...]``, plain or a coroutine function.
Resolver = Callable[[str], Sequence[str] | Awaitable[Sequence[str]]]

SCHEME = "discovery:"
#: The group a discovery URI means when it names none (the CLI's default group).
DEFAULT_GROUP = "default"


class DiscoveryError(RegistryError):
    """A discovery URI that cannot be parsed or whose registry cannot be read."""


def parse(uri: str) -> tuple[str, str]:
    """``discovery:URL?group=G`` -> (registry URL, group)."""
    if not uri.lower().startswith(SCHEME):
        raise DiscoveryError(f"not a discovery URI (discovery:zk://host:port/root?group=G): "
                             f"{uri!r}")
    rest = uri[len(SCHEME):]
    query = ""
    if rest.startswith("("):
        inner, sep, tail = rest[1:].partition(")")
        if not sep:
            raise DiscoveryError(f"discovery URI: unbalanced parenthesis in {uri!r}")
        rest, query = inner, tail.removeprefix("?")
        if tail and not tail.startswith("?"):
            raise DiscoveryError(f"discovery URI: expected '?options' after ')' in {uri!r}")
    if "://" not in rest:
        raise DiscoveryError(f"discovery URI names no registry URL: {uri!r}")
    # Not urlsplit/urlunsplit: they turn sqlite:///abs/path into sqlite:/abs/path.
    base, _, own_query = rest.partition("?")
    params = parse_qsl(own_query, keep_blank_values=True) + parse_qsl(query,
                                                                      keep_blank_values=True)
    group = DEFAULT_GROUP
    kept = []
    for key, value in params:
        if key == "group":
            group = value
        else:
            kept.append((key, value))
    if not group:
        raise DiscoveryError(f"discovery URI: empty group in {uri!r}")
    return (f"{base}?{urlencode(kept)}" if kept else base), group


def discovery_agent(url: str) -> str | None:
    """The ``discovery:`` URI inside a client URL (alone or as ``failover:(discovery:...)``),
    None when the URL names its brokers itself."""
    start = url.lower().find(SCHEME)
    if start < 0:
        return None
    rest = url[start:]
    if not url[:start].endswith("("):
        return rest
    depth = 1  # inside failover:( ... ): up to the parenthesis that closes it
    for i, char in enumerate(rest):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0:
            return rest[:i]
    return rest


def waiting_for(url: str) -> str | None:
    """What a client of ``url`` waits for while discovery finds no broker, as one line
    (``amqlite produce``/``consume`` print it), or None without discovery."""
    agent = discovery_agent(url)
    if agent is None:
        return None
    try:
        registry, group = parse(agent)
    except DiscoveryError:
        return None  # the connect says what is wrong with it
    registry = re.sub(r"://([^:/@]*):[^@/]*@", r"://\1:***@", registry)  # no password shown
    return f"waiting for a broker of group {group!r} registered in {registry} (discovery)"


def order_services(members: list[Member]) -> list[str]:
    """Client URIs, the real master's first (``registry.current_master``), then other
    masters' (highest epoch first), then slaves'; each URI once."""
    master = current_master(members)
    masters = ([master] if master is not None else []) + sorted(
        (m for m in members if m.role == Role.MASTER and m is not master), key=master_order)
    slaves = sorted((m for m in members if m.role != Role.MASTER), key=lambda m: m.name)
    out: list[str] = []
    for m in (*masters, *slaves):
        for uri in m.services:
            if uri not in out:
                out.append(uri)
    return out


def resolve(uri: str) -> list[str]:
    """The group's tcp:// URIs, master first; [] when nobody is registered
    (yet). Blocking (it reads ZooKeeper or the store): call it from a thread
    in asyncio code. Raises ``DiscoveryError`` for a bad URI or registry."""
    url, group = parse(uri)
    try:
        members = read_members(url, group)
    except DiscoveryError:
        raise
    except RegistryError as e:
        raise DiscoveryError(str(e)) from None
    return order_services(members)


#: Agent schemes ``resolve_agent`` answers for (the resolver hook below is keyed by the
#: agent's scheme).
AGENT_SCHEMES = ("zk", "postgresql", "postgres", "sqlite")


def resolve_agent(agent: str) -> list[str]:
    """``resolve`` for the text after ``discovery:`` (the client's resolver hook:
    ``register_discovery_resolver(resolve_agent, scheme)`` for each AGENT_SCHEMES)."""
    return resolve(SCHEME + agent)


# --- the resolver hook ---------------------------------------------------------------

_RESOLVERS: dict[str | None, Resolver] = {}


def register_discovery_resolver(resolver: Resolver | None, scheme: str | None = None) -> None:
    """Plug a resolver for ``discovery:`` URLs: ``resolver(agent) -> [tcp URI, ...]``.

    ``agent`` is the text after ``discovery:`` without the failover options
    (``zk://h:2181/amqlite?group=default``, ``fabric:default``, ...). ``scheme`` restricts
    it to agents starting with ``scheme:``; None registers the fallback. Without any,
    ``resolve_agent`` serves the schemes it lists (zk, postgresql,
    sqlite). It is called on every reconnect pass (a sync resolver runs in a worker
    thread, an async one on the loop); an empty list counts as a failed pass. ``None``
    unregisters.
    """
    if resolver is None:
        _RESOLVERS.pop(scheme, None)
    else:
        _RESOLVERS[scheme] = resolver


def find_resolver(agent: str) -> Resolver | None:
    """A registered resolver for the agent's scheme, the registered fallback, or else the
    built-in registry lookup (``resolve_agent``) for the schemes it knows."""
    scheme = agent.partition(":")[0] if ":" in agent else None
    found = _RESOLVERS.get(scheme) or _RESOLVERS.get(None)
    if found is not None:
        return found
    return resolve_agent if scheme in AGENT_SCHEMES else None


async def resolve_uris(
    agent: str, resolver: Resolver | None, nested: Mapping[str, str]
) -> list[TcpURI]:
    """One reconnect pass's URIs from ``resolver`` (else the registered one): a sync
    resolver runs in a worker thread; bad URIs are logged and skipped, duplicates
    dropped."""
    resolver = resolver or find_resolver(agent)
    if resolver is None:
        raise ConnectionFailedError(f"no discovery resolver for {agent!r}")
    if inspect.iscoroutinefunction(resolver):
        found = await resolver(agent)
    else:
        # A daemon thread, not asyncio.to_thread: a lookup wedged on a dead ZooKeeper
        # must not hold up the exit of a client that gave up (asyncio.run's shutdown
        # waits for the default executor's threads).
        sync_resolver = resolver
        found = await run_blocking(lambda: sync_resolver(agent), name="amqlite-discovery")
        if inspect.isawaitable(found):
            found = await found
    uris: list[TcpURI] = []
    for text in found:
        try:
            uri = parse_tcp_uri(text, nested)
        except URIError as exc:
            log.warning("discovery %s returned a bad URI: %s", agent, exc)
            continue
        if uri not in uris:
            uris.append(uri)
    if not uris:
        log.info("discovery %s resolved no broker", agent)
    return uris
