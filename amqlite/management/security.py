"""Who may use the management API: HTTP Basic against the users file, administrators
from its ``[groups]`` table, and the CSRF rule for state changes.

The users file is the broker's own (``amqlite passwd`` hashes)::

    [users]
    alice = "scrypt$..."
    bob = "scrypt$..."

    [groups]
    admins = ["alice"]    # may purge, move, delete and close; others only look

Without a users file nobody logs in and everybody is an administrator: the listener is
then kept on loopback (``Settings.http_allow_remote`` overrides that).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import logging
import math
import time
from dataclasses import dataclass, field

from amqlite.auth import Authenticator, CheckOutcome, CheckQueue
from amqlite.authz import ADMIN_GROUP, Permission, Policy, UsersFile

log = logging.getLogger("amqlite.management")

#: A verified login is remembered this long (s), keyed by a hash of login and password,
#: so a console polling every second does not pay scrypt (~30 ms of CPU) per request.
LOGIN_CACHE_SECONDS = 60.0
#: Remembered logins at most: a bound against someone cycling passwords.
LOGIN_CACHE_SIZE = 256
REALM = "amqlite"
#: Failed logins of one login name from one address before it is refused (429) for a
#: while without a password check: fail2ban's default ``maxretry``; enough for a few typos.
FAILURES_BEFORE_THROTTLE = 5
#: Failures count within this window from the first one (s); older ones are forgotten.
FAILURE_WINDOW = 60.0
#: How long a throttled login/address pair is answered 429 with ``Retry-After`` (s):
#: five guesses per ten seconds per pair is nothing for a brute force, and an
#: administrator who mistyped waits ten seconds.
THROTTLE_SECONDS = 10.0
#: Login/address pairs remembered at most (a few hundred bytes each): a bound against
#: someone cycling logins; past it idle pairs, then the oldest, are forgotten.
MAX_TRACKED_FAILURES = 10_000
#: A login name in the log is cut to this many characters (it is whatever was sent).
LOGGED_LOGIN_CHARS = 64
#: ``Retry-After`` of a 503 when the password check queue was full (s).
BUSY_RETRY_AFTER = 1


class Unauthorized(Exception):
    """No or wrong credentials (401)."""


class Forbidden(Exception):
    """Logged in, but not allowed (403)."""


class Throttled(Exception):
    """Too many failed logins, or the check queue is full: answered ``status`` with a
    ``Retry-After`` of ``retry_after`` seconds and no password check."""

    def __init__(self, message: str, status: int, retry_after: int) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after


@dataclass
class _Failures:
    count: int
    since: float
    blocked_until: float = 0.0


class FailedLogins:
    """Failed logins per (address, login): after ``FAILURES_BEFORE_THROTTLE`` within
    ``FAILURE_WINDOW`` that pair is refused for ``THROTTLE_SECONDS`` (nginx's limit_req
    answer, 429 with Retry-After, RFC 6585). Keyed by the login too, so a flood of bad
    logins from an address an administrator shares (a NAT, a proxy, loopback) does not
    lock the administrator out; the flood's cost is bounded by the check queue instead."""

    def __init__(self, limit: int = FAILURES_BEFORE_THROTTLE, window: float = FAILURE_WINDOW,
                 throttle: float = THROTTLE_SECONDS,
                 max_tracked: int = MAX_TRACKED_FAILURES) -> None:
        self.limit, self.window, self.throttle = limit, window, throttle
        self.max_tracked = max_tracked
        self._pairs: dict[tuple[str, bytes], _Failures] = {}

    @staticmethod
    def _key(peer: str, login: str) -> tuple[str, bytes]:
        """A login is whatever a request sent (up to a header's 8 KiB): 16 bytes of its
        hash keep every entry small."""
        return peer, hashlib.blake2b(login.encode(), digest_size=16).digest()

    def retry_after(self, peer: str, login: str, now: float) -> float:
        """Seconds this pair is still refused (0: it may try)."""
        entry = self._pairs.get(self._key(peer, login))
        return max(0.0, entry.blocked_until - now) if entry is not None else 0.0

    def failed(self, peer: str, login: str, now: float) -> bool:
        """Count a failure; True when it starts a throttle (worth one log line)."""
        key = self._key(peer, login)
        entry = self._pairs.pop(key, None)  # re-inserted last: the dict is oldest first
        if entry is None or now - entry.since > self.window:
            entry = _Failures(0, now, entry.blocked_until if entry else 0.0)
        entry.count += 1
        started = entry.count >= self.limit and entry.blocked_until <= now
        if entry.count >= self.limit:
            entry.blocked_until = now + self.throttle
        if len(self._pairs) >= self.max_tracked:
            self._forget(now)
        self._pairs[key] = entry
        return started

    def succeeded(self, peer: str, login: str) -> None:
        self._pairs.pop(self._key(peer, login), None)

    def _forget(self, now: float) -> None:
        idle = [k for k, e in self._pairs.items()
                if e.blocked_until <= now and now - e.since > self.window]
        for key in idle:
            del self._pairs[key]
        while len(self._pairs) >= self.max_tracked:  # throttled pairs go last
            oldest = next((k for k, e in self._pairs.items() if e.blocked_until <= now),
                          next(iter(self._pairs)))
            del self._pairs[oldest]


@dataclass
class Access:
    #: Checks passwords and holds the logins (None: authentication is off).
    auth: Authenticator = field(default_factory=lambda: Authenticator(None))
    admins: set[str] = field(default_factory=set)
    _cache: dict[bytes, tuple[str, float]] = field(default_factory=dict)
    #: The users file's [[authorization]] entries (an empty Policy: none).
    policy: Policy = field(default_factory=lambda: Policy([], {}))
    failures: FailedLogins = field(default_factory=FailedLogins)
    #: Password checks run on the STOMP listener's kind of queue (bounded, fair per
    #: address, newest first), made on first use and dropped by ``close``.
    _checks: CheckQueue | None = None

    @classmethod
    def from_users_file(cls, users_file: UsersFile | None) -> Access:
        """The node's loaded users file (None: no logins), so the API and the STOMP
        listener start from the same read of it."""
        access = cls()
        if users_file is not None:
            access.apply(users_file)
        return access

    @property
    def users(self) -> dict[str, str] | None:
        return self.auth.users

    def apply(self, users_file: UsersFile) -> None:
        """Take a (re)loaded users file; remembered logins are forgotten."""
        self.auth.users = users_file.users
        self.admins = users_file.admins
        self.policy = users_file.policy
        self._cache.clear()

    def close(self) -> None:
        """Stop the check threads (the listener stops); a later login makes new ones."""
        if self._checks is not None:
            self._checks.close()
            self._checks = None

    @property
    def per_destination(self) -> bool:
        """True when [[authorization]] entries decide destination actions (not [groups]
        admins alone)."""
        return self.users is not None and self.policy.enabled

    def require(self, login: str | None, destination: str, permission: Permission) -> None:
        """Forbidden unless ``login`` has ``permission`` on ``destination``; with no
        [[authorization]] entry, destination actions need an administrator as before."""
        if self.users is None:
            return
        if not self.policy.enabled:
            if permission is Permission.ADMIN:
                self.require_admin(login)
            return
        if not self.policy.allowed(login, destination, permission):
            raise Forbidden(f"permission denied: login {login!r} has no {permission.value} "
                            f"permission on {destination}")

    @property
    def enabled(self) -> bool:
        return self.users is not None

    async def login(self, authorization: str | None, peer: str = "") -> str | None:
        """The login of a request from address ``peer`` (None when auth is off); raises
        Unauthorized, or Throttled (no password check) after repeated failures of this
        login from ``peer`` or when the check queue is full."""
        if self.users is None:
            return None
        if not authorization or not authorization.startswith("Basic "):
            raise Unauthorized("login required")
        try:
            login, sep, password = base64.b64decode(authorization[6:], validate=True) \
                .decode("utf-8").partition(":")
        except (binascii.Error, UnicodeDecodeError):
            raise Unauthorized("malformed Authorization header") from None
        if not sep:
            raise Unauthorized("malformed Authorization header")
        now = time.monotonic()
        # Before the cache too: a cached password must not answer guesses for free.
        wait = self.failures.retry_after(peer, login, now)
        if wait > 0:
            raise Throttled(f"too many failed logins for {login!r} from this address; "
                            f"retry in {math.ceil(wait)}s", 429, math.ceil(wait))
        key = hashlib.sha256(f"{login}\0{password}".encode()).digest()
        hit = self._cache.get(key)
        if hit is not None and hit[1] > now:
            return hit[0]
        outcome = await self._check(peer, login, password)
        if outcome is CheckOutcome.BUSY:
            raise Throttled("server busy checking logins; retry", 503, BUSY_RETRY_AFTER)
        if outcome is not CheckOutcome.ACCEPTED:
            if self.failures.failed(peer, login, time.monotonic()):
                log.warning("management: %d failed logins for %r from %s; refusing it for "
                            "%gs", self.failures.limit, login[:LOGGED_LOGIN_CHARS], peer or "?",
                            self.failures.throttle)
            raise Unauthorized("wrong login or password")
        self.failures.succeeded(peer, login)
        if len(self._cache) >= LOGIN_CACHE_SIZE:
            self._cache.clear()
        self._cache[key] = (login, now + LOGIN_CACHE_SECONDS)
        return login

    async def _check(self, peer: str, login: str, password: str) -> CheckOutcome:
        """The STOMP listener's check (an unknown login is hashed too: no timing oracle)
        through a CheckQueue: at most its threads hash at once, whatever the flood. Its
        own queue, not the STOMP server's: a flood of HTTP logins then delays only HTTP
        logins, never a STOMP client's (the price: two small pools, not one)."""
        if self._checks is None:
            self._checks = CheckQueue(self.auth)
        done: asyncio.Future[CheckOutcome] = asyncio.get_running_loop().create_future()

        def finished(outcome: CheckOutcome) -> None:
            if not done.done():
                done.set_result(outcome)

        check = self._checks.submit(peer, login, password, finished)
        try:
            return await done
        except asyncio.CancelledError:  # the client went: its check never runs
            if self._checks is not None:
                self._checks.cancel(check)
            raise

    def require_admin(self, login: str | None) -> None:
        if self.users is not None and login not in self.admins:
            raise Forbidden(f"{login} is not an administrator ([groups] {ADMIN_GROUP})")
