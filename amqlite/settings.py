"""Every knob of a broker node, its default, and where the default comes from.

Precedence, highest first: command-line option, ``AMQLITE_<NAME>`` environment
variable, ``--config FILE`` (TOML, keys are the field names below, optionally
under a ``[broker]`` table), then the defaults here.
"""

from __future__ import annotations

import dataclasses
import os
import re
import socket
import ssl
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from amqlite.codec import (
    DEFAULT_MAX_FRAME_SIZE,
    DEFAULT_MAX_HEADER_COUNT,
    DEFAULT_MAX_HEADER_LENGTH,
    ProtocolError,
)
from amqlite.protocol import MAX_HEARTBEAT_MS, parse_heartbeat
from amqlite.tls import TlsError, check_pair, server_context
from amqlite.wire import DEFAULT_STOMP_PORT

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
    """A setting has a value we cannot use; the message names it."""


@dataclass
class Settings:
    group: str = "default"
    name: str = field(default_factory=default_node_name)
    data_dir: str = ""  # default: default_data_dir(group)
    store: str = ""  # default: sqlite:///<data_dir>/amqlite.db
    locker: str = ""  # default: file://<data_dir>/amqlite.lock
    bind: str = DEFAULT_BIND  # HOST:PORT, or "off" (then ssl_bind is the only listener)
    #: STOMP over TLS, HOST:PORT (empty: none); needs ssl_cert and ssl_key.
    ssl_bind: str = ""
    #: PEM certificate (chain) and its private key, for ssl_bind and the HTTP listener.
    ssl_cert: str = ""
    ssl_key: str = ""
    #: PEM CA certificates: when set, TLS clients must present a certificate it signed.
    ssl_ca: str = ""
    #: With ssl_cert set, the management API speaks HTTPS with the same certificate
    #: settings (ssl_ca included); false keeps it plain HTTP.
    http_ssl: bool = True
    #: URIs clients should use to reach this node (registry/cluster-list), comma-separated;
    #: default: tcp://<bind> and ssl://<ssl_bind> for the listeners that are on.
    advertise: str = ""
    rejoin: bool = False
    lock_poll_interval: float = 0.5  # an Artemis backup retries every 500 ms; docs/design.md
    lock_keepalive: float = 1.0
    #: A crashed or paused master's takeover with ZooKeeper (lockers/zookeeper.py).
    zk_session_timeout: float = 4.0
    #: PostgreSQL locker: seconds a paused (SIGSTOP, frozen VM) master keeps the
    #: lock before a slave ends its session; renewed every third of it from a
    #: thread. 0 turns it off. lockers/pg_lease.py says where 3 s comes from.
    lock_lease: float = 3.0
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    #: 0: a quarter of max_connections (UNAUTHENTICATED_SHARE)
    max_unauthenticated: int = 0
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    frame_timeout: float = DEFAULT_FRAME_TIMEOUT
    max_handshake_bytes: int = DEFAULT_MAX_HANDSHAKE_BYTES
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
    max_header_count: int = DEFAULT_MAX_HEADER_COUNT
    max_header_length: int = DEFAULT_MAX_HEADER_LENGTH
    heartbeat: str = f"{DEFAULT_HEARTBEAT[0]},{DEFAULT_HEARTBEAT[1]}"
    max_redeliveries: int = DEFAULT_MAX_REDELIVERIES
    dead_letter_queue: str = DEFAULT_DLQ
    default_prefetch: int = DEFAULT_PREFETCH
    max_memory: int = DEFAULT_MAX_MEMORY  # bytes
    max_destination_memory: int = DEFAULT_MAX_DESTINATION_MEMORY  # bytes
    dedup_window: float = DEFAULT_DEDUP_WINDOW
    housekeeping_interval: float = DEFAULT_HOUSEKEEPING_INTERVAL
    users_file: str = ""  # TOML users file with hashed passwords; empty = no auth
    #: Management HTTP listener, HOST:PORT or "off". Empty: 127.0.0.1, port derived from
    #: the STOMP port (8161 + (port - 61613)) or the next free one (see amqlite.management).
    http_bind: str = ""
    #: Without a users file the HTTP listener must stay on loopback unless this is set.
    http_allow_remote: bool = False
    log_level: str = "INFO"
    #: Seconds a starting node waits for its store and locker to become reachable
    #: before it gives up with a non-zero exit; 0 waits for ever (ActiveMQ's JDBC
    #: store does), which suits a supervisor that starts nodes before their database.
    start_timeout: float = DEFAULT_START_TIMEOUT
    #: Accept a PostgreSQL store whose server runs with fsync = off (a server crash
    #: can then lose RECEIPTed messages): for throwaway test setups only.
    allow_fsync_off: bool = False
    # Broker-side cluster client options (ActiveMQ's transportConnector attributes).
    update_cluster_clients: bool = False
    rebalance_cluster_clients: bool = False
    update_cluster_clients_on_remove: bool = False
    update_cluster_filter: str = ""

    # -- derived ----------------------------------------------------------
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
                f"0..{MAX_HEARTBEAT_MS}, got {self.heartbeat!r}"
            ) from None

    def resolved(self) -> Settings:
        """Fill the defaults that depend on other settings and validate."""
        s = dataclasses.replace(self)
        if not s.group or "/" in s.group:
            raise SettingsError(f"--group: invalid group name {s.group!r}")
        if not s.data_dir:
            s.data_dir = str(default_data_dir(s.group))
        if not s.store:
            s.store = f"sqlite:///{Path(s.data_dir).resolve() / 'amqlite.db'}"
        if not s.locker:
            s.locker = f"file://{Path(s.data_dir).resolve() / 'amqlite.lock'}"
        if not s.plain_enabled and not s.ssl_bind:
            raise SettingsError("bind = off needs ssl_bind: a broker needs one listener")
        try:
            check_pair(s.ssl_cert, s.ssl_key, "--ssl-cert (ssl_cert)", "--ssl-key (ssl_key)")
        except TlsError as e:
            raise SettingsError(str(e)) from None
        if (s.ssl_bind or s.ssl_ca) and not s.ssl_cert:
            raise SettingsError("TLS needs both ssl_cert and ssl_key (--ssl-cert, --ssl-key)")
        if s.ssl_cert:
            s.ssl_context()  # a bad file stops the start here, in one line
        listeners = []
        if s.plain_enabled:
            listeners.append(("tcp", parse_bind(s.bind)))
        if s.ssl_bind:
            listeners.append(("ssl", parse_bind(s.ssl_bind, DEFAULT_SSL_PORT, "--ssl-bind")))
        s.heartbeat_ms  # noqa: B018 - a bad value stops the start here
        if not s.advertise:
            uris = []
            for scheme, (host, port) in listeners:
                host = host if host not in ("0.0.0.0", "::", "") else socket.getfqdn()
                uris.append(f"{scheme}://{host}:{port}")
            s.advertise = ",".join(uris)
        for name in ("max_connections", "max_frame_size", "max_header_count",
                     "max_header_length", "default_prefetch", "max_handshake_bytes",
                     "connect_timeout", "frame_timeout", "max_memory",
                     "max_destination_memory"):
            if getattr(s, name) <= 0:
                raise SettingsError(f"{name}: must be a positive number")
        if s.max_unauthenticated == 0:
            s.max_unauthenticated = default_max_unauthenticated(s.max_connections)
        if not 0 < s.max_unauthenticated <= s.max_connections:
            raise SettingsError("max_unauthenticated: must be between 1 and max_connections")
        if s.update_cluster_filter:
            try:
                re.compile(s.update_cluster_filter)
            except re.error as e:
                raise SettingsError(f"update_cluster_filter: not a regular expression: {e}") \
                    from None
        if s.http_bind and s.http_bind.lower() != HTTP_OFF:
            if ":" not in s.http_bind:
                raise SettingsError(f"http_bind: expected HOST:PORT or off, got {s.http_bind!r}")
            host, _ = parse_bind(s.http_bind, option="http_bind")
            if not s.users_file and not s.http_allow_remote and not is_loopback(host):
                raise SettingsError(
                    f"http_bind {s.http_bind}: without a users_file the management API stays "
                    "on loopback; set http_allow_remote = true to expose it anyway")
        if not 0 <= s.dedup_window < float("inf"):
            raise SettingsError("dedup_window: must be >= 0 seconds")
        if not 0 <= s.start_timeout < float("inf"):
            raise SettingsError("start_timeout: must be >= 0 seconds (0: wait for ever)")
        if s.max_redeliveries < 0:
            raise SettingsError("max_redeliveries: must be >= 0")
        if s.lock_poll_interval <= 0 or s.lock_keepalive <= 0:
            raise SettingsError("lock_poll_interval/lock_keepalive: must be > 0")
        if not s.lock_lease >= 0 or s.lock_lease == float("inf"):
            raise SettingsError("lock_lease: must be >= 0 seconds (0: no lease)")
        return s


def default_max_unauthenticated(max_connections: int) -> int:
    """``max_unauthenticated`` when the setting is 0: a share of the connection slots."""
    return max(1, max_connections // UNAUTHENTICATED_SHARE)


def parse_bind(bind: str, default_port: int = DEFAULT_STOMP_PORT,
               option: str = "--bind") -> tuple[str, int]:
    """``HOST:PORT`` (or ``HOST``) -> (host, port); SettingsError naming ``option``."""
    host, sep, port = bind.rpartition(":")
    if not sep:
        host, port = bind, str(default_port)
    host = host.strip("[]") or "127.0.0.1"
    try:
        p = int(port)
    except ValueError:
        raise SettingsError(f"{option}: port must be a number in {bind!r}") from None
    if host.isdigit():
        # "61613" alone would be the IPv4 address 0.0.240.173 to the resolver.
        raise SettingsError(f"{option}: {bind!r} is not HOST:PORT (for a port, write "
                            f"127.0.0.1:{host} or 0.0.0.0:{host})")
    if not 0 <= p <= 65535:
        raise SettingsError(f"{option}: port out of range in {bind!r}")
    return host, p


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and localhost (names are not resolved)."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


_FIELDS = {f.name: f for f in dataclasses.fields(Settings)}
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
                                f"{type(value).__name__} {value!r}")
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
        raise SettingsError(f"{name}: cannot use {text!r} as {kind.__name__}") from None
    return text


def load_settings(
    cli: dict[str, Any] | None = None,
    config_file: str | None = None,
    environ: dict[str, str] | None = None,
) -> Settings:
    """Merge defaults < config file < environment < command line."""
    values: dict[str, Any] = {}
    if config_file:
        try:
            with open(config_file, "rb") as f:
                data = tomllib.load(f)
        except OSError as e:
            raise SettingsError(f"--config: cannot read {config_file}: {e.strerror}") from None
        except tomllib.TOMLDecodeError as e:
            raise SettingsError(f"--config: {config_file} is not valid TOML: {e}") from None
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
        for key, value in data.items():
            key = key.replace("-", "_")
            if key not in _FIELDS:
                raise SettingsError(f"--config: unknown setting {key!r} in {config_file}")
            values[key] = _coerce(key, value, config_file)
    env = os.environ if environ is None else environ
    for key in _FIELDS:
        env_name = f"AMQLITE_{key.upper()}"
        if env_name in env:
            values[key] = _coerce(key, env[env_name])
    for key, value in (cli or {}).items():
        if value is not None:
            values[key] = _coerce(key, value)
    return Settings(**values).resolved()
