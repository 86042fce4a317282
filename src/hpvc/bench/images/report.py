"""The images benchmark's document, report and figure (pure but for the PNG file).

``document`` turns the samples of ``hpvc.bench.images.runner`` into results:
per archive and way min/median/max seconds; the ratios hpvc / each peer,
paired within a repetition (lower is better: below 1 hpvc is faster); the
second import; ``up`` from the imported image against the built one (paired
ratio imported / built); the disk of two images sharing a base against the
sum of each alone. Goals (issue 26): import <= 1.0x ``podman load`` (median
ratio, each archive), a second import <= 0.1 s (median), ``up`` within 10%
(median ratio), all decided here.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from hpvc.bench.plots import DPI
from hpvc.bench.stats import summary

GOAL_VS_PODMAN = 1.0
GOAL_AGAIN_S = 0.1
GOAL_UP_PCT = 10.0
PEERS = ("podman_load", "tar", "skopeo_umoci")
SIDES = ("built", "imported")  # the image a cluster comes up from
CONFIGS = ("hpvc", "hpvc_again", *PEERS)
MB = 1_000_000


def seconds_by(samples: list[dict[str, Any]], image: str, config: str) -> dict[int, float]:
    return {s["rep"]: s["seconds"] for s in samples if (s["image"], s["config"]) == (image, config)}


def paired(top: dict[int, float], bottom: dict[int, float]) -> list[float]:
    """top / bottom of each repetition both have, in repetition order."""
    return [top[r] / bottom[r] for r in sorted(top) if r in bottom]


def imports(samples: list[dict[str, Any]], labels: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for label in labels:
        per = {c: seconds_by(samples, label, c) for c in CONFIGS}
        ratios = {}
        for peer in PEERS:
            rs = paired(per["hpvc"], per[peer])
            ratios[f"hpvc/{peer}"] = {"n": len(rs), "values": rs, **summary(rs)} if rs else None
        out[label] = {
            "seconds": {c: {**summary(list(v.values())), "n": len(v)} for c, v in per.items() if v},
            "ratios": ratios,
        }
    return out


def clusters(runs: list[dict[str, Any]]) -> dict[str, Any]:
    by: dict[str, dict[int, dict[str, Any]]] = defaultdict(dict)
    for r in runs:
        by[r["config"]][r["rep"]] = r
    sides = {
        side: {k: summary([r[k] for r in reps.values()]) for k in ("up_s", "down_s", "up_inner_s")}
        for side, reps in by.items()
    }
    up = {side: {rep: r["up_s"] for rep, r in reps.items()} for side, reps in by.items()}
    rs = paired(up.get("imported", {}), up.get("built", {}))
    return {
        "sides": sides,
        "ratio": {"n": len(rs), "values": rs, **summary(rs)} if rs else None,
    }


def disk_doc(used: dict[str, Any], labels: list[str]) -> dict[str, Any]:
    alone = {lb: used[f"{lb}_alone"]["store_bytes"] for lb in labels}
    both = used["both"]
    total = sum(alone.values())
    blobs_alone = sum(used[f"{lb}_alone"]["blobs_bytes"] for lb in labels)
    return {
        **used,
        "sum_alone_bytes": total,
        "both_bytes": both["store_bytes"],
        "both_of_sum": both["store_bytes"] / total if total else None,
        "saved_bytes": total - both["store_bytes"],
        "blobs_saved_bytes": blobs_alone - both["blobs_bytes"],
    }


def _goals(imp: dict[str, Any], clu: dict[str, Any]) -> list[dict[str, Any]]:
    goals = []
    for label, d in imp.items():
        r = d["ratios"]["hpvc/podman_load"]
        med = r["median"] if r else float("inf")
        goals.append(
            {
                "what": f"{label}: import <= {GOAL_VS_PODMAN:g}x podman load (median ratio)",
                "met": med <= GOAL_VS_PODMAN,
                "value": f"median {med:.2f}x"
                + (f", {r['min']:.2f} to {r['max']:.2f}" if r else ""),
            }
        )
    for label, d in imp.items():
        again = d["seconds"].get("hpvc_again")
        med = again["median"] if again else float("inf")
        goals.append(
            {
                "what": f"{label}: second import <= {GOAL_AGAIN_S:g} s (median)",
                "met": med <= GOAL_AGAIN_S,
                "value": f"median {med:.3f} s",
            }
        )
    r = clu["ratio"]
    med = r["median"] if r else float("inf")
    goals.append(
        {
            "what": f"up from the imported image within {GOAL_UP_PCT:g}% of the built one"
            " (median ratio)",
            "met": abs(med - 1) * 100 <= GOAL_UP_PCT,
            "value": f"median {med:.3f}" + (f", {r['min']:.3f} to {r['max']:.3f}" if r else ""),
        }
    )
    return goals


def document(
    facts: dict[str, Any],
    setup: dict[str, Any],
    archives: list[dict[str, Any]],
    samples: list[dict[str, Any]],
    cluster: list[dict[str, Any]],
    used: dict[str, Any],
) -> dict[str, Any]:
    labels = [a["label"] for a in archives]
    imp = imports(samples, labels)
    clu = clusters(cluster)
    return {
        "benchmark": "images",
        "facts": facts,
        **setup,
        "archives": archives,
        "timing": "wall clock around the commands as a user types them, each its own process;"
        " sync before every timed step; hpvc imports into an empty store (images removed"
        " first, untimed); podman load into an empty private store (rmi after, untimed)",
        "imports": imp,
        "cluster": clu,
        "disk": disk_doc(used, labels),
        "goals": _goals(imp, clu),
        "samples": samples,
        "cluster_runs": cluster,
    }


def mmm(s: dict[str, float], fmt: str = ".2f") -> str:
    return " / ".join(format(s[k], fmt) for k in ("min", "median", "max"))


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.0f} MiB"


def report_md(doc: dict[str, Any]) -> str:
    f = doc["facts"]
    lines = [
        f"`hpvc bench images`, {doc['repeat']} repetitions (archives and ways alternated),"
        f" on {f['host']} ({f['cpu_model']}, {f['cpus']} CPUs), kernel {f['kernel']},"
        f" {f['podman']}, {f['skopeo']}, {f['umoci']}, {f['date']};"
        f" load average {f['loadavg_start'][0]:.2f} at the start, {f['loadavg_end'][0]:.2f}"
        " at the end.",
        "",
        "| archive | layers | size |",
        "|---|---|---|",
        *(
            f"| {a['label']} | {a['layers']} | {a['archive_bytes'] / MB:.0f} MB |"
            for a in doc["archives"]
        ),
        "",
        "Seconds, min / median / max (" + doc["timing"] + "):",
        "",
        "| archive | " + " | ".join(CONFIGS) + " |",
        "|---|" + "---|" * len(CONFIGS),
    ]
    for label, d in doc["imports"].items():
        cells = [mmm(d["seconds"][c]) if c in d["seconds"] else "" for c in CONFIGS]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", "Paired ratios (lower: hpvc faster), min / median / max:", ""]
    lines += ["| archive | " + " | ".join(f"hpvc/{p}" for p in PEERS) + " |"]
    lines += ["|---|" + "---|" * len(PEERS)]
    for label, d in doc["imports"].items():
        cells = [mmm(r) if (r := d["ratios"][f"hpvc/{p}"]) else "" for p in PEERS]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    c = doc["cluster"]
    lines += [
        "",
        f"{doc['nodes']}-node container cluster from the imported base and from"
        f" {doc['base']!r} (built), seconds min / median / max:",
        "",
        "| image | up | down | up (hpvc's own) |",
        "|---|---|---|---|",
    ]
    for side, s in c["sides"].items():
        lines.append(f"| {side} | {mmm(s['up_s'], '.3f')} | {mmm(s['down_s'], '.3f')}"
                     f" | {mmm(s['up_inner_s'], '.3f')} |")  # fmt: skip
    if c["ratio"]:
        lines += ["", f"up imported / built, paired: {mmm(c['ratio'], '.3f')}."]
    d = doc["disk"]
    lines += [
        "",
        f"Disk (du): base alone {_mib(d['base_alone']['store_bytes'])}, big alone"
        f" {_mib(d['big_alone']['store_bytes'])}, sum {_mib(d['sum_alone_bytes'])};"
        f" both in one store {_mib(d['both_bytes'])} ({d['both_of_sum']:.2f} of the sum);"
        f" blobs shared save {_mib(d['blobs_saved_bytes'])}.",
        "",
        *(
            f"- goal {g['what']}: {'met' if g['met'] else 'NOT met'} ({g['value']})"
            for g in doc["goals"]
        ),
    ]
    return "\n".join(lines) + "\n"


def plot(doc: dict[str, Any], path: Path) -> None:
    """Import seconds per archive and way; up built vs imported; disk."""
    fig = Figure(figsize=(13, 4.2), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    ax1, ax2, ax3 = fig.subplots(1, 3)
    labels = list(doc["imports"])
    width = 0.8 / len(CONFIGS)
    for i, cfg in enumerate(CONFIGS):
        xs, ys, lo, hi = [], [], [], []
        for j, label in enumerate(labels):
            s = doc["imports"][label]["seconds"].get(cfg)
            if s:
                xs.append(j - 0.4 + width * (i + 0.5))
                ys.append(s["median"])
                lo.append(s["median"] - s["min"])
                hi.append(s["max"] - s["median"])
        ax1.bar(xs, ys, width, yerr=[lo, hi], capsize=3, label=cfg)
    mb = {a["label"]: a["archive_bytes"] / MB for a in doc["archives"]}
    ax1.set_xticks(range(len(labels)), [f"{lb} ({mb[lb]:.0f} MB)" for lb in labels])
    ax1.set_ylabel("seconds (median, min-max)")
    ax1.set_title("Import / load / unpack a docker-archive", fontsize=9)
    ax1.legend(fontsize=7)
    sides = list(doc["cluster"]["sides"])
    ups = [doc["cluster"]["sides"][s]["up_s"] for s in sides]
    ax2.bar(
        sides,
        [u["median"] for u in ups],
        yerr=[[u["median"] - u["min"] for u in ups], [u["max"] - u["median"] for u in ups]],
        capsize=4,
        color="tab:blue",
    )
    ax2.set_ylabel("hpvc up, s (median, min-max)")
    ax2.set_title(f"{doc['nodes']}-node container cluster up", fontsize=9)
    d = doc["disk"]
    names = ["base alone", "big alone", "sum", "both, one store"]
    values = [
        d["base_alone"]["store_bytes"],
        d["big_alone"]["store_bytes"],
        d["sum_alone_bytes"],
        d["both_bytes"],
    ]
    ax3.bar(names, [v / (1 << 20) for v in values], color="tab:gray")
    ax3.set_ylabel("MiB on disk (du)")
    ax3.set_title("Image store: two images sharing a base", fontsize=9)
    ax3.tick_params(axis="x", labelsize=8)
    fig.suptitle("hpvc image import (goals: <= 1.0x podman load; again <= 0.1 s; up within 10%)")
    fig.savefig(path, format="png")
