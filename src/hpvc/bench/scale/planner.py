"""The planner on simulated inventories of 100 to 10,000 hosts (issue 33, item 2).

Each inventory replicates the real topology snapshots round-robin (as ``hpvc
bench plan`` does), every host with a fabric address, so the plan includes the
network across hosts; the cluster has ``per_host`` nodes per host of the
inventory (10: 1,000 to 100,000 nodes) in both ``hpvc bench plan`` scenarios
(without their MTU 9000, which VXLAN across hosts cannot give the nodes).
Timed per point: ``plan_cluster`` (wall and CPU), and ``host_overlay`` for the
last host the plan uses (what one host's VXLAN set-up is computed from).
Repetitions are alternated (every size and scenario once, then again), in one
process pinned to one CPU, the cycle collector run before each sample.

The growth is the least-squares slope of log(median seconds) against
log(hosts): below 0.25 constant, below 0.75 less than linear, up to 1.25
linear or n log n (whichever of time/n and time/(n ln n) varies less), above
worse than linear. Three sums: not worth a library.

``python -m hpvc.bench.scale.planner --out DIR`` runs it alone; ``hpvc bench
scale --part planner`` runs it beside the Slurm half.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import resource
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hpvc import __version__
from hpvc.bench.common import cpu_model
from hpvc.bench.planning.runner import load_topologies, one_cpu, scenarios
from hpvc.bench.stats import summary
from hpvc.errors import HpvcError, InputError
from hpvc.plan import host_overlay, plan_cluster
from hpvc.progress import Progress, quiet
from hpvc.spec import parse_spec
from hpvc.topology.inventory import Fabric

SIZES = (100, 300, 1000, 3000, 10000)  # hosts
PER_HOST = 10  # nodes per host of the inventory
GOAL = {"hosts": 1000, "nodes": 10000, "seconds": 0.3}  # issue 33 item 3 (0.69 s before)


def default_topologies() -> Path:
    """$HPVC_TOPOLOGIES, else the repository's tests/data/topologies."""
    env = os.environ.get("HPVC_TOPOLOGIES")
    repo = Path(__file__).resolve().parents[4]
    for c in [Path(env)] if env else [repo / "tests" / "data" / "topologies"]:
        if c.is_dir():
            return c
    raise InputError(
        "bench scale planner",
        "no topology snapshots found",
        "set HPVC_TOPOLOGIES to a directory of hwloc-gather-topology tarballs",
    )


def fit(xs: Sequence[float], ys: Sequence[float]) -> dict[str, Any]:
    """Log-log slope of ``ys`` against ``xs`` and the growth it means, in words."""
    if len(xs) < 2 or min(ys) <= 0:
        return {"slope": None, "growth": "too few points to fit"}
    lx = [math.log(x) for x in xs]
    ly = [math.log(y) for y in ys]
    mx, my = statistics.fmean(lx), statistics.fmean(ly)
    slope = sum((a - mx) * (b - my) for a, b in zip(lx, ly, strict=True)) / sum(
        (a - mx) ** 2 for a in lx
    )
    if slope < 0.25:
        words = "constant"
    elif slope < 0.75:
        words = "less than linear"
    elif slope <= 1.25:
        # Which model leaves the smaller spread: time per n, or per n ln n.
        per_n = statistics.pstdev(b - a for a, b in zip(lx, ly, strict=True))
        per_nlogn = statistics.pstdev(
            b - a - math.log(a) for a, b in zip(lx, ly, strict=True) if a > 0
        )
        words = "n log n" if per_nlogn < per_n else "linear"
    else:
        words = "worse than linear"
    return {"slope": round(slope, 3), "growth": words}


def _inventory(topos: list[Any], hosts: int) -> tuple[list[Any], dict[str, Fabric]]:
    inv = [(f"host{i:05d}", topos[i % len(topos)].topology) for i in range(hosts)]
    fabric = {name: Fabric(f"172.16.{i // 250}.{i % 250 + 1}") for i, (name, _) in enumerate(inv)}
    return inv, fabric


def _specs(nodes: int) -> list[tuple[str, str, Any]]:
    out = []
    for sc in scenarios(nodes):
        net = {"subnet": sc.spec["network"]["subnet"]}  # no MTU 9000: VXLAN takes 50 of it
        out.append((sc.name, sc.describe, parse_spec({**sc.spec, "network": net}, sc.name)))
    return out


def _sample(
    spec: Any, inv: list[Any], fabric: dict[str, Fabric]
) -> tuple[float, float, float, int]:
    gc.collect()
    w0, c0 = time.perf_counter(), time.process_time()
    plan = plan_cluster(spec, inv, fabric=fabric)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    o0 = time.perf_counter()
    host_overlay(plan, plan.hosts[-1].name)
    return wall, cpu, time.perf_counter() - o0, len(plan.hosts)


def run(
    out: Path,
    reps: int,
    sizes: Sequence[int] = SIZES,
    per_host: int = PER_HOST,
    topologies: Path | None = None,
    progress: Progress = quiet,
) -> dict[str, Any]:
    """Time the planner at every size ``reps`` times; write planner.json and planner.png."""
    if reps < 1 or not sizes or min(sizes) < 1 or per_host < 1:
        raise InputError(
            "bench scale planner",
            "repetitions, host counts and nodes per host must be 1 or more",
            "--reps 3 --sizes 100,1000 --per-host 10",
        )
    started = time.perf_counter()
    topos = load_topologies(topologies or default_topologies())
    cells: dict[tuple[str, int], dict[str, Any]] = {}
    with one_cpu() as cpu:
        for rep in range(reps):
            for hosts in sizes:
                inv, fabric = _inventory(topos, hosts)
                for name, describe, spec in _specs(hosts * per_host):
                    progress(f"planner: {hosts} hosts, {name}, run {rep + 1}/{reps}")
                    wall, cpu_s, overlay, used = _sample(spec, inv, fabric)
                    c = cells.setdefault(
                        (name, hosts),
                        {"describe": describe, "wall_s": [], "cpu_s": [], "overlay_s": []},
                    )
                    c["wall_s"].append(wall)
                    c["cpu_s"].append(cpu_s)
                    c["overlay_s"].append(overlay)
                    c["hosts_used"] = used
                del inv, fabric
    doc = _document(cells, sizes, per_host, reps, [t.name for t in topos], cpu)
    doc["elapsed_s"] = round(time.perf_counter() - started, 1)
    out.mkdir(parents=True, exist_ok=True)
    (out / "planner.json").write_text(json.dumps(doc, indent=2) + "\n")
    doc["plot"] = plot(doc, out / "planner.png")
    return doc


def _document(
    cells: dict[tuple[str, int], dict[str, Any]],
    sizes: Sequence[int],
    per_host: int,
    reps: int,
    topologies: list[str],
    cpu: int | None,
) -> dict[str, Any]:
    series = []
    for name in dict.fromkeys(n for n, _ in cells):
        points = []
        for hosts in sizes:
            c = cells[(name, hosts)]
            wall, overlay = summary(c["wall_s"]), summary(c["overlay_s"])
            nodes = hosts * per_host
            points.append(
                {
                    "hosts": hosts,
                    "nodes": nodes,
                    "hosts_used": c["hosts_used"],
                    "wall_s": c["wall_s"],
                    "cpu_s": c["cpu_s"],
                    "overlay_s": c["overlay_s"],
                    "wall": wall,
                    "cpu": summary(c["cpu_s"]),
                    "overlay": overlay,
                    "us_per_node": wall["median"] / nodes * 1e6,
                }
            )
        xs = [float(p["hosts"]) for p in points]
        series.append(
            {
                "scenario": name,
                "describe": cells[(name, sizes[0])]["describe"],
                "points": points,
                "fit": fit(xs, [p["wall"]["median"] for p in points]),
                "overlay_fit": fit(xs, [p["overlay"]["median"] for p in points]),
            }
        )
    at_goal = [
        p["wall"]["median"]
        for s in series
        for p in s["points"]
        if p["hosts"] == GOAL["hosts"] and p["nodes"] == GOAL["nodes"]
    ]
    return {
        "benchmark": "scale-planner",
        "hpvc": __version__,
        "python": platform.python_version(),
        "cpu_model": cpu_model(),
        "node": platform.node(),
        "pinned_cpu": cpu,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "reps": reps,
        "sizes": list(sizes),
        "nodes_per_host": per_host,
        "topologies": topologies,
        "series": series,
        "goal": {**GOAL, "median_s": max(at_goal) if at_goal else None},
        "goal_met": (max(at_goal) < GOAL["seconds"]) if at_goal else None,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
    }


def plot(doc: dict[str, Any], path: Path) -> str:
    """Median plan time (min-max bars) and one host's overlay against hosts, log-log."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4.5), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    for s in doc["series"]:
        xs = [p["hosts"] for p in s["points"]]
        med = [p["wall"]["median"] for p in s["points"]]
        lo = [m - p["wall"]["min"] for m, p in zip(med, s["points"], strict=True)]
        hi = [p["wall"]["max"] - m for m, p in zip(med, s["points"], strict=True)]
        label = f"plan, {s['scenario']} ({s['fit']['growth']})"
        ax.errorbar(xs, med, yerr=[lo, hi], marker="o", capsize=3, label=label)
        ov = [p["overlay"]["median"] for p in s["points"]]
        ax.plot(xs, ov, marker=".", linestyle="--", label=f"one host's overlay, {s['scenario']}")
    first = doc["series"][0]["points"]
    x0, y0 = first[0]["hosts"], first[0]["wall"]["median"]
    xs = [p["hosts"] for p in first]
    ax.plot(xs, [y0 * x / x0 for x in xs], ":", color="grey", label="linear (from the first point)")
    g = doc["goal"]
    ax.plot([g["hosts"]], [g["seconds"]], "r*", markersize=12, label=f"goal: < {g['seconds']} s")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(f"hosts in the inventory ({doc['nodes_per_host']} nodes per host)")
    ax.set_ylabel("seconds (median, min-max)")
    ax.set_title(f"planner, one CPU, {doc['reps']} runs each")
    ax.legend(fontsize=7)
    fig.savefig(path, format="png")
    return path.name


def report_lines(result: dict[str, Any]) -> list[str]:
    """Markdown for report.md: the table, the fitted growth in words, the goal."""
    g = result["goal"]
    lines = [
        "### Planner",
        "",
        f"Inventories of {', '.join(f'{h:,}' for h in result['sizes'])} hosts"
        f" ({len(result['topologies'])} real topologies round-robin, fabric addresses),"
        f" {result['nodes_per_host']} nodes per host, {result['reps']} runs alternated,"
        f" one CPU ({result['cpu_model']}), Python {result['python']}, {result['date']}.",
        "",
        "| scenario | hosts | nodes | hosts used | min s | median s | max s | us/node"
        " | one host's overlay s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in result["series"]:
        for p in s["points"]:
            w = p["wall"]
            lines.append(
                f"| {s['scenario']} | {p['hosts']:,} | {p['nodes']:,} | {p['hosts_used']:,}"
                f" | {w['min']:.3f} | {w['median']:.3f} | {w['max']:.3f}"
                f" | {p['us_per_node']:.1f} | {p['overlay']['median']:.4f} |"
            )
    lines.append("")
    for s in result["series"]:
        f, o = s["fit"], s["overlay_fit"]
        lines.append(
            f"- {s['scenario']}: plan time {f['growth']} in the number of hosts (log-log"
            f" slope {f['slope']}); one host's overlay {o['growth']} (slope {o['slope']})."
        )
    goal = f"- Goal: {g['nodes']:,} nodes on {g['hosts']:,} hosts < {g['seconds']} s: "
    if result["goal_met"] is None:
        goal += f"not measured (no point of {g['hosts']:,} hosts, {g['nodes']:,} nodes)."
    else:
        goal += "met" if result["goal_met"] else "NOT met"
        goal += f" (median of the slower scenario {g['median_s']:.3f} s)."
    lines += [
        goal,
        "",
        f"![planner]({result.get('plot', 'planner.png')})",
    ]
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m hpvc.bench.scale.planner",
        description="Time the planner on simulated inventories (issue 33).",
    )
    ap.add_argument("--out", type=Path, default=Path("bench/results/scale"))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--sizes", default=",".join(str(s) for s in SIZES), help="host counts")
    ap.add_argument("--per-host", type=int, default=PER_HOST, help="nodes per host")
    ap.add_argument("--topologies", type=Path, default=None)
    args = ap.parse_args(argv)
    try:
        try:
            sizes = [int(x) for x in args.sizes.split(",") if x.strip()]
        except ValueError:
            raise InputError(f"--sizes {args.sizes}", "not numbers", "--sizes 100,1000") from None
        result = run(
            args.out,
            args.reps,
            sizes,
            args.per_host,
            args.topologies,
            progress=lambda m: print(m, file=sys.stderr),
        )
    except HpvcError as e:
        print(f"hpvc: {e.line()}", file=sys.stderr)
        return e.exit_code
    print("\n".join(report_lines(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
