"""A loopback TCP forwarder a test can close and open again: clients see a server go
away (connections dropped, new ones refused) and come back, while what is behind it
restarts out of their sight.

Why the ZooKeeper outage test needs it: ZooKeeper 3.8.0 (Debian's) listens before its
database is loaded, and a client connection it closes in that window hits a
NullPointerException in the close path and is left open without an answer
(ZOOKEEPER-5051); kazoo then waits for the handshake's answer a whole session timeout
(its connect timeout is the session timeout divided by the number of hosts), and the
master, suspended that long, demotes. Seen in a clean-clone CI run and in one run of
seven under load. The gate opens again only once the restarted server serves.
"""

from __future__ import annotations

import contextlib
import socket
import threading

from amqlite.listen import pick_ports

#: Bytes per read while forwarding (ZooKeeper's frames are small).
CHUNK = 65536


class TcpGate:
    """Forwards 127.0.0.1:``port`` to 127.0.0.1:``target`` while open."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.port = pick_ports(1)[0]
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._sockets: set[socket.socket] = set()

    def open(self) -> None:
        listener = socket.create_server(("127.0.0.1", self.port), reuse_port=False)
        with self._lock:
            self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True,
                         name="tcp-gate-accept").start()

    def close(self) -> None:
        """New connections refused, every forwarded one dropped (both ends)."""
        with self._lock:
            listener, self._listener = self._listener, None
            sockets, self._sockets = self._sockets, set()
        for s in ([listener] if listener else []) + list(sockets):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # closed
            try:
                server = socket.create_connection(("127.0.0.1", self.target), timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)  # idle between ZooKeeper's pings is not an end
            with self._lock:
                if self._listener is not listener:  # closed meanwhile
                    client.close()
                    server.close()
                    return
                self._sockets.update((client, server))
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True,
                                 name="tcp-gate-pump").start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        """One direction; its end ends the other's too (it reads EOF or an error)."""
        try:
            while data := src.recv(CHUNK):
                dst.sendall(data)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_RDWR)
        with self._lock:
            self._sockets.discard(src)
        src.close()
