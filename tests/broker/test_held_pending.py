"""``MemoryBudget``'s rules for persistent SENDs awaiting their commit and for encoded
frames not yet written (issue 23, item 1), as pure logic; the real broker's side is
tests/integration/test_held_broker_wide.py."""

from __future__ import annotations

from amqlite.broker.memory import PENDING_REASON, MemoryBudget
from tests.broker.test_held_memory import Conn


def test_a_producer_is_paused_once_held_bytes_pass_the_budget() -> None:
    budget = MemoryBudget(100, 25)
    a, b = Conn(), Conn()
    budget.hold_pending(a, 60)
    budget.hold_pending(b, 50)  # 110 held: past the budget, nothing to give back
    assert (a.paused, b.paused) == (set(), {PENDING_REASON})
    budget.release_pending(b, 50, 0)  # its commit landed: 60 held, within the budget
    assert not b.paused
    budget.hold_pending(b, 50)
    budget.release_pending(a, 60, 0)  # a's commit: 50 held, below the resume level
    assert not b.paused and budget.held_bytes == 50


def test_waiting_bytes_that_cannot_be_given_back_do_not_hold_a_persistent_producer() -> None:
    """A queue's MIN_IN_MEMORY floor may pass a small budget: a persistent producer is
    paused for what clients hold, not for messages that wait for consumers."""
    budget = MemoryBudget(100, 25)
    budget.waiting_bytes = 150  # nothing to give back (no reclaim)
    a = Conn()
    budget.hold_pending(a, 40)
    assert not a.paused
    budget.hold_pending(a, 70)  # 110 held
    assert a.paused == {PENDING_REASON}
    budget.release_pending(a, 110, 0)
    assert not a.paused


def test_stored_messages_are_given_back_with_slack_for_pending_bytes() -> None:
    budget = MemoryBudget(800, 400)
    budget.waiting_bytes = 800
    asked: list[int] = []

    def reclaim(want: int) -> int:
        asked.append(want)
        budget.waiting_bytes -= want
        return want

    budget.reclaim = reclaim
    budget.hold_pending(Conn(), 10)
    assert asked == [10 + 800 // 8]  # what one SEND needs, and an eighth to spare
    budget.hold_pending(Conn(), 10)
    assert asked == [110]  # the next one fits: no walk


def test_released_output_dispatches_starved_sources() -> None:
    budget = MemoryBudget(100, 25)
    calls: list[int] = []
    budget.redispatch = lambda: calls.append(1)
    budget.output_changed(100)
    assert (budget.held_bytes, budget.output_bytes) == (100, 100)
    budget.starved.add(object())  # type: ignore[arg-type]
    budget.output_changed(-100)
    assert (budget.held_bytes, budget.output_bytes, calls) == (0, 0, [1])
