"""What the application handles: destinations, send results, delivered messages, the
subscriptions that queue them, transport listeners and interruption records."""

from __future__ import annotations

import asyncio
import enum
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from amqlite.codec import Frame
from amqlite.wire import (  # re-exported: amqlite.client's public names
    CLUSTER_URIS_HEADER,
    PRODUCER_ID_HEADER,
    PRODUCER_SEQ_HEADER,
    REBALANCE_HEADER,
)

if TYPE_CHECKING:
    from amqlite.client.asyncclient import AsyncClient

__all__ = [
    "CLUSTER_URIS_HEADER",
    "PRODUCER_ID_HEADER",
    "PRODUCER_SEQ_HEADER",
    "REBALANCE_HEADER",
    "Interruption",
    "Message",
    "SendResult",
    "Subscription",
    "TransportListener",
    "stomp_destination",
]


def stomp_destination(name: str) -> str:
    """``queue://x`` / ``topic://x`` (ActiveMQ style) or ``/queue/x`` / ``/topic/x`` ->
    the STOMP destination; anything else is a ValueError naming it."""
    for prefix, kind in (("queue://", "queue"), ("topic://", "topic")):
        if name.startswith(prefix) and len(name) > len(prefix):
            return f"/{kind}/{name[len(prefix):]}"
    if name.startswith(("/queue/", "/topic/")) and len(name) > len("/queue/"):
        return name
    raise ValueError(
        f"destination {name!r}: use queue://NAME, topic://NAME, /queue/NAME or /topic/NAME"
    )


class TransportListener:
    """No-op base for transport listeners; any object with some of these methods works."""

    def on_command(self, frame: Frame) -> None:
        """Every frame received from the broker (CONNECTED, MESSAGE, RECEIPT, ERROR)."""

    def on_exception(self, exc: BaseException) -> None:
        """Reconnect gave up (ConnectionFailedError) or an ack was not confirmed."""

    def on_interrupted(self) -> None:
        """The connection dropped; the client is reconnecting."""

    def on_resumed(self) -> None:
        """A connection is (re-)established and the client state restored on it."""


@dataclass(frozen=True, slots=True)
class SendResult:
    """What the broker confirmed: the message identity and where it went.

    ``seq`` of a persistent send is its producer sequence (1, 2, 3, ... with no
    holes); a non-persistent send gets a local number the broker never sees.
    """

    producer_id: str
    seq: int
    destination: str
    receipt: str | None

    @property
    def identity(self) -> tuple[str, int]:
        return (self.producer_id, self.seq)


@dataclass(slots=True)
class Interruption:
    """One outage of the client's connection, for reports (``amqlite produce``)."""

    started: float  # time.monotonic()
    from_uri: str
    reason: str
    ended: float | None = None
    to_uri: str | None = None

    @property
    def duration(self) -> float | None:
        return None if self.ended is None else self.ended - self.started


@dataclass(frozen=True, slots=True)
class Message:
    """A MESSAGE frame as delivered to the application."""

    frame: Frame
    subscription: Subscription
    #: Which connection delivered it: an ack is only meaningful on that connection.
    generation: int

    @property
    def headers(self) -> dict[str, str]:
        return self.frame.headers

    @property
    def body(self) -> bytes:
        return self.frame.body

    @property
    def text(self) -> str:
        return self.frame.body.decode("utf-8", "replace")

    @property
    def destination(self) -> str:
        return self.frame.headers.get("destination", "")

    @property
    def message_id(self) -> str:
        return self.frame.headers.get("message-id", "")

    @property
    def ack_id(self) -> str:
        return self.frame.headers.get("ack") or self.message_id

    @property
    def redelivered(self) -> bool:
        return self.frame.headers.get("redelivered", "false").lower() == "true"

    @property
    def identity(self) -> tuple[str, int] | None:
        """The producer identity, when the producer set one (amqlite clients do)."""
        pid = self.frame.headers.get(PRODUCER_ID_HEADER)
        seq = self.frame.headers.get(PRODUCER_SEQ_HEADER)
        if pid is None or seq is None or not seq.lstrip("-").isdigit():
            return None
        return (pid, int(seq))


class _End(enum.Enum):
    CLOSED = enum.auto()


_CLOSED: Final = _End.CLOSED  # end-of-stream marker in a subscription's queue


class Subscription:
    """One subscription; messages come through ``receive()``/``async for`` or a callback."""

    def __init__(
        self,
        client: AsyncClient,
        sub_id: str,
        destination: str,
        ack: str,
        headers: dict[str, str],
        callback: Callable[[Message], Any] | None,
    ) -> None:
        self.client = client
        self.id = sub_id
        self.destination = destination
        self.ack = ack
        self.headers = headers  # the SUBSCRIBE headers, re-sent after every reconnect
        self.callback = callback
        self.closed = False
        self.delivered = 0
        self.dropped_at_interruption = 0
        self._queue: asyncio.Queue[Message | _End] = asyncio.Queue()
        self._active: asyncio.Future[None] | None = None

    def __repr__(self) -> str:
        return f"<Subscription {self.id} {self.destination} ack={self.ack}>"

    @property
    def durable_name(self) -> str | None:
        return self.headers.get("activemq.subscriptionName")

    async def receive(self, timeout: float | None = None) -> Message | None:
        """The next message, or None after ``timeout`` seconds or once unsubscribed."""
        if self.closed and self._queue.empty():
            return None
        try:
            async with asyncio.timeout(timeout):
                item = await self._queue.get()
        except TimeoutError:
            return None
        if item is _CLOSED:
            self._queue.put_nowait(_CLOSED)  # wake every other reader too
            return None
        return item

    def __aiter__(self) -> AsyncIterator[Message]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Message]:
        while True:
            message = await self.receive()
            if message is None:
                return
            yield message

    def _deliver(self, message: Message) -> None:
        self.delivered += 1
        if self.callback is None:
            self._queue.put_nowait(message)
            return
        self.client._call_user(self.callback, message)

    def _drop_undelivered(self, generation: int) -> int:
        """Drop queued messages of an older connection (the broker redelivers them)."""
        kept: list[Message | _End] = []
        dropped = 0
        while not self._queue.empty():
            item = self._queue.get_nowait()
            if isinstance(item, Message) and item.generation <= generation:
                dropped += 1
            else:
                kept.append(item)
        for item in kept:
            self._queue.put_nowait(item)
        self.dropped_at_interruption += dropped
        return dropped

    def _close(self) -> None:
        if not self.closed:
            self.closed = True
            self._queue.put_nowait(_CLOSED)
