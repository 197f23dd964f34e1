"""Broker URLs of the amqlite client: ``tcp://``, ``failover:`` and ``discovery:``.

Pure parsing, no I/O, so every form and every error is unit-tested. The option names,
defaults and meanings are ActiveMQ's failover transport's (``FailoverTransport.java`` of
ActiveMQ 5.x), so an operator's existing URLs keep working:

``tcp://host:port[?inner options]`` (``stomp://`` is an alias)
    one broker, no reconnect (like ActiveMQ's plain tcp transport).
``ssl://host:port[?inner options]`` (``stomp+ssl://`` is an alias)
    the same over TLS, anywhere a tcp URI may stand (inside ``failover:``, from
    ``discovery:``, in cluster updates). Whom to trust and the client certificate are
    client arguments (``tls=ClientTls(...)``), not URI options.
``failover:(uri1,...,uriN)?options``, ``failover://(...)?options``
    reconnect across the listed brokers with the failover options below.
``failover:uri1,...,uriN``
    the same with default options; a ``?query`` here belongs to the last inner URI,
    exactly as in ActiveMQ (so ``failover:tcp://a:1?randomize=false`` is an error naming
    ``randomize`` as a failover option: write ``failover:(tcp://a:1)?randomize=false``).
``discovery:(agent)?options``, ``discovery:agent?options``
    ask a resolver (the hook in ``amqlite.client.discovery``; by default its registry
    lookup) for the group's current tcp URIs on every reconnect pass. Query parameters
    that are failover options (or ``nested.*``) configure the failover transport; the
    others stay with the agent (``discovery:zk://h:2181/amqlite?group=orders&randomize=false``
    asks the ZooKeeper registry about ``group=orders``), except names so close to a
    failover option that they are surely a typo, which are errors.

Inner (tcp) options: ``connectionTimeout`` (ms for TCP connect plus the STOMP handshake,
ActiveMQ's TcpTransport default 30000) and ``heartBeat`` (``cx,cy`` ms offered in CONNECT).
``nested.NAME=VALUE`` on a failover/discovery URL applies ``NAME=VALUE`` to every inner URI,
including URIs learned later (cluster updates, ``updateURIsURL``, discovery). As in
ActiveMQ, where the nested options are appended to the inner query, a nested value wins
over the inner URI's own.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import unquote, urlsplit

from amqlite.wire import DEFAULT_STOMP_PORT

__all__ = [
    "ACTIVEMQ_FAILOVER_DEFAULTS",
    "DEFAULT_CONNECTION_TIMEOUT_MS",
    "DEFAULT_HEARTBEAT_MS",
    "DEFAULT_INITIAL_RECONNECT_DELAY",
    "DEFAULT_STOMP_PORT",
    "BrokerURL",
    "FailoverOptions",
    "TcpOptions",
    "TcpURI",
    "URIError",
    "parse_broker_url",
    "parse_tcp_uri",
    "parse_uri_list",
]

# --- defaults (ActiveMQ 5.x FailoverTransport.java field initialisers) ------------------

#: FailoverTransport.DEFAULT_INITIAL_RECONNECT_DELAY.
DEFAULT_INITIAL_RECONNECT_DELAY = 10
#: ``maxReconnectDelay = 1000 * 30``.
DEFAULT_MAX_RECONNECT_DELAY = 30_000
#: ``backOffMultiplier = 2d`` (set through ``reconnectDelayExponent``).
DEFAULT_RECONNECT_DELAY_EXPONENT = 2.0
#: FailoverTransport.INFINITE: retry forever / wait forever.
INFINITE = -1
#: ``warnAfterReconnectAttempts = 10``.
DEFAULT_WARN_AFTER_RECONNECT_ATTEMPTS = 10
#: ``maxCacheSize = 128 * 1024`` bytes of tracked messages.
DEFAULT_MAX_CACHE_SIZE = 128 * 1024
#: ActiveMQ's TcpTransport ``connectionTimeout`` default (ms).
DEFAULT_CONNECTION_TIMEOUT_MS = 30_000
#: Heart-beats offered in CONNECT. ActiveMQ's InactivityMonitor drops a silent peer after
#: 30 s (``maxInactivityDuration=30000``); 10 s beats with the 2x grace of
#: ``amqlite.protocol`` notice a dead half-open connection in 20 s, and match the broker's
#: own default offer.
DEFAULT_HEARTBEAT_MS = (10_000, 10_000)

#: ``ssl://`` (ActiveMQ's name; ``stomp+ssl://`` is an alias) is STOMP over TLS: the server
#: certificate is verified and, unless the client is told otherwise, its hostname checked.
TLS_SCHEMES = ("ssl", "stomp+ssl")
TCP_SCHEMES = ("tcp", "stomp", *TLS_SCHEMES)


class URIError(ValueError):
    """A broker URL or one of its options is wrong; the message names the culprit."""


@dataclass(frozen=True, slots=True)
class TcpOptions:
    """Per-broker connection options (the inner URI's query, plus ``nested.*``)."""

    connection_timeout_ms: int = DEFAULT_CONNECTION_TIMEOUT_MS
    heartbeat_ms: tuple[int, int] = DEFAULT_HEARTBEAT_MS


@dataclass(frozen=True, slots=True)
class TcpURI:
    """One broker address. Equality and hashing use host and port only, like ActiveMQ's
    ``compareURIs``: the same broker reached with other options is the same broker."""

    host: str
    port: int
    scheme: str = "tcp"
    options: TcpOptions = field(default_factory=TcpOptions, compare=False)
    query: str = field(default="", compare=False)

    @property
    def tls(self) -> bool:
        return self.scheme in TLS_SCHEMES

    @property
    def key(self) -> tuple[str, int]:
        return (self.host.lower(), self.port)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TcpURI) and self.key == other.key

    def __hash__(self) -> int:
        return hash(self.key)

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"


@dataclass(frozen=True, slots=True)
class FailoverOptions:
    """ActiveMQ failover transport options; field comments give the query name."""

    initial_reconnect_delay: int = DEFAULT_INITIAL_RECONNECT_DELAY  # initialReconnectDelay
    max_reconnect_delay: int = DEFAULT_MAX_RECONNECT_DELAY  # maxReconnectDelay
    use_exponential_backoff: bool = True  # useExponentialBackOff
    reconnect_delay_exponent: float = DEFAULT_RECONNECT_DELAY_EXPONENT  # reconnectDelayExponent
    max_reconnect_attempts: int = INFINITE  # maxReconnectAttempts (0: never reconnect)
    startup_max_reconnect_attempts: int = INFINITE  # startupMaxReconnectAttempts
    randomize: bool = True  # randomize
    backup: bool = False  # backup: keep a warm standby connection
    timeout: int = INFINITE  # timeout (ms a send may wait for a connection, then fails)
    track_messages: bool = False  # trackMessages
    max_cache_size: int = DEFAULT_MAX_CACHE_SIZE  # maxCacheSize (bytes)
    update_uris_supported: bool = True  # updateURIsSupported
    update_uris_url: str | None = None  # updateURIsURL
    warn_after_reconnect_attempts: int = DEFAULT_WARN_AFTER_RECONNECT_ATTEMPTS
    reconnect_supported: bool = True  # reconnectSupported
    priority_backup: bool = False  # priorityBackup
    priority_uris: tuple[TcpURI, ...] = ()  # priorityURIs
    nested: tuple[tuple[str, str], ...] = ()  # nested.NAME=VALUE, in query order

    def nested_map(self) -> dict[str, str]:
        return dict(self.nested)


#: Query name -> (field name). The values ActiveMQ ships with, for tests and docs.
_FAILOVER_NAMES: dict[str, str] = {
    "initialReconnectDelay": "initial_reconnect_delay",
    "maxReconnectDelay": "max_reconnect_delay",
    "useExponentialBackOff": "use_exponential_backoff",
    "reconnectDelayExponent": "reconnect_delay_exponent",
    "maxReconnectAttempts": "max_reconnect_attempts",
    "startupMaxReconnectAttempts": "startup_max_reconnect_attempts",
    "randomize": "randomize",
    "backup": "backup",
    "timeout": "timeout",
    "trackMessages": "track_messages",
    "maxCacheSize": "max_cache_size",
    "updateURIsSupported": "update_uris_supported",
    "updateURIsURL": "update_uris_url",
    "warnAfterReconnectAttempts": "warn_after_reconnect_attempts",
    "reconnectSupported": "reconnect_supported",
    "priorityBackup": "priority_backup",
    "priorityURIs": "priority_uris",
}

#: ActiveMQ's defaults by query name (priorityURIs empty, updateURIsURL unset).
ACTIVEMQ_FAILOVER_DEFAULTS: dict[str, object] = {
    name: getattr(FailoverOptions(), attr) for name, attr in _FAILOVER_NAMES.items()
}

_TCP_NAMES: dict[str, str] = {
    "connectionTimeout": "connection_timeout_ms",
    "heartBeat": "heartbeat_ms",
}

# --- value parsers -----------------------------------------------------------------------


def _bool(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise ValueError("expected true or false")


def _int(minimum: int) -> Callable[[str], int]:
    def parse(value: str) -> int:
        try:
            number = int(value.strip())
        except ValueError:
            raise ValueError("expected an integer") from None
        if number < minimum:
            raise ValueError(f"must be >= {minimum}")
        return number

    return parse


def _positive_float(value: str) -> float:
    try:
        number = float(value.strip())
    except ValueError:
        raise ValueError("expected a number") from None
    if not number > 0 or number != number or number == float("inf"):
        raise ValueError("must be a positive number")
    return number


def _text(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty")
    return value.strip()


def _heartbeat(value: str) -> tuple[int, int]:
    parts = value.split(",")
    if len(parts) != 2:
        raise ValueError("expected 'cx,cy' in ms")
    try:
        cx, cy = int(parts[0]), int(parts[1])
    except ValueError:
        raise ValueError("expected 'cx,cy' in ms") from None
    if cx < 0 or cy < 0:
        raise ValueError("heart-beat values must be >= 0")
    return (cx, cy)


def _priority_uris(value: str) -> tuple[TcpURI, ...]:
    return tuple(parse_uri_list(value, what="priorityURIs"))


_FAILOVER_PARSERS: dict[str, Callable[[str], Any]] = {
    "initialReconnectDelay": _int(0),
    "maxReconnectDelay": _int(0),
    "useExponentialBackOff": _bool,
    "reconnectDelayExponent": _positive_float,
    "maxReconnectAttempts": _int(INFINITE),
    "startupMaxReconnectAttempts": _int(INFINITE),
    "randomize": _bool,
    "backup": _bool,
    "timeout": _int(INFINITE),
    "trackMessages": _bool,
    "maxCacheSize": _int(0),
    "updateURIsSupported": _bool,
    "updateURIsURL": _text,
    "warnAfterReconnectAttempts": _int(INFINITE),
    "reconnectSupported": _bool,
    "priorityBackup": _bool,
    "priorityURIs": _priority_uris,
}

_TCP_PARSERS: dict[str, Callable[[str], Any]] = {
    "connectionTimeout": _int(1),
    "heartBeat": _heartbeat,
}

# --- helpers -----------------------------------------------------------------------------


def _unknown(name: str, known: Iterable[str], where: str, hint: str = "") -> URIError:
    known = sorted(known)
    close = difflib.get_close_matches(name, known, n=1)
    if not close:
        close = [k for k in known if k.lower() == name.lower()]
    suggestion = f" (did you mean {close[0]!r}?)" if close else ""
    listed = ", ".join(known)
    return URIError(f"unknown {where} option {name!r}{suggestion}{hint}; known: {listed}")


def _split_query(query: str, where: str) -> list[tuple[str, str]]:
    """``a=1&b=2`` -> pairs, percent-decoded; a malformed or repeated pair is an error."""
    pairs: list[tuple[str, str]] = []
    seen: set[str] = set()
    if not query:
        return pairs
    for part in query.split("&"):
        if not part:
            continue
        name, sep, value = part.partition("=")
        name = unquote(name).strip()
        if not sep or not name:
            raise URIError(f"malformed option {part!r} in {where}: expected NAME=VALUE")
        if name in seen:
            raise URIError(f"option {name!r} given twice in {where}")
        seen.add(name)
        pairs.append((name, unquote(value)))
    return pairs


def _split_top_level(text: str) -> list[str]:
    """Split on commas outside parentheses (inner URIs may not nest, but say so clearly)."""
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return [p.strip() for p in parts]


def _tcp_options(pairs: Iterable[tuple[str, str]], where: str) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name, raw in pairs:
        if name not in _TCP_PARSERS:
            hint = ""
            if name in _FAILOVER_PARSERS:
                hint = f" ({name} is a failover option: put it after failover:(...)?)"
            raise _unknown(name, _TCP_PARSERS, f"tcp ({where})", hint)
        try:
            values[_TCP_NAMES[name]] = _TCP_PARSERS[name](raw)
        except ValueError as exc:
            raise URIError(f"bad value {raw!r} for option {name} in {where}: {exc}") from None
    return values


# --- public parsers ----------------------------------------------------------------------


def parse_tcp_uri(text: str, nested: Mapping[str, str] | None = None) -> TcpURI:
    """One ``tcp://host[:port][?options]`` URI; ``nested`` options override its own."""
    raw = text.strip()
    if not raw:
        raise URIError("empty broker URI")
    if raw.lower().startswith(("failover:", "discovery:")):
        raise URIError(f"broker URI {raw!r}: failover:/discovery: URIs cannot be nested")
    scheme, sep, _ = raw.partition("://")
    if not sep:
        raise URIError(f"broker URI {raw!r}: expected tcp://host:port")
    if scheme.lower() not in TCP_SCHEMES:
        raise URIError(
            f"broker URI {raw!r}: unsupported scheme {scheme!r} (use tcp://, stomp:// or ssl://)"
        )
    try:
        parts = urlsplit(raw)
        port = parts.port
    except ValueError as exc:
        raise URIError(f"broker URI {raw!r}: {exc}") from None
    host = parts.hostname
    if not host:
        raise URIError(f"broker URI {raw!r}: no host")
    if parts.path not in ("", "/") or parts.fragment or parts.username or parts.password:
        raise URIError(
            f"broker URI {raw!r}: only tcp://host:port[?options] is allowed "
            "(give login and passcode to the client, not in the URI)"
        )
    options = _tcp_options(_split_query(parts.query, raw), raw)
    if nested:
        options.update(_tcp_options(nested.items(), f"nested options of {raw}"))
    return TcpURI(
        host=host,
        port=port if port is not None else DEFAULT_STOMP_PORT,
        scheme=scheme.lower(),
        options=TcpOptions(**options),
        query=parts.query,
    )


def parse_uri_list(
    text: str, nested: Mapping[str, str] | None = None, *, what: str = "URI list"
) -> list[TcpURI]:
    """Comma- (or whitespace-) separated tcp URIs, e.g. an updateURIsURL file or a cluster
    update; duplicates (same host and port) are dropped, order is kept."""
    result: list[TcpURI] = []
    for chunk in text.replace("\n", ",").replace(" ", ",").split(","):
        if chunk.strip():
            uri = parse_tcp_uri(chunk, nested)
            if uri not in result:
                result.append(uri)
    if not result:
        raise URIError(f"{what}: no URI in {text!r}")
    return result


@dataclass(frozen=True, slots=True)
class BrokerURL:
    """A parsed broker URL: where to connect and how to fail over."""

    text: str
    kind: Literal["tcp", "failover", "discovery"]
    uris: tuple[TcpURI, ...]
    options: FailoverOptions
    #: The discovery agent (what the resolver is asked about), for ``discovery:`` URLs.
    discovery: str | None = None

    def with_options(self, **changes: Any) -> BrokerURL:
        return dataclasses.replace(self, options=dataclasses.replace(self.options, **changes))


def _split_discovery_query(query: str, where: str) -> tuple[str, str]:
    """Discovery query -> (failover part, agent part), raw text kept for the agent."""
    ours: list[str] = []
    agents: list[str] = []
    for part in query.split("&"):
        if not part:
            continue
        name = unquote(part.partition("=")[0]).strip()
        if name in _FAILOVER_PARSERS or name.startswith("nested."):
            ours.append(part)
        elif difflib.get_close_matches(name, _FAILOVER_PARSERS, n=1, cutoff=0.8):
            raise _unknown(name, _FAILOVER_PARSERS, f"failover ({where})")
        else:
            agents.append(part)
    return "&".join(ours), "&".join(agents)


def _failover_options(query: str, where: str) -> FailoverOptions:
    values: dict[str, Any] = {}
    nested: list[tuple[str, str]] = []
    for name, raw in _split_query(query, where):
        if name.startswith("nested."):
            inner = name[len("nested."):]
            # Validate now so a typo fails at parse time, not at the first reconnect.
            _tcp_options([(inner, raw)], f"{where} ({name})")
            nested.append((inner, raw))
            continue
        if name not in _FAILOVER_PARSERS:
            hint = ""
            if name in _TCP_PARSERS:
                hint = f" ({name} is a tcp option: use nested.{name} or put it on each URI)"
            raise _unknown(name, _FAILOVER_PARSERS, "failover", hint)
        try:
            values[_FAILOVER_NAMES[name]] = _FAILOVER_PARSERS[name](raw)
        except (ValueError, URIError) as exc:
            raise URIError(f"bad value {raw!r} for failover option {name}: {exc}") from None
    options = FailoverOptions(**values, nested=tuple(nested))
    if options.priority_uris and options.nested:
        nested_map = options.nested_map()
        options = dataclasses.replace(
            options,
            priority_uris=tuple(
                parse_tcp_uri(_raw_text(u), nested_map) for u in options.priority_uris
            ),
        )
    return options


def _raw_text(uri: TcpURI) -> str:
    return f"{uri}?{uri.query}" if uri.query else str(uri)


def _split_composite(body: str, scheme: str, text: str) -> tuple[str, str]:
    """``(a,b)?q`` -> (``a,b``, ``q``); ``a,b`` -> (``a,b``, ``""``)."""
    if body.startswith("//("):
        body = body[2:]
    if not body.startswith("("):
        return body, ""
    depth = 0
    for index, char in enumerate(body):
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth == 0:
                rest = body[index + 1:].strip()
                if rest and not rest.startswith("?"):
                    raise URIError(
                        f"{scheme} URL {text!r}: unexpected {rest!r} after ')'; "
                        "options follow as ?name=value&..."
                    )
                return body[1:index], rest[1:]
    raise URIError(f"{scheme} URL {text!r}: unbalanced parentheses")


def parse_broker_url(text: str) -> BrokerURL:
    """Parse any broker URL the client accepts; raise URIError naming what is wrong."""
    if not isinstance(text, str) or not text.strip():
        raise URIError("empty broker URL")
    raw = text.strip()
    scheme, colon, body = raw.partition(":")
    scheme = scheme.lower()
    if not colon:
        raise URIError(f"broker URL {raw!r}: expected tcp://, failover: or discovery:")
    if scheme in TCP_SCHEMES:
        uri = parse_tcp_uri(raw)
        # Plain tcp: one pass over one URI and no reconnect, as ActiveMQ's tcp transport.
        options = FailoverOptions(
            max_reconnect_attempts=0, startup_max_reconnect_attempts=0, randomize=False
        )
        return BrokerURL(raw, "tcp", (uri,), options)
    if scheme == "failover":
        inner, query = _split_composite(body, "failover", raw)
        options = _failover_options(query, raw)
        nested = options.nested_map()
        uris: list[TcpURI] = []
        for part in _split_top_level(inner):
            if not part:
                raise URIError(f"failover URL {raw!r}: empty URI in the list")
            if part.startswith("("):
                raise URIError(f"failover URL {raw!r}: nested parentheses in {part!r}")
            uri = parse_tcp_uri(part, nested)
            if uri not in uris:
                uris.append(uri)
        return BrokerURL(raw, "failover", tuple(uris), options)
    if scheme == "discovery":
        if body.startswith("//("):
            body = body[2:]
        if body.startswith("("):
            agent, query = _split_composite(body, "discovery", raw)
        else:
            agent, _, query = body.partition("?")
        agent = agent.strip()
        if not agent:
            raise URIError(f"discovery URL {raw!r}: no discovery agent (discovery:AGENT)")
        query, agent_query = _split_discovery_query(query, raw)
        if agent_query:
            agent += ("&" if "?" in agent else "?") + agent_query
        return BrokerURL(raw, "discovery", (), _failover_options(query, raw), discovery=agent)
    raise URIError(
        f"broker URL {raw!r}: unsupported scheme {scheme!r} "
        "(use tcp://, ssl://, failover: or discovery:)"
    )
