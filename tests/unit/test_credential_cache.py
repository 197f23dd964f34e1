"""CredentialCache and the per-login bound of CheckQueue (issue 23 item 2)."""

from __future__ import annotations

import asyncio
import threading

from amqlite import auth
from amqlite.auth import (
    Authenticator,
    CheckOutcome,
    CheckQueue,
    CredentialCache,
    hash_password,
)

WAIT = 10.0


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_good_answer_is_kept_per_login_until_its_ttl() -> None:
    clock = Clock()
    cache = CredentialCache(good_ttl=300, bad_ttl=60, clock=clock)
    cache.remember("alice", "right", "hash1", True)
    assert cache.recall("alice", "right", "hash1") is True
    assert cache.recall("alice", "wrong", "hash1") is None  # unknown: must be hashed
    assert cache.recall("alice", "right", "hash2") is None  # the users file changed
    clock.now = 301
    assert cache.recall("alice", "right", "hash1") is None


def test_wrong_answer_is_kept_per_passcode_until_its_ttl() -> None:
    clock = Clock()
    cache = CredentialCache(good_ttl=300, bad_ttl=60, clock=clock)
    cache.remember("alice", "wrong", "hash1", False)
    assert cache.recall("alice", "wrong", "hash1") is False
    assert cache.recall("alice", "wrong2", "hash1") is None
    assert cache.recall("bob", "wrong", "hash1") is None
    clock.now = 61
    assert cache.recall("alice", "wrong", "hash1") is None


def test_cache_is_bounded_and_holds_no_passcode() -> None:
    cache = CredentialCache(size=3)
    for i in range(10):
        cache.remember(f"u{i}", f"secret-{i}", "h", i % 2 == 0)
    assert len(cache.good) <= 3 and len(cache.bad) <= 3
    dump = repr(cache.good) + repr(cache.bad)
    assert "secret" not in dump
    # Lengths are part of the MAC input: moving a byte between fields changes it.
    assert cache.key("ab", "c", "h") != cache.key("a", "bc", "h")


class CountingAuth(Authenticator):
    """A real users table; counts checks and can hold them on a gate."""

    def __init__(self, users: dict[str, str]) -> None:
        super().__init__(users)
        self.gate = threading.Event()
        self.ran: list[tuple[str | None, str | None]] = []

    def check(self, login: str | None, passcode: str | None) -> bool:
        self.ran.append((login, passcode))
        self.gate.wait(WAIT)
        return super().check(login, passcode)


def test_known_answers_skip_the_queue_and_waiting_guesses_of_one_login_are_bounded() -> None:
    async def main() -> None:
        auth = CountingAuth({"alice": hash_password("right"), "carol": hash_password("c")})
        queue = CheckQueue(auth, threads=1, max_per_login=2, cache=CredentialCache())
        got: dict[str, list[CheckOutcome]] = {}

        def submit(name: str, login: str, passcode: str) -> None:
            got[name] = []
            queue.submit("nat", login, passcode, got[name].append)

        auth.gate.set()
        submit("first", "alice", "right")
        async with asyncio.timeout(WAIT):
            while not got["first"]:
                await asyncio.sleep(0.01)
        assert got["first"] == [CheckOutcome.ACCEPTED]
        auth.gate.clear()
        submit("holder", "bob", "x")  # holds the only thread
        for i in range(5):
            submit(f"g{i}", "alice", f"wrong{i}")
        submit("carol", "carol", "c")
        submit("again", "alice", "right")  # known: answered without the queue
        await asyncio.sleep(0.05)
        assert got["again"] == [CheckOutcome.ACCEPTED]
        # Only two of alice's guesses wait; the older three were answered busy, and
        # carol's check (same address) was not pushed out by them.
        assert [got[f"g{i}"] for i in range(3)] == [[CheckOutcome.BUSY]] * 3
        assert got["carol"] == []
        auth.gate.set()
        async with asyncio.timeout(WAIT):
            while not (got["carol"] and got["g3"] and got["g4"]):
                await asyncio.sleep(0.01)
        assert got["carol"] == [CheckOutcome.ACCEPTED]
        assert got["g4"] == [CheckOutcome.DENIED]
        # A repeated wrong guess is refused from the cache: no second hash.
        hashed = len(auth.ran)
        submit("repeat", "alice", "wrong4")
        await asyncio.sleep(0.05)
        assert got["repeat"] == [CheckOutcome.DENIED] and len(auth.ran) == hashed
        queue.close()
    asyncio.run(main())


def test_a_repeated_guess_waits_once_and_is_hashed_once() -> None:
    """Sockets repeating one login/passcode while it waits or runs share one check: one
    place in the queue and one hash, and every one of them gets its answer."""
    async def main() -> None:
        auth = CountingAuth({"alice": hash_password("right")})
        queue = CheckQueue(auth, threads=1, max_per_login=2, cache=CredentialCache())
        got: list[CheckOutcome] = []
        queue.submit("nat", "bob", "x", got.append)  # holds the only thread
        for _ in range(50):
            queue.submit("nat", "alice", "wrong", got.append)
        assert queue.pending == 1  # 50 sockets, one waiting check
        auth.gate.set()
        async with asyncio.timeout(WAIT):
            while len(got) < 51:
                await asyncio.sleep(0.01)
        assert got.count(CheckOutcome.DENIED) == 51
        assert auth.ran == [("bob", "x"), ("alice", "wrong")]
        queue.close()
    asyncio.run(main())


def test_a_passcode_tried_once_beats_a_flood_of_oft_tried_guesses() -> None:
    """A flood cycling through a list of wrong passcodes for alice (each tried many
    times, none answered yet): alice's own passcode, tried once, is never the one a full
    queue drops, and runs as soon as the thread is free, whatever came after it (many
    passcodes of alice's tried again: a list of guesses, not a client retrying)."""
    async def main() -> None:
        auth = CountingAuth({"alice": hash_password("right")})
        queue = CheckQueue(auth, threads=1, max_per_login=4, cache=CredentialCache())
        busy: list[str] = []
        mine: list[CheckOutcome] = []

        def guess(word: str) -> None:
            queue.submit("nat", "alice", word,
                         lambda o, w=word: busy.append(w) if o is CheckOutcome.BUSY else None)

        guess("holder")  # runs, holds the thread
        words = [f"guess{i}" for i in range(20)]
        for _ in range(3):  # the list cycled: each guess tried three times
            for word in words:
                guess(word)
        queue.submit("nat", "alice", "right", mine.append)
        for word in words * 2:  # the flood goes on
            guess(word)
        await asyncio.sleep(0.05)
        assert mine == []  # waiting, not dropped
        assert queue.pending == 4
        auth.gate.set()
        async with asyncio.timeout(WAIT):
            while not mine:
                await asyncio.sleep(0.01)
        assert mine == [CheckOutcome.ACCEPTED]
        assert auth.ran[1] == ("alice", "right"), auth.ran  # next after the holder
        assert busy  # the guesses were the ones refused
        queue.close()
    asyncio.run(main())


def test_a_retried_passcode_beats_a_flood_of_unique_guesses() -> None:
    """A flood with a new wrong passcode for alice on every socket (each tried once):
    alice's first try is pushed out by newer guesses ("server busy"), but her retry of
    the same passcode is preferred to every guess tried once: it is not dropped, and
    runs next when the thread is free. Sockets joining a waiting check are not tries."""
    async def main() -> None:
        auth = CountingAuth({"alice": hash_password("right")})
        queue = CheckQueue(auth, threads=1, max_per_login=4, cache=CredentialCache())
        first: list[CheckOutcome] = []
        retry: list[CheckOutcome] = []
        flood = iter(range(10_000))

        def guesses(n: int) -> None:
            for _ in range(n):
                queue.submit("nat", "alice", f"unique{next(flood)}", lambda o: None)

        queue.submit("nat", "bob", "x", lambda o: None)  # holds the only thread
        guesses(10)
        queue.submit("nat", "alice", "right", first.append)
        guesses(10)
        await asyncio.sleep(0.01)
        assert first == [CheckOutcome.BUSY]
        queue.submit("nat", "alice", "right", retry.append)
        guesses(50)
        await asyncio.sleep(0.01)
        assert retry == []  # waiting, not dropped
        auth.gate.set()
        async with asyncio.timeout(WAIT):
            while not retry:
                await asyncio.sleep(0.01)
        assert retry == [CheckOutcome.ACCEPTED]
        assert auth.ran[1] == ("alice", "right"), auth.ran  # next after the holder
        queue.close()
    asyncio.run(main())


def test_the_unknown_login_hash_is_ready_before_the_first_check() -> None:
    """An unknown login is checked against a dummy hash so that it takes as long as a
    known one; made lazily (not at import), it must still exist before the first CONNECT,
    or the first unknown login would take twice as long as any other."""
    auth._dummy_hash.cache_clear()
    Authenticator(None)
    assert auth._dummy_hash.cache_info().currsize == 0, "made without a users file"
    users = Authenticator({"alice": hash_password("secret")})
    assert auth._dummy_hash.cache_info().currsize == 1
    assert users.check("alice", "secret") and not users.check("mallory", "secret")
