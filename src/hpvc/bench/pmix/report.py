"""report.md of ``hpvc bench pmix``: pure, results.json's document in, Markdown out."""

from __future__ import annotations

from typing import Any

HOW = {
    "container": "nodes up, tasks join them, PMIx forwarded",
    "vm": "guests up, tasks relayed into them with their PMIx",
}


def _mmm(s: dict[str, float], fmt: str = "{:.3f}") -> str:
    return " / ".join(fmt.format(s[k]) for k in ("min", "median", "max"))


def report_md(doc: dict[str, Any]) -> str:
    lines = [
        f"# hpvc bench pmix ({doc['kind']} nodes)",
        "",
        f"Host: {doc.get('cpu_model', '?')}, {doc.get('cpus', '?')} CPUs; {doc['slurm']};"
        f" {doc['repeat']} repetitions, the order rotated; jobs submitted by"
        f" {doc['submitted_by']}.",
        "",
        "## MPI: srun --mpi=pmix against mpirun in the same node",
        "",
        "| test | metric | srun --mpi=pmix min/median/max | mpirun min/median/max |"
        " srun/mpirun (paired) min/median/max |",
        "| --- | --- | --- | --- | --- |",
    ]
    for row in doc["mpi"]:
        lines.append(
            f"| {row['what']} | {row['metric']} ({row['unit']}) | {_mmm(row['srun_pmix'])} |"
            f" {_mmm(row['mpirun'])} | {_mmm(row['ratio_srun_mpirun'])} |"
        )
    launch = doc["step_launch"]
    lines += [
        "",
        "## Step launch: srun -N2 -n4 --mpi=pmix true in a salloc -N2 allocation",
        "",
        "| config | seconds min/median/max |",
        "| --- | --- |",
        f"| plain srun | {_mmm(launch['plain'])} |",
        f"| --hpvc ({HOW[doc['kind']]}) | {_mmm(launch['hpvc'])} |",
        "",
        f"Added by --hpvc (medians): {launch['added_median_s']:+.3f} s.",
        "",
    ]
    return "\n".join(lines)
