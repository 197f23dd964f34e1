"""Issue 15: the integrity check's record of its result is a write like any other, so
it goes through the fence: a deposed master's late check changes nothing."""

from __future__ import annotations

from collections.abc import Callable

from store import SqlStore
from tests.helpers.store import one


def test_late_integrity_check_of_a_deposed_master_writes_nothing(
        make_store: Callable[..., SqlStore]) -> None:
    old, new = make_store(), make_store()
    old_epoch = old.claim_epoch("old")
    new_epoch = new.claim_epoch("new")  # takes over before old's check ran
    assert new_epoch > old_epoch
    before = one(new, "SELECT checkpoint_at FROM amq_groups WHERE grp = 'g1'")

    result = old.check_integrity(old_epoch)  # counts, but must not record

    assert not result.mismatch
    recorded = one(old, "SELECT actual_count FROM amq_activations "
                        "WHERE grp = 'g1' AND epoch = :e", e=old_epoch)
    assert recorded is None
    assert one(new, "SELECT checkpoint_at FROM amq_groups WHERE grp = 'g1'") == before


def test_integrity_check_of_the_current_master_is_recorded(
        make_store: Callable[..., SqlStore]) -> None:
    store = make_store()
    epoch = store.claim_epoch("master")
    store.check_integrity(epoch)
    assert one(store, "SELECT actual_count FROM amq_activations "
                      "WHERE grp = 'g1' AND epoch = :e", e=epoch) == 0
