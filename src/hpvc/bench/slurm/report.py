"""The report of ``hpvc bench slurm``: where an ``--hpvc`` step's time goes
(phases) and the Markdown table of both paths."""

from __future__ import annotations

from typing import Any

from hpvc.bench.stats import summary

PHASES = {
    "check": "`hpvc node check` in srun, as the user",
    "node_up": "`hpvc node up` on the slowest host, start to exit:",
    "start": "  its start: the interpreter (with a resident hpvc: the client and the fork)",
    "cli": "  typer and the node commands' imports (none left with a resident hpvc)",
    "image": "  image lookup",
    "plan": "  topology, plan, record",
    "host": "  cgroups, bridge, shared memory",
    "nodes": "  overlay, netns, veth, crun",
    "qemu": "  VMs: disks, taps, QEMU started and pinned",
    "boot": "  VMs: the guests boot to hpvc-ready (their agent listening)",
    "configure": "  VMs: hosts and ARP over ssh (clusters too big for the command line)",
    "share": "  spec checks, locks, join records",
    "running": "  (the share was running already)",
    "rest": "Slurm itself and the tasks' join (the step's wall clock less the above)",
}


def phase_table(rows: list[dict[str, Any]], labels: dict[str, str]) -> list[dict[str, Any]]:
    """Median seconds per phase of each --hpvc step that ran `hpvc node up`."""
    out = []
    for what in [w for w in labels if not w.startswith("alloc_later")]:
        got = [r["phases"] for r in rows if r["what"] == what and r.get("phases")]
        if not got:
            continue
        keys = [k for k in PHASES if any(k in g for g in got)]
        out.append(
            {
                "what": what,
                "runs": len(got),
                "median_s": {k: summary([g.get(k, 0.0) for g in got])["median"] for k in keys},
            }
        )
    return out


def _labels(doc: dict[str, Any]) -> dict[str, str]:
    """What each measured step is (results from before layouts: the container one)."""
    if "what" in doc:
        return dict(doc["what"])
    return {t["what"]: t["describe"] for t in doc["table"]}


def report_md(doc: dict[str, Any]) -> str:
    lines = [
        f"Launch latency of `srun --hpvc` against plain `srun` on the local Slurm test cluster"
        f" (3 slurmd on one machine), {doc['repeat']} repetitions, order rotated;"
        f" {doc['host']} ({doc['cpu_model']}, {doc['cpus']} CPUs), {doc['slurm']},"
        f" {doc['date']}. Virtual cluster: {doc['virtual_cluster']}. Jobs submitted by"
        f" the unprivileged user {doc.get('submitted_by', 'root')}."
        + (
            " A resident hpvc (`hpvc serve`) ran on each host and for the submitting side."
            if doc.get("resident")
            else " No resident hpvc: each hpvc command started on its own."
        )
        + (
            f" VMs ran under {doc['accelerator'].upper()}"
            + (" (software emulation: not KVM figures)." if doc["accelerator"] == "tcg" else ".")
            if doc.get("accelerator")
            else ""
        ),
        "",
        "| what | plain min / median / max s | --hpvc min / median / max s | added (median) s |",
        "|---|---|---|---|",
    ]
    for t in doc["table"]:
        p, h = t["plain"], t["hpvc"]
        lines.append(
            f"| {t['describe']} | {p['min']:.3f} / {p['median']:.3f} / {p['max']:.3f}"
            f" | {h['min']:.3f} / {h['median']:.3f} / {h['max']:.3f}"
            f" | {t['added_median_s']:+.3f} |"
        )
    return "\n".join(lines + _phase_lines(doc)) + "\n"


def _phase_lines(doc: dict[str, Any]) -> list[str]:
    table = doc.get("phases") or []
    if not table:
        return []
    labels = _labels(doc)
    heads = [labels[t["what"]].split(",")[0].split(" (")[0] for t in table]
    lines = [
        "",
        "Where an `--hpvc` step that brings the share up spends its time (median s; the hosts"
        " run `hpvc node up` at once, the slowest counts):",
        "",
        "| phase | " + " | ".join(heads) + " |",
        "|---|" + "---|" * len(table),
    ]
    for key, describe in PHASES.items():
        if any(key in t["median_s"] for t in table):
            cells = " | ".join(
                f"{t['median_s'][key]:.3f}" if key in t["median_s"] else "" for t in table
            )
            lines.append(f"| {describe} | {cells} |")
    return lines
