"""The activation's lock proofs (amqlite.activation, issue 22) with a scripted locker and a
real SQLite store: a lock lost at any step aborts before anything is served, the claim is
the epoch read under the lock, a SUSPENDED lock holds a proof until HELD or LOST."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from amqlite import activation
from amqlite.activation import (
    TEST_GATE_ENV,
    ActivationAborted,
    ActivationGuard,
    claim,
    gate_file,
)
from amqlite.settings import Settings
from lockers import Locker, LockerError, LockLost, LockState
from store import SqlStore, open_store
from store.api import StaleClaim

#: Bound of one scripted activation.
TIMEOUT = 10.0


class ScriptedLocker(Locker):
    """A locker whose keepalive runs ``on_proof(n)`` for its n-th proof (1-based)."""

    description = "scripted lock"

    def __init__(self) -> None:
        super().__init__()
        self.held = True
        self.proofs = 0
        self.on_proof: Callable[[int], None] = lambda n: None

    async def try_acquire(self) -> bool:
        return self.held

    async def keepalive(self) -> None:
        self.proofs += 1
        self.on_proof(self.proofs)
        if not self.held:
            raise LockLost("scripted lock: gone")

    async def release(self) -> None:
        self.held = False


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqlStore]:
    s = open_store(f"sqlite:///{tmp_path / 'amqlite.db'}", "g")
    assert isinstance(s, SqlStore)
    s.open()
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(name="n1", group="g", data_dir=str(tmp_path)).resolved()


def activate(store: SqlStore, locker: ScriptedLocker, settings: Settings,
             during: Callable[[ActivationGuard], None] | None = None) -> tuple[int, int]:
    """Run ``claim``; ``during(guard)`` runs at the first proof (as a locker callback would)."""

    async def main() -> tuple[int, int]:
        guard = ActivationGuard(locker, settings.name, asyncio.Event())
        if during is not None:
            scripted = locker.on_proof

            def first_proof_reports(n: int) -> None:
                if n == 1:
                    during(guard)
                scripted(n)

            locker.on_proof = first_proof_reports
        epoch, _ = await asyncio.wait_for(claim(store, locker, guard, settings), TIMEOUT)
        return epoch, locker.proofs

    return asyncio.run(main())


def test_claim_proves_the_lock_before_and_after(store: SqlStore, settings: Settings) -> None:
    locker = ScriptedLocker()
    store.claim_epoch("earlier")
    epoch, proofs = activate(store, locker, settings)
    assert epoch == 2
    assert proofs == 2  # before the claim (the read epoch is ours) and after it


def test_lock_gone_before_the_claim_claims_nothing(store: SqlStore, settings: Settings) -> None:
    locker = ScriptedLocker()
    locker.held = False
    with pytest.raises(ActivationAborted, match="before claiming"):
        activate(store, locker, settings)
    assert store.read_epoch() == 0


def test_lock_gone_right_after_the_claim_aborts(store: SqlStore, settings: Settings) -> None:
    locker = ScriptedLocker()

    def lose_at_second(n: int) -> None:
        if n == 2:
            locker.held = False

    locker.on_proof = lose_at_second
    with pytest.raises(ActivationAborted, match="after claiming epoch 1"):
        activate(store, locker, settings)


def test_a_lost_notification_aborts_even_if_the_locker_still_says_yes(
        store: SqlStore, settings: Settings) -> None:
    """LOST (or a reason to demote) reported while activating wins over a later proof."""
    with pytest.raises(ActivationAborted, match="lock lost"):
        activate(store, ScriptedLocker(), settings,
                 during=lambda guard: guard.state(LockState.LOST))


def test_a_freeze_from_a_locker_thread_aborts(store: SqlStore, settings: Settings) -> None:
    with pytest.raises(ActivationAborted, match="may be gone"):
        activate(store, ScriptedLocker(), settings, during=lambda guard: guard.freeze())


def test_stale_claim_with_the_lock_gone_aborts(store: SqlStore, settings: Settings) -> None:
    """Another node claimed between our read and our claim, having taken the lock: the
    store refuses, and the proof after the refusal finds the lock gone."""
    locker = ScriptedLocker()

    def taken_over(n: int) -> None:
        if n == 1:
            store.claim_epoch("other")  # passes our first proof, then claims
        if n == 2:
            locker.held = False

    locker.on_proof = taken_over
    with pytest.raises(ActivationAborted, match="refused the claim"):
        activate(store, locker, settings)
    assert store.read_epoch() == 1


def test_stale_claim_with_the_lock_still_ours_is_a_store_error(
        store: SqlStore, settings: Settings) -> None:
    """A deposed node's late claim came in between: ours is refused, the lock is still
    ours, the node retries the activation (a store error)."""
    locker = ScriptedLocker()
    locker.on_proof = lambda n: store.claim_epoch("deposed") if n == 1 else None
    with pytest.raises(StaleClaim):
        activate(store, locker, settings)


def test_suspended_lock_waits_for_held(settings: Settings) -> None:
    async def main() -> None:
        locker = ScriptedLocker()
        guard = ActivationGuard(locker, settings.name, asyncio.Event())
        guard.state(LockState.SUSPENDED)
        proving = asyncio.create_task(guard.confirm("step"))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert not proving.done(), "a SUSPENDED lock proved nothing"
        guard.state(LockState.HELD)
        await asyncio.wait_for(proving, TIMEOUT)

    asyncio.run(main())


def test_suspended_lock_then_lost_aborts(settings: Settings) -> None:
    async def main() -> None:
        locker = ScriptedLocker()
        guard = ActivationGuard(locker, settings.name, asyncio.Event())
        guard.state(LockState.SUSPENDED)
        proving = asyncio.create_task(guard.confirm("step"))
        await asyncio.sleep(0)
        guard.state(LockState.LOST)
        with pytest.raises(ActivationAborted, match="step: lock lost"):
            await asyncio.wait_for(proving, TIMEOUT)

    asyncio.run(main())


class DoubtfulLocker(ScriptedLocker):
    """``prove`` is in doubt (LockerError) until ``doubt`` is cleared."""

    def __init__(self) -> None:
        super().__init__()
        self.doubt = True

    async def prove(self) -> None:
        await self.keepalive()
        if self.doubt:
            raise LockerError("scripted lock: cannot reach the server")


def test_lock_in_doubt_is_proved_again_once_held(settings: Settings) -> None:
    async def main() -> None:
        locker = DoubtfulLocker()
        guard = ActivationGuard(locker, settings.name, asyncio.Event())
        proving = asyncio.create_task(guard.confirm("step"))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert not proving.done(), "a check in doubt proved nothing"
        locker.doubt = False
        guard.state(LockState.HELD)  # wakes the proof at once
        await asyncio.wait_for(proving, TIMEOUT)
        assert locker.proofs == 2

    asyncio.run(main())


def test_lock_in_doubt_for_too_long_counts_as_lost(
        settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(activation, "PROOF_TIMEOUT", 0.2)
    monkeypatch.setattr(activation, "DOUBT_RETRY", 0.05)

    async def main() -> None:
        guard = ActivationGuard(DoubtfulLocker(), settings.name, asyncio.Event())
        with pytest.raises(ActivationAborted, match=r"not proved for 0\.2s"):
            await asyncio.wait_for(guard.confirm("step"), TIMEOUT)

    asyncio.run(main())


def test_gate_file_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TEST_GATE_ENV, raising=False)
    assert gate_file("claim") is None
    monkeypatch.setenv(TEST_GATE_ENV, "claim:/tmp/gate")
    assert gate_file("claim") == Path("/tmp/gate")
    assert gate_file("listen") is None
    monkeypatch.setenv(TEST_GATE_ENV, "claim:")
    assert gate_file("claim") is None
