"""CredentialCache and the per-login bound of CheckQueue (issue 23 item 2)."""

from __future__ import annotations

import asyncio
import threading

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
    assert cache._mac("ab", "c", "h") != cache._mac("a", "bc", "h")


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
