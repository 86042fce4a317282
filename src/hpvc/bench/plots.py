"""PNG figures of a ``hpvc bench run``, drawn from its samples (matplotlib, no display).

One figure per suite, written next to results.json as ``<suite>.png``:

- hpcc: median ratio to native per metric, one bar per config, min-max error
  bars, a line at 1.0 and one at each ratio goal (like Figures 4.1-4.4 of the
  HPC virtual-cluster paper in ``seeds/``);
- isolation: mean with standard-deviation error bars per config, one panel per
  metric (like Figure 5 of the Palacios paper);
- io: throttles measured / target (with the goal band), the weight split against
  1:9, and the overhead of idle limits against native;
- startup: ``up`` time against the number of nodes, one line per backend.

Figures are made with ``matplotlib.figure.Figure`` directly (Agg canvas), so no
pyplot state and no display is involved.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from hpvc.bench.report import (
    BASELINE,
    Sample,
    keys,
    paired_ratios,
    per_rep,
    select,
    stdev,
)

DPI = 110
BAR_GROUP = 0.8  # share of each x slot the bars of a group take


def _figure(width: float, height: float, panels: int = 1) -> tuple[Figure, list[Axes]]:
    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, panels, squeeze=False)[0]
    return fig, list(axes)


def _save(fig: Figure, path: Path) -> None:
    fig.savefig(path, format="png")


def _spread(values: list[float]) -> tuple[float, float, float]:
    """(median, median - min, max - median): a bar and its min-max error bar."""
    med = statistics.median(values)
    return med, med - min(values), max(values) - med


def _bars(
    ax: Axes,
    labels: list[str],
    series: dict[str, list[list[float] | None]],
    center: Callable[[list[float]], tuple[float, float, float]] = _spread,
) -> None:
    """Grouped bars: per label (x slot), one bar per series; None leaves a gap."""
    width = BAR_GROUP / max(1, len(series))
    for i, (name, per_label) in enumerate(series.items()):
        xs, ys, lo, hi = [], [], [], []
        for j, vals in enumerate(per_label):
            if vals:
                y, down, up = center(vals)
                xs.append(j - BAR_GROUP / 2 + width * (i + 0.5))
                ys.append(y)
                lo.append(down)
                hi.append(up)
        ax.bar(xs, ys, width, yerr=[lo, hi], capsize=3, label=name)
    ax.set_xticks(
        range(len(labels)), labels, rotation=30, ha="right", rotation_mode="anchor", fontsize=8
    )


def _goal_values(sdoc: dict[str, Any], key: str) -> list[float]:
    return sorted({float(g[key]) for g in sdoc.get("goals", []) if key in g})


def plot_hpcc(sdoc: dict[str, Any], path: Path) -> bool:
    samples: list[Sample] = sdoc["samples"]
    base = BASELINE["hpcc"]
    metrics = list(dict.fromkeys(m for m, _ in keys(samples)))
    apart = sdoc.get("not_comparable") or {}
    configs = [
        c for c in dict.fromkeys(c for _, c in keys(samples)) if c != base and c not in apart
    ]
    series: dict[str, list[list[float] | None]] = {
        c: [paired_ratios(samples, m, c, base) or None for m in metrics] for c in configs
    }
    if not any(v for s in series.values() for v in s):
        return False
    fig, (ax,) = _figure(max(6.0, 0.5 * len(metrics) * max(1, len(configs)) + 2), 4.5)
    _bars(ax, metrics, series)
    ax.axhline(1.0, color="black", linewidth=0.8)
    for g in _goal_values(sdoc, "median_ratio_at_least"):
        ax.axhline(g, color="red", linestyle="--", linewidth=0.8, label=f"goal {g:g}")
    ax.set_ylabel(f"ratio to {base} (higher is better)")
    ax.set_title(f"HPCC: ratio to {base} per repetition (median, min-max)", fontsize=10)
    ax.legend(fontsize=8)
    _save(fig, path)
    return True


def _mean_sd(values: list[float]) -> tuple[float, float, float]:
    sd = stdev(values)
    return statistics.fmean(values), sd, sd


def plot_isolation(sdoc: dict[str, Any], path: Path) -> bool:
    samples: list[Sample] = sdoc["samples"]
    metrics = list(dict.fromkeys(m for m, _ in keys(samples)))
    configs = list(dict.fromkeys(c for _, c in keys(samples)))
    if not metrics:
        return False
    fig, axes = _figure(max(5.0, 3.2 * len(metrics)), 4.0, len(metrics))
    for ax, m in zip(axes, metrics, strict=True):
        meta = next(x for x in samples if x["metric"] == m)
        vals = [select(samples, c, m) for c in configs]
        shown = [(c, v) for c, v in zip(configs, vals, strict=True) if v]
        means = [statistics.fmean(v) for _, v in shown]
        sds = [stdev(v) for _, v in shown]
        ax.bar([c for c, _ in shown], means, yerr=sds, capsize=4, color="tab:blue")
        ax.set_title(m, fontsize=9)
        better = "higher" if meta["higher_is_better"] else "lower"
        ax.set_ylabel(f"{meta['unit']} ({better} is better)", fontsize=8)
        ax.tick_params(axis="x", labelsize=8)
    fig.suptitle("Isolation: mean and standard deviation per config", fontsize=10)
    _save(fig, path)
    return True


def _io_throttle(ax: Axes, sdoc: dict[str, Any]) -> None:
    """Measured / target per throttle: median with min-max, the goal as a band around 1."""
    samples: list[Sample] = sdoc["samples"]
    goals = [g for g in sdoc.get("goals", []) if "within_pct" in g]
    labels, points = [], []
    for g in goals:
        target = g.get("target_MBps")
        labels.append(
            g["metric"].removesuffix("_vs_target") + (f"\n{target:g} MB/s" if target else "")
        )
        points.append(select(samples, g["config"], g["metric"]))
    xs = [i for i, v in enumerate(points) if v]
    spread = [_spread(v) for v in points if v]
    ax.errorbar(
        xs,
        [s[0] for s in spread],
        yerr=[[s[1] for s in spread], [s[2] for s in spread]],
        fmt="o",
        capsize=4,
        label="measured / target",
    )
    ax.axhline(1.0, color="black", linewidth=0.8)
    pcts = sorted({float(g["within_pct"]) for g in goals})
    for pct in pcts:
        ax.axhspan(1 - pct / 100, 1 + pct / 100, color="green", alpha=0.12, label=f"goal ±{pct:g}%")
    top = max([s[0] + s[2] for s in spread] + [1 + p / 50 for p in pcts] + [1.1])
    low = min([s[0] - s[1] for s in spread] + [1 - p / 50 for p in pcts] + [0.9])
    ax.set_ylim(low, top)
    ax.set_xticks(range(len(labels)), labels, fontsize=8)
    ax.set_ylabel("measured / target")
    ax.set_title("Throttles", fontsize=9)
    ax.legend(fontsize=7)


def _io_weight(ax: Axes, samples: list[Sample]) -> None:
    metrics = [m for m, c in keys(samples) if c == "weighted" and m.endswith("_w900_per_w100")]
    vals: list[list[float] | None] = [select(samples, "weighted", m) or None for m in metrics]
    _bars(ax, [m.removesuffix("_w900_per_w100") for m in metrics], {"w900 / w100": vals})
    ax.axhline(9.0, color="red", linestyle="--", linewidth=0.8, label="target 9")
    ax.set_ylabel("bandwidth w900 / w100")
    ax.set_title("bfq weights 100 : 900", fontsize=9)
    ax.legend(fontsize=7)


def _io_overhead(ax: Axes, samples: list[Sample]) -> None:
    base = BASELINE["io"]
    metrics = list(dict.fromkeys(m for m, c in keys(samples) if c == base))
    configs = [
        c
        for c in dict.fromkeys(c for _, c in keys(samples))
        if c not in (base, "throttled", "weighted")
    ]
    series: dict[str, list[list[float] | None]] = {
        c: [paired_ratios(samples, m, c, base) or None for m in metrics] for c in configs
    }
    _bars(ax, [m.removesuffix("_MBps") for m in metrics], series)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_ylabel(f"bandwidth / {base}")
    ax.set_title("Idle limits vs native", fontsize=9)
    ax.legend(fontsize=7)


def plot_io(sdoc: dict[str, Any], path: Path) -> bool:
    samples: list[Sample] = sdoc["samples"]
    cfgs = {c for _, c in keys(samples)}
    panels: list[Callable[[Axes], None]] = []
    if "throttled" in cfgs:
        panels.append(lambda ax: _io_throttle(ax, sdoc))
    if "weighted" in cfgs:
        panels.append(lambda ax: _io_weight(ax, samples))
    if BASELINE["io"] in cfgs:
        panels.append(lambda ax: _io_overhead(ax, samples))
    if not panels:
        return False
    fig, axes = _figure(4.2 * len(panels), 4.2, len(panels))
    for draw, ax in zip(panels, axes, strict=True):
        draw(ax)
    fig.suptitle("Block I/O of container nodes (medians, min-max error bars)")
    _save(fig, path)
    return True


def plot_startup(sdoc: dict[str, Any], path: Path) -> bool:
    samples: list[Sample] = sdoc["samples"]
    lines: dict[str, list[tuple[int, list[float]]]] = {}
    for m, c in keys(samples):
        if found := re.fullmatch(r"up_s_(\d+)", m):
            lines.setdefault(c, []).append((int(found[1]), list(per_rep(samples, c, m).values())))
    if not lines:
        return False
    fig, (ax,) = _figure(6.0, 4.2)
    for config, points in lines.items():
        points.sort()
        spread = [_spread(v) for _, v in points]
        ax.errorbar(
            [n for n, _ in points],
            [s[0] for s in spread],
            yerr=[[s[1] for s in spread], [s[2] for s in spread]],
            marker="o",
            capsize=3,
            label=config,
        )
    for g in sdoc.get("goals", []):
        if "median_below" in g and (found := re.fullmatch(r"up_s_(\d+)", str(g["metric"]))):
            ax.plot(
                [int(found[1])],
                [float(g["median_below"])],
                "rx",
                markersize=9,
                label=f"goal: {found[1]} {g['config']} nodes < {g['median_below']:g} s",
            )
    ax.set_xlabel("nodes")
    ax.set_ylabel("hpvc up, s (median, min-max)")
    ax.set_title("Cluster start-up")
    ax.legend(fontsize=8)
    _save(fig, path)
    return True


PLOTTERS: dict[str, Callable[[dict[str, Any], Path], bool]] = {
    "hpcc": plot_hpcc,
    "isolation": plot_isolation,
    "io": plot_io,
    "startup": plot_startup,
}


def write_all(doc: dict[str, Any], out: Path) -> dict[str, str]:
    """Draw every suite that has samples; return suite -> file name (relative to ``out``)."""
    out.mkdir(parents=True, exist_ok=True)
    written = {}
    for name, sdoc in doc["suites"].items():
        draw = PLOTTERS.get(name)
        if draw is None or not sdoc.get("samples"):
            continue
        path = out / f"{name}.png"
        if draw(sdoc, path):
            written[name] = path.name
    return written
