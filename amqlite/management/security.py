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
import tomllib
from dataclasses import dataclass, field

from amqlite.auth import _DUMMY_HASH, AuthError, load_users, verify_password

#: The ``[groups]`` entry that lists administrators.
ADMIN_GROUP = "admins"
#: A verified login is remembered this long (s), keyed by a hash of login and password,
#: so a console polling every second does not pay scrypt (~30 ms of CPU) per request.
LOGIN_CACHE_SECONDS = 60.0
#: Remembered logins at most: a bound against someone cycling passwords.
LOGIN_CACHE_SIZE = 256
#: Header a state-changing request must carry: a cross-site form or image cannot set it,
#: and a cross-site script that tries needs a CORS preflight we never answer.
CSRF_HEADER = "X-Requested-By"
REALM = "amqlite"


class Unauthorized(Exception):
    """No or wrong credentials (401)."""


class Forbidden(Exception):
    """Logged in, but not allowed (403)."""


def load_admins(path: str) -> set[str]:
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise AuthError(f"users file {path}: {e}") from None
    groups = data.get("groups", {})
    admins = groups.get(ADMIN_GROUP, []) if isinstance(groups, dict) else []
    if not isinstance(admins, list) or not all(isinstance(a, str) for a in admins):
        raise AuthError(f'users file {path}: [groups] {ADMIN_GROUP} must be a list of logins')
    return set(admins)


@dataclass
class Access:
    users: dict[str, str] | None
    admins: set[str] = field(default_factory=set)
    _cache: dict[bytes, tuple[str, float]] = field(default_factory=dict)

    @classmethod
    def from_file(cls, users_file: str) -> Access:
        if not users_file:
            return cls(None)
        return cls(load_users(users_file), load_admins(users_file))

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
        stored = self.users.get(login)
        ok = await asyncio.to_thread(verify_password, password,
                                       stored or _DUMMY_HASH)
        if not ok or stored is None:
            raise Unauthorized("wrong login or password")
        if len(self._cache) >= LOGIN_CACHE_SIZE:
            self._cache.clear()
        self._cache[key] = (login, now + LOGIN_CACHE_SECONDS)
        return login

    def require_admin(self, login: str | None) -> None:
        if self.users is not None and login not in self.admins:
            raise Forbidden(f"{login} is not an administrator ([groups] {ADMIN_GROUP})")
