"""Which ``Host`` a management request may name and where a state change may come from:
the defence against DNS rebinding and cross-site requests (issue 23, item 3).

A page on ``evil.example`` whose name is made to resolve to 127.0.0.1 reaches a loopback
listener with ``Host: evil.example:PORT``; the browser sends it as same-origin. So:

- every request's ``Host`` must name this node: its bind address, ``localhost`` and the
  loopback addresses when bound to loopback or to every address, the name the node
  shows in its URL, any IP literal when bound to every address (an address cannot be
  rebound: only names can), and the names of ``http_allowed_hosts``; otherwise 421
  (RFC 9110: "misdirected request"), before routing and before any login;
- a state change (anything but GET/HEAD) needs the CSRF header, and an ``Origin`` (or,
  without one, a ``Referer``) that is this listener itself, ``scheme://Host``; a missing,
  ``null`` or foreign one is refused (403). Browsers send ``Origin`` with every POST and
  DELETE, same-origin ones included; the CLI sends its base URL.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from urllib.parse import urlsplit

from aiohttp import web

from amqlite.management.security import Forbidden
from amqlite.settings import is_loopback
from amqlite.wire import CSRF_HEADER

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

    def check_host(self, request: web.Request) -> None:
        """MisdirectedRequest unless the request's ``Host`` names this node."""
        host = request.headers.get("Host")
        if not host:
            raise MisdirectedRequest("a Host header is required")
        name = host_name(host)
        if name in self.names or (self.wildcard and _is_ip(name)):
            return
        raise MisdirectedRequest(
            f"this node does not serve host {name[:100]!r} (add it to http_allowed_hosts)")

    @staticmethod
    def check_origin(request: web.Request) -> None:
        """Forbidden unless a state change carries the CSRF header and comes from this
        listener's own origin (``Origin``, else ``Referer``)."""
        if not request.headers.get(CSRF_HEADER):
            raise Forbidden(f"state changes need the {CSRF_HEADER} header (CSRF defence)")
        expected = f"{request.scheme}://{request.host}".lower()
        origin = request.headers.get("Origin")
        if origin is None:
            referer = request.headers.get("Referer")
            if not referer:
                raise Forbidden("state changes need an Origin or Referer header of this "
                                f"listener ({expected})")
            parts = urlsplit(referer)
            origin = f"{parts.scheme}://{parts.netloc}"
        if origin.strip().lower().rstrip("/") != expected:
            raise Forbidden(f"cross-origin request from {origin[:100]!r} refused "
                            f"(expected {expected})")
