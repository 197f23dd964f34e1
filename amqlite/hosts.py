"""Which ``Host`` a listener answers to: the defence against DNS rebinding, shared by the
management API (``amqlite.management.origin``) and the WebSocket listener
(``amqlite.websocket``), which both serve browsers.

A page on ``evil.example`` whose name is made to resolve to 127.0.0.1 reaches a loopback
listener with ``Host: evil.example:PORT``; the browser sends it as same-origin. So every
request's ``Host`` must name this node: its bind address, ``localhost`` and the loopback
addresses when bound to loopback or to every address, the name the node shows in its
URL, any IP literal when bound to every address (an address cannot be rebound: only
names can), and the names of ``http_allowed_hosts``.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and localhost (names are not resolved)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


#: Wildcard bind hosts: the listener answers on every address of the machine.
WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::"})
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


class MisdirectedRequest(Exception):
    """The ``Host`` of a request is not a name of this node (421)."""


def host_name(host: str) -> str:
    """The name or address of a ``Host`` value without port and brackets, lower case."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    if host.count(":") == 1:
        host = host.partition(":")[0]
    return host.rstrip(".")


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class HostGuard:
    """The names a listener bound to ``bind_host`` answers to."""

    def __init__(self, bind_host: str, allowed: Iterable[str] = ()) -> None:
        self.bind_host = host_name(bind_host) if bind_host not in WILDCARD_HOSTS else ""
        self.wildcard = self.bind_host == ""
        self.names: set[str] = {host_name(a) for a in allowed if a.strip()}
        if self.bind_host:
            self.names.add(self.bind_host)
        if self.wildcard or is_loopback(self.bind_host):
            self.names |= LOOPBACK_NAMES
        if self.wildcard:
            for name in (socket.gethostname(), socket.getfqdn()):
                if name:
                    self.names.add(host_name(name))

    def allow(self, name: str) -> None:
        """Also answer to ``name`` (e.g. the host of the URL the node publishes)."""
        self.names.add(host_name(name))

    def check_host_value(self, host: str | None) -> None:
        """MisdirectedRequest unless ``host`` (a ``Host`` header's value, None when
        absent) names this node."""
        if not host:
            raise MisdirectedRequest("a Host header is required")
        name = host_name(host)
        if name in self.names or (self.wildcard and _is_ip(name)):
            return
        raise MisdirectedRequest(
            f"this node does not serve host {name[:100]!r} (add it to http_allowed_hosts)")
