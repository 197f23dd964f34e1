"""The ids of an action's body (inputs.ids): JSON has one number type, so what JSON
Schema calls an integer (5.0 too) is accepted, as long as a double holds it exactly."""

from __future__ import annotations

import pytest

from amqlite.management.actions import ActionError
from amqlite.management.inputs import MAX_ID, ids


def test_integral_numbers_are_ids() -> None:
    assert ids({"ids": [1, 5.0, 0, MAX_ID, 2.0**53]}) == [1, 5, 0, MAX_ID, 2**53]
    assert all(type(i) is int for i in ids({"ids": [5.0]}) or [])
    assert ids({}) is None and ids({"ids": None}) is None


@pytest.mark.parametrize("bad", [[1.5], [-1], [-1.0], [2.0**53 + 2], [1e19], [float("inf")],
                                 [float("nan")], [True], ["1"], [MAX_ID + 1], 3, "1,2"])
def test_anything_else_is_a_400(bad: object) -> None:
    with pytest.raises(ActionError) as e:
        ids({"ids": bad})
    assert e.value.status == 400 and "\n" not in str(e.value)
