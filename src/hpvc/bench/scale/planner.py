"""The planner on simulated inventories of 100 to 10,000 hosts (issue 33, item 2).

Each inventory replicates the real topology snapshots round-robin (as ``hpvc
bench plan`` does), every host with a fabric address, so the plan includes the
network across hosts; the cluster has ``per_host`` nodes per host of the
inventory (10: 1,000 to 100,000 nodes) in both ``hpvc bench plan`` scenarios
(without their MTU 9000, which VXLAN across hosts cannot give the nodes).
Timed per point: ``plan_cluster`` (wall and CPU), the cycle collector's first
full pass over the new plan (the planner pauses it), and ``host_overlay`` for
the last host the plan uses (what one host's VXLAN set-up is computed from).
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


MEASURES = ("wall_s", "cpu_s", "collect_s", "overlay_s")


def _sample(spec: Any, inv: list[Any], fabric: dict[str, Fabric]) -> tuple[dict[str, float], int]:
    """One plan: its wall and CPU seconds, the collector's first full pass over
    it after (the planner pauses the collector: docs/planning.md "Speed"), and
    one host's overlay of it."""
    gc.collect()
    w0, c0 = time.perf_counter(), time.process_time()
    plan = plan_cluster(spec, inv, fabric=fabric)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    g0 = time.perf_counter()
    gc.collect()
    o0 = time.perf_counter()
    host_overlay(plan, plan.hosts[-1].name)
    took = {"wall_s": wall, "cpu_s": cpu, "collect_s": o0 - g0}
    return {**took, "overlay_s": time.perf_counter() - o0}, len(plan.hosts)


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
                    took, used = _sample(spec, inv, fabric)
                    c = cells.setdefault(
                        (name, hosts), {"describe": describe, **{m: [] for m in MEASURES}}
                    )
                    for m in MEASURES:
                        c[m].append(took[m])
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
            nodes = hosts * per_host
            point: dict[str, Any] = {"hosts": hosts, "nodes": nodes, "hosts_used": c["hosts_used"]}
            for m in MEASURES:
                point[m] = c[m]
                point[m.removesuffix("_s")] = summary(c[m])
            point["cpu_us_per_node"] = point["cpu"]["median"] / nodes * 1e6
            points.append(point)
        xs = [float(p["hosts"]) for p in points]
        series.append(
            {
                "scenario": name,
                "describe": cells[(name, sizes[0])]["describe"],
                "points": points,
                **{
                    f"{m}_fit": fit(xs, [p[m]["median"] for p in points])
                    for m in ("wall", "cpu", "collect", "overlay")
                },
            }
        )
    at_goal = [
        (p["wall"]["median"], p["cpu"]["median"])
        for s in series
        for p in s["points"]
        if p["hosts"] == GOAL["hosts"] and p["nodes"] == GOAL["nodes"]
    ]
    wall_goal = max(w for w, _ in at_goal) if at_goal else None
    cpu_goal = max(c for _, c in at_goal) if at_goal else None
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
        "goal": {**GOAL, "median_s": wall_goal, "cpu_median_s": cpu_goal},
        "goal_met": None if wall_goal is None else wall_goal < GOAL["seconds"],
        # Wall over CPU seconds of all plans: about 1 on a CPU of its own, 2 when
        # another process took half of it (the machine is shared).
        "wall_over_cpu": round(
            sum(sum(p["wall_s"]) for s in series for p in s["points"])
            / max(1e-9, sum(sum(p["cpu_s"]) for s in series for p in s["points"])),
            2,
        ),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
    }


def plot(doc: dict[str, Any], path: Path) -> str:
    """Plan time (wall median, min-max bars; CPU median), the collector's pass and
    one host's overlay against the number of hosts, log-log."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.5, 5), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    for s in doc["series"]:
        pts = s["points"]
        xs = [p["hosts"] for p in pts]
        med = [p["wall"]["median"] for p in pts]
        lo = [m - p["wall"]["min"] for m, p in zip(med, pts, strict=True)]
        hi = [p["wall"]["max"] - m for m, p in zip(med, pts, strict=True)]
        growth = f"{s['wall_fit']['growth']} (CPU: {s['cpu_fit']['growth']})"
        label = f"plan (wall), {s['scenario']}: {growth}"
        line = ax.errorbar(xs, med, yerr=[lo, hi], marker="o", capsize=3, label=label)
        color = line.lines[0].get_color()
        cpu = [p["cpu"]["median"] for p in pts]
        ax.plot(xs, cpu, marker="x", color=color, alpha=0.6, label=f"plan (CPU), {s['scenario']}")
        for key, style, what in (
            ("collect", "-.", "collector's pass"),
            ("overlay", "--", "overlay"),
        ):
            ys = [p[key]["median"] for p in pts]
            ax.plot(xs, ys, style, marker=".", color=color, label=f"{what}, {s['scenario']}")
    first = doc["series"][0]["points"]
    x0, y0 = first[0]["hosts"], first[0]["cpu"]["median"]
    xs = [p["hosts"] for p in first]
    ax.plot(
        xs, [y0 * x / x0 for x in xs], ":", color="grey", label="linear (from the first CPU point)"
    )
    g = doc["goal"]
    ax.plot([g["hosts"]], [g["seconds"]], "r*", markersize=12, label=f"goal: < {g['seconds']} s")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(f"hosts in the inventory ({doc['nodes_per_host']} nodes per host)")
    ax.set_ylabel("seconds (median; plan wall: min-max)")
    ax.set_title(f"planner on one CPU, {doc['reps']} runs each (wall/CPU {doc['wall_over_cpu']})")
    ax.legend(fontsize=6)
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
        f" one CPU ({result['cpu_model']}), Python {result['python']}, {result['date']};"
        f" wall/CPU seconds of all plans {result['wall_over_cpu']} (1: the CPU was the"
        " planner's alone).",
        "",
        "| scenario | hosts | nodes | hosts used | wall min / median / max s | CPU median s"
        " | CPU us/node | collector's pass s | one host's overlay s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in result["series"]:
        for p in s["points"]:
            w = p["wall"]
            lines.append(
                f"| {s['scenario']} | {p['hosts']:,} | {p['nodes']:,} | {p['hosts_used']:,}"
                f" | {w['min']:.3f} / {w['median']:.3f} / {w['max']:.3f}"
                f" | {p['cpu']['median']:.3f} | {p['cpu_us_per_node']:.1f}"
                f" | {p['collect']['median']:.3f} | {p['overlay']['median']:.4f} |"
            )
    lines.append("")
    for s in result["series"]:
        f = {k: s[f"{k}_fit"] for k in ("wall", "cpu", "collect", "overlay")}
        lines.append(
            f"- {s['scenario']}: plan time {f['cpu']['growth']} in the number of hosts by CPU"
            f" seconds (log-log slope {f['cpu']['slope']}), {f['wall']['growth']} by wall"
            f" ({f['wall']['slope']});"
            f" the collector's pass {f['collect']['growth']} ({f['collect']['slope']});"
            f" one host's overlay {f['overlay']['growth']} ({f['overlay']['slope']})."
        )
    goal = f"- Goal: {g['nodes']:,} nodes on {g['hosts']:,} hosts < {g['seconds']} s: "
    if result["goal_met"] is None:
        goal += f"not measured (no point of {g['hosts']:,} hosts, {g['nodes']:,} nodes)."
    else:
        goal += "met" if result["goal_met"] else "NOT met"
        goal += (
            f" (slower scenario: median {g['median_s']:.3f} s wall, {g['cpu_median_s']:.3f} s CPU)."
        )
    lines += [goal, "", f"![planner]({result.get('plot', 'planner.png')})"]
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
