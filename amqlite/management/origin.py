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

from urllib.parse import urlsplit

from aiohttp import web

from amqlite import hosts
from amqlite.hosts import MisdirectedRequest, host_name
from amqlite.management.security import Forbidden
from amqlite.wire import CSRF_HEADER

__all__ = ["HostGuard", "MisdirectedRequest", "host_name"]


class HostGuard(hosts.HostGuard):
    """``amqlite.hosts.HostGuard`` for aiohttp requests, with the CSRF/Origin rule."""

    def check_host(self, request: web.Request) -> None:
        """MisdirectedRequest unless the request's ``Host`` names this node."""
        self.check_host_value(request.headers.get("Host"))

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
