"""Users file and password hashes for CONNECT's login/passcode.

The users file is TOML: ``[users]`` mapping a login to a hash made by
``amqlite passwd``. Hashes are scrypt (in the standard library, memory-hard)
in a self-describing string, so parameters can be raised later without
breaking old entries.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import tomllib

#: scrypt cost: n=2**14, r=8, p=1 is the interactive-login setting from the
#: scrypt paper and Python's docs; ~20-50 ms of CPU, so verification runs in
#: a thread and does not stall the event loop.
SCRYPT_N = 2**14
SCRYPT_R = 8
SCRYPT_P = 1
SALT_BYTES = 16
HASH_BYTES = 32
PREFIX = "scrypt"


class AuthError(ValueError):
    """The users file is unusable; the message names the problem."""


def hash_password(password: str, *, salt: bytes | None = None) -> str:
    salt = salt if salt is not None else os.urandom(SALT_BYTES)
    digest = hashlib.scrypt(
        password.encode(), salt=salt, n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P, dklen=HASH_BYTES
    )
    b64 = base64.b64encode
    return f"{PREFIX}${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${b64(salt).decode()}${b64(digest).decode()}"


def verify_password(password: str, stored: str) -> bool:
    try:
        prefix, n, r, p, salt, digest = stored.split("$")
        if prefix != PREFIX:
            return False
        expected = base64.b64decode(digest)
        actual = hashlib.scrypt(
            password.encode(), salt=base64.b64decode(salt), n=int(n), r=int(r), p=int(p),
            dklen=len(expected),
        )
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(actual, expected)


def load_users(path: str) -> dict[str, str]:
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as e:
        raise AuthError(f"users file {path}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise AuthError(f"users file {path} is not valid TOML: {e}") from None
    users = data.get("users")
    if not isinstance(users, dict) or not all(isinstance(v, str) for v in users.values()):
        raise AuthError(f"users file {path}: expected a [users] table of login = \"hash\"")
    return dict(users)


class Authenticator:
    """Checks a CONNECT's credentials; with no users file everyone may connect."""

    def __init__(self, users: dict[str, str] | None) -> None:
        self.users = users

    @property
    def enabled(self) -> bool:
        return self.users is not None

    def check(self, login: str | None, passcode: str | None) -> bool:
        if self.users is None:
            return True
        stored = self.users.get(login or "")
        # Hash even for an unknown login so timing does not reveal which logins exist.
        ok = verify_password(passcode or "", stored or _DUMMY_HASH)
        return ok and stored is not None


_DUMMY_HASH = hash_password("not a password", salt=b"\0" * SALT_BYTES)
