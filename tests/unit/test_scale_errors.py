"""`hpvc scale` errors carry a fix: a role the spec lacks names the roles it
has (issue 32, item 14b)."""

from __future__ import annotations

from typing import Any

import pytest

from hpvc.cluster.lifecycle import _rescaled
from hpvc.errors import InputError

SPEC: dict[str, Any] = {
    "name": "demo",
    "nodes": [
        {"role": "head", "count": 1},
        {"role": "compute", "count": 2},
        {"role": "compute", "count": 1},
    ],
}


@pytest.mark.parametrize(
    ("changes", "why", "fix"),
    [
        (
            {"storage": 1},
            "the spec has no 'storage' nodes",
            "scale one of its roles: head, compute",
        ),
        ({"compute": -1}, "a count cannot be negative", "give compute=0 or more"),
        ({"compute": 1}, "the first groups of compute hold 2 nodes", "give compute=2 or more"),
    ],
)
def test_each_scale_error_has_a_fix(changes: dict[str, int], why: str, fix: str) -> None:
    with pytest.raises(InputError) as e:
        _rescaled(SPEC, changes)
    line = e.value.line()
    assert why in line
    assert line.endswith(f"({fix})")


def test_the_last_group_of_a_role_scales() -> None:
    counts = [g["count"] for g in _rescaled(SPEC, {"compute": 5})["nodes"]]
    assert counts == [1, 2, 3]
