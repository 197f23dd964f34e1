"""Users file and password hashes for CONNECT's login/passcode.

The users file is TOML: ``[users]`` mapping a login to a hash made by
``amqlite passwd``. Hashes are scrypt (in the standard library, memory-hard)
in a self-describing string, so parameters can be raised later without
breaking old entries.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import enum
import functools
import hashlib
import hmac
import itertools
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

#: scrypt cost: n=2**14, r=8, p=1 is the interactive-login setting from the
#: scrypt paper and Python's docs; ~20-50 ms of CPU, so verification runs in
#: a thread and does not stall the event loop.
SCRYPT_N = 2**14
SCRYPT_R = 8
SCRYPT_P = 1
SALT_BYTES = 16
HASH_BYTES = 32
PREFIX = "scrypt"


log = logging.getLogger(__name__)


class AuthError(ValueError):
    """The users file is unusable; the message names the problem."""


def hash_password(password: str, *, salt: bytes | None = None) -> str:
    """``scrypt$N$r$p$salt$digest``: algorithm and parameters travel with the hash."""
    salt = salt if salt is not None else os.urandom(SALT_BYTES)
    digest = hashlib.scrypt(
        password.encode(), salt=salt, n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P, dklen=HASH_BYTES
    )
    b64 = base64.b64encode
    return f"{PREFIX}${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${b64(salt).decode()}${b64(digest).decode()}"


def _verify_scrypt(password: str, fields: list[str]) -> bool:
    n, r, p, salt, digest = fields
    expected = base64.b64decode(digest)
    actual = hashlib.scrypt(
        password.encode(), salt=base64.b64decode(salt), n=int(n), r=int(r), p=int(p),
        dklen=len(expected),
    )
    return hmac.compare_digest(actual, expected)


#: Algorithm name (the hash's first ``$`` field) -> (number of fields after it, verifier).
#: The parameters live in each hash, so raising SCRYPT_N later only changes new hashes;
#: a new algorithm is a new entry here, and every old hash still verifies.
VERIFIERS: dict[str, tuple[int, Callable[[str, list[str]], bool]]] = {
    PREFIX: (5, _verify_scrypt),
}


def _split(stored: str) -> tuple[str, list[str], bool]:
    """A stored hash's algorithm, the fields after it, and whether a verifier of that
    algorithm takes that many fields."""
    algorithm, _, rest = stored.partition("$")
    fields = rest.split("$")
    known = VERIFIERS.get(algorithm)
    return algorithm, fields, known is not None and len(fields) == known[0]


def check_hash(stored: str) -> str | None:
    """Why ``stored`` cannot be verified (never quoting it), or None when it can."""
    algorithm, fields, usable = _split(stored)
    if algorithm not in VERIFIERS:
        return ("is not in a known format (make one with 'amqlite passwd'; algorithms: "
                + ", ".join(VERIFIERS) + ")")
    if not usable:
        return f"is a malformed {algorithm} hash"
    if algorithm == PREFIX:
        try:
            n, r, p = (int(x) for x in fields[:3])
            base64.b64decode(fields[3], validate=True)
            base64.b64decode(fields[4], validate=True)
        except ValueError:
            return f"is a malformed {algorithm} hash"
        if n < 2 or n & (n - 1) or r < 1 or p < 1:
            return f"has invalid {algorithm} parameters"
    return None


def needs_upgrade(stored: str) -> bool:
    """True when ``stored`` was made with other than today's algorithm or parameters."""
    return not stored.startswith(f"{PREFIX}${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}$")


def verify_password(password: str, stored: str) -> bool:
    algorithm, fields, usable = _split(stored)
    if not usable:
        return False
    try:
        return VERIFIERS[algorithm][1](password, fields)
    except (ValueError, TypeError, MemoryError):
        return False


def check_new_password(password: str) -> None:
    """Refuse a password no one should use: empty or only spaces (ValueError)."""
    if not password or not password.strip():
        raise ValueError("an empty password is refused")


class Authenticator:
    """Checks a CONNECT's credentials; with no users file everyone may connect."""

    def __init__(self, users: dict[str, str] | None) -> None:
        self.users = users
        if users is not None:
            _dummy_hash()  # now: the first unknown login must take no longer than others

    @property
    def enabled(self) -> bool:
        return self.users is not None

    def check(self, login: str | None, passcode: str | None) -> bool:
        if self.users is None:
            return True
        stored = self.users.get(login or "")
        # Hash even for an unknown login so timing does not reveal which logins exist.
        ok = verify_password(passcode or "", stored or _dummy_hash())
        return ok and stored is not None


@functools.cache
def _dummy_hash() -> str:
    """Made when a users file is loaded (``Authenticator``), not at import: scrypt would
    cost every process that imports this module (each CLI command, each broker start)
    50 ms."""
    return hash_password("not a password", salt=b"\0" * SALT_BYTES)


# -- password checks under load ------------------------------------------------------------

#: Threads that run scrypt. hashlib.scrypt releases the GIL, so each thread takes a core;
#: on the 2-core machines we target, one hashes while the other keeps the event loop serving
#: connected clients (more threads would only let a login flood starve message traffic).
CHECK_THREADS = max(1, min(4, (os.cpu_count() or 2) - 1))
#: Checks waiting for a thread, over all peers. At ~30 ms a check on one thread, 128 is ~4 s
#: of work: within the handshake timeout, so a queued login can still finish in time.
MAX_PENDING_CHECKS = 128
#: Checks waiting per peer address: one address flooding CONNECTs cannot crowd out others,
#: while a client pool of one application host reconnecting after a failover still fits.
MAX_PENDING_PER_PEER = 32
#: Checks waiting per login: a flood of guesses for one login cannot fill its address's
#: share (or the whole queue) and push out the logins of everyone else behind that address.
MAX_PENDING_PER_LOGIN = 4
#: How long a verified passcode skips the queue: a client that logged in within this time
#: logs in again at once, whatever flood of wrong passcodes for its login is going on.
GOOD_CREDENTIAL_TTL = 300.0
#: How long a passcode that failed is refused without hashing it again: a flood repeating
#: one wrong passcode costs one check, not one per socket.
BAD_CREDENTIAL_TTL = 60.0
#: Entries in each of the two caches (logins verified; wrong login/passcode pairs).
CREDENTIAL_CACHE_SIZE = 4096


class CheckOutcome(enum.Enum):
    """How a queued password check ended, as the waiting connection sees it."""

    ACCEPTED = "accepted"
    DENIED = "denied"
    BUSY = "busy"  # dropped from a full queue before it ran


class CredentialCache:
    """Outcomes of recent password checks, so a known answer does not wait for scrypt.

    Never holds a passcode: each entry is an HMAC-SHA256, under a key made at random when
    the process starts, of the login, the stored hash it was checked against and the
    passcode. A users file that changes a login's hash (or removes the login) therefore
    makes its entries miss. Good answers are kept one per login (the passcode that last
    verified) for ``good_ttl``; wrong ones per login/passcode pair for ``bad_ttl``. Both
    maps are bounded, least recently used first out.
    """

    def __init__(self, *, good_ttl: float = GOOD_CREDENTIAL_TTL,
                 bad_ttl: float = BAD_CREDENTIAL_TTL, size: int = CREDENTIAL_CACHE_SIZE,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.good_ttl = good_ttl
        self.bad_ttl = bad_ttl
        self.size = size
        self.clock = clock
        self._key = os.urandom(32)
        self.good: OrderedDict[str, tuple[bytes, float]] = OrderedDict()  # login -> mac
        self.bad: OrderedDict[bytes, float] = OrderedDict()  # mac -> expiry

    def key(self, login: str, passcode: str, stored: str | None) -> bytes:
        """The entry of a login/passcode pair (an HMAC; also CheckQueue's key)."""
        mac = hmac.new(self._key, digestmod=hashlib.sha256)
        for part in (login, stored or "", passcode):
            data = part.encode("utf-8", "surrogatepass")
            mac.update(len(data).to_bytes(8, "big") + data)  # unambiguous concatenation
        return mac.digest()

    def recall(self, login: str, passcode: str, stored: str | None) -> bool | None:
        """True/False when this answer is known and fresh, None when it must be hashed."""
        now = self.clock()
        mac = self.key(login, passcode, stored)
        good = self.good.get(login)
        if good is not None:
            if good[1] <= now:
                del self.good[login]
            elif hmac.compare_digest(good[0], mac):
                self.good.move_to_end(login)
                return True
        expiry = self.bad.get(mac)
        if expiry is not None:
            if expiry <= now:
                del self.bad[mac]
            else:
                return False
        return None

    def remember(self, login: str, passcode: str, stored: str | None, ok: bool) -> None:
        mac = self.key(login, passcode, stored)
        now = self.clock()
        if ok:
            self.good[login] = (mac, now + self.good_ttl)
            self.good.move_to_end(login)
            self.bad.pop(mac, None)
            table: OrderedDict[str, tuple[bytes, float]] | OrderedDict[bytes, float] = self.good
        else:
            self.bad[mac] = now + self.bad_ttl
            self.bad.move_to_end(mac)
            table = self.bad
        while len(table) > self.size:
            table.popitem(last=False)

    def clear(self) -> None:
        self.good.clear()
        self.bad.clear()


@dataclass(eq=False)
class PendingCheck:
    """One CONNECT's credentials waiting for (or in) a hashing thread."""

    peer: str
    login: str | None
    passcode: str | None = field(repr=False)
    done: Callable[[CheckOutcome], None]
    cancelled: bool = False
    #: The stored hash when the check was submitted (what a cached answer is tied to).
    stored: str | None = field(default=None, repr=False)
    #: The hash it waits for, shared with every CONNECT of the same login and passcode.
    group: CheckGroup | None = field(default=None, repr=False)
    #: Answered no at submit (a denial the cache knew, a full queue), the answer a loop
    #: turn away: its socket closes then anyway (``crowded_out`` takes it first).
    refused: bool = False


@dataclass(eq=False)
class CheckGroup:
    """One login/passcode pair to hash, and the CONNECTs waiting for its answer: the same
    guess repeated on many sockets is one entry of the queue and one hash."""

    peer: str  # the address of its first CONNECT: the queue it waits in
    login: str | None
    passcode: str | None = field(repr=False)
    stored: str | None = field(repr=False)
    key: bytes | None = field(repr=False)  # CredentialCache.key; None: no cache
    #: Its entry in ``CheckQueue.tally``: the pair whatever its hash (a users file
    #: reloaded does not make a flood's guesses new).
    tally_key: bytes | None = field(repr=False)
    #: Times this pair was tried recently when it joined the queue (``CheckQueue.tally``).
    seen: int
    order: int  # arrival: among equally tried, the newest goes first, the oldest is dropped
    waiters: list[PendingCheck] = field(default_factory=list)


#: Login/passcode pairs whose recent tries are counted (least recently tried first out):
#: as many as the credential cache holds.
TALLY_SIZE = CREDENTIAL_CACHE_SIZE
#: Passcodes of one login tried again recently that still look like its clients
#: retrying after "server busy" (``CheckQueue.rank``): one, or two while a password
#: changes; more is a flood cycling through a list of guesses.
RETRIED_PASSCODES_MAX = 2
#: How long a passcode counts as tried again after its last try (s): a client retries
#: within a second or two.
RETRY_WINDOW = 10.0


class Retries:
    """Per login, the passcodes tried again within ``RETRY_WINDOW`` (by their
    ``CheckQueue.tally`` key: an HMAC under the process's random key, never a passcode),
    at most ``RETRIED_PASSCODES_MAX + 1`` per login and ``TALLY_SIZE`` logins, least
    recently tried first out: enough to tell "a few" from "more"."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.logins: OrderedDict[str, OrderedDict[bytes, float]] = OrderedDict()

    def note(self, login: str, key: bytes) -> None:
        keys = self.logins.pop(login, None) or OrderedDict()
        self.logins[login] = keys
        keys.pop(key, None)
        keys[key] = self.clock()
        while len(keys) > RETRIED_PASSCODES_MAX + 1:
            keys.popitem(last=False)
        while len(self.logins) > TALLY_SIZE:
            self.logins.popitem(last=False)

    def forget(self, login: str, key: bytes) -> None:
        keys = self.logins.get(login)
        if keys is not None:
            keys.pop(key, None)

    def few(self, login: str) -> bool:
        """At most ``RETRIED_PASSCODES_MAX`` passcodes of ``login`` tried again lately."""
        keys = self.logins.get(login)
        if keys is None:
            return True
        since = self.clock() - RETRY_WINDOW
        while keys and next(iter(keys.values())) < since:
            keys.popitem(last=False)
        return len(keys) <= RETRIED_PASSCODES_MAX


class CheckQueue:
    """Runs password checks on a few threads with bounded, fair waiting.

    Why this shape: a flood of bad CONNECTs must not delay a good login by more than a
    couple of checks. So

    - at most ``threads`` checks run at once, on our own pool (not the default executor
      that the store's blocking calls use);
    - CONNECTs with the same login and passcode share one check (``CheckGroup``) while it
      waits or runs: a flood repeating a guess takes one place in the queue and one hash;
    - waiting checks are kept per peer address and served round-robin across addresses;
      within an address by ``rank``: a login's passcode tried again goes first while
      the login has one or two of those (a client retrying after "server busy", where
      a flood of unique guesses tries each once), else the fewest tried (a user's
      passcode before a list of guesses cycled over and over), newest first among
      equals: a flooder's backlog delays only itself, and a login behind a flood from
      its own address gets in on its first try or on a retry;
    - a check whose sockets all closed is removed at once and never runs (``cancel``);
    - waiting is bounded per login, per address and in total; past a bound the last
      by rank (the oldest among equals) of that login, of that address, or of the
      address with most waiting is answered BUSY (the newcomer itself when it is last);
    - with a ``cache`` (CredentialCache), an answer known from a recent check is given
      without queueing (a login that verified recently gets in whatever the flood), and a
      waiting check whose answer became known meanwhile does not run either.
    """

    def __init__(self, auth: Authenticator, *, threads: int = CHECK_THREADS,
                 max_pending: int = MAX_PENDING_CHECKS,
                 max_per_peer: int = MAX_PENDING_PER_PEER,
                 max_per_login: int = MAX_PENDING_PER_LOGIN,
                 cache: CredentialCache | None = None) -> None:
        self.auth = auth
        self.threads = threads
        self.max_pending = max_pending
        self.max_per_peer = max_per_peer
        self.max_per_login = max_per_login
        self.cache = cache
        self.waiting: dict[str, list[CheckGroup]] = {}  # insertion order = round-robin
        self.by_login: dict[str, list[CheckGroup]] = {}  # the same checks, per login
        self.by_key: dict[bytes, CheckGroup] = {}  # waiting or running, by cache key
        #: Recent tries per login/passcode pair (by cache key), bounded (TALLY_SIZE).
        self.tally: OrderedDict[bytes, int] = OrderedDict()
        #: Per login, the passcodes tried again lately (``rank``).
        self.retries = Retries()
        self.pending = 0  # waiting checks (groups)
        self.running: set[CheckGroup] = set()
        self.arrivals = itertools.count()
        #: Since the last take_counts(): checks hashed, dropped unrun because their socket
        #: closed, answered BUSY from a full queue (what an operator sees of a flood), and
        #: answered from the cache without hashing (sockets, except "run").
        self.counts = {"run": 0, "dropped": 0, "busy": 0, "cached": 0}
        self._executor: ThreadPoolExecutor | None = None
        self.closed = False

    def submit(self, peer: str, login: str | None, passcode: str | None,
               done: Callable[[CheckOutcome], None]) -> PendingCheck:
        """Queue a check; ``done`` is called on the event loop thread, unless cancelled
        (never before this returns)."""
        users = self.auth.users
        stored = users.get(login or "") if users is not None else None
        check = PendingCheck(peer, login, passcode, done, stored=stored)
        loop = asyncio.get_running_loop()
        known = self._recall(check.login, check.passcode, stored)
        if known is not None:
            check.refused = not known
            loop.call_soon(self._answer, check, known)
            return check
        key: bytes | None = None
        tally_key: bytes | None = None
        if self.cache is not None:
            key = self.cache.key(login or "", passcode or "", stored)
            tally_key = self.cache.key(login or "", passcode or "", None)
        group = self.by_key.get(key) if key is not None else None
        if group is not None:  # the same pair waits or runs: its answer is this one's
            group.waiters.append(check)  # not a try of its own: a pool's sockets at
            check.group = group          # once are one try, not a flood's repeats
            return check
        seen = self._tried(tally_key)
        if seen > 1 and tally_key is not None:
            self.retries.note(login or "", tally_key)
        group = CheckGroup(peer, login, passcode, stored, key, tally_key, seen,
                           next(self.arrivals))
        group.waiters.append(check)
        check.group = group
        victim = self._victim(group)
        if victim is group:  # tried more than everything waiting: refused, not queued
            self.counts["busy"] += 1
            check.group = None
            check.refused = True
            loop.call_soon(self._refuse, check)
            return check
        if victim is not None:
            self._drop(victim)
        self.waiting.setdefault(peer, []).append(group)
        self.by_login.setdefault(login or "", []).append(group)
        if key is not None:
            self.by_key[key] = group
        self.pending += 1
        self._start_next()
        return check

    def rank(self, group: CheckGroup) -> tuple[int, int, int]:
        """Serving order, lowest first; a full queue drops the highest. A client that
        got "server busy" retries its one passcode, while a flood of a new guess on
        every socket tries each once: while a login has at most
        ``RETRIED_PASSCODES_MAX`` passcodes tried again lately, those go first, the
        most tried first. A login with more is under a flood cycling through a list of
        guesses: then the fewest tried go first (a user's first try before guesses
        tried over and over). The newest first among equals."""
        if group.seen > 1 and not self.oft_tried(group):
            return 0, -group.seen, -group.order
        return 1, group.seen, -group.order

    def oft_tried(self, group: CheckGroup) -> bool:
        """A guess of a flood cycling through a list: tried again, for a login with
        more passcodes tried again than a client retrying has (``rank``)."""
        return group.seen > 1 and not self.retries.few(group.login or "")

    def _tried(self, key: bytes | None) -> int:
        """Count one more try of the pair ``key``; how many were counted recently."""
        if key is None:
            return 1
        seen = self.tally.pop(key, 0) + 1
        self.tally[key] = seen
        if len(self.tally) > TALLY_SIZE:
            self.tally.popitem(last=False)
        return seen

    def _victim(self, newcomer: CheckGroup) -> CheckGroup | None:
        """The waiting check to answer BUSY to make room for ``newcomer`` (maybe itself),
        or None when it fits: the bounds per login, per address, then in total."""
        same_login = self.by_login.get(newcomer.login or "")
        if same_login is not None and len(same_login) >= self.max_per_login:
            return max([*same_login, newcomer], key=self.rank)
        queue = self.waiting.get(newcomer.peer)
        if queue is not None and len(queue) >= self.max_per_peer:
            return max([*queue, newcomer], key=self.rank)
        if self.pending >= self.max_pending:
            fullest = max(self.waiting, key=lambda p: len(self.waiting[p]))
            return max([*self.waiting[fullest], newcomer], key=self.rank)
        return None

    def _recall(self, login: str | None, passcode: str | None,
                stored: str | None) -> bool | None:
        if self.cache is None or self.auth.users is None:
            return None
        return self.cache.recall(login or "", passcode or "", stored)

    def _answer(self, check: PendingCheck, ok: bool) -> None:
        """A cached answer, given a loop iteration after submit (unless cancelled since)."""
        if not check.cancelled and not self.closed:
            self.counts["cached"] += 1
            self._notify(check, CheckOutcome.ACCEPTED if ok else CheckOutcome.DENIED)

    def _refuse(self, check: PendingCheck) -> None:
        """A newcomer refused by a full queue, a loop iteration after submit."""
        if not check.cancelled and not self.closed:
            self._notify(check, CheckOutcome.BUSY)

    def cancel(self, check: PendingCheck) -> None:
        """The socket went: the check must not run (if it already runs, its result is dropped)."""
        if check.cancelled:
            return
        check.cancelled = True
        group, check.group = check.group, None
        if group is None:
            return
        with contextlib.suppress(ValueError):
            group.waiters.remove(check)
        if not group.waiters and group not in self.running and self._queued(group):
            self._unqueue(group)
            self.counts["dropped"] += 1

    def _queued(self, group: CheckGroup) -> bool:
        queue = self.waiting.get(group.peer)
        return queue is not None and group in queue

    def close(self) -> None:
        self.closed = True
        for groups in (*self.waiting.values(), self.running):
            for group in groups:
                for check in group.waiters:
                    check.cancelled = True
        self.waiting.clear()
        self.by_login.clear()
        self.by_key.clear()
        self.tally.clear()
        self.retries.logins.clear()
        self.pending = 0
        if self.cache is not None:
            self.cache.clear()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

    def take_counts(self) -> dict[str, int]:
        """The counts since the last call, reset."""
        counts, self.counts = self.counts, dict.fromkeys(self.counts, 0)
        return counts

    def _unqueue(self, group: CheckGroup) -> None:
        """Take a waiting check out of its address's and its login's queue."""
        for table, key in ((self.waiting, group.peer), (self.by_login, group.login or "")):
            queue = table[key]
            queue.remove(group)  # bounded: at most max_per_peer / max_per_login entries
            if not queue:
                del table[key]
        if group.key is not None and self.by_key.get(group.key) is group:
            del self.by_key[group.key]
        self.pending -= 1

    def _drop(self, group: CheckGroup) -> None:
        self._unqueue(group)
        self._answer_all(group, CheckOutcome.BUSY)

    def _answer_all(self, group: CheckGroup, outcome: CheckOutcome) -> None:
        waiters, group.waiters = group.waiters, []
        for check in waiters:
            if check.cancelled:
                continue
            check.group = None
            if outcome is CheckOutcome.BUSY:
                self.counts["busy"] += 1
            self._notify(check, outcome)

    @staticmethod
    def _notify(check: PendingCheck, outcome: CheckOutcome) -> None:
        """Tell the waiter once; its failure must not stop the queue for everyone else."""
        check.cancelled = True
        try:
            check.done(outcome)
        except Exception:
            log.exception("handling the outcome of a login check for %s failed", check.peer)

    def _start_next(self) -> None:
        loop = asyncio.get_running_loop()
        while not self.closed and len(self.running) < self.threads and self.waiting:
            peer, queue = next(iter(self.waiting.items()))
            group = min(queue, key=self.rank)  # see rank
            self._unqueue(group)
            if peer in self.waiting:  # to the back of the round
                self.waiting[peer] = self.waiting.pop(peer)
            known = self._recall(group.login, group.passcode, group.stored)
            if known is not None:  # answered while it waited (the same guess ran)
                self.counts["cached"] += len(group.waiters)
                self._answer_all(group, CheckOutcome.ACCEPTED if known else CheckOutcome.DENIED)
                continue
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self.threads,
                                                    thread_name_prefix="amqlite-auth")
            self.running.add(group)
            if group.key is not None:
                self.by_key[group.key] = group  # later CONNECTs of the pair join it
            self.counts["run"] += 1
            future = loop.run_in_executor(self._executor, self.auth.check, group.login,
                                          group.passcode)
            future.add_done_callback(functools.partial(self._finished, group))

    def _finished(self, group: CheckGroup, future: asyncio.Future[bool]) -> None:
        self.running.discard(group)
        if group.key is not None and self.by_key.get(group.key) is group:
            del self.by_key[group.key]
        hashed = not future.cancelled() and future.exception() is None
        ok = hashed and future.result()
        if hashed and self.cache is not None and not self.closed:
            self.cache.remember(group.login or "", group.passcode or "", group.stored, ok)
            if ok and group.tally_key is not None:
                self.tally.pop(group.tally_key, None)
                self.retries.forget(group.login or "", group.tally_key)
        if not self.closed:
            self._answer_all(group, CheckOutcome.ACCEPTED if ok else CheckOutcome.DENIED)
            self._start_next()


#: Sockets not logged in looked at (oldest first) for one to close past
#: max_unauthenticated (``crowded_out``): a bounded scan per refused socket.
EVICTION_SCAN = 64


class Waiting(Protocol):
    """A socket not logged in, as ``crowded_out`` reads it."""

    @property
    def check(self) -> PendingCheck | None: ...


W = TypeVar("W", bound=Waiting)


def crowded_out(unauthenticated: Iterable[W], checks: CheckQueue) -> W:
    """The socket to close for a newcomer past ``max_unauthenticated``: among the
    oldest EVICTION_SCAN of ``unauthenticated`` (oldest first), the first already refused
    (``PendingCheck.refused``: it closes within a loop turn anyway), waiting for a
    passcode tried again and again among many of its login's (a flood's guess: its answer
    is the same for every socket that tries it, see ``CheckQueue.oft_tried``) or sharing
    its check with other sockets (a burst of one login and passcode: closing one of them
    saves no check and delays none), else the oldest that has not sent its CONNECT yet,
    else the oldest. A user's login waiting for its check is not pushed out by the flood
    of guesses for its login, nor by a burst of sockets that have said nothing yet (a CI
    run: a flood's burst of a few hundred accepted in one loop turn closed alice's login,
    the oldest, with "server busy"), nor by a burst of a guess the cache already knows is
    wrong (a test run under load: each had its denial on the way, none counted as a guess
    waiting, alice was the oldest), nor by the flood of one wrong passcode hashed again
    after her password changed (CI runs under load: hundreds of sockets waited on that
    one check, alice was the oldest). The sockets waiting for a check are at most
    MAX_PENDING_CHECKS, below the default max_unauthenticated (a quarter of
    max_connections), so sockets that have said nothing yet keep room to say it.
    A function of its inputs, not a server method: the server's class is compiled
    (``amqlite.native``), so its test cannot build one from stand-ins."""
    oldest = None
    silent = None
    for conn in itertools.islice(unauthenticated, EVICTION_SCAN):
        oldest = oldest or conn
        check = conn.check
        if check is None:
            silent = silent or conn
            continue
        if check.refused:
            return conn
        group = check.group
        if group is not None and (len(group.waiters) > 1 or checks.oft_tried(group)):
            return conn
    if silent is not None:
        return silent
    assert oldest is not None
    return oldest
