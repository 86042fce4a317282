"""The results of ``hpvc bench scale`` (Slurm half): per host count, medians of
both paths, the cost hpvc adds, its fitted growth, the goals, and the plots.

Pure but for ``plots`` (PNG files). The growth is the slope of a least-squares
line through (log hosts, log cost): about 0 is constant, about 1 linear, above
1.25 worse than linear (written out by hand: three sums, not worth a library).
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from hpvc.bench.slurm.report import PHASES
from hpvc.bench.stats import summary

# Issue 33's goals on 32 hosts: seconds added to the first task, per mode; epilog per host.
GOAL_FIRST_TASK = {"resident": 0.5, "no_resident": 1.0}
GOAL_EPILOG_S = 0.5
FLOOR_S = 0.005  # costs below this count as this much in the fit (log of 0)
TCG = " (TCG emulation)"  # after every growth word of a VM run: the emulator's curve too


def mode_of(resident: bool) -> str:
    return "resident" if resident else "no_resident"


def fit(xs: list[float], ys: list[float]) -> dict[str, Any]:
    """Log-log slope of ``ys`` against ``xs`` and what it says in words."""
    pts = [(math.log(x), math.log(max(y, FLOOR_S))) for x, y in zip(xs, ys, strict=True)]
    if len(pts) < 2:
        return {"slope": None, "growth": "one host count only: no fit"}
    mx = statistics.fmean(p[0] for p in pts)
    my = statistics.fmean(p[1] for p in pts)
    sxx = sum((p[0] - mx) ** 2 for p in pts)
    slope = sum((p[0] - mx) * (p[1] - my) for p in pts) / sxx
    if slope < 0.25:
        words = "about constant"
    elif slope < 0.75:
        words = "less than linear"
    elif slope <= 1.25:
        words = "about linear"
    else:
        words = "worse than linear"
    return {"slope": slope, "growth": words}


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else math.nan


def _rows_at(rows: list[dict[str, Any]], mode: str, h: int, config: str) -> list[dict[str, Any]]:
    return [
        r
        for r in rows
        if mode_of(r["resident"]) == mode and r["hosts"] == h and r["config"] == config
    ]


def _line(rows: list[dict[str, Any]], mode: str, h: int) -> dict[str, Any]:
    plain, hp = _rows_at(rows, mode, h, "plain"), _rows_at(rows, mode, h, "hpvc")
    first_p = [r["first_task_s"] for r in plain]
    first_h = [r["first_task_s"] for r in hp]
    # Per repetition: the plain and --hpvc runs of one repetition side by side.
    added = [
        b["first_task_s"] - a["first_task_s"] for a in plain for b in hp if a["rep"] == b["rep"]
    ]
    epilog = [max(r["epilog_s"].values()) for r in hp if r["epilog_s"]]
    epilog_hosts = [v for r in hp for v in r["epilog_s"].values()]
    cpu = [(b["cpu_s"] - a["cpu_s"]) / h for a in plain for b in hp if a["rep"] == b["rep"]]
    phases = [r["phases"] for r in hp if r.get("phases")]
    keys = [k for k in PHASES if any(k in p for p in phases)]
    qemu = [r["qemu_rss_per_host_mib"] for r in hp if "qemu_rss_per_host_mib" in r]
    return {
        "hosts": h,
        "plain_first_task_s": summary(first_p),
        "hpvc_first_task_s": summary(first_h),
        "added_first_task_s": summary(added),
        "hpvc_wall_s": summary([r["wall_s"] for r in hp]),
        "epilog_slowest_host_s": summary(epilog) if epilog else None,
        "epilog_per_host_s": summary(epilog_hosts) if epilog_hosts else None,
        "hpvc_cpu_per_host_s": summary(cpu),
        "phases_median_s": {k: _median([p.get(k, 0.0) for p in phases]) for k in keys},
        **({"qemu_rss_per_host_mib": summary(qemu)} if qemu else {}),
    }


def document(facts: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    modes = [
        m for m in ("resident", "no_resident") if any(mode_of(r["resident"]) == m for r in rows)
    ]
    counts = sorted({r["hosts"] for r in rows})
    vm = facts.get("kind") == "vm"
    table: dict[str, list[dict[str, Any]]] = {}
    growth: dict[str, dict[str, Any]] = {}
    goals: list[dict[str, Any]] = []
    for m in modes:
        lines = [_line(rows, m, h) for h in counts]
        table[m] = lines
        xs = [float(h) for h in counts]
        growth[m] = {
            "added_first_task": fit(xs, [ln["added_first_task_s"]["median"] for ln in lines]),
            "hpvc_cpu_per_host": fit(xs, [ln["hpvc_cpu_per_host_s"]["median"] for ln in lines]),
            "hpvc_cpu_all_hosts": fit(
                xs, [ln["hpvc_cpu_per_host_s"]["median"] * ln["hosts"] for ln in lines]
            ),
        }
        if all(ln["epilog_slowest_host_s"] for ln in lines):
            growth[m]["epilog_slowest_host"] = fit(
                xs, [ln["epilog_slowest_host_s"]["median"] for ln in lines]
            )
        if all("qemu_rss_per_host_mib" in ln for ln in lines):
            growth[m]["qemu_memory_per_host"] = fit(
                xs, [ln["qemu_rss_per_host_mib"]["median"] for ln in lines]
            )
        if vm:  # issue 33's goals are for container nodes on 32 hosts
            for f in growth[m].values():
                f["growth"] += TCG
            continue
        top = lines[-1]
        words = m.replace("_", " ")
        goals.append(
            {
                "what": f"first task on {top['hosts']} hosts, {words}: added (median)",
                "value_s": top["added_first_task_s"]["median"],
                "goal_s": GOAL_FIRST_TASK[m],
                "met": top["added_first_task_s"]["median"] <= GOAL_FIRST_TASK[m],
            }
        )
        if top["epilog_per_host_s"]:
            goals.append(
                {
                    "what": f"epilog per host on {top['hosts']} hosts, {words} (median)",
                    "value_s": top["epilog_per_host_s"]["median"],
                    "goal_s": GOAL_EPILOG_S,
                    "met": top["epilog_per_host_s"]["median"] <= GOAL_EPILOG_S,
                }
            )
    return facts | {"table": table, "growth": growth, "goals": goals, "runs": rows}


def _mmm(s: dict[str, float] | None) -> str:
    return f"{s['min']:.3f} / {s['median']:.3f} / {s['max']:.3f}" if s else "-"


def _phase_lines(lines: list[dict[str, Any]]) -> list[str]:
    keys = [k for k in PHASES if any(k in ln["phases_median_s"] for ln in lines)]
    if not keys:
        return []
    out = [
        "",
        "Phases of the `--hpvc` job's way to its first task (median s; the hosts run"
        " `hpvc node up` at once, the slowest counts; `rest` is Slurm and the tasks' join):",
        "",
        "| phase | " + " | ".join(f"{ln['hosts']} h" for ln in lines) + " |",
        "|---|" + "---|" * len(lines),
    ]
    for k in keys:
        cells = " | ".join(
            f"{ln['phases_median_s'][k]:.3f}" if k in ln["phases_median_s"] else "" for ln in lines
        )
        out.append(f"| {k} | {cells} |")
    return out


def _memory_lines(doc: dict[str, Any]) -> list[str]:
    out = []
    for mode, mem in sorted(doc.get("memory", {}).items()):
        for what, m in sorted(mem.items()):
            per = m["per_host_mib"]
            out.append(
                f"- {mode.replace('_', ' ')}: {what} on {m['hosts']} hosts:"
                f" {statistics.median(per):.1f} MiB per host"
                f" (median; {min(per):.1f}-{max(per):.1f}),"
                f" {m['total_mib']:.0f} MiB in all"
            )
    return out


def report_md(doc: dict[str, Any]) -> str:
    vm = doc.get("kind") == "vm"
    nodes = (
        "one VM node per host (TCG emulation)"
        if vm
        else f"{doc['nodes_per_host']} container nodes per host"
    )
    lines = [
        f"# hpvc bench scale (Slurm)\n\n`srun -N<h> --hpvc` against plain `srun -N<h>` on the"
        f" Slurm test cluster ({max(doc['hosts'])} simulated hosts on one machine, sharing its"
        f" {doc['cpus']} CPUs), {doc['reps']} repetitions alternated; {doc['host']}"
        f" ({doc['cpu_model']}), {doc['date']}. Virtual cluster: {nodes},"
        f" one network, VXLAN across hosts. Jobs submitted by"
        f" {doc['submitted_by']}. {doc['vm']}.",
    ]
    for mode, rows in doc["table"].items():
        title = "with a resident hpvc on every host" if mode == "resident" else "no resident hpvc"
        lines += [
            "",
            f"## {title}",
            "",
            "| hosts | plain first task s | --hpvc first task s | added s | epilog slowest host s"
            " | epilog per host s | hpvc CPU s per host |" + (" QEMU MiB per host |" if vm else ""),
            "|---|---|---|---|---|---|---|" + ("---|" if vm else ""),
        ]
        for ln in rows:
            qemu = ln.get("qemu_rss_per_host_mib")
            lines.append(
                f"| {ln['hosts']} | {_mmm(ln['plain_first_task_s'])}"
                f" | {_mmm(ln['hpvc_first_task_s'])}"
                f" | {_mmm(ln['added_first_task_s'])} | {_mmm(ln['epilog_slowest_host_s'])}"
                f" | {_mmm(ln['epilog_per_host_s'])} | {_mmm(ln['hpvc_cpu_per_host_s'])} |"
                + (
                    f" {qemu['min']:.0f} / {qemu['median']:.0f} / {qemu['max']:.0f} |"
                    if vm and qemu
                    else " - |"
                    if vm
                    else ""
                )
            )
        lines += _phase_lines(rows)
        lines += ["", "Fitted growth against the host count (log-log slope):", ""]
        for what, f in doc["growth"][mode].items():
            slope = f"{f['slope']:.2f}" if f["slope"] is not None else "-"
            lines.append(f"- {what.replace('_', ' ')}: {f['growth']} (slope {slope})")
    lines += ["", "## Memory", "", *_memory_lines(doc)]
    if vm:
        lines.append(
            "- QEMU: peak resident set per host during each --hpvc job, in the table above"
            " (hpvc CPU s per host includes QEMU's emulation)"
        )
    lines += ["", "## Goals", ""]
    if vm:
        lines.append("- issue 33's goals are for container nodes on 32 hosts: not judged for VMs")
    for g in doc["goals"]:
        verdict = "met" if g["met"] else "NOT met"
        lines.append(f"- {g['what']}: {g['value_s']:.3f} s, goal <= {g['goal_s']} s: {verdict}")
    return "\n".join(lines) + "\n"


def plots(doc: dict[str, Any], out: Path) -> list[str]:
    """``scale-first-task.png``, ``scale-epilog.png``, ``scale-cpu.png``
    against the host count (log-log), one line per mode; their names."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    out.mkdir(parents=True, exist_ok=True)
    panels = {
        "scale-first-task.png": (
            "time to the first task (median s)",
            [("plain_first_task_s", "plain srun"), ("hpvc_first_task_s", "srun --hpvc")],
        ),
        "scale-epilog.png": ("epilog, slowest host (median s)", [("epilog_slowest_host_s", "")]),
        "scale-cpu.png": ("hpvc's CPU seconds per host (median)", [("hpvc_cpu_per_host_s", "")]),
    }
    written = []
    for name, (title, series) in panels.items():
        fig = Figure(figsize=(6, 4), dpi=110, layout="constrained")
        FigureCanvasAgg(fig)
        ax = fig.subplots()
        for mode, lines in doc["table"].items():
            for key, label in series:
                pts = [
                    (ln["hosts"], max(ln[key]["median"], FLOOR_S)) for ln in lines if ln.get(key)
                ]
                if not pts:
                    continue
                tag = f"{label}, {mode.replace('_', ' ')}".strip(", ")
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=tag)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("hosts")
        ax.set_title(title + (" (VMs, TCG emulation)" if doc.get("kind") == "vm" else ""))
        ax.legend(fontsize="small")
        fig.savefig(out / name, format="png")
        written.append(name)
    return written
