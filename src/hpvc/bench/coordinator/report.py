"""The coordinator benchmark's document, report and figure (pure but for the PNG file).

``document`` turns the samples of ``hpvc.bench.coordinator.runner`` into results:
per phase and cluster the measured rate against its target (error in %), the
phases' sums against the declared capacity, rebalance times, and the paired
overhead ratios (managed/unmanaged, enforced/managed) with min/median/max.
``report_md`` writes report.md; ``plot`` the figure coordinator.png.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from hpvc.bench.stats import summary

MB = 1_000_000
GOAL_SHARE_PCT = 5.0
GOAL_REBALANCE_S = 1.0
GOAL_OVERHEAD = 0.98  # managed/unmanaged: < 2% loss when uncontended
SIDES = ("unmanaged", "managed", "enforced")
GOAL_RATIO = "managed/unmanaged"
COST_RATIO = "enforced/managed"


def _err(measured: float, target: float) -> float:
    return (measured - target) / target * 100


def _shares(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per phase and cluster: target, measured (fio, cgroup) and the worst error."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[(r["phase"], r["cluster"])].append(r)
    out = []
    for (phase, cluster), rs in groups.items():
        target = rs[0]["target_bps"]
        row: dict[str, Any] = {"phase": phase, "cluster": cluster, "target_bps": target}
        errs = []
        for key in ("fio_bps", "cgroup_bps"):
            values = [r[key] for r in rs if key in r]
            if values:
                row[key] = summary(values)
                errs += [_err(v, target) for v in values]
        row["error_pct"] = summary(errs)
        row["worst_abs_error_pct"] = max(abs(e) for e in errs)
        # The median over repetitions of each measurement's error: a repetition in
        # which the whole host stalled moves every cluster's sample, not the median.
        medians = [_err(row[k]["median"], target) for k in ("fio_bps", "cgroup_bps") if k in row]
        row["median_abs_error_pct"] = max(abs(e) for e in medians)
        out.append(row)
    return out


def _aggregate(rows: list[dict[str, Any]], capacity: int) -> list[dict[str, Any]]:
    sums: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    for r in rows:
        sums[r["phase"]][r["rep"]] += r["cgroup_bps"]
    return [
        {"phase": phase, "capacity_bps": capacity, "sum_bps": summary(list(by_rep.values())),
         "of_capacity": summary([v / capacity for v in by_rep.values()])}
        for phase, by_rep in sums.items()
    ]  # fmt: skip


def _overhead(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per side, and the ratios paired within each pair of runs:
    managed/unmanaged (the goal) and enforced/managed (what enforcing costs)."""
    values = {s: [r["fio_bps"] for r in rows if r["side"] == s] for s in SIDES}
    sides = {s: summary(v) for s, v in values.items() if v}
    pairs: dict[tuple[int, int], dict[str, float]] = defaultdict(dict)
    for r in rows:
        pairs[(r["rep"], r["pair"])][r["side"]] = r["fio_bps"]
    ratios = {}
    for name in (GOAL_RATIO, COST_RATIO):
        top, bottom = name.split("/")
        paired = [p[top] / p[bottom] for p in pairs.values() if top in p and bottom in p]
        if paired:
            ratios[name] = summary(paired)
    return {"sides": sides, "ratios": ratios}


def document(
    facts: dict[str, Any],
    capacity: int,
    seconds: int,
    repeat: int,
    samples: dict[str, list[Any]],
    loadavg_end: list[float],
) -> dict[str, Any]:
    shares = _shares(samples["shares"])
    rebalance: dict[str, list[float]] = defaultdict(list)
    for r in samples["rebalance"]:
        rebalance[r["trigger"]].append(r["seconds"])
    overhead = _overhead(samples["overhead"])
    worst = max((s["median_abs_error_pct"] for s in shares), default=float("inf"))
    worst_sample = max((s["worst_abs_error_pct"] for s in shares), default=float("inf"))
    slowest = max((max(v) for v in rebalance.values()), default=float("inf"))
    paired = overhead["ratios"].get(GOAL_RATIO, {})
    ratio = paired.get("median", 0.0)
    spread = f", pairs {paired['min']:.2f} to {paired['max']:.2f}" if paired else ""
    goals = [
        {"what": f"every share (median over repetitions) within {GOAL_SHARE_PCT:g}% of its"
         " target", "met": worst <= GOAL_SHARE_PCT,
         "value": f"worst median {worst:.2f}%, worst single sample {worst_sample:.2f}%"},
        {"what": f"rebalance within {GOAL_REBALANCE_S:g} s", "met": slowest <= GOAL_REBALANCE_S,
         "value": f"slowest {slowest * 1000:.0f} ms"},
        {"what": f"uncontended loss < {(1 - GOAL_OVERHEAD) * 100:g}% ({GOAL_RATIO})",
         "met": ratio >= GOAL_OVERHEAD, "value": f"median {ratio:.3f}{spread}"},
    ]  # fmt: skip
    return {
        "benchmark": "coordinator",
        "facts": {**facts, "loadavg_end": loadavg_end},
        "capacity_bps": capacity,
        "seconds": seconds,
        "repeat": repeat,
        "shares": shares,
        "aggregate": _aggregate(samples["shares"], capacity),
        "rebalance": {k: summary(v) | {"samples": v} for k, v in rebalance.items()},
        "overhead": overhead,
        "goals": goals,
        "meets_goal": all(g["met"] for g in goals),
        "samples": samples,
    }


def _mb(v: float) -> str:
    return f"{v / MB:.2f}"


def report_md(doc: dict[str, Any]) -> str:
    f = doc["facts"]
    lines = [
        "# Storage bandwidth coordinator",
        "",
        f"{f.get('date', '')}, {f.get('host', '')}, kernel {f.get('kernel', '')},"
        f" {f.get('cpus', '?')} CPUs, load {f.get('loadavg_start', '?')} at start."
        f" Declared write capacity {_mb(doc['capacity_bps'])} MB/s, fio {doc['seconds']} s"
        f" runs (direct I/O, 1 MiB, through NFS), {doc['repeat']} repetitions.",
        "",
        "## Shares (MB/s; min / median / max over repetitions)",
        "",
        "| phase | cluster | target | fio | server cgroup | error % |",
        "|---|---|---|---|---|---|",
    ]
    for s in doc["shares"]:
        cells = [
            " / ".join(_mb(s[k][m]) for m in ("min", "median", "max")) if k in s else "-"
            for k in ("fio_bps", "cgroup_bps")
        ]
        e = s["error_pct"]
        lines.append(
            f"| {s['phase']} | {s['cluster']} | {_mb(s['target_bps'])} | {cells[0]} | {cells[1]}"
            f" | {e['min']:+.2f} / {e['median']:+.2f} / {e['max']:+.2f} |"
        )
    lines += ["", "| phase | sum of the clusters (MB/s) | of the capacity |", "|---|---|---|"]
    for a in doc["aggregate"]:
        s, o = a["sum_bps"], a["of_capacity"]
        lines.append(f"| {a['phase']} | {_mb(s['min'])} / {_mb(s['median'])} / {_mb(s['max'])}"
                     f" | {o['min']:.3f} / {o['median']:.3f} / {o['max']:.3f} |")  # fmt: skip
    lines += [
        "",
        "## Rebalance time (ms)",
        "",
        "| trigger | min | median | max |",
        "|---|---|---|---|",
    ]
    for trigger, r in doc["rebalance"].items():
        lines.append(
            f"| {trigger} | "
            + " | ".join(f"{r[k] * 1000:.1f}" for k in ("min", "median", "max"))
            + " |"
        )
    ov = doc["overhead"]
    lines += ["", "## Uncontended (one cluster alone, MB/s)", "", "| side | min | median | max |",
              "|---|---|---|---|"]  # fmt: skip
    for side, v in ov["sides"].items():
        lines.append(f"| {side} | {_mb(v['min'])} | {_mb(v['median'])} | {_mb(v['max'])} |")
    lines += ["", "| ratio (paired per repetition) | min | median | max |", "|---|---|---|---|"]
    for name, v in ov["ratios"].items():
        lines.append(f"| {name} | {v['min']:.3f} | {v['median']:.3f} | {v['max']:.3f} |")
    lines += ["", "## Goals", ""]
    lines += [
        f"- {g['what']}: {'met' if g['met'] else 'NOT met'} ({g['value']})" for g in doc["goals"]
    ]
    lines += ["", "Sides (one cluster alone, its shared directory a loop file system): `unmanaged`",
              "= the site file does not name its disk (hpvc without the coordinator); `managed` =",
              "the site file names it with 10 GB/s, so the cluster may take it all: no throttle,",
              "writes buffered; `enforced` = a demand of 5 GB/s (below the capacity): a write",
              "throttle that never bites and synchronous writes, as when clusters compete.",
              "Figure: coordinator.png.", ""]  # fmt: skip
    return "\n".join(lines)


def _short(phase: str) -> str:
    """A phase's name as an axis label: "1:2:4", "4 left", "demand"."""
    return {"after 4 left": "4 left"}.get(phase, "demand" if "asks" in phase else phase)


def plot(doc: dict[str, Any], path: Path) -> None:
    """coordinator.png: shares vs targets, sums vs capacity, rebalance times, overhead."""
    fig = Figure(figsize=(16, 4.4), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    ax_s, ax_a, ax_r, ax_o = fig.subplots(1, 4, width_ratios=[2.2, 1, 1, 1])
    labels = [f"{_short(s['phase'])}\n{s['cluster']}" for s in doc["shares"]]
    xs = range(len(labels))
    med = [s["cgroup_bps"]["median"] / MB for s in doc["shares"]]
    lo = [m - s["cgroup_bps"]["min"] / MB for m, s in zip(med, doc["shares"], strict=True)]
    hi = [s["cgroup_bps"]["max"] / MB - m for m, s in zip(med, doc["shares"], strict=True)]
    ax_s.bar(xs, med, yerr=[lo, hi], color="tab:blue", label="measured (server cgroup)")
    ax_s.scatter(xs, [s["target_bps"] / MB for s in doc["shares"]], color="black", marker="_",
                 s=400, zorder=3, label="target")  # fmt: skip
    ax_s.set_xticks(list(xs), labels, fontsize=8)
    ax_s.set_ylabel("MB/s")
    ax_s.set_title("per-cluster share vs target")
    ax_s.legend(fontsize=7)
    agg = doc["aggregate"]
    ax_a.bar(range(len(agg)), [a["sum_bps"]["median"] / MB for a in agg], color="tab:green")
    ax_a.axhline(doc["capacity_bps"] / MB, color="black", linestyle="--", label="declared capacity")
    ax_a.set_xticks(range(len(agg)), [_short(a["phase"]) for a in agg], fontsize=8)
    ax_a.set_title("sum of the shares vs capacity")
    ax_a.legend(fontsize=7)
    for i, (trigger, r) in enumerate(doc["rebalance"].items()):
        ax_r.scatter([i] * len(r["samples"]), [v * 1000 for v in r["samples"]], label=trigger)
    ax_r.axhline(GOAL_REBALANCE_S * 1000, color="red", linestyle=":", label="goal 1 s")
    ax_r.set_yscale("log")
    ax_r.set_xticks(range(len(doc["rebalance"])), [t.split(" (")[0] for t in doc["rebalance"]],
                    fontsize=7)  # fmt: skip
    ax_r.set_ylabel("ms")
    ax_r.set_title("rebalance time")
    ax_r.legend(fontsize=6)
    sides = doc["overhead"]["sides"]
    ax_o.bar(range(len(sides)), [v["median"] / MB for v in sides.values()],
             yerr=[[v["median"] / MB - v["min"] / MB for v in sides.values()],
                   [v["max"] / MB - v["median"] / MB for v in sides.values()]],
             color=["tab:gray", "tab:orange", "tab:blue"][: len(sides)])  # fmt: skip
    ax_o.set_xticks(range(len(sides)), list(sides))
    ratio = doc["overhead"]["ratios"].get(GOAL_RATIO, {}).get("median")
    title = "uncontended, one cluster"
    ax_o.set_title(title + (f"\n{GOAL_RATIO} {ratio:.3f}" if ratio else ""), fontsize=9)
    ax_o.set_ylabel("MB/s")
    fig.savefig(path, format="png")
