"""``Client``: the blocking facade for scripts. It runs an ``AsyncClient`` on an event loop
in a background thread and waits for each call; ``SyncSubscription`` is its subscription."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine, Iterator, Mapping
from typing import Any, TypeVar

from amqlite.client.asyncclient import DISCONNECT_TIMEOUT_S, AsyncClient
from amqlite.client.messages import Interruption, Message, SendResult, Subscription
from amqlite.client.uri import BrokerURL, TcpURI

__all__ = ["Client", "SyncSubscription"]

_T = TypeVar("_T")


class SyncSubscription:
    """A subscription of the blocking ``Client``."""

    def __init__(self, client: Client, subscription: Subscription) -> None:
        self._client = client
        self.subscription = subscription

    @property
    def id(self) -> str:
        return self.subscription.id

    @property
    def destination(self) -> str:
        return self.subscription.destination

    def receive(self, timeout: float | None = None) -> Message | None:
        """The next message, or None after ``timeout`` seconds or once unsubscribed."""
        return self._client._run(self.subscription.receive(timeout))

    def __iter__(self) -> Iterator[Message]:
        while True:
            message = self.receive()
            if message is None:
                return
            yield message


class Client:
    """Blocking API over ``AsyncClient``: same arguments, same semantics.

    The asyncio client runs on a private event loop in a daemon thread; every method
    submits a coroutine there and waits. Listener and subscription callbacks run on that
    loop thread: they must not block and must not call this blocking API (use
    ``client.async_client`` coroutines from there).
    """

    def __init__(self, broker_url: str | BrokerURL, **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run_loop, name="amqlite-client",
                                        daemon=True)
        self._thread.start()
        self._ready.wait()
        try:
            self.async_client: AsyncClient = self._run(_make_client(broker_url, kwargs))
        except BaseException:
            self.close()
            raise

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.call_soon(self._ready.set)
        self._loop.run_forever()
        self._loop.close()

    def _run(self, coro: Coroutine[Any, Any, _T], timeout: float | None = None) -> _T:
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("blocking Client call from its own loop thread (a callback?): "
                               "use client.async_client coroutines there")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout)
        except BaseException:
            future.cancel()
            raise

    # state
    @property
    def connected(self) -> bool:
        return self.async_client.connected

    @property
    def connected_uri(self) -> TcpURI | None:
        return self.async_client.connected_uri

    @property
    def producer_id(self) -> str:
        return self.async_client.producer_id

    @property
    def unconfirmed_acks(self) -> list[Message]:
        return self.async_client.unconfirmed_acks

    @property
    def interruptions(self) -> list[Interruption]:
        return self.async_client.interruptions

    @property
    def resent(self) -> int:
        return self.async_client.resent

    # calls
    def connect(self, timeout: float | None = None) -> None:
        self._run(self.async_client.connect(), timeout)

    def send(self, destination: str, body: bytes | str = b"",
             headers: Mapping[str, str] | None = None, **kwargs: Any) -> SendResult:
        return self._run(self.async_client.send(destination, body, headers, **kwargs))

    def subscribe(self, destination: str, **kwargs: Any) -> SyncSubscription:
        sub = self._run(self.async_client.subscribe(destination, **kwargs))
        return SyncSubscription(self, sub)

    def unsubscribe(self, subscription: SyncSubscription, *, remove_durable: bool = False
                    ) -> None:
        self._run(self.async_client.unsubscribe(subscription.subscription,
                                                remove_durable=remove_durable))

    def ack(self, message: Message, *, transaction: str | None = None) -> bool:
        return self._run(self.async_client.ack(message, transaction=transaction))

    def nack(self, message: Message, *, transaction: str | None = None) -> bool:
        return self._run(self.async_client.nack(message, transaction=transaction))

    def begin(self, transaction: str | None = None) -> str:
        return self._run(self.async_client.begin(transaction))

    def commit(self, transaction: str) -> None:
        self._run(self.async_client.commit(transaction))

    def abort(self, transaction: str) -> None:
        self._run(self.async_client.abort(transaction))

    def disconnect(self, timeout: float = DISCONNECT_TIMEOUT_S) -> None:
        if self._loop.is_running() and hasattr(self, "async_client"):
            self._run(self.async_client.disconnect(timeout))

    def close(self) -> None:
        """Disconnect and stop the loop thread. Idempotent."""
        if not self._thread.is_alive():
            return
        with contextlib.suppress(Exception):
            self.disconnect()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()

    def __enter__(self) -> Client:
        self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def _make_client(broker_url: str | BrokerURL, kwargs: dict[str, Any]) -> AsyncClient:
    return AsyncClient(broker_url, **kwargs)
