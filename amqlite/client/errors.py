"""The client's exceptions: what an application catches, and why each one is raised."""

from __future__ import annotations

from typing import TYPE_CHECKING

from amqlite.codec import Frame

if TYPE_CHECKING:
    from amqlite.client.messages import Message

__all__ = [
    "AckNotConfirmedError",
    "BrokerRefusedError",
    "ClientClosedError",
    "ClientError",
    "ConnectRefusedError",
    "ConnectionFailedError",
    "FailoverTimeoutError",
    "SendTimeoutError",
    "TransactionOutcomeUnknownError",
    "TransactionRolledBackError",
]


class ClientError(Exception):
    """Base class of the client's errors."""


class ConnectionFailedError(ClientError):
    """No broker could be reached within the attempt limits (or reconnect is disabled)."""


class ClientClosedError(ClientError):
    """The client was disconnected (or failed for good) while the call was pending."""


class FailoverTimeoutError(ClientError, TimeoutError):
    """The failover ``timeout`` elapsed before the request could be completed."""


class SendTimeoutError(FailoverTimeoutError):
    """A send did not get its RECEIPT within ``timeout`` ms.

    ``written`` False: it never reached a broker and was withdrawn. True: the outcome is
    unknown; it stays queued and is re-sent with the same ``identity`` after a reconnect.
    """

    def __init__(self, message: str, identity: tuple[str, int], written: bool) -> None:
        super().__init__(message)
        self.identity = identity
        self.written = written


def error_text(frame: Frame) -> str:
    """An ERROR frame as one line: its ``message`` header, then its body if it has one."""
    text = frame.headers.get("message", "error")
    detail = frame.body.decode("utf-8", "replace").strip()
    return f"{text}: {detail}" if detail else text


class BrokerRefusedError(ClientError):
    """The broker answered a request with an ERROR frame (kept in ``frame``)."""

    def __init__(self, frame: Frame) -> None:
        super().__init__(f"broker refused: {error_text(frame)}")
        self.frame = frame


class AckNotConfirmedError(ClientError):
    """An ACK/NACK could not be confirmed: it may or may not have taken effect, so the
    message may come again (flagged ``redelivered``) or not."""

    def __init__(self, message: Message, reason: str) -> None:
        super().__init__(f"ack of {message.message_id} not confirmed: {reason}")
        self.message = message
        self.reason = reason


class TransactionRolledBackError(ClientError):
    """The transaction was lost with its connection (it held ACKs, which cannot be
    replayed); nothing of it was committed."""


class TransactionOutcomeUnknownError(TransactionRolledBackError):
    """COMMIT was written but the connection dropped before its RECEIPT, and the
    transaction held ACKs so it could not be replayed: it may or may not be committed."""


#: Words of an ERROR ``message`` answering CONNECT that mean the credentials were refused
#: (amqlite says "authentication failed", ActiveMQ "User name [...] or password is
#: invalid" / "not authorized"). ActiveMQ's failover transport treats a
#: SecurityException as final rather than retrying it; so do we.
SECURITY_REFUSALS = ("authentication", "password", "not authorized", "unauthorized",
                     "access denied", "security")


class ConnectRefusedError(ClientError):
    """The broker answered CONNECT with ERROR; ``security`` when it refused the login
    (retrying cannot help, so failover gives up at once)."""

    def __init__(self, text: str, refusal: str = "") -> None:
        super().__init__(text)
        #: The ERROR frame's ``message`` header.
        self.refusal = refusal

    @property
    def security(self) -> bool:
        """The login or passcode was refused (not e.g. "server busy")."""
        lowered = self.refusal.lower()
        return any(word in lowered for word in SECURITY_REFUSALS)
