"""``MemoryBudget``'s ledger of what clients make the broker hold (issue 23, item 1):
transaction contents and partial frames, and the rule that the largest partial frame
always reads."""

from __future__ import annotations

import pytest

from amqlite.broker.memory import PARTIAL_REASON, MemoryBudget
from amqlite.broker.session import Session
from amqlite.validation import BrokerError


class Conn:
    def __init__(self) -> None:
        self.paused: set[str] = set()
        self.closed = False

    def pause_reading(self, reason: str) -> None:
        self.paused.add(reason)

    def resume_reading(self, reason: str) -> None:
        self.paused.discard(reason)


def test_transactions_count_against_the_share_and_the_budget() -> None:
    budget = MemoryBudget(100, 25)
    a, b, c = (Session(Conn()) for _ in range(3))  # type: ignore[arg-type]
    budget.hold_transaction(a, 50)
    with pytest.raises(BrokerError, match="share of max_memory: 50 bytes"):
        budget.hold_transaction(a, 1)
    budget.hold_transaction(b, 40)
    with pytest.raises(BrokerError, match=r"memory budget \(max_memory, 100 bytes\)"):
        budget.hold_transaction(c, 11)
    assert (budget.held_bytes, c.tx_bytes) == (90, 0)  # the refused SEND holds nothing
    budget.release_transaction(a, 50)
    budget.hold_transaction(c, 11)
    assert (budget.held_bytes, a.tx_bytes) == (51, 0)


def test_past_the_budget_only_the_largest_partial_frame_reads() -> None:
    budget = MemoryBudget(100, 25)
    big, mid, small = Conn(), Conn(), Conn()
    budget.partial_changed(big, 0, 60)  # type: ignore[arg-type]
    budget.partial_changed(mid, 0, 30)  # type: ignore[arg-type]
    budget.partial_changed(small, 0, 5)  # type: ignore[arg-type]
    assert not (big.paused or mid.paused or small.paused)  # 95: within the budget
    budget.partial_changed(mid, 30, 40)  # type: ignore[arg-type]  # 105: past it
    assert mid.paused == small.paused == {PARTIAL_REASON}  # crossing stops all but big
    budget.partial_changed(big, 60, 70)  # type: ignore[arg-type]  # the largest reads on
    assert not big.paused
    budget.partial_changed(small, 5, 6)  # type: ignore[arg-type]
    assert small.paused == {PARTIAL_REASON}
    # The largest completes: 46 left, below the resume level (75): all resume.
    budget.partial_changed(big, 70, 0)  # type: ignore[arg-type]
    assert not (mid.paused or small.paused)
    assert budget.held_bytes == 46


def test_a_completion_above_the_resume_level_resumes_the_largest_paused() -> None:
    budget = MemoryBudget(100, 25)
    c0, c1, c2, _c3 = conns = [Conn() for _ in range(4)]
    for c, n in zip(conns, (30, 31, 32, 30), strict=True):
        budget.partial_changed(c, 0, n)  # type: ignore[arg-type]
    # 123 held: crossing the budget stops all but the largest (ties too)
    assert [bool(c.paused) for c in conns] == [True, True, False, True]
    budget.partial_changed(c2, 32, 40)  # type: ignore[arg-type]  # the largest reads on
    assert not c2.paused
    budget.partial_changed(c2, 40, 0)  # type: ignore[arg-type]  # 91 held, past 75
    assert [bool(c.paused) for c in conns] == [True, False, False, True]  # c1 reads now
    assert budget.partial_reader is c1
    budget.partial_changed(c1, 31, 41)  # type: ignore[arg-type]  # 101: it reads on
    assert not c1.paused
    budget.partial_changed(c1, 41, 0)  # type: ignore[arg-type]  # 60: all resume
    assert not any(c.paused for c in conns)
    assert budget.held_bytes == 60
    budget.forget(c0)  # type: ignore[arg-type]
    assert c0 not in budget.partial_paused
