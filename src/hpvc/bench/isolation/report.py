"""The isolation experiment's results document and its markdown report.

The document: ``samples`` is the flat list other code reads, one row per
sample and metric (``rep``: the repetition, ``order``: the sample's place in
the whole run); ``summary[config][metric]``: n, mean, stdev (sample), min,
median, max and mean and stdev relative to idle's; ``goals``: per metric,
partitioned stdev within 2x of idle's; ``load``, ``visits``: the evidence.
Pure: what a run gathered (``Outcome``) in, document and markdown out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hpvc.bench.isolation.layout import Layout, Partitioning, describe
from hpvc.bench.isolation.stats import (
    CONFIGS,
    LOAD_KEYS,
    METRICS,
    MIN_LOAD_CPUS,
    SUITE,
    goals,
    load_summary,
    load_verified,
    summarize,
)

LOAD_DESCRIBE = (
    "one busy loop (sh -c 'while :; do :; done') per tenant vCPU, the tenant having as many"
    " vCPUs as the host has CPUs, started by crun exec inside the tenant's container"
)


@dataclass
class Outcome:
    """What one benchmark run was set up with and what it gathered."""

    layouts: dict[str, Layout]
    parting: Partitioning
    threads: int
    samples_per_config: int
    hpcc_n: int
    samples: list[dict[str, Any]] = field(default_factory=list)
    load: list[dict[str, Any]] = field(default_factory=list)
    visits: list[dict[str, Any]] = field(default_factory=list)


def document(
    facts: dict[str, Any], r: Outcome, repeat: int, wall: float, loadavg_end: list[float]
) -> dict[str, Any]:
    """The results document (``loadavg_end``: the host's load averages at the end)."""
    summ = summarize(r.samples)
    texts = {c: [x for x in (lay.hpc, lay.tenant) if x] for c, lay in r.layouts.items()}
    desc = describe(r.parting, r.threads)
    return {
        "suite": SUITE,
        **facts,
        "repeat": repeat,
        "samples_per_config": r.samples_per_config,
        "wall_s": wall,
        "loadavg_end": loadavg_end,
        "workload": f"hpcc, 1 process, N = {r.hpcc_n} (hpvc run HPC -n 1 -- hpcc)",
        "hpcc_n": r.hpcc_n,
        "competing_load": LOAD_DESCRIBE,
        "partition_mode": r.parting.mode,
        "hpc_vcpus": r.parting.vcpus,
        "metrics": [
            {"metric": m.name, "unit": m.unit, "higher_is_better": True, "hpcc": m.field}
            for m in METRICS
        ],
        "configs": {c: {"describe": desc[c], "specs": texts[c]} for c in CONFIGS},
        "samples": r.samples,
        "load": r.load,
        "visits": r.visits,
        "summary": summ,
        "load_summary": load_summary(r.load),
        "load_verified": load_verified(r.load),
        "min_load_cpus": MIN_LOAD_CPUS,
        "goals": goals(summ),
    }


def _f(v: float | None, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _load_cell(ls: dict[str, Any], key: str) -> str:
    s = ls.get(key)
    return "-" if not s else f"{s['mean']:.2f} ({s['min']:.2f}-{s['max']:.2f})"


def _cpusets(doc: dict[str, Any], config: str) -> str:
    seen = [v for v in doc["visits"] if v["config"] == config]
    if not seen:
        return "-"
    sets = sorted({f"{v['hpc_cpus']} / {v['tenant_cpus'] or '-'}" for v in seen})
    return ", ".join(sets)


def _metric_rows(doc: dict[str, Any]) -> list[str]:
    lines = []
    for m in doc["metrics"]:
        for c in doc["summary"]:
            s = doc["summary"][c].get(m["metric"])
            if s is None:
                continue
            cells = [f"{m['metric']} ({m['unit']})", c, str(s["n"])]
            cells += [_f(s[k]) for k in ("mean", "stdev", "min", "median", "max")]
            cells += [_f(s["rel_mean_vs_idle"]), _f(s["rel_stdev_vs_idle"])]
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def report_md(doc: dict[str, Any]) -> str:
    """Markdown: per metric and configuration mean, stdev, min/median/max and vs idle;
    the goals; what the competing load and the rest of the host burned."""
    lines = [
        f"Isolation (seed 002, Figure 5): {doc['workload']}, {doc['repeat']} repetitions x"
        f" {doc['samples_per_config']} samples per configuration, order rotating, on"
        f" {doc['host']} ({doc['cpu_model']}, {doc['cpus']} CPUs), kernel {doc['kernel']},"
        f" {doc.get('open_mpi', '')}, {doc['crun']}, {doc['date']}; {doc['wall_s']:.0f} s in all.",
        "",
        "| metric | config | n | mean | stdev | min | median | max | mean vs idle"
        " | stdev vs idle |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *_metric_rows(doc),
    ]
    lines += ["", "Goals (higher is better for every metric):"]
    for g in doc["goals"]:
        verdict = "met" if g["met"] else "NOT met"
        lines.append(
            f"- {g['metric']}: {g['config']} stdev <= {g['stdev_vs_idle_at_most']:.1f} x idle's:"
            f" {verdict} ({_f(g['value'])})"
        )
    ok = "yes" if doc["load_verified"] else "NO"
    lines += [
        "",
        f"Competing load: {doc['competing_load']}. Verified (the tenant's cgroup burned"
        f" >= {doc['min_load_cpus']} CPUs during every loaded sample): {ok}.",
        "CPUs used during the samples, mean (min-max), from the cgroups' CPU time and"
        " /proc/stat; 'rest of host' is everything else on the machine (other users),"
        " 'stolen' is time the hypervisor took from this VM:",
        "",
        "| config | HPC node | tenant | rest of host | stolen | load avg 1 min"
        " | cpuset HPC / tenant |",
        "|---|---|---|---|---|---|---|",
    ]
    for c, ls in doc["load_summary"].items():
        cells = [c, *(_load_cell(ls, k) for k in LOAD_KEYS), _cpusets(doc, c)]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"Partition mode on this host: {doc['partition_mode']}."]
    lines += [f"- {c}: {cfg['describe']}" for c, cfg in doc["configs"].items()]
    return "\n".join(lines) + "\n"
