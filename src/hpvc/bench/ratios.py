"""Per-sample tables of any suite: min/median/max and paired ratios to a baseline.

``ratio_rows`` groups a flat list of ``samples`` (the shape every suite
shares) per suite, config and metric, with the min/median/max of the values
and of the ratios to the baseline's value of the same repetition (higher is
better: target/baseline, for a time baseline/target); ``goal_of`` decides a
row's median-ratio goal and ``table_md`` writes the rows as one markdown table
per config. Nothing here is specific to one suite (``hpcc`` uses it for its
own report), so it lives apart from the suites, and using it imports no
runner, cluster or host code.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from hpvc.bench.stats import summary


def ratio(baseline: float, target: float, higher_is_better: bool) -> float:
    """> 1 is better than the baseline: target/baseline, or baseline/target."""
    return target / baseline if higher_is_better else baseline / target


def ratio_rows(samples: list[dict[str, Any]], baseline: str = "native") -> list[dict[str, Any]]:
    """Per (suite, config, metric), in order of first appearance: min/median/max of the
    values and of the ratios to ``baseline``'s value of the same repetition."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for s in samples:
        groups.setdefault((s["suite"], s["config"], s["metric"]), []).append(s)
    rows: list[dict[str, Any]] = []
    for (suite, config, metric), got in groups.items():
        first = got[0]
        row: dict[str, Any] = {
            "suite": suite,
            "config": config,
            "metric": metric,
            "unit": first["unit"],
            "higher_is_better": first["higher_is_better"],
            "n": len(got),
            **summary([float(s["value"]) for s in got]),
            "ratio": None,
        }
        base = {s["rep"]: float(s["value"]) for s in groups.get((suite, baseline, metric), [])}
        pairs = [(base[s["rep"]], float(s["value"])) for s in got if s["rep"] in base]
        if config != baseline and pairs:
            rs = [ratio(b, v, bool(first["higher_is_better"])) for b, v in pairs]
            row["ratio"] = {"n": len(rs), **summary(rs)}
        rows.append(row)
    return rows


def goal_of(row: dict[str, Any], goals: list[dict[str, Any]], baseline: str) -> bool | None:
    """Whether the row meets its goal (median ratio); None where it has none."""
    for g in goals:
        if (g["metric"], g["config"], g.get("vs", baseline)) == (
            row["metric"],
            row["config"],
            baseline,
        ):
            r = row["ratio"]
            return r is not None and r["median"] >= g["median_ratio_at_least"]
    return None


def _num(v: float) -> str:
    return f"{v:.4g}" if abs(v) < 1000 else f"{v:.0f}"


def table_md(
    rows: list[dict[str, Any]],
    goals: list[dict[str, Any]],
    baseline: str = "native",
    no_ratio: Iterable[str] = (),
) -> str:
    """One markdown table per config: values and paired ratios to ``baseline``."""
    skip = set(no_ratio)
    out: list[str] = []
    for config in dict.fromkeys(r["config"] for r in rows):
        out += [
            f"### {config}",
            "",
            "| metric | unit | min | median | max | ratio min | ratio median | ratio max | goal"
            " | met |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in (x for x in rows if x["config"] == config):
            cells = [r["metric"], r["unit"], *(_num(r[k]) for k in ("min", "median", "max"))]
            rt = r["ratio"]
            if config == baseline:
                cells += ["1 (ref)", "", ""]
            elif rt is None or config in skip:
                cells += ["n/a", "", ""]
            else:
                cells += [f"{rt[k]:.3f}" for k in ("min", "median", "max")]
            goal = next(
                (g for g in goals if (g["metric"], g["config"]) == (r["metric"], config)), None
            )
            met = goal_of(r, goals, baseline) if config not in skip else None
            cells += [
                f">= {goal['median_ratio_at_least']:g}" if goal else "",
                "" if met is None else ("yes" if met else "no"),
            ]
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)
