"""The isolation experiment's numbers: hpcc rates, sample rows, load, statistics, goals.

Each sample is one hpcc run in the HPC node: its HPL and single DGEMM rates
(GFLOP/s) and its single STREAM Triad (GB/s). ``samples`` is the flat list
every suite shares, one row per sample and metric; ``summarize`` gives per
config and metric n, mean, stdev (sample), min, median, max and mean and stdev
relative to idle's; ``goals``: partitioned stdev within 2x of idle's. The load
rows prove that the competing tenant burned CPU. Pure: numbers in, numbers out.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from hpvc.bench.hpcc.parse import summary_fields
from hpvc.bench.stats import summary
from hpvc.errors import HpvcError

SUITE = "isolation"
CONFIGS = ("idle", "partitioned", "shared")
LOADED = ("partitioned", "shared")
GOAL_STDEV_RATIO = 2.0
MIN_LOAD_CPUS = 0.25  # the tenant must burn this many CPUs in every loaded sample (idle: ~0)
LOAD_KEYS = ("hpc_cpus", "tenant_cpus", "other_cpus", "steal_cpus", "loadavg_1m")


@dataclass(frozen=True)
class Metric:
    name: str
    field: str  # key in hpcc's summary section
    unit: str
    scale: float  # field * scale = value in unit


METRICS = (
    Metric("HPL", "HPL_Tflops", "GFLOP/s", 1000.0),
    Metric("DGEMM", "SingleDGEMM_Gflops", "GFLOP/s", 1.0),
    Metric("STREAM_Triad", "SingleSTREAM_Triad", "GB/s", 1.0),
)


def parse_hpcc(text: str, n: int) -> dict[str, float]:
    """Metric name -> value from hpccoutf.txt's last summary, which must be for our N
    (proof hpcc read our input) and successful; every metric must be a positive rate."""
    fields = summary_fields(text)
    if fields.get("HPL_N") != str(n):
        raise HpvcError("hpcc", f"ran N={fields.get('HPL_N')}, not {n}", "hpccinf.txt unread?")
    if fields.get("Success") != "1":
        raise HpvcError("hpcc", "reports Success != 1 (a check failed)", "run hpcc by hand")
    out: dict[str, float] = {}
    for m in METRICS:
        try:
            value = float(fields[m.field]) * m.scale
        except (KeyError, ValueError):
            raise HpvcError("hpcc", f"summary has no number for {m.field}", "") from None
        if not value > 0:
            raise HpvcError("hpcc", f"{m.field} = {fields[m.field]} (not a rate)", "")
        out[m.name] = value
    return out


def sample_rows(where: dict[str, Any], rates: dict[str, float]) -> list[dict[str, Any]]:
    """The shared interface: one flat row per metric."""
    return [
        {
            "suite": SUITE,
            "config": where["config"],
            "metric": m.name,
            "unit": m.unit,
            "higher_is_better": True,
            "rep": where["rep"],
            "order": where["order"],
            "value": rates[m.name],
        }
        for m in METRICS
    ]


def rotations(repeat: int) -> list[list[str]]:
    """The configurations' order in each repetition (rotated, so none always goes first)."""
    n = len(CONFIGS)
    return [list(CONFIGS[i % n :] + CONFIGS[: i % n]) for i in range(repeat)]


# --- statistics ---------------------------------------------------------------------


def stats(values: list[float]) -> dict[str, float]:
    """mean, sample standard deviation (0 for one value), min, median, max."""
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return {"mean": statistics.fmean(values), "stdev": sd, **summary(values)}


def _ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def summarize(samples: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """config -> metric -> n and stats, with mean and stdev relative to idle's."""
    values: dict[str, dict[str, list[float]]] = {}
    for s in samples:
        values.setdefault(s["config"], {}).setdefault(s["metric"], []).append(float(s["value"]))
    out: dict[str, dict[str, dict[str, Any]]] = {
        c: {m: {"n": len(v), **stats(v)} for m, v in per.items()} for c, per in values.items()
    }
    for per_metric in out.values():
        for m, d in per_metric.items():
            idle = out.get("idle", {}).get(m)
            d["rel_mean_vs_idle"] = _ratio(d["mean"], idle["mean"]) if idle else None
            d["rel_stdev_vs_idle"] = _ratio(d["stdev"], idle["stdev"]) if idle else None
    return out


def goals(summ: dict[str, dict[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    out = []
    for m in METRICS:
        rel = summ.get("partitioned", {}).get(m.name, {}).get("rel_stdev_vs_idle")
        out.append(
            {
                "metric": m.name,
                "config": "partitioned",
                "stdev_vs_idle_at_most": GOAL_STDEV_RATIO,
                "value": rel,
                "met": rel is not None and rel <= GOAL_STDEV_RATIO,
            }
        )
    return out


# --- the competing load ---------------------------------------------------------------


def load_cpus(cpu_s: float | None, wall_s: float) -> float | None:
    """Average number of CPUs busy over ``wall_s`` (None when unknown)."""
    return cpu_s / wall_s if cpu_s is not None and wall_s > 0 else None


def _delta(a: float | None, b: float | None) -> float | None:
    return b - a if a is not None and b is not None else None


def load_row(
    where: dict[str, Any],
    wall: float,
    before: dict[str, float | None],
    after: dict[str, Any],
    loadavg_1m: float,
) -> dict[str, Any]:
    """CPUs each side used on average during a sample; ``other_cpus``: the rest of the host.
    ``before`` and ``after``: CPU seconds of hpc, tenant, host (busy) and steal."""
    d = {k: _delta(before[k], after.get(k)) for k in before}
    cpus = {k: load_cpus(v, wall) for k, v in d.items()}
    known = [cpus["host"], cpus["hpc"]]
    other = (
        max(0.0, known[0] - known[1] - (cpus["tenant"] or 0.0))
        if known[0] is not None and known[1] is not None
        else None
    )
    return {
        **where,
        "wall_s": wall,
        "tenant_cpu_s": d["tenant"],
        "tenant_cpus": cpus["tenant"],
        "hpc_cpu_s": d["hpc"],
        "hpc_cpus": cpus["hpc"],
        "host_busy_cpus": cpus["host"],
        "steal_cpus": cpus["steal"],
        "other_cpus": other,
        "loadavg_1m": loadavg_1m,
    }


def load_summary(load: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per configuration: CPUs the HPC node, the tenant and the rest of the host used."""
    out: dict[str, dict[str, Any]] = {}
    for config in CONFIGS:
        rows = [x for x in load if x["config"] == config]
        out[config] = {"samples": len(rows)}
        for k in LOAD_KEYS:
            vals = [float(x[k]) for x in rows if x.get(k) is not None]
            out[config][k] = stats(vals) if vals else None
    return out


def load_verified(load: list[dict[str, Any]]) -> bool:
    """Every loaded sample saw the tenant burn at least MIN_LOAD_CPUS CPUs."""
    rows = [x for x in load if x["config"] in LOADED]
    return bool(rows) and all(
        x["tenant_cpus"] is not None and x["tenant_cpus"] >= MIN_LOAD_CPUS for x in rows
    )
