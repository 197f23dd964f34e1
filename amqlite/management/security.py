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
import time
from dataclasses import dataclass, field

from amqlite.auth import Authenticator
from amqlite.authz import ADMIN_GROUP, Permission, Policy, UsersFile, load_users_file

#: A verified login is remembered this long (s), keyed by a hash of login and password,
#: so a console polling every second does not pay scrypt (~30 ms of CPU) per request.
LOGIN_CACHE_SECONDS = 60.0
#: Remembered logins at most: a bound against someone cycling passwords.
LOGIN_CACHE_SIZE = 256
REALM = "amqlite"


class Unauthorized(Exception):
    """No or wrong credentials (401)."""


class Forbidden(Exception):
    """Logged in, but not allowed (403)."""


@dataclass
class Access:
    users: dict[str, str] | None
    admins: set[str] = field(default_factory=set)
    _cache: dict[bytes, tuple[str, float]] = field(default_factory=dict)
    #: The users file's [[authorization]] entries (an empty Policy: none).
    policy: Policy = field(default_factory=lambda: Policy([], {}))

    @classmethod
    def from_file(cls, users_file: str) -> Access:
        if not users_file:
            return cls(None)
        access = cls(None)
        access.apply(load_users_file(users_file))
        return access

    def apply(self, users_file: UsersFile) -> None:
        """Take a (re)loaded users file; remembered logins are forgotten."""
        self.users = users_file.users
        self.admins = users_file.admins
        self.policy = users_file.policy
        self._cache.clear()

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

    async def login(self, authorization: str | None) -> str | None:
        """The login of a request (None when auth is off); raises Unauthorized."""
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
        key = hashlib.sha256(f"{login}\0{password}".encode()).digest()
        now = time.monotonic()
        hit = self._cache.get(key)
        if hit is not None and hit[1] > now:
            return hit[0]
        # The STOMP listener's check: an unknown login is hashed too (no timing oracle).
        if not await asyncio.to_thread(Authenticator(self.users).check, login, password):
            raise Unauthorized("wrong login or password")
        if len(self._cache) >= LOGIN_CACHE_SIZE:
            self._cache.clear()
        self._cache[key] = (login, now + LOGIN_CACHE_SECONDS)
        return login

    def require_admin(self, login: str | None) -> None:
        if self.users is not None and login not in self.admins:
            raise Forbidden(f"{login} is not an administrator ([groups] {ADMIN_GROUP})")
