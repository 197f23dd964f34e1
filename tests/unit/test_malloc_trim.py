"""Free heap goes back to the kernel when it would push RSS past the budget
(``MemoryBudget.trim``, ``amqlite.broker.heap``; issue 23).

The rule is pure logic, tested with the heap's free bytes given; the glibc part runs
in a fresh interpreter (malloc's state is the process's): 256 KiB bodies freed around
survivors leave holes that glibc keeps resident, and a trim gives them back.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from amqlite.broker import heap
from amqlite.broker.memory import TRIM_DIVISOR, MemoryBudget
from tests.helpers.broker_proc import REPO_ROOT

MIB = 1024 * 1024
BUDGET = 64 * MIB


def budget_with_heap(monkeypatch: pytest.MonkeyPatch, free: int) -> tuple[MemoryBudget,
                                                                          list[int]]:
    """A budget whose heap has ``free`` bytes free; the list counts the trims."""
    trims: list[int] = []
    monkeypatch.setattr(heap, "heap_free", lambda: free)
    monkeypatch.setattr(heap, "trim_malloc", lambda: trims.append(1))
    return MemoryBudget(BUDGET, BUDGET), trims


def test_trims_when_counted_and_free_bytes_pass_the_budget(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """40 MiB of messages wait, 30 MiB of the heap are free: past the budget together,
    so the first look (after a step of released or held bytes) trims."""
    budget, trims = budget_with_heap(monkeypatch, 30 * MIB)
    budget.waiting_bytes = 40 * MIB
    budget._churned(BUDGET // TRIM_DIVISOR - 1)
    assert trims == [], "looked before a step of churn"
    budget._churned(1)
    assert trims == [1]
    assert budget.churn == 0


def test_keeps_free_heap_below_the_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """Within the budget the holes stay (reused without page faults): no trim."""
    budget, trims = budget_with_heap(monkeypatch, 20 * MIB)
    budget.waiting_bytes = 40 * MIB
    budget._churned(BUDGET)
    assert budget.trim() is False
    assert trims == []


def test_held_and_released_bytes_both_count_as_churn(monkeypatch: pytest.MonkeyPatch) -> None:
    """A partial frame growing and completing is churn: together a step, one trim."""
    budget, trims = budget_with_heap(monkeypatch, BUDGET + 1)
    conn = object()
    half = BUDGET // TRIM_DIVISOR // 2
    budget.partial_changed(conn, 0, half)  # type: ignore[arg-type]
    assert trims == []
    budget.partial_changed(conn, half, 0)  # type: ignore[arg-type]
    assert trims == [1]


PROBE = """
import os
from amqlite.broker import heap, memory

MIB = 1024 * 1024

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

assert heap.tune_malloc()
big = bytearray(8 * MIB)  # freed: glibc serves blocks up to 8 MiB from its heap now
del big
bodies = [b"x" * (256 * 1024) for _ in range(256)]  # 64 MiB of bodies in the heap
kept = bodies[::16]  # a survivor every 4 MiB: the holes are not the heap's top
del bodies
budget = memory.MemoryBudget(16 * MIB, 16 * MIB)
before, free = rss(), heap.heap_free()
trimmed = budget.trim()
print(free, before - rss(), int(trimmed))
"""


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                    reason="glibc's malloc only")
def test_trim_gives_heap_holes_back_to_the_kernel() -> None:
    """60 MiB freed between survivors stays resident (glibc gives back only its top)
    and is counted free; the budget's trim gives most of it back. MALLOC_* and
    GLIBC_TUNABLES would change malloc's thresholds: the probe runs without them."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    env["PYTHONPATH"] = str(REPO_ROOT)
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=60, check=True).stdout
    free, given_back, trimmed = map(int, out.split())
    assert free >= 48 * MIB, f"only {free / MIB:.1f} MiB free in the heap"
    assert trimmed == 1
    assert given_back >= 40 * MIB, f"the trim gave back {given_back / MIB:.1f} MiB"
