"""Every knob of a broker node, its default, and where the default comes from.

Precedence, highest first: command-line option, ``AMQLITE_<NAME>`` environment
variable, ``--config FILE`` (TOML, keys are the field names below, optionally
under a ``[broker]`` table), then the defaults here. Every field is all three: the
options of ``amqlite start`` are made from the fields (``--kebab-case``, booleans
``--x/--no-x``), their help and origin texts from each field's metadata (``doc``).

Settings are checked here, once, whatever their source: ``Settings.resolved`` checks
each value against its domain (``Domain`` in the field's metadata, then the rules
between fields); ``load_settings`` also parses the store and locker URLs with those
backends' own parsers, and ``read_settings`` names the settings that were given but do
not apply to the chosen store or locker. A bad value is one ``SettingsError`` line.
"""

from __future__ import annotations

import dataclasses
import os
import re
import socket
import ssl
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from amqlite.codec import (
    DEFAULT_MAX_FRAME_SIZE,
    DEFAULT_MAX_HEADER_COUNT,
    DEFAULT_MAX_HEADER_LENGTH,
    ProtocolError,
)
from amqlite.hosts import is_loopback
from amqlite.policy import DestinationPolicy, Policies, PolicyEntry, PolicyError, take_policies
from amqlite.protocol import MAX_HEARTBEAT_MS, parse_heartbeat
from amqlite.setting_domains import (
    BYTES,
    COUNT,
    COUNT_OR_ZERO,
    LEASE,
    LEVEL,
    LOG_LEVELS,
    NAME,
    PREFETCH,
    SECONDS,
    SECONDS_OR_ZERO,
    Domain,
    described,
)
from amqlite.tls import TlsError, check_pair, server_context
from amqlite.wire import DEFAULT_STOMP_PORT, DEFAULT_WS_PORT, DEFAULT_WSS_PORT, WS_PATH
from lockers import DEFAULT_KEEPALIVE_INTERVAL, DEFAULT_POLL_INTERVAL, GROUP_NAME

#: Listen on loopback unless told otherwise: security by default.
DEFAULT_BIND = f"127.0.0.1:{DEFAULT_STOMP_PORT}"
#: A bound on sockets so a connection flood cannot exhaust file descriptors.
#: ActiveMQ's transport default maximumConnections is 1000.
DEFAULT_MAX_CONNECTIONS = 1000
#: A socket must complete the handshake (CONNECT sent, login checked, CONNECTED back) this
#: soon or it is closed: RabbitMQ's handshake_timeout is 10 s (ActiveMQ waits 30 s, which
#: lets a socket flood hold slots three times as long for no benefit to real clients).
DEFAULT_CONNECT_TIMEOUT = 10.0
#: A frame that has started arriving must be complete this soon, whatever the heart-beat:
#: a client trickling a byte a second is closed. 60 s is nginx's client_header_timeout and
#: client_body_timeout; a max_frame_size frame (10 MiB) then needs ~175 KB/s.
DEFAULT_FRAME_TIMEOUT = 60.0
#: Bytes a socket may have buffered before it gets CONNECTED: a CONNECT still arriving, or
#: frames pipelined behind one whose login is being checked. A CONNECT is a few hundred
#: bytes; 64 KiB leaves room for long bearer-token passcodes and is the top of the range
#: brokers use for the handshake (AMQP's pre-tune frame_min_size is 4 KiB, RabbitMQ's
#: handshake frames stay well below 64 KiB).
DEFAULT_MAX_HANDSHAKE_BYTES = 64 * 1024
#: Sockets that have not authenticated yet, as a share of max_connections: a flood of
#: sockets that never log in cannot take every slot from clients that reconnect.
UNAUTHENTICATED_SHARE = 4  # a quarter

#: ActiveMQ's RedeliveryPolicy.maximumRedeliveries default.
DEFAULT_MAX_REDELIVERIES = 6
#: ActiveMQ's shared dead-letter queue is ActiveMQ.DLQ; ours is a STOMP name.
DEFAULT_DLQ = "/queue/DLQ"
#: ActiveMQ's default queue prefetch for STOMP subscriptions.
DEFAULT_PREFETCH = 1000
#: Server heart-beat offered in CONNECTED ("can send every, want every", ms).
#: 10 s both ways is what stomp.py examples and RabbitMQ commonly use.
DEFAULT_HEARTBEAT = (10_000, 10_000)
#: How long a producer identity is remembered after its message was stored.
#: Re-sends after a failover come within seconds; 10 minutes leaves margin
#: for a client that was partitioned for a while (Artemis keeps 20 000 ids per
#: address instead; a time window does not depend on the traffic rate).
DEFAULT_DEDUP_WINDOW = 600.0
#: Bytes of messages the broker keeps waiting in memory before it pauses
#: producers of non-persistent messages and leaves persistent ones in the
#: store. A small VM (1 GiB) runs the broker beside its OS and more: RabbitMQ's
#: vm_memory_high_watermark (0.4 of RAM) would give ~400 MB, ActiveMQ's
#: memoryUsage on small configs is 64 MB; 256 MiB sits between and leaves a
#: 1 GiB VM room for Python itself (~60 MB) and in-flight deliveries.
DEFAULT_MAX_MEMORY = 256 * 1024 * 1024
#: The same, per destination (queue, durable subscription, or slow non-durable
#: topic subscriber): one stalled destination may take a quarter of the budget,
#: so it cannot starve the others (ActiveMQ's per-destination memoryLimit).
DEFAULT_MAX_DESTINATION_MEMORY = 64 * 1024 * 1024
#: How often a master checkpoints housekeeping (reap expired, prune dedup).
DEFAULT_HOUSEKEEPING_INTERVAL = 5.0
#: No bound on the wait for the store/locker at start (see Settings.start_timeout).
DEFAULT_START_TIMEOUT = 0.0
#: ``http_bind`` value meaning "no HTTP listener".
HTTP_OFF = "off"
#: ``bind`` value meaning "no plain-text STOMP listener" (only ``ssl_bind``).
BIND_OFF = "off"
#: STOMP over TLS: ActiveMQ's ``stomp+ssl`` connector port.
DEFAULT_SSL_PORT = 61612


def default_data_dir(group: str) -> Path:
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(Path.home(), ".local", "share")
    return Path(base) / "amqlite" / group


def default_node_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class SettingsError(ValueError):
    """A setting has a value we cannot use; the message names it (``setting``: which)."""

    def __init__(self, message: str, setting: str = "") -> None:
        super().__init__(message)
        self.setting = setting


def _destination_ok(value: str) -> bool:
    from amqlite.validation import BrokerError, check_destination, is_temporary

    try:
        check_destination(value)
    except BrokerError:
        return False
    return not is_temporary(value)  # a connection's, never stored


DESTINATION = described("a destination /queue/NAME or /topic/NAME", _destination_ok)

#: Keys of a field's metadata (see ``doc``). ``FILE_ONLY``: a field only the config file
#: sets (tables, not one value): no option, no environment variable.
HELP, ORIGIN, DOMAIN, METAVAR, DERIVED = "help", "origin", "domain", "metavar", "derived"
FILE_ONLY = "file_only"


def doc(text: str, origin: str = "", *, domain: Domain | None = None, metavar: str = "",
        derived: str = "") -> dict[str, Any]:
    """A field's metadata: ``text`` says what it does, ``origin`` where its default comes
    from, ``domain`` what it may be (checked by ``resolved``), ``metavar`` its value in
    ``--help``, ``derived`` the default when it is computed from other settings."""
    return {HELP: text, ORIGIN: origin, DOMAIN: domain, METAVAR: metavar, DERIVED: derived}


@dataclass
class Settings:
    group: str = field(default="default", metadata=doc(
        "Broker group: nodes of one group share one store and one lock."))
    name: str = field(default_factory=default_node_name, metadata=doc(
        "This node's name in logs, the lock and the registry.", domain=NAME,
        derived="HOST-PID"))
    data_dir: str = field(default="", metadata=doc(
        "Data directory of the embedded store, the lock file and pid files.",
        metavar="DIR", derived="$XDG_DATA_HOME/amqlite/GROUP (~/.local/share/amqlite/GROUP)"))
    store: str = field(default="", metadata=doc(
        "Store URL: sqlite:///PATH or postgresql://USER@HOST/DB.", metavar="URL",
        derived="sqlite:///DATA_DIR/amqlite.db"))
    locker: str = field(default="", metadata=doc(
        "Locker URL: file:///PATH, postgresql://... or zk://HOST:PORT[/ROOT].",
        metavar="URL", derived="file://DATA_DIR/amqlite.lock"))
    bind: str = field(default=DEFAULT_BIND, metadata=doc(
        "STOMP listener HOST:PORT, or 'off' (then --ssl-bind is the only listener).",
        "loopback unless told otherwise; 61613 is STOMP's IANA port (amqlite/wire.py)",
        metavar="HOST:PORT"))
    ssl_bind: str = field(default="", metadata=doc(
        "STOMP over TLS listener HOST:PORT (ssl:// URIs); needs --ssl-cert and --ssl-key.",
        f"a port left out is {DEFAULT_SSL_PORT}, ActiveMQ's stomp+ssl port",
        metavar="HOST:PORT", derived="none"))
    ssl_cert: str = field(default="", metadata=doc(
        "PEM certificate (chain) of the TLS listeners.", metavar="FILE", derived="none"))
    ssl_key: str = field(default="", metadata=doc(
        "PEM private key of --ssl-cert.", metavar="FILE", derived="none"))
    ssl_ca: str = field(default="", metadata=doc(
        "PEM CA certificates: TLS clients must present a certificate one signed.",
        metavar="FILE", derived="none"))
    ws_bind: str = field(default="", metadata=doc(
        f"STOMP over WebSocket listener HOST:PORT (ws://HOST:PORT{WS_PATH}).",
        f"a port left out is {DEFAULT_WS_PORT}, RabbitMQ Web-STOMP's", metavar="HOST:PORT",
        derived="none"))
    wss_bind: str = field(default="", metadata=doc(
        f"STOMP over secure WebSocket listener HOST:PORT (wss://HOST:PORT{WS_PATH}); needs "
        "--ssl-cert and --ssl-key.", f"a port left out is {DEFAULT_WSS_PORT}, RabbitMQ "
        "Web-STOMP's TLS port", metavar="HOST:PORT", derived="none"))
    ws_allowed_origins: str = field(default="", metadata=doc(
        "Origins (scheme://host:port) whose pages may open a WebSocket, comma-separated, "
        "or '*' for any; others get 403 (cross-site WebSocket hijacking defence).",
        metavar="ORIGINS", derived="the management console's own origin"))
    http_ssl: bool = field(default=True, metadata=doc(
        "With --ssl-cert, serve the management API over HTTPS with the same certificate "
        "settings (--ssl-ca included); off keeps it plain HTTP."))
    advertise: str = field(default="", metadata=doc(
        "URIs clients should use to reach this node (registry, cluster-list), "
        "comma-separated.", metavar="URIS",
        derived="tcp://BIND and ssl://SSL_BIND of the listeners that are on"))
    rejoin: bool = field(default=False, metadata=doc(
        "After losing mastership, wait as slave again instead of exiting (exit code 3)."))
    lock_poll_interval: float = field(default=DEFAULT_POLL_INTERVAL, metadata=doc(
        "Seconds between a slave's tries for the file lock (the other lockers wait on "
        "their server).", "an Artemis backup retries every 500 ms (lockers/base.py)",
        domain=SECONDS))
    lock_keepalive: float = field(default=DEFAULT_KEEPALIVE_INTERVAL, metadata=doc(
        "Seconds between a master's checks that it still holds the lock.",
        "Artemis checks every 2 s; ours is one cheap query (lockers/base.py)",
        domain=SECONDS))
    zk_session_timeout: float = field(default=4.0, metadata=doc(
        "ZooKeeper locker: seconds a crashed or paused master keeps the lock.",
        "ZK_SESSION_TIMEOUT, lockers/zookeeper.py: the least a stock server grants",
        domain=SECONDS))
    lock_lease: float = field(default=3.0, metadata=doc(
        "PostgreSQL locker: seconds a paused master keeps the lock before a slave ends "
        "its session; 0: no lease.",
        "PG_LEASE, lockers/pg_lease.py: renewed every second, takeover within 5 s",
        domain=LEASE))
    max_connections: int = field(default=DEFAULT_MAX_CONNECTIONS, metadata=doc(
        "Open sockets; past it new ones get an ERROR and are closed.",
        "ActiveMQ's transport maximumConnections", domain=COUNT))
    max_unauthenticated: int = field(default=0, metadata=doc(
        "Sockets not logged in yet; past it one gets ERROR 'server busy' (docs/limits.md). "
        "0: the derived default.", domain=COUNT_OR_ZERO,
        derived=f"max_connections / {UNAUTHENTICATED_SHARE}"))
    connect_timeout: float = field(default=DEFAULT_CONNECT_TIMEOUT, metadata=doc(
        "Seconds a socket has to CONNECT and be answered.", "RabbitMQ's handshake_timeout",
        domain=SECONDS))
    frame_timeout: float = field(default=DEFAULT_FRAME_TIMEOUT, metadata=doc(
        "Seconds a frame has to complete after its first byte, whatever the heart-beat.",
        "nginx's client_header_timeout and client_body_timeout", domain=SECONDS))
    max_handshake_bytes: int = field(default=DEFAULT_MAX_HANDSHAKE_BYTES, metadata=doc(
        "Bytes a socket may have buffered before it gets CONNECTED.",
        "room for long bearer-token passcodes, the top of brokers' handshake range",
        domain=BYTES, metavar="BYTES"))
    max_frame_size: int = field(default=DEFAULT_MAX_FRAME_SIZE, metadata=doc(
        "Bytes of one frame; a bigger one gets an ERROR and the socket is closed.",
        "ActiveMQ allows 100 MB; a CPython frame is held several times over "
        "(amqlite/codec.py)", domain=BYTES, metavar="BYTES"))
    max_header_count: int = field(default=DEFAULT_MAX_HEADER_COUNT, metadata=doc(
        "Headers of one frame.", "ActiveMQ's StompWireFormat.MAX_HEADERS", domain=COUNT))
    max_header_length: int = field(default=DEFAULT_MAX_HEADER_LENGTH, metadata=doc(
        "Bytes of one 'name:value' header line.",
        "ActiveMQ's StompWireFormat.MAX_HEADER_LENGTH", domain=BYTES, metavar="BYTES"))
    heartbeat: str = field(default=f"{DEFAULT_HEARTBEAT[0]},{DEFAULT_HEARTBEAT[1]}", metadata=doc(
        "Server heart-beat offer 'send_ms,expect_ms'; silent clients are dropped after 2x.",
        "what stomp.py examples and RabbitMQ commonly use", metavar="MS,MS"))
    max_redeliveries: int = field(default=DEFAULT_MAX_REDELIVERIES, metadata=doc(
        "Redeliveries of a message before it goes to --dead-letter-queue.",
        "ActiveMQ's RedeliveryPolicy.maximumRedeliveries", domain=COUNT_OR_ZERO))
    dead_letter_queue: str = field(default=DEFAULT_DLQ, metadata=doc(
        "Where messages past --max-redeliveries go.", "ActiveMQ's ActiveMQ.DLQ as a STOMP "
        "name", domain=DESTINATION, metavar="DESTINATION"))
    default_prefetch: int = field(default=DEFAULT_PREFETCH, metadata=doc(
        "Unacked messages per client-ack subscription that asks for none "
        "(activemq.prefetchSize).", "ActiveMQ's queue prefetch for STOMP", domain=PREFETCH))
    max_memory: int = field(default=DEFAULT_MAX_MEMORY, metadata=doc(
        "Bytes of messages waiting in memory, broker-wide; past it producers are paused "
        "and persistent messages stay in the store.", "between RabbitMQ's 0.4 of a 1 GiB "
        "VM and ActiveMQ's 64 MB memoryUsage", domain=BYTES, metavar="BYTES"))
    max_destination_memory: int = field(default=DEFAULT_MAX_DESTINATION_MEMORY, metadata=doc(
        "The same per destination.", "a quarter of max_memory (ActiveMQ's per-destination "
        "memoryLimit)", domain=BYTES, metavar="BYTES"))
    dedup_window: float = field(default=DEFAULT_DEDUP_WINDOW, metadata=doc(
        "Seconds a producer identity is remembered after its message was stored.",
        "re-sends after a failover come within seconds; 10 minutes leaves margin",
        domain=SECONDS_OR_ZERO))
    housekeeping_interval: float = field(default=DEFAULT_HOUSEKEEPING_INTERVAL, metadata=doc(
        "Seconds between a master's housekeeping rounds (reap expired, prune dedup).",
        domain=SECONDS))
    gc_inactive_destinations: float = field(default=0.0, metadata=doc(
        "Seconds a queue may go without consumers, messages or SENDs before it is "
        "deleted; 0: never.", "off, as ActiveMQ's gcInactiveDestinations "
        "(inactiveTimoutBeforeGC)", domain=SECONDS_OR_ZERO, derived="0 (off)"))
    users_file: str = field(default="", metadata=doc(
        "TOML users file of hashed passwords; when set, CONNECT must authenticate.",
        metavar="FILE", derived="none: no authentication"))
    http_bind: str = field(default="", metadata=doc(
        "Management HTTP listener HOST:PORT, or 'off'.", metavar="HOST:PORT",
        derived="127.0.0.1:8161 + (STOMP port - 61613), or the next free port"))
    http_allow_remote: bool = field(default=False, metadata=doc(
        "Let the management API listen beyond loopback without a users file."))
    allow_anonymous_remote: bool = field(default=False, metadata=doc(
        "Let STOMP (bind, ssl_bind) listen beyond loopback without a users file: anyone "
        "who reaches the port may send and read everything."))
    http_allowed_hosts: str = field(default="", metadata=doc(
        "Host names the management API answers to besides its bind address (and "
        "localhost on loopback), comma-separated; other Host headers get 421 (DNS "
        "rebinding defence).", metavar="NAMES",
        derived="none: the bind address, loopback names, the node's own name"))
    metrics_login: str = field(default="", metadata=doc(
        "A login of the users file that may read /metrics without being an "
        "administrator (a Prometheus scrape login).", metavar="LOGIN",
        derived="none: administrators only"))
    metrics_token_file: str = field(default="", metadata=doc(
        "File holding a bearer token that may read /metrics (Authorization: Bearer; "
        "Prometheus' bearer_token_file).", metavar="FILE",
        derived="none: administrators only"))
    log_level: str = field(default="INFO", metadata=doc(
        "Log level.", domain=LEVEL, metavar="|".join(LOG_LEVELS)))
    start_timeout: float = field(default=DEFAULT_START_TIMEOUT, metadata=doc(
        "Seconds a starting node waits for its store and locker to become reachable; "
        "0 waits for ever.", "ActiveMQ's JDBC store waits for ever", domain=SECONDS_OR_ZERO,
        derived="0 (for ever)"))
    allow_fsync_off: bool = field(default=False, metadata=doc(
        "Accept a PostgreSQL store whose server runs with fsync = off (a crash can lose "
        "RECEIPTed messages): throwaway test setups only."))
    allow_async_replication: bool = field(default=False, metadata=doc(
        "Serve from a PostgreSQL store with standbys but none synchronous, or whose commits "
        "do not wait for it (a promoted standby can lack RECEIPTed messages)."))
    update_cluster_clients: bool = field(default=False, metadata=doc(
        "Tell clients the group's URIs (ActiveMQ's updateClusterClients)."))
    rebalance_cluster_clients: bool = field(default=False, metadata=doc(
        "With --update-cluster-clients, ask clients to rebalance (rebalanceClusterClients)."))
    update_cluster_clients_on_remove: bool = field(default=False, metadata=doc(
        "With --update-cluster-clients, tell clients when a node goes too "
        "(updateClusterClientsOnRemove)."))
    update_cluster_filter: str = field(default="", metadata=doc(
        "With --update-cluster-clients, a regular expression of the node names to tell "
        "clients about (updateClusterFilter).", metavar="REGEX", derived="all nodes"))
    policies: tuple[PolicyEntry, ...] = field(default=(), metadata={
        HELP: "[[policy]] tables of the config file (amqlite.policy)", FILE_ONLY: True})

    # -- derived ----------------------------------------------------------
    def destination_policies(self) -> Policies:
        """The per-destination policies, the broker-wide settings as their defaults."""
        defaults = DestinationPolicy(dead_letter_queue=self.dead_letter_queue,
                                     max_redeliveries=self.max_redeliveries)
        return Policies(self.policies, defaults)

    @property
    def plain_enabled(self) -> bool:
        return self.bind.strip().lower() != BIND_OFF

    @property
    def bind_address(self) -> tuple[str, int]:
        """The plain listener's address; with ``bind = off`` the TLS one's, so what
        derives from "the STOMP port" (the HTTP port, logs) still has one."""
        if not self.plain_enabled and self.ssl_bind:
            return parse_bind(self.ssl_bind, DEFAULT_SSL_PORT)
        return parse_bind(self.bind)

    @property
    def ssl_address(self) -> tuple[str, int] | None:
        return parse_bind(self.ssl_bind, DEFAULT_SSL_PORT) if self.ssl_bind else None

    @property
    def ws_listeners(self) -> list[tuple[str, tuple[str, int]]]:
        """(scheme, address) of the WebSocket listeners that are on: ws and/or wss."""
        return [(scheme, parse_bind(bind, port, f"--{scheme}-bind"))
                for scheme, bind, port in (("ws", self.ws_bind, DEFAULT_WS_PORT),
                                           ("wss", self.wss_bind, DEFAULT_WSS_PORT)) if bind]

    @property
    def websocket_uris(self) -> list[str]:
        """The URLs a page opens to reach this node's WebSocket listeners (registry,
        cluster-list, CONNECTED's cluster header); a wildcard bind names the host."""
        return [f"{scheme}://{_shown_host(host)}:{port}{WS_PATH}"
                for scheme, (host, port) in self.ws_listeners]

    @property
    def advertise_uris(self) -> list[str]:
        return [u.strip() for u in self.advertise.split(",") if u.strip()]

    def ssl_context(self) -> ssl.SSLContext:
        """The listeners' TLS context (ssl_cert, ssl_key, ssl_ca); SettingsError when a
        file is unreadable, expired or does not match its key."""
        try:
            return server_context(self.ssl_cert, self.ssl_key, self.ssl_ca)
        except TlsError as e:
            raise SettingsError(str(e)) from None

    @property
    def heartbeat_ms(self) -> tuple[int, int]:
        """``heartbeat`` parsed as a CONNECT ``heart-beat`` header is (one parser)."""
        try:
            return parse_heartbeat(self.heartbeat)
        except ProtocolError:
            raise SettingsError(
                f"heartbeat: expected 'send_ms,expect_ms', two integers in "
                f"0..{MAX_HEARTBEAT_MS}, got {self.heartbeat!r}", "heartbeat"
            ) from None

    def resolved(self) -> Settings:
        """Fill the defaults that depend on other settings and validate."""
        s = dataclasses.replace(self)
        if not GROUP_NAME.fullmatch(s.group):
            raise SettingsError(f"group: invalid group name {s.group!r}: use letters, "
                                "digits, '.', '_' and '-' (at most 100)", "group")
        if not s.data_dir:
            s.data_dir = str(default_data_dir(s.group))
        if not s.store:
            s.store = f"sqlite:///{Path(s.data_dir).resolve() / 'amqlite.db'}"
        if not s.locker:
            s.locker = f"file://{Path(s.data_dir).resolve() / 'amqlite.lock'}"
        for f in dataclasses.fields(s):
            domain: Domain | None = f.metadata.get(DOMAIN)
            value = getattr(s, f.name)
            if domain is not None and not domain.accepts(value):
                raise SettingsError(f"{f.name}: must be {domain.must_be()}, got {value!r}",
                                    f.name)
        s.log_level = s.log_level.upper()
        if not s.plain_enabled and not s.ssl_bind:
            raise SettingsError("bind = off needs ssl_bind: a broker needs one listener")
        try:
            check_pair(s.ssl_cert, s.ssl_key, "--ssl-cert (ssl_cert)", "--ssl-key (ssl_key)")
        except TlsError as e:
            raise SettingsError(str(e)) from None
        if (s.ssl_bind or s.wss_bind or s.ssl_ca) and not s.ssl_cert:
            raise SettingsError("TLS needs both ssl_cert and ssl_key (--ssl-cert, --ssl-key)")
        if s.ssl_cert:
            s.ssl_context()  # a bad file stops the start here, in one line
        listeners = []
        if s.plain_enabled:
            listeners.append(("tcp", parse_bind(s.bind)))
        if s.ssl_bind:
            listeners.append(("ssl", parse_bind(s.ssl_bind, DEFAULT_SSL_PORT, "--ssl-bind")))
        for scheme, (host, port) in [*listeners, *s.ws_listeners]:
            option = {"tcp": "bind", "ssl": "ssl_bind"}.get(scheme, f"{scheme}_bind")
            if port == 0:  # any free port: nothing a client or the registry could name
                raise SettingsError(f"{option}: port 0 is no address clients can use", option)
            # As http_bind below: no logins (a client certificate is one) stays on loopback.
            anonymous = not s.users_file and not (scheme in ("ssl", "wss") and s.ssl_ca)
            if anonymous and not s.allow_anonymous_remote and not is_loopback(host):
                raise SettingsError(
                    f"{option} {getattr(s, option)}: without a users_file STOMP stays on "
                    "loopback; set allow_anonymous_remote = true to expose it anyway", option)
        s.heartbeat_ms  # noqa: B018 - a bad value stops the start here
        if not s.advertise:
            uris = []
            for scheme, (host, port) in listeners:
                uris.append(f"{scheme}://{_shown_host(host)}:{port}")
            s.advertise = ",".join(uris)
        check_advertise(s.advertise_uris)
        if s.ws_allowed_origins:
            from amqlite.websocket import OriginError, parse_origins

            try:
                parse_origins(s.ws_allowed_origins)
            except OriginError as e:
                raise SettingsError(f"ws_allowed_origins: {e}", "ws_allowed_origins") from None
        if s.max_unauthenticated == 0:
            s.max_unauthenticated = default_max_unauthenticated(s.max_connections)
        if not 0 < s.max_unauthenticated <= s.max_connections:
            raise SettingsError("max_unauthenticated: must be between 1 and max_connections",
                                "max_unauthenticated")
        if s.update_cluster_filter:
            try:
                re.compile(s.update_cluster_filter)
            except re.error as e:
                raise SettingsError(f"update_cluster_filter: not a regular expression: {e}",
                                    "update_cluster_filter") from None
        if s.http_bind and s.http_bind.lower() != HTTP_OFF:
            if ":" not in s.http_bind:
                raise SettingsError(f"http_bind: expected HOST:PORT or off, got {s.http_bind!r}",
                                    "http_bind")
            host, _ = parse_bind(s.http_bind, option="http_bind")
            if not s.users_file and not s.http_allow_remote and not is_loopback(host):
                raise SettingsError(
                    f"http_bind {s.http_bind}: without a users_file the management API stays "
                    "on loopback; set http_allow_remote = true to expose it anyway", "http_bind")
        return s


def _shown_host(host: str) -> str:
    """A bind host as clients should name it: a wildcard is this machine's name."""
    return host if host not in ("0.0.0.0", "::", "") else socket.getfqdn()


def check_advertise(uris: list[str]) -> None:
    """Each advertised URI must be one a client can use (the client's own parser)."""
    from amqlite.client.uri import URIError, parse_tcp_uri

    for uri in uris:
        try:
            parse_tcp_uri(uri)
        except URIError as e:
            raise SettingsError(f"advertise: {e}", "advertise") from None


def default_max_unauthenticated(max_connections: int) -> int:
    """``max_unauthenticated`` when the setting is 0: a share of the connection slots."""
    return max(1, max_connections // UNAUTHENTICATED_SHARE)


def parse_bind(bind: str, default_port: int = DEFAULT_STOMP_PORT,
               option: str = "--bind") -> tuple[str, int]:
    """``HOST:PORT`` (or ``HOST``) -> (host, port); SettingsError naming ``option``."""
    setting = option.lstrip("-").replace("-", "_")
    host, sep, port = bind.rpartition(":")
    if not sep:
        host, port = bind, str(default_port)
    host = host.strip("[]") or "127.0.0.1"
    try:
        p = int(port)
    except ValueError:
        raise SettingsError(f"{option}: port must be a number in {bind!r}", setting) from None
    if host.isdigit():
        # "61613" alone would be the IPv4 address 0.0.240.173 to the resolver.
        raise SettingsError(f"{option}: {bind!r} is not HOST:PORT (for a port, write "
                            f"127.0.0.1:{host} or 0.0.0.0:{host})", setting)
    if not 0 <= p <= 65535:
        raise SettingsError(f"{option}: port out of range in {bind!r}", setting)
    return host, p


#: The settings an option, a variable or a config key sets (not the file's tables).
_FIELDS = {f.name: f for f in dataclasses.fields(Settings) if not f.metadata.get(FILE_ONLY)}
#: A field's type, from its annotation (a string under ``from __future__ import annotations``).
_KINDS: dict[str, type] = {"str": str, "int": int, "float": float, "bool": bool}


@dataclass(frozen=True)
class Definition:
    """One setting as ``amqlite start`` offers it: option, variable, help and default."""

    name: str
    kind: type
    help: str
    origin: str
    metavar: str
    default: str  # as shown: the value, or how it is derived

    @property
    def option(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return f"AMQLITE_{self.name.upper()}"


def _shown(f: dataclasses.Field[Any]) -> str:
    if f.metadata.get(DERIVED):
        return str(f.metadata[DERIVED])
    value = f.default
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    if f.metadata.get(METAVAR) == "BYTES" and isinstance(value, int) and value % 1024 == 0:
        size, unit = (value // 1024**2, "MiB") if value % 1024**2 == 0 else (value // 1024, "KiB")
        return f"{value} ({size} {unit})"
    return str(value)


def definitions() -> list[Definition]:
    """Every setting, in the order of the Settings fields."""
    return [Definition(name=f.name, kind=_KINDS[str(f.type)], help=f.metadata.get(HELP, ""),
                       origin=f.metadata.get(ORIGIN, ""), metavar=f.metadata.get(METAVAR, ""),
                       default=_shown(f))
            for f in _FIELDS.values()]


def check_backends(s: Settings) -> None:
    """The store and locker URLs, parsed by their backends (no connection is made)."""
    from lockers import LockerError, open_locker
    from store import StoreError, parse_store_url

    try:
        parse_store_url(s.store)
    except StoreError as e:
        raise SettingsError(f"store: {e}", "store") from None
    try:
        open_locker(s.locker, s.group, node=s.name, lease=s.lock_lease,
                    session_timeout=s.zk_session_timeout, keepalive_interval=s.lock_keepalive)
    except LockerError as e:
        raise SettingsError(f"locker: {e}", "locker") from None


#: How a wrong-type TOML value is explained.
_TOML_TYPES = {str: "a string (in quotes)", int: "an integer", float: "a number",
               bool: "true or false"}
#: The optional table that may hold every setting.
BROKER_TABLE = "broker"


def _coerce(name: str, value: Any, source: str | None = None) -> Any:
    """``value`` as the field's type. From TOML (``source`` names the file) a number
    or boolean where text belongs is a mistake (``bind = 61613``), not a string."""
    kind = type(getattr(Settings(), name))
    if isinstance(value, kind) and not (kind is int and isinstance(value, bool)):
        return value
    if source is not None:
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if not isinstance(value, str) or kind is str:
            raise SettingsError(f"{name} in {source}: expected {_TOML_TYPES[kind]}, got "
                                f"{type(value).__name__} {value!r}", name)
        # A quoted number or boolean ("2.0", "true": what `amqlite container` writes) is
        # read as the environment's text is, below; one that does not parse is refused.
    text = str(value).strip()
    try:
        if kind is bool:
            if text.lower() in ("1", "true", "yes", "on"):
                return True
            if text.lower() in ("0", "false", "no", "off", ""):
                return False
            raise ValueError(text)
        if kind is int:
            return int(text)
        if kind is float:
            return float(text)
    except ValueError:
        raise SettingsError(f"{name}: cannot use {text!r} as {kind.__name__}", name) from None
    return text


def _read_config(config_file: str) -> dict[str, Any]:
    try:
        with open(config_file, "rb") as f:
            data = tomllib.load(f)
    except OSError as e:
        raise SettingsError(f"--config: cannot read {config_file}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise SettingsError(f"--config: {config_file} is not valid TOML: {e}") from None
    try:  # [[policy]] tables, at top level beside [broker] or inside it
        data, policies = take_policies(data, BROKER_TABLE, config_file)
    except PolicyError as e:
        raise SettingsError(f"--config: {e}", "policies") from None
    if BROKER_TABLE in data:
        outside = sorted(k for k in data if k != BROKER_TABLE)
        if outside:
            # Either layout works, a mix is refused: silently ignoring one half
            # would start a broker that is not the one the file describes.
            raise SettingsError(
                f"--config: {config_file} has a [{BROKER_TABLE}] table and top-level "
                f"settings ({', '.join(outside)}): put them all in one place")
        data = data[BROKER_TABLE]
        if not isinstance(data, dict):
            raise SettingsError(f"--config: {BROKER_TABLE} in {config_file} must be a table")
    for key in data:
        if key.replace("-", "_") not in _FIELDS:
            raise SettingsError(f"--config: unknown setting {key!r} in {config_file}")
    values = {key.replace("-", "_"): value for key, value in data.items()}
    if policies is not None:
        values["policies"] = policies
    return values


def read_settings(
    cli: dict[str, Any] | None = None,
    config_file: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> tuple[Settings, list[str]]:
    """Merge defaults < config file < environment < command line, check everything
    (``resolved``, ``check_backends``); also the warnings for settings given that do not
    apply (``unused``). A SettingsError names where the bad value was set."""
    values: dict[str, Any] = {}
    given: dict[str, str] = {}  # setting -> where its value came from
    try:
        if config_file:
            for key, value in _read_config(config_file).items():
                given[key] = f"in {config_file}"
                values[key] = value if key == "policies" else _coerce(key, value, config_file)
        env = os.environ if environ is None else environ
        for key in _FIELDS:
            env_name = f"AMQLITE_{key.upper()}"
            if env_name in env:
                given[key] = env_name
                values[key] = _coerce(key, env[env_name])
        for key, value in (cli or {}).items():
            if value is not None:
                given[key] = "--" + key.replace("_", "-")
                values[key] = _coerce(key, value)
        settings = Settings(**values).resolved()
        check_backends(settings)
    except SettingsError as e:
        if e.setting in given and given[e.setting] not in str(e):
            raise SettingsError(f"{e} ({given[e.setting]})", e.setting) from None
        raise
    from amqlite.setting_warnings import unused  # its own room, which imports this one

    return settings, unused(settings, given)


def load_settings(
    cli: dict[str, Any] | None = None,
    config_file: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """``read_settings`` without its warnings."""
    return read_settings(cli, config_file, environ)[0]
