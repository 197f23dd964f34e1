"""CheckQueue: the order, bounds and cancellation of password checks under a login flood.

The checks here are instant and recorded; a gate (threading.Event) holds the one running
check so the test decides what is waiting when.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from amqlite.auth import Authenticator, CheckOutcome, CheckQueue

#: Deadline for one check to come back from the thread pool.
WAIT = 10.0


class GatedAuth(Authenticator):
    """Accepts passcode "ok"; every check waits for the gate and records its login."""

    def __init__(self) -> None:
        super().__init__({})
        self.gate = threading.Event()
        self.ran: list[str | None] = []

    def check(self, login: str | None, passcode: str | None) -> bool:
        self.ran.append(login)
        self.gate.wait(WAIT)
        return passcode == "ok"


class Outcomes(dict[str, CheckOutcome]):
    """Outcomes by login; wakes a waiter on each one."""

    def __init__(self) -> None:
        super().__init__()
        self.changed = asyncio.Event()

    def __setitem__(self, key: str, value: CheckOutcome) -> None:
        super().__setitem__(key, value)
        self.changed.set()


async def settle(queue: CheckQueue, outcomes: Outcomes, count: int) -> None:
    """Open the gate and wait (with a deadline) until `count` outcomes are in."""
    auth = queue.auth
    assert isinstance(auth, GatedAuth)
    auth.gate.set()
    async with asyncio.timeout(WAIT):
        while len(outcomes) < count:
            outcomes.changed.clear()
            await outcomes.changed.wait()


def run(coro) -> None:
    asyncio.run(coro)


def gated_queue(**limits: int) -> tuple[GatedAuth, CheckQueue, Outcomes, Any]:
    """A one-thread queue whose checks wait for the gate, its outcomes, and ``submit``."""
    auth = GatedAuth()
    queue = CheckQueue(auth, threads=1, **limits)
    outcomes = Outcomes()
    return auth, queue, outcomes, submitter(queue, outcomes)


def submitter(queue: CheckQueue, outcomes: Outcomes):
    def submit(peer: str, login: str, passcode: str = "bad"):
        return queue.submit(peer, login, passcode,
                            lambda outcome: outcomes.__setitem__(login, outcome))
    return submit


def test_round_robin_across_peers_newest_first_within_a_peer() -> None:
    async def main() -> None:
        auth, queue, outcomes, submit = gated_queue()
        submit("flooder", "f0")  # runs at once, holds the only thread
        for i in range(1, 6):
            submit("flooder", f"f{i}")
        submit("other", "good", "ok")
        await settle(queue, outcomes, 7)
        # The other address is served right after the running check, not after the flood;
        # the flooder's own backlog goes newest first.
        assert auth.ran == ["f0", "f5", "good", "f4", "f3", "f2", "f1"]
        assert outcomes["good"] is CheckOutcome.ACCEPTED
        assert outcomes["f3"] is CheckOutcome.DENIED
        queue.close()
    run(main())


def test_newest_login_from_a_flooding_address_goes_next() -> None:
    async def main() -> None:
        auth, queue, outcomes, submit = gated_queue()
        for i in range(10):
            submit("nat", f"f{i}")
        submit("nat", "good", "ok")
        await settle(queue, outcomes, 11)
        assert auth.ran[:2] == ["f0", "good"]
        assert outcomes["good"] is CheckOutcome.ACCEPTED
        queue.close()
    run(main())


def test_cancelled_check_never_runs() -> None:
    async def main() -> None:
        auth, queue, outcomes, submit = gated_queue()
        submit("a", "running")
        gone = [submit("a", f"gone{i}") for i in range(5)]
        submit("a", "kept")
        for check in gone:
            queue.cancel(check)
        assert queue.pending == 1
        await settle(queue, outcomes, 2)
        assert auth.ran == ["running", "kept"]
        assert set(outcomes) == {"running", "kept"}  # no callback for a cancelled check
        queue.close()
    run(main())


def test_per_peer_cap_drops_that_peers_oldest_as_busy() -> None:
    async def main() -> None:
        auth, queue, outcomes, submit = gated_queue(max_per_peer=3)
        submit("a", "running")
        for i in range(5):
            submit("a", f"w{i}")
        # w0 and w1 were the oldest waiting when w3 and w4 came: answered BUSY at once.
        assert outcomes == {"w0": CheckOutcome.BUSY, "w1": CheckOutcome.BUSY}
        assert queue.pending == 3
        await settle(queue, outcomes, 6)
        assert auth.ran == ["running", "w4", "w3", "w2"]
        queue.close()
    run(main())


def test_global_cap_drops_oldest_of_the_fullest_peer() -> None:
    async def main() -> None:
        auth, queue, outcomes, submit = gated_queue(max_pending=4, max_per_peer=10)
        submit("a", "running")
        for i in range(3):
            submit("a", f"a{i}")
        submit("b", "b0")
        submit("c", "c0")  # the queue is full: a's oldest waiting check goes
        assert outcomes == {"a0": CheckOutcome.BUSY}
        assert queue.pending == 4
        await settle(queue, outcomes, 6)
        assert auth.ran == ["running", "a2", "b0", "c0", "a1"]
        queue.close()
    run(main())


def test_global_cap_over_single_check_peers_forgets_emptied_ones_and_keeps_the_newcomer(
        ) -> None:
    """With one waiting check per address, the full queue empties an address: it is
    forgotten, and when the emptied address is the newcomer's own its check still runs."""
    async def main() -> None:
        auth, queue, outcomes, submit = gated_queue(max_pending=2, max_per_peer=10)
        submit("a", "running")
        submit("b", "b0")
        submit("c", "c0")
        submit("d", "d0")  # full: b (the first fullest) loses b0 and is forgotten
        assert outcomes == {"b0": CheckOutcome.BUSY}
        assert list(queue.waiting) == ["c", "d"]
        submit("c", "c1")  # full again: c is the fullest, and the newcomer's own address
        assert outcomes == {"b0": CheckOutcome.BUSY, "c0": CheckOutcome.BUSY}
        assert queue.pending == 2 and sum(map(len, queue.waiting.values())) == 2
        await settle(queue, outcomes, 5)
        assert sorted(auth.ran[1:]) == ["c1", "d0"]
        queue.close()
    run(main())
