"""Failed management logins (issue 14/16): repeated failures of one login from one
address are refused with 429 and Retry-After and no password check; other logins from
that address are not; password checks go through the STOMP side's CheckQueue."""

from __future__ import annotations

import asyncio
import base64

import pytest

from amqlite.auth import hash_password
from amqlite.authz import ADMIN_GROUP, Policy, UsersFile
from amqlite.management.security import (
    FAILURES_BEFORE_THROTTLE,
    THROTTLE_SECONDS,
    Access,
    FailedLogins,
    Throttled,
    Unauthorized,
)

PEER = "192.0.2.7"


def basic(login: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{login}:{password}".encode()).decode()


@pytest.fixture(scope="module")
def users() -> dict[str, str]:
    return {"alice": hash_password("right"), "bob": hash_password("bobs")}


def access(users: dict[str, str]) -> Access:
    a = Access()
    a.apply(UsersFile(users, {ADMIN_GROUP: frozenset({"alice"})}, Policy([], {})))
    return a


def test_failures_throttle_one_pair_for_a_while() -> None:
    f = FailedLogins(limit=3, window=60.0, throttle=10.0)
    assert not f.failed(PEER, "alice", 0.0) and not f.failed(PEER, "alice", 1.0)
    assert f.failed(PEER, "alice", 2.0)  # the third: throttled from now
    assert f.retry_after(PEER, "alice", 2.0) == 10.0
    assert f.retry_after(PEER, "bob", 2.0) == 0.0  # another login, same address
    assert f.retry_after("198.51.100.1", "alice", 2.0) == 0.0  # same login, elsewhere
    assert f.retry_after(PEER, "alice", 12.5) == 0.0
    f.failed(PEER, "alice", 13.0)  # still within the window: throttled again at once
    assert f.retry_after(PEER, "alice", 13.0) == 10.0
    f.succeeded(PEER, "alice")
    assert f.retry_after(PEER, "alice", 13.0) == 0.0


def test_failures_outside_the_window_are_forgotten() -> None:
    f = FailedLogins(limit=2, window=5.0, throttle=10.0)
    f.failed(PEER, "alice", 0.0)
    assert not f.failed(PEER, "alice", 6.0)  # a new window: one failure
    assert f.retry_after(PEER, "alice", 6.0) == 0.0


def test_tracked_pairs_are_bounded_and_keep_throttles_over_idle_ones() -> None:
    """Someone cycling logins to push a throttled pair out finds the noise forgotten
    first, idle pairs before failing ones."""
    f = FailedLogins(limit=2, window=30.0, throttle=100.0, max_tracked=10)
    f.failed(PEER, "target", 0.0)
    f.failed(PEER, "target", 0.0)  # throttled until 100
    for i in range(50):
        f.failed(PEER, f"noise{i}", 1.0 + i / 10)  # one failure each: not throttled
    assert len(f._pairs) <= 10
    assert f.retry_after(PEER, "target", 10.0) > 0


def test_access_refuses_a_guessed_login_but_not_its_neighbours(users: dict[str, str]) -> None:
    async def scenario() -> None:
        a = access(users)
        try:
            for _ in range(FAILURES_BEFORE_THROTTLE):
                with pytest.raises(Unauthorized):
                    await a.login(basic("alice", "wrong"), PEER)
            # Throttled: even the right password waits (a guess must not be answered).
            with pytest.raises(Throttled) as info:
                await a.login(basic("alice", "right"), PEER)
            assert info.value.status == 429
            assert 0 < info.value.retry_after <= THROTTLE_SECONDS
            assert await a.login(basic("bob", "bobs"), PEER) == "bob"
            assert await a.login(basic("alice", "right"), "198.51.100.1") == "alice"
            assert a._checks is not None and a._checks.threads >= 1
        finally:
            a.close()

    asyncio.run(scenario())
