"""Per-destination authorization, ActiveMQ's model, from the users file.

::

    [users]
    alice = "scrypt$..."
    bob = "scrypt$..."
    [groups]
    admins = ["alice"]
    apps = ["alice", "bob"]
    [[authorization]]
    destination = "/queue/orders.>"   # '*' one segment, '>' the rest ('.' separates)
    read = ["apps"]                    # SUBSCRIBE (also durable), browse
    write = ["apps"]                   # SEND
    admin = ["admins"]                 # create, purge, delete, move, retry
    auto_create = false                # true: a reader/writer creates it by using it

Rules, as ActiveMQ's ``authorizationPlugin``:

- no ``[[authorization]]`` entry at all: every authenticated login may do everything
  (what amqlite did before);
- otherwise every entry whose pattern matches the destination counts and their group
  lists are united; a destination no entry matches is denied (ActiveMQ has the same
  "no entry, no access"; add ``destination = "/queue/>"`` for a default);
- using a destination the broker does not know yet creates it, which needs ``admin``
  (ActiveMQ's rule). An entry with ``auto_create = true`` lets whoever may ``read``
  (SUBSCRIBE) or ``write`` (SEND) it create it, for the common "apps create their own
  queues" setup;
- the dead-letter queue and advisory destinations are names like any other: give
  them their own entries (``/queue/DLQ``, ``/topic/ActiveMQ.Advisory.>``). Messages the
  broker itself moves to the dead-letter queue are not checked.
"""

from __future__ import annotations

import enum
import tomllib
from dataclasses import dataclass, field

from amqlite.auth import AuthError, check_hash
from amqlite.wildcard import Pattern, WildcardError, WildcardIndex, compile_pattern

#: Cached decisions at most; past it the cache starts over (it holds
#: (login, destination, permission) triples, a few hundred bytes each).
DECISION_CACHE_SIZE = 65_536
#: The ``[groups]`` entry that lists administrators of the management API.
ADMIN_GROUP = "admins"


class Permission(enum.Enum):
    READ = "read"
    WRITE = "write"
    ADMIN = "admin"


@dataclass(frozen=True)
class Entry:
    """One ``[[authorization]]`` table; its pattern is matched by
    amqlite.wildcard, the same rules as wildcard subscriptions."""

    pattern: Pattern
    groups: dict[Permission, frozenset[str]]
    auto_create: bool = False

    def matches(self, destination: str) -> bool:
        return self.pattern.matches(destination)


def parse_pattern(pattern: object, where: str) -> Pattern:
    """``/queue/a.*.>`` compiled (amqlite.wildcard); AuthError when malformed."""
    if not isinstance(pattern, str):
        raise AuthError(f"{where}: destination must be a string like \"/queue/orders.>\"")
    try:
        return compile_pattern(pattern)
    except WildcardError as e:
        raise AuthError(f"{where}: {e}") from None


@dataclass
class Policy:
    """Who may do what where; the decision per (login, destination, permission) is cached,
    so the hot path pays one dict lookup once a pair has been seen."""

    entries: list[Entry]
    member_of: dict[str, frozenset[str]]  # login -> its groups
    _cache: dict[tuple[str | None, str, Permission], bool] = field(default_factory=dict)
    #: The entries by pattern: a decision looks only at the entries that match.
    _index: WildcardIndex[Entry] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._index = WildcardIndex()
        for entry in self.entries:
            self._index.add(entry.pattern, entry)

    @property
    def enabled(self) -> bool:
        return bool(self.entries)

    def allowed(self, login: str | None, destination: str, permission: Permission) -> bool:
        key = (login, destination, permission)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        ok = self._decide(login, destination, permission)
        if len(self._cache) >= DECISION_CACHE_SIZE:
            self._cache.clear()
        self._cache[key] = ok
        return ok

    def may_create(self, login: str | None, destination: str, permission: Permission) -> bool:
        """May ``login`` create ``destination`` by using it with ``permission``?"""
        if self.allowed(login, destination, Permission.ADMIN):
            return True
        return (self.allowed(login, destination, permission)
                and any(e.auto_create for e in self._index.matching(destination)))

    def _decide(self, login: str | None, destination: str, permission: Permission) -> bool:
        if not self.entries:
            return True
        groups = self.member_of.get(login or "", frozenset())
        return any(not groups.isdisjoint(e.groups[permission])
                   for e in self._index.matching(destination))


@dataclass
class UsersFile:
    """Everything the users file says: hashes, groups, authorization entries."""

    users: dict[str, str]
    groups: dict[str, frozenset[str]]
    policy: Policy

    @property
    def admins(self) -> set[str]:
        return set(self.groups.get(ADMIN_GROUP, ()))


def load_users_file(path: str) -> UsersFile:
    """Read and check the whole users file; AuthError (one line, no secret) when unusable.

    Checked: TOML, ``[users]`` of hashes this broker can verify, ``[groups]`` of lists of
    logins, ``[[authorization]]`` entries with valid patterns naming defined groups."""
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
    for login, stored in users.items():
        problem = check_hash(stored)
        if problem:  # never echo the hash itself
            raise AuthError(f"users file {path}: the hash of {login!r} {problem}")
    raw_groups = data.get("groups", {})
    if not isinstance(raw_groups, dict):
        raise AuthError(f"users file {path}: [groups] must be a table of name = [logins]")
    groups: dict[str, frozenset[str]] = {}
    for name, members in raw_groups.items():
        if not isinstance(members, list) or not all(isinstance(m, str) for m in members):
            raise AuthError(f"users file {path}: [groups] {name} must be a list of logins")
        groups[name] = frozenset(members)
    raw_entries = data.get("authorization", [])
    if not isinstance(raw_entries, list):
        raise AuthError(f"users file {path}: authorization must be [[authorization]] tables")
    entries = []
    for i, raw in enumerate(raw_entries, 1):
        where = f"users file {path}: [[authorization]] #{i}"
        if not isinstance(raw, dict):
            raise AuthError(f"{where} must be a table")
        unknown = set(raw) - {"destination", "read", "write", "admin", "auto_create"}
        if unknown:
            raise AuthError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
        pattern = parse_pattern(raw.get("destination"), where)
        per: dict[Permission, frozenset[str]] = {}
        for perm in Permission:
            names = raw.get(perm.value, [])
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                raise AuthError(f"{where}: {perm.value} must be a list of group names")
            missing = [n for n in names if n not in groups]
            if missing:
                raise AuthError(f"{where}: {perm.value} names unknown group(s) "
                                f"{', '.join(missing)} (not in [groups])")
            per[perm] = frozenset(names)
        auto_create = raw.get("auto_create", False)
        if not isinstance(auto_create, bool):
            raise AuthError(f"{where}: auto_create must be true or false")
        entries.append(Entry(pattern, per, auto_create))
    member_of: dict[str, set[str]] = {}
    for name, members in groups.items():
        for m in members:
            member_of.setdefault(m, set()).add(name)
    policy = Policy(entries, {k: frozenset(v) for k, v in member_of.items()})
    return UsersFile(dict(users), groups, policy)
