"""The planner gives the very plans it gave before it was made faster (issue 33).

tests/data/plan-golden.json holds a digest of every case of
tests/unit/plan_golden.py, recorded before the speed work; a plan that differs
in any field (a pin, an address, a note, an error's words) changes its digest.
"""

from __future__ import annotations

import json
from pathlib import Path

from hpvc.topology import Topology, read_topology
from tests.unit import plan_golden


def test_plans_match_the_recorded_digests(snapshots: dict[str, Path]) -> None:
    real: dict[str, Topology] = {name: read_topology(root) for name, root in snapshots.items()}
    recorded = json.loads(plan_golden.DIGESTS.read_text())
    found = plan_golden.digests(real)
    assert sorted(found) == sorted(recorded)
    changed = sorted(k for k in found if found[k] != recorded[k])
    assert changed == [], f"plans changed: {changed[:10]} (see tests/unit/plan_golden.py)"


def test_a_changed_plan_changes_its_digest() -> None:
    plan = {"nodes": [{"name": "compute0", "cpuset": [2, 3]}]}
    moved = {"nodes": [{"name": "compute0", "cpuset": [2, 4]}]}
    assert plan_golden.digest(plan) != plan_golden.digest(moved)
    assert plan_golden.digest(plan) == plan_golden.digest(json.loads(json.dumps(plan)))
