"""hpvc against Podman in ``hpvc bench startup``: per-size summaries, ratios, goals, tables.

Pure: the samples come from ``startup.runner`` (hpvc) and ``startup.podman``
(the peer), taken alternated in one run. A ratio is hpvc / Podman of the
same repetition (below 1: hpvc is faster); its min/median/max are over the
repetitions, and ``of_medians`` is the ratio of the two medians. Goals (issue
16), at 8 nodes: ``hpvc up`` median <= 0.5 s and <= 0.8x Podman's parallel
start; ``hpvc down`` <= 0.8x Podman's removal (of the containers started in
parallel); and (issue 33 item 4, no resident hpvc) ``hpvc up`` <= 0.5x
Podman's parallel start.
"""

from __future__ import annotations

import statistics
from typing import Any

from hpvc.bench.stats import summary

GOAL_NODES = 8
GOAL_UP_S = 0.5
GOAL_UP_RATIO = 0.8
GOAL_UP_RATIO_COLD = 0.5  # issue 33: without `hpvc serve`
GOAL_DOWN_RATIO = 0.8
# name -> (hpvc's sample, Podman's mode, Podman's sample)
RATIOS = {
    "up_vs_parallel_start": ("up_s", "parallel", "start_s"),
    "up_vs_sequential_start": ("up_s", "sequential", "start_s"),
    "down_vs_rm": ("down_s", "parallel", "rm_s"),
}


def _paired(
    hpvc: list[dict[str, Any]], peer: list[dict[str, Any]], a: str, b: str
) -> dict[str, Any]:
    theirs = {r["rep"]: float(r[b]) for r in peer}
    rs = [float(r[a]) / theirs[r["rep"]] for r in hpvc if r["rep"] in theirs]
    mine = statistics.median(float(r[a]) for r in hpvc)
    return {
        "n": len(rs),
        **summary(rs),
        "of_medians": mine / statistics.median(theirs.values()),
    }


def size_doc(
    n: int, hpvc: list[dict[str, Any]], peer: dict[str, list[dict[str, Any]]]
) -> dict[str, Any]:
    """Podman's samples of one size, and hpvc/Podman ratios paired per repetition."""
    doc: dict[str, Any] = {
        mode: {
            "runs": runs,
            "start": summary([r["start_s"] for r in runs]),
            "rm": summary([r["rm_s"] for r in runs]),
        }
        for mode, runs in peer.items()
    }
    ratios = {name: _paired(hpvc, peer[mode], a, b) for name, (a, mode, b) in RATIOS.items()}
    out: dict[str, Any] = {"podman": doc, "ratios": ratios}
    if n == GOAL_NODES:
        up = statistics.median(r["up_s"] for r in hpvc)
        out["goals"] = {
            f"up median <= {GOAL_UP_S:g} s": up <= GOAL_UP_S,
            f"up <= {GOAL_UP_RATIO:g}x podman parallel start (median ratio)": ratios[
                "up_vs_parallel_start"
            ]["median"]
            <= GOAL_UP_RATIO,
            f"up <= {GOAL_UP_RATIO_COLD:g}x podman parallel start (median ratio)": ratios[
                "up_vs_parallel_start"
            ]["median"]
            <= GOAL_UP_RATIO_COLD,
            f"down <= {GOAL_DOWN_RATIO:g}x podman rm (median ratio)": ratios["down_vs_rm"]["median"]
            <= GOAL_DOWN_RATIO,
        }
    return out


def _mmm(s: dict[str, float]) -> str:
    return f"{s['min']:.3f} | {s['median']:.3f} | {s['max']:.3f}"


def report_lines(doc: dict[str, Any]) -> list[str]:
    """The report.md section: seconds and ratios per size, then the goals."""
    peer = doc.get("peer")
    if not peer:
        return []
    if "skipped" in peer:
        return ["", f"Podman side skipped: {peer['skipped']}."]
    lines = [
        "",
        f"Against {peer['version']} (runtime {peer['runtime']}, network backend"
        f" {peer['network_backend']}), alternated with hpvc in every repetition:"
        f" {peer['image']}; {peer['limits']}; {peer['network']}; {peer['timing']}.",
        "",
        "| nodes | what | min s | median s | max s |",
        "|---|---|---|---|---|",
    ]
    for s in doc["sizes"]:
        p = s["peer"]["podman"]
        rows = [
            ("hpvc up", s["up"]),
            ("podman parallel start", p["parallel"]["start"]),
            ("podman sequential start", p["sequential"]["start"]),
            ("hpvc down", s["down"]),
            ("podman rm (of the parallel start)", p["parallel"]["rm"]),
            ("podman rm (of the sequential start)", p["sequential"]["rm"]),
        ]
        lines += [f"| {s['nodes']} | {what} | {_mmm(x)} |" for what, x in rows]
    lines += [
        "",
        "Ratios hpvc / podman, paired per repetition (below 1: hpvc faster):",
        "",
        "| nodes | ratio | min | median | max | of medians |",
        "|---|---|---|---|---|---|",
    ]
    for s in doc["sizes"]:
        for name, r in s["peer"]["ratios"].items():
            lines.append(f"| {s['nodes']} | {name} | {_mmm(r)} | {r['of_medians']:.3f} |")
    goals = [
        (s["nodes"], g, met) for s in doc["sizes"] for g, met in s["peer"].get("goals", {}).items()
    ]
    if goals:
        lines += ["", "| nodes | goal | met |", "|---|---|---|"]
        lines += [f"| {n} | {g} | {'yes' if met else 'no'} |" for n, g, met in goals]
    return lines
