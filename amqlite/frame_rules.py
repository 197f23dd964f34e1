"""What a STOMP frame may be, and the error when it is not: the parser's limits, the one
strict integer parser for client input, what each version does to a header value
(1.0's trimming, the trailing CR only 1.2 can carry), ``ProtocolError``. Apart from
amqlite.codec (which re-exports what its users need: the limits, ``parse_uint``,
``ProtocolError``) so that the codec stays one room under 700 lines; compiled with it
(amqlite.native.HOT_MODULES).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from amqlite.wire import STOMP_1_0

__all__ = [
    "DEFAULT_MAX_FRAME_SIZE",
    "DEFAULT_MAX_HEADER_COUNT",
    "DEFAULT_MAX_HEADER_LENGTH",
    "HANDSHAKE_COMMANDS",
    "MAX_CONTENT_LENGTH",
    "TRIMMED_1_0",
    "Fault",
    "Limits",
    "ProtocolError",
    "header_too_long",
    "parse_uint",
    "receipt_line",
    "refuse_trailing_cr",
    "too_many_headers",
    "trims_values",
]

Fault = Literal["remote", "local"]

#: Frames that negotiate the version (parsed before it is known).
HANDSHAKE_COMMANDS: frozenset[str] = frozenset({"CONNECT", "STOMP", "CONNECTED"})
#: STOMP 1.0 header values lose these at both ends: the 1.0 specification's own examples
#: put a space after the colon ("login: <username>") and ActiveMQ trims 1.0 values
#: (Java's String.trim); 1.1 and 1.2 keep every byte.
TRIMMED_1_0 = " \t"

# ActiveMQ's StompWireFormat.MAX_HEADERS: more headers than this is an attack, not a message.
DEFAULT_MAX_HEADER_COUNT = 1000
# ActiveMQ's StompWireFormat.MAX_HEADER_LENGTH (10 KiB per "name:value" line).
DEFAULT_MAX_HEADER_LENGTH = 10 * 1024
# ActiveMQ allows 100 MB (maxDataLength) because the JVM streams frames into one buffer.
# In CPython a frame lives as the receive buffer, the body bytes and the store row at once,
# per connection, so 100 MB x a few connections would exhaust a small broker's RAM;
# 10 MiB is still far above any sane STOMP message.
DEFAULT_MAX_FRAME_SIZE = 10 * 1024 * 1024


#: The largest content-length we parse at all: a signed 64-bit size, what every other
#: STOMP implementation (Java's long) can hold. Anything bigger fails the frame-size
#: limit anyway; the cap only keeps int() off a 5,000-digit string.
MAX_CONTENT_LENGTH = 2**63 - 1


#: Digits of each bound parse_uint was called with (a handful of constants).
_DIGITS: dict[int, int] = {}


def parse_uint(text: str, max_value: int) -> int | None:
    """``text`` as a non-negative integer in ``0..max_value``, or None.

    The one strict integer parser for client input: ASCII digits only (``int()`` also
    takes ``1_0``, signs, spaces and non-ASCII digits), and the digit count is capped
    before ``int()`` runs, so a 5,000-digit value costs nothing and raises nothing.
    Leading zeros are allowed (``007`` is 7), as Java's parseInt allows them.
    """
    if not (text.isascii() and text.isdigit()):
        return None  # also the empty string
    digits = _DIGITS.get(max_value)
    if digits is None:
        digits = _DIGITS[max_value] = len(str(max_value))
    if len(text) > digits:
        text = text.lstrip("0") or "0"  # header lines are bounded: at most 10 KiB
        if len(text) > digits:
            return None
    value = int(text)
    return value if value <= max_value else None


class ProtocolError(Exception):
    """A STOMP protocol violation, attributed to whoever caused it.

    ``fault="remote"``: the peer sent something bad (answer with ERROR and close).
    ``fault="local"``: our own code asked to send something invalid (a bug here).
    """

    def __init__(
        self,
        message: str,
        detail: str = "",
        *,
        fault: Fault = "remote",
        receipt_id: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(f"{message}: {detail}" if detail else message)
        self.fault: Fault = fault
        self.message = message
        self.detail = detail
        self.receipt_id = receipt_id
        # Extra ERROR frame headers the spec asks for (e.g. ``version`` on failed negotiation).
        self.headers: dict[str, str] = dict(headers or {})

    def __repr__(self) -> str:
        return (
            f"ProtocolError({self.message!r}, {self.detail!r}, fault={self.fault!r}, "
            f"receipt_id={self.receipt_id!r})"
        )


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-connection parser limits; a violation is the peer's fault."""

    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
    max_header_count: int = DEFAULT_MAX_HEADER_COUNT
    max_header_length: int = DEFAULT_MAX_HEADER_LENGTH

    def __post_init__(self) -> None:
        for name in ("max_frame_size", "max_header_count", "max_header_length"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"Limits.{name} must be a positive int, got {value!r}")

def too_many_headers(limit: int) -> ProtocolError:
    return ProtocolError("too many headers", f"frame has more than {limit} headers")


def header_too_long(limit: int, length: int) -> ProtocolError:
    return ProtocolError("header too long", f"header line of {length} bytes exceeds {limit}")


def trims_values(command: str, headers: dict[str, str]) -> bool:
    """Whether a frame parsed as STOMP 1.0 gets its header values trimmed: every frame of a
    1.0 connection, but not a handshake frame that negotiates 1.1/1.2 (whose values are
    taken as they are, spaces included, by those specifications)."""
    if command not in HANDSHAKE_COMMANDS:
        return True
    offered = headers.get("accept-version", headers.get("version"))
    return offered is None or offered.strip(TRIMMED_1_0) == STOMP_1_0


def refuse_trailing_cr(command: str, headers: dict[str, str], version: str) -> None:
    """A name or value that still ends with CR once the EOL is gone (``x:v\\r\\r\\n``)
    cannot be sent back in STOMP 1.0 or 1.1: the reader takes that CR for part of the
    EOL, and only 1.2 can escape it. The broker echoes ``receipt`` and the subscription
    ``id`` to this very client, so refuse the frame now, not when the echo fails."""
    for name, value in headers.items():
        if name.endswith("\r") or value.endswith("\r"):
            raise ProtocolError(
                "malformed header",
                f"header {name[:40]!r} in {command[:40]} frame ends with CR, which STOMP "
                f"{version} cannot carry (only 1.2 escapes it as \\r)",
                receipt_id=headers.get("receipt"),
            )


def receipt_line(raw: bytes) -> bytes | None:
    """The value of the first ``receipt`` header line of a raw head, if any."""
    for line in raw.split(b"\n")[1:]:
        if line.startswith(b"receipt:"):
            return line[len(b"receipt:"):].rstrip(b"\r")
    return None
