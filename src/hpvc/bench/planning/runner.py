"""How long the planner takes for a big cluster: 1,000 hosts, 10,000 nodes.

The hosts replicate real topology snapshots (round-robin), so the planner sees
sparse NUMA numbering, offline CPUs, memory-only nodes and hosts with no
hugepage pool at all, as a real inventory would. Each scenario is planned
``repeat`` times in this process, pinned to one CPU; wall and CPU time of
every run are recorded.
"""

from __future__ import annotations

import os
import platform
import tarfile
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpvc import __version__
from hpvc.bench.common import cpu_model
from hpvc.bench.stats import summary
from hpvc.cluster import inspect
from hpvc.cluster.inspect import HostView
from hpvc.progress import Progress, quiet
from hpvc.spec import Spec, parse_spec

GOAL_S = 10.0


@dataclass(frozen=True)
class Scenario:
    name: str
    describe: str
    spec: dict[str, Any]


def scenarios(nodes: int) -> list[Scenario]:
    """Two shapes of a ``nodes``-node cluster: socket-exclusive with hugepages, and a fill."""
    compute = (nodes - 1) * 9 // 10
    rest = nodes - 1 - compute
    net = {"subnet": "10.64.0.0/16" if nodes < 65000 else "10.0.0.0/8", "mtu": 9000}
    return [
        Scenario(
            "hpc-hugepages",
            "VMs, 1-vCPU dedicated computes, 2M hugepages, NUMA mirror, whole-socket hpc",
            {
                "name": "bench-hpc",
                "kind": "vm",
                "network": net,
                "tuning": {"pinning": "dedicated", "hugepages": "2M", "partition": "hpc"},
                "nodes": [
                    {"role": "head", "vcpus": 2, "memory": "2GiB", "pinning": "shared"},
                    {"role": "compute", "count": compute, "vcpus": 1, "memory": "512MiB"},
                    {"role": "storage", "count": rest, "memory": "512MiB", "pinning": "shared"},
                ],
            },
        ),
        Scenario(
            "commodity-fill",
            "VMs, 2-vCPU dedicated computes filling most CPUs of every host, no hugepages",
            {
                "name": "bench-fill",
                "kind": "vm",
                "network": net,
                "tuning": {"pinning": "dedicated", "hugepages": "none", "partition": "commodity"},
                "nodes": [
                    {"role": "head", "vcpus": 4, "memory": "4GiB"},
                    {"role": "compute", "count": compute, "vcpus": 2, "memory": "1GiB"},
                    {"role": "storage", "count": rest, "memory": "1GiB", "pinning": "shared"},
                ],
            },
        ),
    ]


def load_topologies(source: Path) -> list[HostView]:
    """Read every snapshot in ``source`` (``*.tar.bz2`` files or extracted roots)."""
    out: list[HostView] = []
    tarballs = sorted(source.glob("*.tar.bz2"))
    if tarballs:
        with tempfile.TemporaryDirectory(prefix="hpvc-bench-") as tmp:
            for tb in tarballs:
                with tarfile.open(tb) as tar:
                    tar.extractall(tmp, filter="tar")
                name = tb.name.removesuffix(".tar.bz2")
                out.append(inspect.read_host(Path(tmp) / name, name))
        return out
    for root in sorted(p for p in source.iterdir() if p.is_dir()):
        out.append(inspect.read_host(root, root.name))
    return out


@contextmanager
def one_cpu() -> Iterator[int | None]:
    """Run the body pinned to one CPU (the first this process may use)."""
    if not hasattr(os, "sched_setaffinity"):
        yield None
        return
    before = os.sched_getaffinity(0)
    cpu = min(before)
    os.sched_setaffinity(0, {cpu})
    try:
        yield cpu
    finally:
        os.sched_setaffinity(0, before)


def _time(spec: Spec, hosts: list[HostView]) -> tuple[float, float, int]:
    w0, c0 = time.perf_counter(), time.process_time()
    used = inspect.hosts_used(spec, hosts)
    return time.perf_counter() - w0, time.process_time() - c0, used


def run(
    source: Path,
    hosts: int = 1000,
    nodes: int = 10000,
    repeat: int = 5,
    progress: Progress = quiet,
) -> dict[str, Any]:
    """Plan each scenario ``repeat`` times; return the results document."""
    topos = load_topologies(source)
    inventory = [topos[i % len(topos)].named(f"host{i:05d}") for i in range(hosts)]
    results = []
    with one_cpu() as cpu:
        for sc in scenarios(nodes):
            spec = parse_spec(sc.spec, f"<bench {sc.name}>")
            wall: list[float] = []
            cpu_s: list[float] = []
            used = 0
            for i in range(repeat):
                progress(f"{sc.name}: run {i + 1}/{repeat}")
                w, c, used = _time(spec, inventory)
                wall.append(w)
                cpu_s.append(c)
            results.append(
                {
                    "name": sc.name,
                    "describe": sc.describe,
                    "spec": sc.spec,
                    "hosts_used": used,
                    "wall_s": wall,
                    "cpu_s": cpu_s,
                    "wall": summary(wall),
                    "goal_s": GOAL_S,
                    "median_over_goal": summary(wall)["median"] / GOAL_S,
                }
            )
    return {
        "benchmark": "plan-scale",
        "hpvc": __version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "node": platform.node(),
        "cpu_model": cpu_model(),
        "pinned_cpu": cpu,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "hosts": hosts,
        "nodes": nodes,
        "repeat": repeat,
        "topologies": [t.name for t in topos],
        "scenarios": results,
    }


def report_md(doc: dict[str, Any]) -> str:
    """The Markdown table docs/benchmarks.md quotes."""
    lines = [
        f"Planning {doc['nodes']:,} nodes over {doc['hosts']:,} hosts"
        f" ({len(doc['topologies'])} real topologies, round-robin), {doc['repeat']} runs each,"
        f" one CPU ({doc['cpu_model']}), Python {doc['python']}, {doc['date']}.",
        "",
        "| scenario | hosts used | min s | median s | max s | goal s | median/goal |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in doc["scenarios"]:
        w = s["wall"]
        lines.append(
            f"| {s['name']} | {s['hosts_used']} | {w['min']:.3f} | {w['median']:.3f}"
            f" | {w['max']:.3f} | {s['goal_s']:.0f} | {s['median_over_goal']:.3f} |"
        )
    lines += ["", *(f"- {s['name']}: {s['describe']}" for s in doc["scenarios"])]
    return "\n".join(lines) + "\n"
