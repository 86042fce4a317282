"""The block-I/O benchmark's results document, its report and the CLI's summary rows.

Throttles: measured bandwidth and error against the target per node and
direction (goal: median error within 5%). Weights: the split of two nodes
reading at once against 1:9. Overhead: bandwidth per config and the ratios
of the configs per repetition (1.0 = no overhead). Pure: samples in,
document and markdown out.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hpvc.bench.io.jobs import (
    FILE_MIB,
    GOAL_ERROR_PCT,
    MB,
    NODES,
    OVERHEAD_CONFIGS,
    SEQ_READ,
    SEQ_WRITE,
    WEIGHT_JOBS,
    WEIGHT_TARGET,
    throttle_targets,
)
from hpvc.bench.stats import summary


def throttle_doc(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for label, job, target in throttle_targets():
        mine = [x for x in samples if x["node"] == label and x["job"] == job.key]
        bw = [float(x["bw_bytes"]) for x in mine]
        err = [(b - target) / target * 100 for b in bw]
        med = summary(err)["median"]
        out.append(
            {
                "node": label,
                "job": job.key,
                "direction": job.direction,
                "target_bps": target,
                "measured_bps": summary(bw),
                "error_pct": summary(err),
                "worst_abs_error_pct": max(abs(e) for e in err),
                "meets_goal": abs(med) <= GOAL_ERROR_PCT,
                "samples": mine,
            }
        )
    return out


def weight_doc(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for job in WEIGHT_JOBS:
        mine = [x for x in samples if x["job"] == job.key]
        out.append(
            {
                "job": job.key,
                "rw": job.rw,
                "bs": job.bs,
                "target_ratio": WEIGHT_TARGET,
                "ratio": summary([x["ratio"] for x in mine]),
                "w100_bps": summary([x["w100"]["bw_bytes"] for x in mine]),
                "w900_bps": summary([x["w900"]["bw_bytes"] for x in mine]),
                "samples": mine,
            }
        )
    return out


def _bw(samples: list[dict[str, Any]], job: str, config: str) -> list[float]:
    rows = sorted((x for x in samples if x["job"] == job and x["config"] == config),
                  key=lambda x: int(x["rep"]))  # fmt: skip
    return [float(x["bw_bytes"]) for x in rows]


def overhead_doc(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per job: bandwidth per config, and per-repetition ratios (1.0 = no overhead)."""
    pairs = {"open/native": ("open", "native"), "high/native": ("high", "native")}
    pairs["high/open"] = ("high", "open")
    out = []
    for job in (SEQ_READ, SEQ_WRITE):
        bw = {c: _bw(samples, job.key, c) for c in OVERHEAD_CONFIGS}
        ratios = {}
        for key, (a, b) in pairs.items():
            r = [x / y for x, y in zip(bw[a], bw[b], strict=True)]
            ratios[key] = {"samples": r, **summary(r)}
        out.append(
            {
                "job": job.key,
                "bps": {c: {"samples": v, **summary(v)} for c, v in bw.items()},
                "ratios": ratios,
                "samples": [x for x in samples if x["job"] == job.key],
            }
        )
    return out


def fio_settings(seconds: int) -> dict[str, Any]:
    return {
        "ioengine": "psync",
        "direct": 1,
        "file_mib": FILE_MIB,
        "runtime_s": seconds,
        "time_based": True,
        "weight_ramp_s": WEIGHT_JOBS[0].ramp_s,
        "files": "one per side, laid out from the host, in the cluster's shared directory"
        " (/shared in the nodes): same ext4 on the loop device, no overlay",
    }


def document(
    facts: dict[str, Any],
    seconds: int,
    repeat: int,
    samples: dict[str, list[Any]],
    loadavg_end: list[float],
) -> dict[str, Any]:
    """The results document (``loadavg_end``: the host's load averages at the end)."""
    throttle = throttle_doc(samples["throttle"])
    return {
        "benchmark": "block-io",
        **facts,
        "repeat": repeat,
        "fio_job": fio_settings(seconds),
        "nodes": {n.label: {"io": n.io, "describe": n.describe} for n in NODES},
        "goal": {"throttle_abs_error_pct_at_most": GOAL_ERROR_PCT, "of": "median error"},
        "meets_goal": all(t["meets_goal"] for t in throttle),
        "throttle": throttle,
        "weight": weight_doc(samples["weight"]),
        "overhead": {
            "configs": OVERHEAD_CONFIGS,
            "ratio": "bandwidth a / bandwidth b per repetition; 1.0 = no overhead",
            "jobs": overhead_doc(samples["overhead"]),
        },
        "loadavg_end": loadavg_end,
    }


def _mb(v: float) -> str:
    return f"{v / MB:.2f}"


def _triple(s: dict[str, float], f: Callable[[float], str]) -> str:
    return f"{f(s['min'])} / {f(s['median'])} / {f(s['max'])}"


def _throttle_md(doc: dict[str, Any]) -> list[str]:
    lines = [
        "### Throttle accuracy (one node at a time)",
        "",
        "| node | job | target MB/s | measured MB/s min / median / max"
        " | error % min / median / max | goal met |",
        "|---|---|---|---|---|---|",
    ]
    for t in doc["throttle"]:
        err = _triple(t["error_pct"], lambda v: f"{v:+.1f}")
        met = "yes" if t["meets_goal"] else "no"
        lines.append(
            f"| {t['node']} | {t['job']} | {t['target_bps'] / MB:g}"
            f" | {_triple(t['measured_bps'], _mb)} | {err} | {met} |"
        )
    return lines


def _weight_md(doc: dict[str, Any]) -> list[str]:
    lines = [
        "### Weight split (bfq weights 100 and 900, both nodes reading at once; target 1:9)",
        "",
        "| job | w100 MB/s median | w900 MB/s median | ratio 1:x min / median / max | target |",
        "|---|---|---|---|---|",
    ]
    for w in doc["weight"]:
        lines.append(
            f"| {w['job']} | {_mb(w['w100_bps']['median'])} | {_mb(w['w900_bps']['median'])}"
            f" | {_triple(w['ratio'], lambda v: f'{v:.2f}')} | 1:{w['target_ratio']:g} |"
        )
    return lines


def _overhead_md(doc: dict[str, Any]) -> list[str]:
    ov = doc["overhead"]
    cfgs = list(ov["configs"])
    lines = [
        "### Overhead of idle limits (ratio = bandwidth a / b per repetition, 1.0 = none)",
        "",
        "| job | " + " | ".join(f"{c} MB/s median" for c in cfgs) + " | "
        + " | ".join(f"{k} min / median / max" for k in ov["jobs"][0]["ratios"]) + " |",
        "|---|" + "---|" * (len(cfgs) + len(ov["jobs"][0]["ratios"])),
    ]  # fmt: skip
    for j in ov["jobs"]:
        bws = " | ".join(f"{j['bps'][c]['median'] / MB:.0f}" for c in cfgs)
        rs = " | ".join(_triple(r, lambda v: f"{v:.3f}") for r in j["ratios"].values())
        lines.append(f"| {j['job']} | {bws} | {rs} |")
    lines += ["", *(f"- {c}: {d}" for c, d in ov["configs"].items())]
    return lines


def _page_cache_note(disk: dict[str, Any]) -> list[str]:
    if disk.get("loop_direct_io") != "0":
        return []
    return [
        "The loop device reads and writes its backing file through the host's page cache"
        " (loop direct I/O 0), so unthrottled bandwidth is bounded by memory and CPU, not"
        " by a disk: the overhead ratios compare CPU paths and are noisy on a shared machine.",
        "",
    ]


def report_md(doc: dict[str, Any]) -> str:
    disk, job = doc["disk"], doc["fio_job"]
    lines = [
        f"Block I/O of container nodes, fio ({doc['fio']}; in the nodes {doc['fio_in_nodes']}),"
        f" {doc['repeat']} repetitions (parts alternated), {job['runtime_s']} s per fio run,"
        f" direct I/O, psync, on {doc['host']} ({doc['cpu_model']}, {doc['cpus']} CPUs),"
        f" kernel {doc['kernel']}, {doc['crun']}, {doc['date']}.",
        "",
        f"Device: {disk['device']} ({disk['kind']}, {disk['size_bytes'] >> 30} GiB, backing"
        f" file on {disk['backing_file_fs']}, loop direct I/O {disk['loop_direct_io']}),"
        f" scheduler `{disk['scheduler']}`. Goal: throttles within"
        f" {GOAL_ERROR_PCT:g}% of target (median error):"
        f" {'met' if doc['meets_goal'] else 'NOT met'}.",
        "",
        *_page_cache_note(disk),
        *_throttle_md(doc),
        "",
        *_weight_md(doc),
        "",
        *_overhead_md(doc),
    ]
    return "\n".join(lines) + "\n"


def summary_rows(doc: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    """(part, what, target, median, min / max) for the CLI's table."""
    rows = []
    for t in doc["throttle"]:
        m, e = t["measured_bps"], t["error_pct"]
        rows.append(
            (
                "throttle",
                f"{t['node']} {t['direction']}",
                f"{t['target_bps'] / MB:g} MB/s",
                f"{_mb(m['median'])} MB/s ({e['median']:+.1f}%)",
                f"{_mb(m['min'])} / {_mb(m['max'])}",
            )
        )
    for w in doc["weight"]:
        r = w["ratio"]
        rows.append(
            ("weight", w["job"], "1:9", f"1:{r['median']:.2f}", f"{r['min']:.2f} / {r['max']:.2f}")
        )
    for j in doc["overhead"]["jobs"]:
        for key, r in j["ratios"].items():
            rows.append(
                ("overhead", f"{j['job']} {key}", "1.0", f"{r['median']:.3f}",
                 f"{r['min']:.3f} / {r['max']:.3f}")
            )  # fmt: skip
    return rows
