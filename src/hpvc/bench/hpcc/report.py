"""The hpcc suite's results document and its report, from the samples of a run.

``samples`` is a flat list of one value per (config, metric, rep), the shape
every suite shares; ``ratios.ratio_rows`` and ``ratios.table_md`` turn it into
min/median/max and paired per-repetition ratios to native (higher is better:
target/native, latency native/target). Pure: documents in, documents and
markdown out.
"""

from __future__ import annotations

from typing import Any

from hpvc.bench import ratios
from hpvc.bench.hpcc.configs import CONFIGS
from hpvc.bench.hpcc.input import NB, grid
from hpvc.bench.hpcc.parse import METRICS, SUITE
from hpvc.bench.stats import summary

GOAL_RATIO = 0.97
GOAL_METRICS = ("HPL", "DGEMM", "STREAM_Triad", "STREAM_Copy")


def not_comparable(
    described: dict[str, dict[str, Any]], n: int, accel: str | None
) -> dict[str, str]:
    """Configs whose ratios to native mean nothing, and why."""
    out: dict[str, str] = {}
    for c, d in described.items():
        if d["n"] != n:
            out[c] = f"N={d['n']}, native N={n}"
        if CONFIGS[c].kind == "vm" and accel != "kvm":
            out[c] = f"VM under {accel or 'unknown'} (software emulation)" + (
                f", N={d['n']}" if d["n"] != n else ""
            )
    return out


def document(
    facts: dict[str, Any],
    configs: list[str],
    described: dict[str, dict[str, Any]],
    samples: list[dict[str, Any]],
    runs: list[dict[str, Any]],
    n: int,
    llc: int,
    procs: int,
    accel: str | None,
    loadavg_end: list[float],
) -> dict[str, Any]:
    """The suite's results document (``loadavg_end``: the host's load when it ended)."""
    p, q = grid(procs)
    return {
        "suite": SUITE,
        **facts,
        "loadavg_end": loadavg_end,
        "repeat": 1 + max((r["rep"] for r in runs), default=-1),
        "procs": procs,
        "input": {"n": n, "nb": NB, "p": p, "q": q, "llc_bytes": llc, "matrix_bytes": 8 * n * n},
        "accelerator": accel,
        "configs": {c: described[c] for c in configs},
        "not_comparable": not_comparable(described, n, accel),
        "metrics": [
            {"key": m.key, "field": m.field, "unit": m.unit, "higher_is_better": m.higher_is_better}
            for m in METRICS
        ],
        "ratio": "> 1 is better than native: target/native, latency native/target,"
        " paired by repetition",
        "goals": [
            {
                "metric": m,
                "config": "container",
                "vs": "native",
                "median_ratio_at_least": GOAL_RATIO,
            }
            for m in GOAL_METRICS
        ],
        "runs": runs,
        "samples": samples,
    }


def report_md(doc: dict[str, Any]) -> str:
    """The run in markdown: where, what, then one table per config."""
    i = doc["input"]
    lines = [
        f"HPC Challenge ({doc['suite']}), {doc['procs']} ranks, {doc['repeat']} repetition(s)"
        f" with the configs alternated, on {doc['host']} ({doc['cpu_model']}, {doc['cpus']} CPUs),"
        f" kernel {doc['kernel']}, {doc.get('open_mpi', '')}, {doc['crun']}, {doc['date']}.",
        "",
        f"Input: N={i['n']}, NB={i['nb']}, grid {i['p']}x{i['q']}; matrix"
        f" {i['matrix_bytes'] / 2**20:.0f} MiB, last-level cache {i['llc_bytes'] / 2**20:.0f} MiB."
        f" Ratio: {doc['ratio']}.",
        "",
        *sizing_lines(doc),
        *(f"- {c}: {d['describe']} (N={d['n']})" for c, d in doc["configs"].items()),
        *(f"- {c}: no ratios, not comparable: {why}" for c, why in doc["not_comparable"].items()),
        "",
    ]
    rows = ratios.ratio_rows(doc["samples"])
    lines.append(ratios.table_md(rows, doc["goals"], no_ratio=doc["not_comparable"]))
    walls: dict[str, list[float]] = {}
    for r in doc["runs"]:
        walls.setdefault(r["config"], []).append(r["wall_s"])
    lines.append(
        "Wall time per run (median s): "
        + ", ".join(f"{c} {summary(w)['median']:.1f}" for c, w in walls.items())
    )
    return "\n".join(lines) + "\n"


def sizing_lines(doc: dict[str, Any]) -> list[str]:
    """How N was chosen and which BLAS ran (runs before issue 33 have neither: none)."""
    out = []
    size = doc.get("sizing")
    if size:
        probe = size.get("probe")
        pred = size.get("predicted_s")
        out.append(
            f"N={size['n']} (time budget {size['budget_s']:.0f} s per native run"
            + (f", predicted {pred:.0f} s" if pred is not None else "")
            + (
                f"; probe N={probe['n']}: {probe['wall_s']:.1f} s,"
                f" HPL {probe['hpl_gflops']:.2f} GFLOP/s"
                if probe
                else ""
            )
            + "):"
        )
        out += [f"- {why}" for why in size["reasons"]]
        out.append("")
    b = doc.get("blas")
    if b:
        env = " ".join(f"{k}={v}" for k, v in b["env"].items())
        ran = "; ".join(f"{c}: {', '.join(names)}" for c, names in b["ran"].items())
        same = "the same on every side" if b["same_everywhere"] else "NOT the same on every side"
        out += [f"BLAS ({b['choice']}, {env}, node image {b['image']}): {ran} ({same}).", ""]
    return out
