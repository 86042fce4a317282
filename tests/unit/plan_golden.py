"""Fixed planner cases and a digest of each plan, to show that making the planner
faster changed no plan it produces (tests/unit/test_plan_golden.py).

The cases are drawn from a seeded ``random.Random`` (not hypothesis: the same
cases on every run, so digests recorded once can be compared): random specs on
inventories of the real topology snapshots, a second cluster beside the first
(reservations), a scaled cluster (``existing``), one host's share (``only``),
and both ``hpvc bench plan`` scenarios on 60 replicated hosts with fabric
addresses (the network across hosts). Recording, after a change that is meant
to change plans (say why in the commit):

    .venv/bin/python -m tests.unit.plan_golden --write
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hpvc.errors import HpvcError
from hpvc.plan import Plan, plan_cluster
from hpvc.plan.reservations import reservations_from_plans
from hpvc.spec import parse_spec
from hpvc.topology import Topology
from hpvc.topology.inventory import Fabric

DIGESTS = Path(__file__).resolve().parents[1] / "data" / "plan-golden.json"
RANDOM_CASES = 160
SEED = 33


def _spec(rng: random.Random, name: str) -> dict[str, Any]:
    """A spec like tests/unit/topogen.specs draws, from ``rng``."""
    groups: list[dict[str, Any]] = []
    for role in rng.sample(["head", "compute", "storage"], rng.randint(1, 3)):
        g: dict[str, Any] = {
            "role": role,
            "count": rng.randint(0, 6),
            "vcpus": rng.randint(1, 8),
            "memory": f"{rng.randint(1, 6)}GiB",
        }
        if rng.random() < 0.5:
            g["pinning"] = rng.choice(["dedicated", "shared"])
        groups.append(g)
    if all(g["count"] == 0 for g in groups):
        groups[0]["count"] = 1
    kind = rng.choice(["container", "vm"])
    hugepages = rng.choice(["none", "2M", "1G"])
    if kind == "container" and hugepages != "none":
        for g in groups:
            gib = int(g["memory"].removesuffix("GiB"))
            if gib > 1 and rng.random() < 0.5:
                g["hugepage_memory"] = f"{rng.randint(1, gib - 1)}GiB"
    return {
        "name": name,
        "kind": kind,
        "tuning": {
            "pinning": rng.choice(["dedicated", "shared"]),
            "hugepages": hugepages,
            "numa": rng.choice(["mirror", "none"]),
            "partition": rng.choice(["hpc", "commodity"]),
        },
        "nodes": groups,
    }


def _outcome(
    spec: dict[str, Any], hosts: list[tuple[str, Topology]], **kw: Any
) -> tuple[Plan | None, Any]:
    try:
        plan = plan_cluster(parse_spec(spec), hosts, **kw)
    except HpvcError as e:
        return None, {"error": type(e).__name__, "text": str(e)}
    return plan, plan.to_json()


def _bench_specs(nodes: int) -> list[dict[str, Any]]:
    from hpvc.bench.planning.runner import scenarios

    # Without the scenarios' MTU 9000: across hosts VXLAN leaves nodes 8950 of it.
    return [{**sc.spec, "network": {"subnet": "10.64.0.0/16"}} for sc in scenarios(nodes)]


def cases(real: dict[str, Topology]) -> Iterator[tuple[str, Any]]:
    """(case name, what the planner gave: a plan's JSON or the error) for every case."""
    rng = random.Random(SEED)
    names = sorted(real)
    for i in range(RANDOM_CASES):
        picks = [rng.choice(names) for _ in range(rng.randint(1, 4))]
        hosts = [(f"h{k}", real[n]) for k, n in enumerate(picks)]
        fabric = {h: Fabric(f"192.0.2.{k + 1}") for k, (h, _) in enumerate(hosts)}
        first = _spec(rng, rng.choice(["a", "b", "hpc-x"]))
        a, out = _outcome(first, hosts, fabric=fabric)
        yield f"random{i}", out
        if a is None:
            continue
        res = reservations_from_plans([a], dict(hosts))
        second = _spec(rng, "other")
        _, out = _outcome(second, hosts, reservations=res)
        yield f"random{i}-beside", out
        grown = [dict(g, count=g["count"] + rng.randint(0, 3)) for g in first["nodes"]]
        spec2 = {**first, "nodes": grown}
        _, out = _outcome(spec2, hosts, existing=a)
        yield f"random{i}-scaled", out
        share = {n.name for n in a.nodes if n.host == a.hosts[-1].name}
        _, out = _outcome(first, hosts, only=share)
        yield f"random{i}-share", out
    inventory = [(f"host{k:03d}", real[names[k % len(names)]]) for k in range(60)]
    fabric = {h: Fabric(f"10.1.{k // 250}.{k % 250 + 1}") for k, (h, _) in enumerate(inventory)}
    for j, spec in enumerate(_bench_specs(600)):
        _, out = _outcome(spec, inventory, fabric=fabric)
        yield f"bench{j}", out


def digest(out: Any) -> str:
    text = json.dumps(out, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def digests(real: dict[str, Topology]) -> dict[str, str]:
    return {name: digest(out) for name, out in cases(real)}


def _real_topologies() -> dict[str, Topology]:
    import tarfile
    import tempfile

    from hpvc.topology import read_topology

    source = Path(__file__).resolve().parents[1] / "data" / "topologies"
    out: dict[str, Topology] = {}
    with tempfile.TemporaryDirectory(prefix="hpvc-golden-") as tmp:
        for tb in sorted(source.glob("*.tar.bz2")):
            with tarfile.open(tb) as tar:
                tar.extractall(tmp, filter="tar")
            name = tb.name.removesuffix(".tar.bz2")
            out[name] = read_topology(Path(tmp) / name)
    return out


if __name__ == "__main__":
    found = digests(_real_topologies())
    if sys.argv[1:] == ["--write"]:
        DIGESTS.write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")
        print(f"wrote {len(found)} digests to {DIGESTS}")
    else:
        old = json.loads(DIGESTS.read_text())
        changed = sorted(k for k in found.keys() | old.keys() if found.get(k) != old.get(k))
        print(f"{len(found)} cases, {len(changed)} changed: {changed[:20]}")
