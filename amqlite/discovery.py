"""``discovery:`` URIs: find a group's brokers in the registry instead of naming them.

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

from urllib.parse import parse_qsl, urlencode

from amqlite.registry import ROLE_MASTER, Member, RegistryError, read_members

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


def order_services(members: list[Member]) -> list[str]:
    """Client URIs, the real master's first (highest epoch), then other
    masters', then slaves'; each URI once."""
    masters = sorted((m for m in members if m.role == ROLE_MASTER),
                     key=lambda m: (-(m.epoch if m.epoch is not None else -1), m.name))
    slaves = sorted((m for m in members if m.role != ROLE_MASTER), key=lambda m: m.name)
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


#: Agent schemes ``resolve_agent`` answers for (amqlite.client's resolver hook is keyed
#: by the agent's scheme).
AGENT_SCHEMES = ("zk", "postgresql", "postgres", "sqlite")


def resolve_agent(agent: str) -> list[str]:
    """``resolve`` for the text after ``discovery:`` (the client's resolver hook:
    ``register_discovery_resolver(resolve_agent, scheme)`` for each AGENT_SCHEMES)."""
    return resolve(SCHEME + agent)
