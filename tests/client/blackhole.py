"""A TCP proxy that can become a network partition, without network namespaces.

``TcpProxy`` forwards a local port to a target until ``blackhole()``. From then on it
forwards nothing in either direction, answers nothing and closes nothing: every connection
through it, old or new, sees a silent peer. That is what a partition looks like to both
ends (a SIGSTOPped peer looks the same), except that a new connection's TCP handshake still
completes, as towards a paused process whose kernel still accepts.

``hold()`` makes it a slow peer instead: new connections are accepted but reach the target
only at ``release()``, with what the client wrote meanwhile.

``cut()`` makes the target go away loudly (every connection closed, new ones refused)
and ``reopen()`` brings it back on the same port: a server restarted out of the
clients' sight.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable

from tests.helpers.servers import free_ports

__all__ = ["TcpProxy"]

HOST = "127.0.0.1"
#: Bytes moved per recv: a few STOMP frames or PostgreSQL messages at a time.
CHUNK = 64 * 1024
#: Backlog of the proxy's listening socket: a broker's store pool plus clients.
BACKLOG = 64


class TcpProxy:
    """Forwards ``HOST:port`` to ``HOST:target_port``, one thread pair per connection."""

    def __init__(self, target_port: int, name: str = "proxy") -> None:
        self.target_port = target_port
        self.name = name
        # Below the ephemeral range (pick_ports), so that reopen() finds it free again.
        self.port: int = free_ports(1, HOST)[0]
        self._listener = socket.create_server((HOST, self.port), backlog=BACKLOG)
        self._dark = threading.Event()
        self._released = threading.Event()
        self._released.set()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        #: Connections accepted in all, and after the blackhole.
        self.accepted = 0
        self.accepted_dark = 0

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> TcpProxy:
        threading.Thread(target=self._accept_loop, args=(self._listener,),
                         name=f"{self.name}-accept", daemon=True).start()
        return self

    def cut(self) -> None:
        """The target gone: the listener and every connection closed (both ends see it)."""
        with contextlib.suppress(OSError):
            self._listener.close()
        self._close_connections()

    def reopen(self) -> None:
        """Listening again on the same port, after ``cut()``."""
        self._listener = socket.create_server((HOST, self.port), backlog=BACKLOG)
        self.start()

    @property
    def dark(self) -> bool:
        return self._dark.is_set()

    def blackhole(self) -> None:
        """Stop forwarding for good, silently: nothing is sent, nothing is closed."""
        self._dark.set()

    def hold(self) -> None:
        """Connections accepted from now on wait for ``release()`` before going through."""
        self._released.clear()

    def release(self) -> None:
        self._released.set()

    def close(self) -> None:
        """Close the listener and every connection (test teardown)."""
        self._closed.set()
        self._released.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        self._close_connections()

    def _close_connections(self) -> None:
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()

    def _keep(self, sock: socket.socket) -> None:
        with self._lock:
            if self._closed.is_set():
                sock.close()
                return
            self._sockets.append(sock)

    def _accept_loop(self, listener: socket.socket) -> None:
        while not self._closed.is_set():
            try:
                client, _ = listener.accept()
            except OSError:
                return
            self.accepted += 1
            self._keep(client)
            if self.dark:
                self.accepted_dark += 1
                self._spawn(self._swallow, client)
            elif self._released.is_set():
                self._forward(client)
            else:
                self._spawn(self._forward_on_release, client)

    def _forward_on_release(self, client: socket.socket) -> None:
        self._released.wait()
        if not self._closed.is_set():
            self._forward(client)

    def _forward(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection((HOST, self.target_port))
        except OSError:
            client.close()  # the target refuses: so does the proxy
            return
        self._keep(upstream)
        self._spawn(self._pump, client, upstream)
        self._spawn(self._pump, upstream, client)

    def _spawn(self, target: Callable[..., None], *args: socket.socket) -> None:
        threading.Thread(target=target, args=args, name=f"{self.name}-pump",
                         daemon=True).start()

    def _swallow(self, sock: socket.socket) -> None:
        """Read and drop everything, never answer, never close."""
        with contextlib.suppress(OSError):
            while sock.recv(CHUNK):
                pass

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        """Copy source to sink until either end closes; once dark, drop instead of copying
        and let no close through."""
        try:
            while True:
                data = source.recv(CHUNK)
                if self.dark:
                    if not data:
                        return
                    continue
                if not data:
                    break
                sink.sendall(data)
        except OSError:
            if self.dark:
                return
        if not self.dark:
            with contextlib.suppress(OSError):
                sink.shutdown(socket.SHUT_WR)
