"""report.md of ``hpvc bench spark``: TeraSort times per configuration, and the
ratios native/config paired per repetition (above 1: faster than native)."""

from __future__ import annotations

from typing import Any

from hpvc.bench.ratios import goal_of, ratio_rows, table_md

WHAT = {
    "native": "Spark standalone on the host: master and workers as host processes, data on"
    " the host's disk",
    "container": "the Spark virtual cluster (head + computes, containers), data on its shared"
    " directory, a host folder on the same disk bound into the nodes",
    "container-nfs": "the same cluster with its shared directory served over NFS by the head"
    " (what the shared storage costs, against `container`)",
    "vm": "the same cluster as virtual machines (QEMU), its shared directory over NFS from the"
    " head's guest",
}


def sizes(doc: dict[str, Any]) -> list[str]:
    """The run's size labels (results of older runs list whole GiB)."""
    return doc.get("sizes") or [f"{s}GiB" for s in doc.get("sizes_gib", [])]


def _goal_size(label: str) -> bool:
    return label.endswith("GiB")


def _node_mib(doc: dict[str, Any]) -> str:
    """The compute nodes' memory: one number (older runs), or per kind of node."""
    n = doc["node_mib"]
    if isinstance(n, int):
        return f"{n} MiB"
    return ", ".join(f"{mib} MiB as {kind}s" for kind, mib in n.items())


def goals(doc: dict[str, Any]) -> list[dict[str, Any]]:
    g = doc["goal"]
    return [
        {
            "metric": f"sort {s}",
            "config": g["config"],
            "median_ratio_at_least": g["median_ratio_at_least"],
        }
        for s in sizes(doc)
        if _goal_size(s)
    ]


def verdicts(doc: dict[str, Any]) -> list[tuple[str, bool | None, dict[str, Any] | None]]:
    """(metric, met, ratio summary) of every goal row."""
    rows = ratio_rows(doc["samples"])
    out = []
    for g in goals(doc):
        row = next((r for r in rows if (r["metric"], r["config"]) == (g["metric"], g["config"])),
                   None)  # fmt: skip
        out.append((g["metric"], goal_of(row, goals(doc), "native") if row else None,
                    row["ratio"] if row else None))  # fmt: skip
    return out


def report_md(doc: dict[str, Any]) -> str:
    h = doc["host"]
    lines = [
        "# hpvc bench spark: TeraSort, virtual cluster vs native Spark",
        "",
        f"{h['date']}, {h['host']} ({h['cpu_model']}, {h['cpus']} CPUs, kernel {h['kernel']}),"
        f" load at start {h['loadavg_start'][0]:.2f}. {doc['repeat']} repetitions per size,"
        " configurations alternated (the order rotates every repetition).",
        "",
        f"Every configuration: Spark 3.5.3, the spark image's JRE, hpvc's TeraSort jar,"
        f" {doc['workers']} workers of 1 core and {doc['worker_mib']} MiB (one whole-worker"
        f" executor each; cluster nodes of {_node_mib(doc)}).",
        "",
        *(f"Scaled down to fit this host: {n}." for n in doc.get("scaled_down", [])),
        *([""] if doc.get("scaled_down") else []),
        *(f"- `{c}`: {WHAT[c]}" for c in doc["configs"]),
        "",
        "`sort` is TeraSort's own time for the sort (sampling, shuffle, sort, write; after the"
        " executors are up); `sort step wall` is the whole spark-submit as a user waits for it"
        " (JVM and executors starting included). Ratios are native/config per repetition:"
        " above 1 the configuration is faster.",
        "",
        "## Goals",
        "",
    ]
    if not goals(doc):
        lines.append("None at these sizes: the goal (container/native) is for 1 GiB and up.")
    for metric, met, r in verdicts(doc):
        cell = "no data" if r is None else (
            f"{r['min']:.3f} / {r['median']:.3f} / {r['max']:.3f}")  # fmt: skip
        state = {True: "met", False: "NOT met", None: "n/a"}[met]
        lines.append(f"- container/native, {metric} (>= {doc['goal']['median_ratio_at_least']}):"
                     f" min/median/max {cell}: {state}")  # fmt: skip
    nfs = [r for r in ratio_rows(doc["samples"], baseline="container")
           if r["config"] == "container-nfs" and r["ratio"]]  # fmt: skip
    if nfs:
        lines += ["", "## What NFS costs (container-nfs against container, per repetition)", ""]
        lines += [f"- {r['metric']}: {r['ratio']['min']:.3f} / {r['ratio']['median']:.3f} /"
                  f" {r['ratio']['max']:.3f} (min/median/max; below 1: slower on NFS)"
                  for r in nfs]  # fmt: skip
    acc = h.get("accelerator")
    if acc is not None:
        name = acc.get("vm")
        label = "KVM" if name == "kvm" else "TCG: software emulation, far slower than KVM"
        lines += ["", f"## VMs: {name} ({label})", "", f"{acc.get('note') or ''}".strip()]
        vs_nfs = [r for r in ratio_rows(doc["samples"], baseline="container-nfs")
                  if r["config"] == "vm" and r["ratio"]]  # fmt: skip
        if vs_nfs:
            lines += ["", "`vm` against `container-nfs` (the same cluster and storage path as"
                      " containers), per repetition:"]  # fmt: skip
        lines += [f"- {r['metric']}: {r['ratio']['min']:.3f} / {r['ratio']['median']:.3f} /"
                  f" {r['ratio']['max']:.3f} (min/median/max; below 1: slower as VMs)"
                  for r in vs_nfs]  # fmt: skip
    lines += ["", "## All figures", "", table_md(ratio_rows(doc["samples"]), goals(doc))]
    return "\n".join(lines) + "\n"


def slurm_report_md(doc: dict[str, Any]) -> str:
    """report.md of ``hpvc bench spark --slurm`` (hpvc.bench.spark.slurm)."""
    h = doc["host"]
    spark = [s for s in doc["samples"] if s["config"] in doc["configs"]]
    start = [s for s in doc["samples"] if s["config"] not in doc["configs"]]
    lines = [
        "# hpvc bench spark --slurm: TeraSort as a Slurm job across hosts vs native Spark",
        "",
        f"{h['date']}, {h['host']} ({h['cpu_model']}, {h['cpus']} CPUs, kernel {h['kernel']}),"
        f" load at start {h['loadavg_start'][0]:.2f}. A private Slurm test cluster of"
        f" {doc['hosts']} hosts (namespaces apart on this machine), jobs submitted by"
        f" {doc['submitted_by']}; {doc['repeat']} repetitions, the order alternating.",
        "",
        f"Both: Spark 3.5.3, the spark image's JRE and TeraSort jar, {doc['workers']} workers"
        f" (one per host) of 1 core and {doc['worker_mib']} MiB, one whole-worker executor each.",
        "",
        "- `native`: master, driver and a worker on the first host, a worker on each other,"
        " as host processes in the hosts' namespaces; data on this machine's disk; unpinned",
        *(
            [
                "- `native-pinned`: the same daemons and driver held to the CPUs of the job's"
                f" share on each host ({_cpus(doc)}): native on what Slurm gave the job"
            ]
            if "native-pinned" in doc["configs"]
            else []
        ),
        "- `slurm-nfs`: an `sbatch -N3` job of a head and three compute containers of"
        f" {doc['node_mib']} MiB; data on the job's shared directory, NFS from head0 over"
        " the job's VXLAN network; each TeraSort step an `srun --overlap` step (driver in"
        " compute0)",
        *(
            [
                "- `slurm-bind`: the same job, its data in the site's `binds=` folder on this"
                " machine's disk (as native's): against `slurm-nfs`, what NFS costs"
            ]
            if "slurm-bind" in doc["configs"]
            else []
        ),
        "",
        "## Goals",
        "",
    ]
    goal = [{"metric": f"sort {s}", "config": "slurm-nfs",
             "median_ratio_at_least": doc["goal"]["median_ratio_at_least"]}
            for s in doc["sizes"]]  # fmt: skip
    rows = ratio_rows(spark)
    bases = ["native"] + (["native-pinned"] if "native-pinned" in doc["configs"] else [])
    for base in bases:
        based = ratio_rows(spark, baseline=base)
        for g in goal:
            row = next((r for r in based
                        if (r["metric"], r["config"]) == (g["metric"], g["config"])),
                       None)  # fmt: skip
            r = row["ratio"] if row else None
            cell = "no data" if r is None else (
                f"{r['min']:.3f} / {r['median']:.3f} / {r['max']:.3f}")  # fmt: skip
            met = {True: "met", False: "NOT met", None: "n/a"}[
                goal_of(row, goal, base) if row else None
            ]
            lines.append(f"- slurm-nfs/{base}, {g['metric']} (>= {g['median_ratio_at_least']}):"
                         f" min/median/max {cell}: {met}")  # fmt: skip
    lines += ["", "## A job's time to its first task", "",
              "`srun -N3 --hpvc=SPEC hostname` as a new job (its shares come up in it), with"
              " the Spark spec and with the same nodes without `[shared]` and `[spark]`:", "",
              table_md(ratio_rows(start, baseline="without"), [], baseline="without"),
              "## All figures", "", table_md(rows, goal)]  # fmt: skip
    if "native-pinned" in doc["configs"]:
        lines += ["## Against native-pinned (the same CPUs as the job)", "",
                  table_md(ratio_rows(spark, baseline="native-pinned"), goal,
                           baseline="native-pinned")]  # fmt: skip
    return "\n".join(lines) + "\n"


def _cpus(doc: dict[str, Any]) -> str:
    """The job's CPUs per host as recorded (``n1 0; n2 0; ...``)."""
    got = doc.get("share_cpus") or {}
    return "; ".join(f"{h} CPUs {','.join(map(str, c))}" for h, c in got.items()) or "not recorded"
