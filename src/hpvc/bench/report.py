"""Goals, report.md and comparisons of a ``hpvc bench run``, all from its samples.

Everything here reads a run's document (results.json) and measures nothing: the
numbers from samples (per-repetition means and the paired, direction-aware
ratios to the suite's baseline), the goals decided from them (``GoalResult``,
``GOAL_KINDS``, ``evaluate``, ``goal_results``), report.md with its goal table
and per-suite sample tables, and ``compare`` of two runs. It is apart from
``harness``, which plans and runs the suites and writes results.json, so that
``hpvc bench report`` and ``hpvc bench compare`` (and the plots) need only the
samples and each suite's own ``report_md``, never the planning and running;
``harness`` imports from here, never the other way round.
"""

from __future__ import annotations

import importlib
import json
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpvc.bench.common import error_line
from hpvc.bench.hpcc import report as hpcc_report
from hpvc.bench.io import report as io_report
from hpvc.bench.isolation import report as isolation_report
from hpvc.bench.startup import runner as startup
from hpvc.bench.stats import summary
from hpvc.errors import HpvcError, InputError

Sample = dict[str, Any]

# The config every other config of the suite is paired with (ratios per repetition).
BASELINE = {"hpcc": "native", "isolation": "idle", "io": "native"}


# --- shared with the harness -----------------------------------------------------------


def suite_module(name: str) -> Any:
    """A suite's runner written apart from the harness (hpcc, isolation), imported when used."""
    module = f"hpvc.bench.{name}.runner"
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise HpvcError(f"suite {name}", f"cannot import {module}: {e}") from None


# --- numbers from samples --------------------------------------------------------------


def select(samples: list[Sample], config: str, metric: str) -> list[float]:
    return [float(x["value"]) for x in samples if x["config"] == config and x["metric"] == metric]


def keys(samples: list[Sample]) -> list[tuple[str, str]]:
    """(metric, config) pairs in first-seen order."""
    return list(dict.fromkeys((str(x["metric"]), str(x["config"])) for x in samples))


def per_rep(samples: list[Sample], config: str, metric: str) -> dict[int, float]:
    """Mean value per repetition (suites may take several samples per repetition)."""
    by: dict[int, list[float]] = {}
    for x in samples:
        if x["config"] == config and x["metric"] == metric:
            by.setdefault(int(x["rep"]), []).append(float(x["value"]))
    return {r: statistics.fmean(v) for r, v in by.items()}


def higher_is_better(samples: list[Sample], metric: str) -> bool:
    return next((bool(x["higher_is_better"]) for x in samples if x["metric"] == metric), True)


def better_ratio(base: float, other: float, hib: bool) -> float:
    """``other`` against ``base``, direction-aware: > 1 means ``other`` is better."""
    num, den = (other, base) if hib else (base, other)
    if den == 0:
        return math.inf if num > 0 else math.nan
    return num / den


def paired_ratios(samples: list[Sample], metric: str, config: str, baseline: str) -> list[float]:
    """One ratio per repetition both configs ran (higher is better, 1.0 = as the baseline)."""
    a, b = per_rep(samples, baseline, metric), per_rep(samples, config, metric)
    hib = higher_is_better(samples, metric)
    return [better_ratio(a[r], b[r], hib) for r in sorted(a.keys() & b.keys())]


def stdev(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def _metrics_of(samples: list[Sample], goal: dict[str, Any]) -> list[str]:
    m = goal.get("metric")
    if m and m != "*":
        return [str(m)]
    return list(dict.fromkeys(str(x["metric"]) for x in samples if x["config"] == goal["config"]))


@dataclass(frozen=True)
class GoalResult:
    suite: str
    text: str
    figure: str
    met: bool | None  # None: nothing measured to decide it
    value: float | None = None


# goal key -> (what it says, the worst of several metrics' figures, the test)
GOAL_KINDS: dict[
    str, tuple[str, Callable[[list[float]], float], Callable[[float, float], bool]]
] = {
    "median_ratio_at_least": ("median ratio vs {vs} ≥ {thr:g}", min, lambda f, t: f >= t),
    "stdev_vs_idle_at_most": ("stdev / stdev of {vs} ≤ {thr:g}", max, lambda f, t: f <= t),
    "within_pct": ("median within {thr:g}% of target", max, lambda f, t: f <= t),
    "median_below": ("median < {thr:g}", max, lambda f, t: f < t),
    "median_at_most": ("median ≤ {thr:g}", max, lambda f, t: f <= t),
    "median_at_least": ("median ≥ {thr:g}", min, lambda f, t: f >= t),
}


def _figure(
    kind: str, goal: dict[str, Any], samples: list[Sample], cfg: str, metric: str, vs: str
) -> float | None:
    """One metric's figure for a goal of ``kind``; None when it was not measured."""
    if kind == "median_ratio_at_least":
        r = paired_ratios(samples, metric, cfg, vs)
        return statistics.median(r) if r else None
    if kind == "stdev_vs_idle_at_most":
        a, b = select(samples, vs, metric), select(samples, cfg, metric)
        if len(a) < 2 or len(b) < 2:
            return None
        return stdev(b) / stdev(a) if stdev(a) > 0 else math.inf
    v = select(samples, cfg, metric)
    if not v:
        return None
    if kind == "within_pct":
        return abs(statistics.median(v) / float(goal.get("target", 1.0)) - 1) * 100
    return statistics.median(v)


def evaluate(
    suite: str, goal: dict[str, Any], samples: list[Sample], apart: dict[str, str] | None = None
) -> GoalResult:
    """Decide a goal from the samples (never from a ``met`` the suite wrote).

    A goal without a metric (or ``"*"``) holds for every metric of its config; the
    figure is then the worst one.
    """
    cfg, apart = str(goal.get("config", "")), apart or {}
    name = f"{cfg} {goal.get('metric') or 'every metric'}"
    kind = next((k for k in GOAL_KINDS if k in goal), None)
    if kind is None:
        met = goal.get("met")
        flag = met if isinstance(met, bool) else None
        return GoalResult(suite, f"{name}: {json.dumps(goal)}", "as the suite reports", flag)
    says, worst, test = GOAL_KINDS[kind]
    thr = float(goal[kind])
    default_vs = "idle" if kind == "stdev_vs_idle_at_most" else BASELINE.get(suite, "")
    vs = str(goal.get("vs", default_vs))
    text = f"{name}: " + says.format(vs=vs, thr=thr)
    if cfg in apart:
        return GoalResult(suite, text, f"not comparable: {apart[cfg]}", None)
    metrics = _metrics_of(samples, goal)
    figs = [_figure(kind, goal, samples, cfg, m, vs) for m in metrics]
    if not figs or any(f is None for f in figs):
        return GoalResult(suite, text, "no samples", None)
    fig = worst([f for f in figs if f is not None])
    shown = f"{fig:.2f}%" if kind == "within_pct" else f"{fig:.3g}"
    return GoalResult(suite, text, shown, test(fig, thr), fig)


def goal_results(doc: dict[str, Any]) -> list[GoalResult]:
    out = []
    for name, sdoc in doc["suites"].items():
        if sdoc.get("error") and not sdoc.get("samples"):
            out.append(GoalResult(name, f"suite failed: {sdoc['error']}", "", False))
            continue
        samples, apart = sdoc.get("samples", []), sdoc.get("not_comparable") or {}
        ran = {s["config"] for s in samples}
        # A goal about a configuration this run did not measure (--targets
        # without container) is not a failed goal: leave it out.
        goals = [g for g in sdoc.get("goals", []) if not g.get("config") or g["config"] in ran]
        out += [evaluate(name, g, samples, apart) for g in goals]
    return out


# --- the report --------------------------------------------------------------------------


def num(v: float) -> str:
    if math.isnan(v) or math.isinf(v):
        return str(v)
    return f"{v:.4g}" if abs(v) < 1e5 else f"{v:.0f}"


def _yes(met: bool | None) -> str:
    return "n/a" if met is None else "yes" if met else "no"


def sample_table(suite: str, samples: list[Sample], apart: dict[str, str]) -> list[str]:
    """Per metric and config: n, min / median / max, stdev, and the paired ratios to the
    baseline (none for configs the suite marks not comparable, with why)."""
    base = BASELINE.get(suite)
    lines = [
        "| metric (unit) | config | n | min | median | max | stdev | ratio min / median / max |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for metric, cfg in keys(samples):
        v = select(samples, cfg, metric)
        s = summary(v)
        unit = next(x["unit"] for x in samples if x["metric"] == metric)
        ratio = ""
        if base and cfg == base:
            ratio = "1 (baseline)"
        elif cfg in apart:
            ratio = f"not comparable: {apart[cfg]}"
        elif base and (r := paired_ratios(samples, metric, cfg, base)):
            ratio = " / ".join(f"{x:.3f}" for x in summary(r).values())
        lines.append(
            f"| {metric} ({unit}) | {cfg} | {len(v)} | {num(s['min'])} | "
            f"{num(s['median'])} | {num(s['max'])} | {num(stdev(v))} | {ratio} |"
        )
    return lines


# Each suite's own report (pure, from its document); startup's is one per kind.
SUITE_REPORTS: dict[str, Callable[[dict[str, Any]], str]] = {
    "hpcc": hpcc_report.report_md,
    "isolation": isolation_report.report_md,
    "io": io_report.report_md,
}


def _suite_text(name: str, sdoc: dict[str, Any]) -> str:
    """The suite's own report, or why there is none (a broken report must not stop ours)."""
    try:
        if name == "startup":
            return "\n".join(startup.report_md(d) for d in sdoc.get("kinds", {}).values())
        return str(SUITE_REPORTS[name](sdoc))
    except Exception as e:
        return f"(the suite's own report failed: {error_line(e)})\n"


def _header(doc: dict[str, Any]) -> list[str]:
    h, host, acc = doc["harness"], doc.get("host", {}), doc.get("accelerator") or {}
    wall = f"{h['wall_s']:.0f} s" if h.get("wall_s") is not None else "unfinished"
    return [
        "# hpvc benchmark run",
        "",
        f"`{' '.join(h.get('argv') or ['hpvc', 'bench', 'run'])}`: suites"
        f" {', '.join(h['suites'])}; targets {', '.join(h['targets'])}; {h['repeat']}"
        f" repetitions; started {h['started']}, {wall}.",
        "",
        f"Host {host.get('host')} ({host.get('cpu_model')}, {host.get('cpus')} CPUs"
        + "".join(f", {k} {host[k]}" for k in ("kernel", "hpvc") if k in host)
        + "".join(f", {host[k]}" for k in ("crun", "open_mpi") if k in host)
        + f"); VM accelerator: {acc.get('vm')}.",
        "",
    ]


def report_md(doc: dict[str, Any], plots: dict[str, str] | None = None) -> str:
    plots = plots or {}
    lines = [
        *_header(doc),
        "## Goals",
        "",
        "Every figure is computed from the samples in results.json.",
        "",
    ]
    goals = goal_results(doc)
    if goals:
        lines += ["| suite | goal | figure | met |", "|---|---|---|---|"]
        lines += [f"| {g.suite} | {g.text} | {g.figure} | {_yes(g.met)} |" for g in goals]
    else:
        lines.append("No goal applies to the configurations this run measured.")
    for name, sdoc in doc["suites"].items():
        lines += ["", f"## {name}", ""]
        if sdoc.get("skipped") or sdoc.get("pending"):
            lines += [f"Skipped: {sdoc['skipped']}." if sdoc.get("skipped") else "Not run."]
            continue
        samples = sdoc.get("samples", [])
        cfgs = list(dict.fromkeys(str(x["config"]) for x in samples)) or doc["harness"].get(
            "configs", {}
        ).get(name, [])
        wall = doc["harness"].get("suite_wall_s", {}).get(name)
        lines += [f"Configs: {', '.join(cfgs)}" + (f"; {wall:.1f} s." if wall is not None else ".")]
        if sdoc.get("error"):
            lines += ["", f"**Error:** {sdoc['error']}"]
        if not samples:
            continue
        if name in plots:
            lines += ["", f"![{name}]({plots[name]})"]
        base = BASELINE.get(name)
        lines += ["", "### Samples", ""]
        if base:
            lines += [
                f"Ratio: paired per repetition with {base}, direction-aware (higher is"
                f" better, 1.0 = as {base}).",
                "",
            ]
        lines += sample_table(name, samples, sdoc.get("not_comparable") or {})
        lines += ["", "### Suite report", "", _suite_text(name, sdoc).rstrip()]
    return "\n".join(lines) + "\n"


def render(out: Path, doc: dict[str, Any]) -> tuple[Path, dict[str, str]]:
    """Write report.md and the plots next to results.json; return the report and plots."""
    from hpvc.bench import plots as plotting

    written = plotting.write_all(doc, out)
    path = out / "report.md"
    path.write_text(report_md(doc, written))
    return path, written


# --- two runs side by side -------------------------------------------------------------


def compare(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    """Per suite / config / metric in both runs: medians and B against A (> 1: B better)."""
    rows = []
    for suite in [s for s in a["suites"] if s in b["suites"]]:
        sa, sb = a["suites"][suite].get("samples", []), b["suites"][suite].get("samples", [])
        have_b = set(keys(sb))
        for metric, cfg in keys(sa):
            if (metric, cfg) not in have_b:
                continue
            va, vb = select(sa, cfg, metric), select(sb, cfg, metric)
            ma, mb = statistics.median(va), statistics.median(vb)
            hib = higher_is_better(sa, metric)
            rows.append(
                {
                    "suite": suite,
                    "config": cfg,
                    "metric": metric,
                    "unit": next(x["unit"] for x in sa if x["metric"] == metric),
                    "higher_is_better": hib,
                    "n_a": len(va),
                    "n_b": len(vb),
                    "median_a": ma,
                    "median_b": mb,
                    "b_vs_a": better_ratio(ma, mb, hib),
                }
            )
    if not rows:
        sa = sorted(k for k, v in a["suites"].items() if v.get("samples"))
        sb = sorted(k for k, v in b["suites"].items() if v.get("samples"))
        raise InputError(
            "bench compare",
            f"the runs share no measured suite, config and metric (A: {', '.join(sa) or 'none'};"
            f" B: {', '.join(sb) or 'none'})",
            "compare two runs of the same suites and targets",
        )
    return rows
