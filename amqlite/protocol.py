"""Sans-I/O STOMP connection state machine for either end of a connection.

It knows the handshake, version negotiation, heart-beat negotiation and which frames each
side may send in which state; it owns no socket and no timer. The asyncio layer feeds it
bytes, acts on the events, and writes the bytes it returns.
"""

from __future__ import annotations

import enum
import math
import re
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import metadata
from typing import Literal

from amqlite.codec import (
    HEARTBEAT,
    Frame,
    FrameParser,
    Limits,
    ProtocolError,
    encode_frame,
    parse_uint,
)
from amqlite.frame_rules import HANDSHAKE_COMMANDS
from amqlite.wire import ACK_AUTO, ACK_MODES, STOMP_1_0, STOMP_1_1, STOMP_1_2, SUPPORTED_VERSIONS

__all__ = [
    "CLIENT_COMMANDS",
    "HEARTBEAT_GRACE",
    "MAX_HEARTBEAT_MS",
    "SERVER_COMMANDS",
    "ConnectionClosed",
    "Event",
    "FrameReceived",
    "Heartbeat",
    "HeartbeatReceived",
    "Role",
    "State",
    "StompProtocol",
    "negotiate_heartbeat",
    "negotiate_version",
    "parse_heartbeat",
    "receive_deadline_ms",
]

Role = Literal["server", "client"]

CLIENT_COMMANDS: frozenset[str] = frozenset(
    {"CONNECT", "STOMP", "SEND", "SUBSCRIBE", "UNSUBSCRIBE", "ACK", "NACK", "BEGIN", "COMMIT",
     "ABORT", "DISCONNECT"}
)
SERVER_COMMANDS: frozenset[str] = frozenset({"CONNECTED", "MESSAGE", "RECEIPT", "ERROR"})
#: The handshake frames each side sends (amqlite.frame_rules.HANDSHAKE_COMMANDS, split).
_CLIENT_HANDSHAKE = HANDSHAKE_COMMANDS & CLIENT_COMMANDS
_SERVER_HANDSHAKE = HANDSHAKE_COMMANDS & SERVER_COMMANDS

# stomp.py tolerates 1.5x the negotiated interval before calling a peer dead; we allow 2x so
# that a client stalled by GC or a busy event loop is not dropped while it is still alive.
HEARTBEAT_GRACE = 2.0
# Java clients (ActiveMQ, Spring) hold heart-beat intervals in an int; larger values are
# nonsense and would only bloat timers, so the header parser rejects them.
MAX_HEARTBEAT_MS = 2**31 - 1

# Spec "Body": only these frames may carry a body.
_BODY_COMMANDS = frozenset({"SEND", "MESSAGE", "ERROR"})
# Spec "SUBSCRIBE ack Header" (amqlite.wire.ACK_MODES), as a set for the lookup.
_ACK_MODES = frozenset(ACK_MODES)

# Required headers per version and command: each requirement is a tuple of alternatives of
# which one must be present (1.0 UNSUBSCRIBE takes ``id`` or ``destination``).
_Requirement = tuple[str, ...]
_REQUIRED_10: dict[str, tuple[_Requirement, ...]] = {
    "SEND": (("destination",),),
    "SUBSCRIBE": (("destination",),),
    "UNSUBSCRIBE": (("id", "destination"),),
    "ACK": (("message-id",),),
    "BEGIN": (("transaction",),),
    "COMMIT": (("transaction",),),
    "ABORT": (("transaction",),),
    "DISCONNECT": (),
    "MESSAGE": (("destination",), ("message-id",)),
    "RECEIPT": (("receipt-id",),),
    "ERROR": (),
}
_REQUIRED_11 = {
    **_REQUIRED_10,
    "SUBSCRIBE": (("destination",), ("id",)),
    "UNSUBSCRIBE": (("id",),),
    "ACK": (("message-id",), ("subscription",)),
    "NACK": (("message-id",), ("subscription",)),
    "MESSAGE": (("destination",), ("message-id",), ("subscription",)),
}
_REQUIRED_12 = {**_REQUIRED_11, "ACK": (("id",),), "NACK": (("id",),)}
REQUIRED_HEADERS: dict[str, dict[str, tuple[_Requirement, ...]]] = {
    STOMP_1_0: _REQUIRED_10,
    STOMP_1_1: _REQUIRED_11,
    STOMP_1_2: _REQUIRED_12,
}

_HEARTBEAT_VALUE = re.compile(r"([0-9]{1,10}),([0-9]{1,10})")



class State(enum.StrEnum):
    """A connection's state, as in websockets' ``State``. String-valued so that logs and
    error messages read as before (``state=idle``)."""

    IDLE = "idle"  # nothing exchanged yet
    CONNECTING = "connecting"  # server: CONNECT received; client: CONNECT sent
    CONNECTED = "connected"
    DISCONNECTING = "disconnecting"  # DISCONNECT seen; only replies flow now
    CLOSED = "closed"  # an ERROR frame went out (server): nothing more may be sent


# Module-level names for the per-frame checks: an enum attribute lookup (State.IDLE)
# costs ~80 ns in CPython 3.11, a module global ~10 ns.
_IDLE = State.IDLE
_CONNECTING = State.CONNECTING
_CONNECTED = State.CONNECTED
_DISCONNECTING = State.DISCONNECTING
#: CONNECTED was sent (server) or received (client), whatever came after.
_ANSWERED = frozenset({State.CONNECTED, State.DISCONNECTING})
#: A header value every version sends as it is (nothing to escape, nothing 1.0 cannot
#: carry): the fast path of ``StompProtocol.receipt``. Receipt ids are client text.
_PLAIN_VALUE = re.compile(r"[^\\:\r\n\x00]*").fullmatch


def _server_name() -> str:
    try:
        return f"amqlite/{metadata.version('amqlite')}"
    except metadata.PackageNotFoundError:
        return "amqlite"


SERVER_NAME = _server_name()


class ConnectionClosed(ProtocolError):
    """Raised when the owner keeps using a protocol that already failed or sent ERROR."""

    def __init__(self, detail: str) -> None:
        super().__init__("connection closed", detail, fault="local")


@dataclass(slots=True, init=False)
class FrameReceived:
    """A frame arrived. One is made per frame received, so its constructor is written
    out: the one ``dataclass`` generates runs as interpreted Python even in the compiled
    build (``codec.Frame``)."""

    frame: Frame

    def __init__(self, frame: Frame) -> None:
        self.frame = frame


@dataclass(frozen=True, slots=True)
class HeartbeatReceived:
    pass


Event = FrameReceived | HeartbeatReceived


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """Negotiated heart-beat from one side's view; 0 means never."""

    send_ms: int
    expect_ms: int


NO_HEARTBEAT = Heartbeat(0, 0)


def parse_heartbeat(value: str | None) -> tuple[int, int]:
    """Parse a ``heart-beat`` header strictly: ``"cx,cy"``; absent means ``(0, 0)``.

    The one heart-beat parser: the broker's ``heartbeat`` setting is read with it too
    (``Settings.heartbeat_ms``, which turns the ProtocolError into a SettingsError).
    """
    if value is None:
        return (0, 0)
    match = _HEARTBEAT_VALUE.fullmatch(value)
    if match is None:
        raise ProtocolError(
            "invalid heart-beat header", f"expected 'cx,cy' non-negative ints, got {value[:40]!r}"
        )
    cx, cy = parse_uint(match.group(1), MAX_HEARTBEAT_MS), parse_uint(match.group(2),
                                                                       MAX_HEARTBEAT_MS)
    if cx is None or cy is None:
        raise ProtocolError(
            "invalid heart-beat header", f"heart-beat {value!r} exceeds {MAX_HEARTBEAT_MS} ms"
        )
    return (cx, cy)


def negotiate_heartbeat(
    client: tuple[int, int], server: tuple[int, int], *, role: Role = "server"
) -> Heartbeat:
    """Spec "Heart-beating": each direction beats every max(sender's cx, receiver's cy)
    when both are non-zero, else never. Returned from ``role``'s point of view."""
    cx, cy = client
    sx, sy = server
    client_to_server = max(cx, sy) if cx and sy else 0
    server_to_client = max(sx, cy) if sx and cy else 0
    if role == "server":
        return Heartbeat(send_ms=server_to_client, expect_ms=client_to_server)
    return Heartbeat(send_ms=client_to_server, expect_ms=server_to_client)


def receive_deadline_ms(heartbeat: Heartbeat, grace: float = HEARTBEAT_GRACE) -> int | None:
    """How long the peer may stay silent before it is presumed dead; None: never."""
    if heartbeat.expect_ms <= 0:
        return None
    return math.ceil(heartbeat.expect_ms * grace)


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def negotiate_version(accept_version: str | None, supported: Iterable[str]) -> str:
    """Highest version both sides speak; a missing ``accept-version`` means a 1.0 client."""
    supported = tuple(supported)
    offered = (
        {STOMP_1_0} if accept_version is None
        else {v.strip() for v in accept_version.split(",")}
    )
    common = offered.intersection(supported)
    if not common:
        listed = ",".join(supported)
        raise ProtocolError(
            "unsupported STOMP version",
            f"client accepts {accept_version!r}, this server supports {listed}",
            headers={"version": listed},
        )
    return max(common, key=_version_key)


def _check_versions(versions: Iterable[str]) -> tuple[str, ...]:
    versions = tuple(versions)
    unknown = [v for v in versions if v not in SUPPORTED_VERSIONS]
    if not versions or unknown:
        raise ProtocolError(
            "unsupported version",
            f"versions {versions!r} must be a non-empty subset of {SUPPORTED_VERSIONS}",
            fault="local",
        )
    return versions


def _check_heartbeat_setting(heartbeat: tuple[int, int]) -> tuple[int, int]:
    if (
        len(heartbeat) != 2
        or any(not isinstance(v, int) or v < 0 or v > MAX_HEARTBEAT_MS for v in heartbeat)
    ):
        raise ProtocolError(
            "invalid heart-beat setting",
            f"heart-beat {heartbeat!r} must be two ints in 0..{MAX_HEARTBEAT_MS}",
            fault="local",
        )
    return (heartbeat[0], heartbeat[1])


def _validate_frame(frame: Frame, version: str, fault: Literal["remote", "local"]) -> None:
    """Per-version required headers and body rules for one non-handshake frame."""
    command = frame.command
    headers = frame.headers
    receipt = headers.get("receipt")
    requirements = REQUIRED_HEADERS[version].get(command)
    if requirements is None:
        raise ProtocolError(
            "unknown command",
            f"{command[:40]!r} is not a STOMP {version} frame here",
            fault=fault,
            receipt_id=receipt,
        )
    for alternatives in requirements:
        for name in alternatives:  # a loop, not any(): no generator per frame
            if name in headers:
                break
        else:
            wanted = " or ".join(repr(name) for name in alternatives)
            raise ProtocolError(
                "missing required header",
                f"{command} frame requires header {wanted} in STOMP {version}",
                fault=fault,
                receipt_id=receipt,
            )
    if frame.body and command not in _BODY_COMMANDS:
        raise ProtocolError(
            "unexpected body",
            f"{command} frames must not have a body ({len(frame.body)} bytes given)",
            fault=fault,
            receipt_id=receipt,
        )
    if command == "SUBSCRIBE":
        ack = headers.get("ack", ACK_AUTO)
        if ack not in _ACK_MODES:
            raise ProtocolError(
                "invalid ack mode",
                f"SUBSCRIBE ack {ack[:40]!r} is not one of {sorted(_ACK_MODES)}",
                fault=fault,
                receipt_id=receipt,
            )


class StompProtocol:
    """One STOMP connection, server or client side, without I/O.

    ``receive_data`` raises :class:`ProtocolError` for any violation; the owner then sends
    ``error(exc)`` (server) and closes. Frames parsed before the violation in the same chunk
    are dropped with it: the peer gets no RECEIPT for them, so nothing it was promised is lost.
    ``supported_versions`` (server) is used as soon as CONNECT arrives so that frames a client
    pipelines behind CONNECT are decoded with the negotiated version.
    """

    def __init__(
        self,
        role: Role,
        limits: Limits | None = None,
        *,
        supported_versions: Iterable[str] = SUPPORTED_VERSIONS,
        hold_handshake: bool = False,
    ) -> None:
        if role not in ("server", "client"):
            raise ValueError(f"role must be 'server' or 'client', got {role!r}")
        self.role: Role = role
        self.limits = limits if limits is not None else Limits()
        self.supported_versions = _check_versions(supported_versions)
        self.version = STOMP_1_0
        self.heartbeat = NO_HEARTBEAT
        self._state: State = _IDLE
        self._parser = FrameParser(self.limits)
        # Stop right after the handshake frame so the rest of the chunk is decoded with
        # the version that frame negotiates.
        self._parser.hold_after = (
            _CLIENT_HANDSHAKE if role == "server" else _SERVER_HANDSHAKE
        )
        # Server: keep what follows CONNECT as unparsed bytes until release_handshake(), so a
        # client whose login is still being checked cannot make us parse and queue frames.
        self.hold_handshake = hold_handshake
        self._receive_closed: str | None = None
        self._send_closed: str | None = None
        self._frames_since_connect = 0
        # Client side: what our CONNECT offered.
        self._offered_versions: tuple[str, ...] = ()
        self._offered_heartbeat: tuple[int, int] = (0, 0)

    @property
    def state(self) -> State:
        """Where the connection is; ``CLOSED`` once nothing may be sent any more."""
        return State.CLOSED if self._send_closed else self._state

    @property
    def connected(self) -> bool:
        return self._state == _CONNECTED and not self._send_closed

    @property
    def handshake_done(self) -> bool:
        """CONNECTED went out (server) or came in (client), whatever happened since
        (DISCONNECT, ERROR): the connection is past its handshake for good."""
        return self._state in _ANSWERED

    # -- receiving ---------------------------------------------------------------------

    def receive_data(self, data: bytes) -> list[Event]:
        """Feed bytes from the peer; return the frames and heart-beats they complete."""
        if self._receive_closed:
            raise ConnectionClosed(self._receive_closed)
        events: list[Event] = []
        try:
            items = self._parser.feed(data)
            while True:
                for item in items:
                    if item is HEARTBEAT:
                        events.append(HeartbeatReceived())
                    else:
                        self._on_frame(item)
                        events.append(FrameReceived(item))
                if not self._parser.held or (
                        self.hold_handshake and self._state == _CONNECTING):
                    break
                self._parser.resume()  # the handshake frame has set the version
                items = self._parser.feed(b"")
        except ProtocolError as exc:
            self._receive_closed = f"receiving stopped after: {exc.message}"
            raise
        return events

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as frames (a partial or held frame)."""
        return self._parser.buffered

    def release_handshake(self) -> list[Event]:
        """With ``hold_handshake``: parse what arrived behind CONNECT, once it is answered."""
        if not self._parser.held:
            return []
        self._parser.resume()
        return self.receive_data(b"")

    def _on_frame(self, frame: Frame) -> None:
        if self.role == "server":
            self._on_client_frame(frame)
        else:
            self._on_server_frame(frame)

    def _on_client_frame(self, frame: Frame) -> None:
        command = frame.command
        receipt = frame.headers.get("receipt")
        state = self._state
        if command in _CLIENT_HANDSHAKE:
            if state != _IDLE:
                raise ProtocolError(
                    "already connected", f"second {command} frame", receipt_id=receipt
                )
            parse_heartbeat(frame.headers.get("heart-beat"))
            # Negotiated again (and answered) by accept_connect; done here so pipelined
            # frames are unescaped and validated with the right version.
            self._parser.version = negotiate_version(
                frame.headers.get("accept-version"), self.supported_versions
            )
            self._state = _CONNECTING
            self._frames_since_connect = 0
            return
        if state == _IDLE:
            raise ProtocolError(
                "not connected", f"{command[:40]} frame received before CONNECT",
                receipt_id=receipt,
            )
        if state == _DISCONNECTING:
            raise ProtocolError(
                "already disconnecting", f"{command[:40]} frame received after DISCONNECT",
                receipt_id=receipt,
            )
        if command not in CLIENT_COMMANDS:
            raise ProtocolError(
                "unknown command", f"{command[:40]!r} is not a STOMP client frame",
                receipt_id=receipt,
            )
        _validate_frame(frame, self._parser.version, "remote")
        self._frames_since_connect += 1
        if command == "DISCONNECT":
            self._state = _DISCONNECTING

    def _on_server_frame(self, frame: Frame) -> None:
        command = frame.command
        state = self._state
        if state == _IDLE:
            raise ProtocolError("unexpected frame", f"{command[:40]} received before CONNECT")
        if command == "ERROR":
            return  # always legal: the server is telling us why it hangs up
        if command == "CONNECTED":
            if state != _CONNECTING:
                raise ProtocolError("unexpected frame", "second CONNECTED frame")
            version = frame.headers.get("version", STOMP_1_0)
            if version not in self._offered_versions:
                raise ProtocolError(
                    "unsupported STOMP version",
                    f"server chose {version!r}, we offered {','.join(self._offered_versions)}",
                )
            server_heartbeat = (
                parse_heartbeat(frame.headers.get("heart-beat")) if version != STOMP_1_0 else (0, 0)
            )
            client_heartbeat = self._offered_heartbeat if version != STOMP_1_0 else (0, 0)
            self.heartbeat = negotiate_heartbeat(client_heartbeat, server_heartbeat, role="client")
            self.version = version
            self._parser.version = version
            self._state = _CONNECTED
            return
        if state == _CONNECTING:
            raise ProtocolError("unexpected frame", f"{command[:40]} received before CONNECTED")
        if command not in SERVER_COMMANDS:
            raise ProtocolError(
                "unknown command", f"{command[:40]!r} is not a STOMP server frame"
            )
        _validate_frame(frame, self.version, "remote")

    # -- handshake ---------------------------------------------------------------------

    def accept_connect(
        self,
        frame: Frame,
        *,
        supported_versions: Iterable[str] | None = None,
        server_heartbeat: tuple[int, int] = (0, 0),
        extra_headers: dict[str, str] | None = None,
    ) -> bytes:
        """Answer the client's CONNECT/STOMP (already authenticated by the caller).

        Returns the encoded CONNECTED frame and sets ``version`` and ``heartbeat``. Raises a
        remote ProtocolError when no version is common (its ``headers`` carry the ``version``
        list the spec wants in the ERROR frame). ``extra_headers`` may override ``server``
        and ``session`` and add others.
        """
        self._check_open()
        if self.role != "server" or self._state != _CONNECTING:
            raise ProtocolError(
                "invalid state",
                f"accept_connect needs a server that received CONNECT (role={self.role}, "
                f"state={self._state})",
                fault="local",
            )
        if frame.command not in _CLIENT_HANDSHAKE:
            raise ProtocolError(
                "invalid frame", f"accept_connect got {frame.command!r}", fault="local"
            )
        supported = (
            self.supported_versions if supported_versions is None
            else _check_versions(supported_versions)
        )
        server_heartbeat = _check_heartbeat_setting(server_heartbeat)
        extra = dict(extra_headers or {})
        if "version" in extra or "heart-beat" in extra:
            raise ProtocolError(
                "invalid CONNECTED headers",
                "version and heart-beat are negotiated, not set by extra_headers",
                fault="local",
            )
        version = negotiate_version(frame.headers.get("accept-version"), supported)
        if version != self._parser.version and self._frames_since_connect:
            raise ProtocolError(
                "version changed",
                f"frames pipelined behind CONNECT were decoded as STOMP {self._parser.version} "
                f"but accept_connect negotiated {version}; pass supported_versions to "
                "StompProtocol() instead",
                fault="local",
            )
        headers = {"version": version}
        if version == STOMP_1_0:
            self.heartbeat = NO_HEARTBEAT  # 1.0 has no heart-beating
        else:
            client_heartbeat = parse_heartbeat(frame.headers.get("heart-beat"))
            self.heartbeat = negotiate_heartbeat(client_heartbeat, server_heartbeat)
            headers["heart-beat"] = f"{server_heartbeat[0]},{server_heartbeat[1]}"
        headers["server"] = SERVER_NAME
        headers["session"] = uuid.uuid4().hex
        headers.update(extra)
        data = encode_frame(Frame("CONNECTED", headers), version)
        self.version = version
        self._parser.version = version
        self._state = _CONNECTED
        return data

    def connect_frame(
        self,
        host: str,
        login: str | None = None,
        passcode: str | None = None,
        heartbeat: tuple[int, int] = (0, 0),
        versions: Iterable[str] = SUPPORTED_VERSIONS,
        extra: dict[str, str] | None = None,
    ) -> bytes:
        """Client side: the encoded CONNECT frame; the reply arrives through receive_data."""
        self._check_open()
        if self.role != "client" or self._state != _IDLE:
            raise ProtocolError(
                "invalid state",
                f"connect_frame needs an idle client (role={self.role}, state={self._state})",
                fault="local",
            )
        versions = _check_versions(versions)
        heartbeat = _check_heartbeat_setting(heartbeat)
        headers = {
            "accept-version": ",".join(versions),
            "host": host,
            "heart-beat": f"{heartbeat[0]},{heartbeat[1]}",
        }
        if login is not None:
            headers["login"] = login
        if passcode is not None:
            headers["passcode"] = passcode
        headers.update(extra or {})
        # CONNECT rather than STOMP: 1.0 servers only know CONNECT.
        data = encode_frame(Frame("CONNECT", headers), STOMP_1_0)
        self._offered_versions = versions
        self._offered_heartbeat = heartbeat
        self._state = _CONNECTING
        return data

    # -- sending -----------------------------------------------------------------------

    def send(self, frame: Frame) -> bytes:
        """Encode ``frame`` for the peer; a frame this side may not send is a local error."""
        self._check_open()
        command = frame.command
        if self.role == "server":
            if command == "ERROR":
                data = encode_frame(frame, self.version)
                self._close_all("ERROR frame sent")
                return data
            if command not in SERVER_COMMANDS or command == "CONNECTED":
                hint = " (use accept_connect)" if command == "CONNECTED" else ""
                raise ProtocolError(
                    "invalid frame", f"a server cannot send {command[:40]!r}{hint}", fault="local"
                )
            allowed = self._state in (_CONNECTED, _DISCONNECTING)
        else:
            if command in _CLIENT_HANDSHAKE:
                raise ProtocolError(
                    "invalid frame", "use connect_frame() to send CONNECT", fault="local"
                )
            if command not in CLIENT_COMMANDS:
                raise ProtocolError(
                    "invalid frame", f"a client cannot send {command[:40]!r}", fault="local"
                )
            allowed = self._state == _CONNECTED
        if not allowed:
            raise ProtocolError(
                "invalid state", f"cannot send {command} while {self._state}", fault="local"
            )
        _validate_frame(frame, self.version, "local")
        data = encode_frame(frame, self.version)
        if command == "DISCONNECT":
            self._state = _DISCONNECTING
        return data

    def receipt(self, receipt_id: str) -> bytes:
        """Server side: the RECEIPT for ``receipt_id``, the one frame every persistent
        SEND is answered with; the same bytes as ``send(Frame("RECEIPT", ...))``
        without building and checking a frame when the id needs no escaping
        (``_PLAIN_VALUE``)."""
        self._check_open()
        if self.role == "server" and self._state in _ANSWERED and _PLAIN_VALUE(receipt_id):
            return b"RECEIPT\nreceipt-id:" + receipt_id.encode() + b"\n\n\x00"
        return self.send(Frame("RECEIPT", {"receipt-id": receipt_id}))

    def message(self, head: str, body: bytes) -> bytes:
        """Server side: a MESSAGE whose head (command line to blank line, escaped for
        this connection's version) the broker joined itself (``codec.join_head``, see
        ``Subscription._write_fast``), with the checks ``send`` makes of one."""
        self._check_open()
        if self.role != "server" or self._state not in _ANSWERED:
            raise ProtocolError(
                "invalid state", f"cannot send MESSAGE while {self._state}", fault="local"
            )
        return b"".join((head.encode("utf-8"), body, b"\x00"))

    def heartbeat_data(self) -> bytes:
        """The bytes of one heart-beat (a bare EOL).

        Not called ``heartbeat()``: that name holds the negotiated :class:`Heartbeat`.
        """
        self._check_open()
        return b"\n"

    def error(self, exc: ProtocolError) -> bytes:
        """The ERROR frame telling the peer about ``exc``; the connection is closed after it."""
        if self.role != "server":
            raise ProtocolError("invalid frame", "only a server sends ERROR", fault="local")
        self._check_open()
        message = " ".join(exc.message.split()) or "error"  # one line, even unescaped in 1.0
        headers = {"message": message}
        if exc.receipt_id is not None:
            headers["receipt-id"] = exc.receipt_id
        headers.update(exc.headers)
        body = b""
        if exc.detail:
            headers["content-type"] = "text/plain;charset=utf-8"
            body = exc.detail.encode("utf-8")
        try:
            data = encode_frame(Frame("ERROR", headers, body), self.version)
        except ProtocolError:
            # A header we echo back is not representable: say what we can.
            data = encode_frame(Frame("ERROR", {"message": message}, body), self.version)
        self._close_all(f"ERROR sent: {message}")
        return data

    def _check_open(self) -> None:
        if self._send_closed:
            raise ConnectionClosed(self._send_closed)

    def _close_all(self, reason: str) -> None:
        self._send_closed = reason
        self._receive_closed = self._receive_closed or reason
