"""A node that shares its host's ivshmem region moves to another host mid-job
(issues 27 and 29: what leaving the region costs an MPI job).

A private two-host Slurm test cluster; per repetition one job, submitted by an
ordinary user with every CPU of each test host (``--exclusive``), of three
1-vCPU VM guests: compute0 and compute1 on n1 share its region, compute2 is on
n2. ``native/bench/migloop.c`` (an Open MPI ping-pong with a checked answer,
counting its round trips each second) runs between compute0 and compute1
under ``srun --mpi=pmix``:

- ``region``: ``secs`` long, both guests on n1; UCX's lane is the region;
- ``move``: ``3 * secs`` long; compute1 moves to n2 a few seconds in
  (``hpvc node migrate``: the guest leaves the region, its pairs go on over
  the module's TCP, then the copy); its longest round trip is the pause as
  the job sees it;
- ``after``: the same processes' rate over the move loop's last ``secs``
  (the move long done): their pair on the module's TCP fallback;
- ``tcp``: a new step, one task per host, where UCX's own ``tcp`` transport
  joins the guests (what a job started after the move gets).

Per repetition: each loop's round trips a second and longest round trip, the
move's QEMU figures and wall time, and how long the region's processes took
to let go (the migrate command's progress line). Ratios: region over after
(what leaving costs), after over tcp (the module's TCP against UCX's own).
Under TCG all of it is emulation's. Architecture: docs/architecture.md
(``bench/``); figures in docs/benchmarks.md.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from hpvc.bench import common
from hpvc.bench.migrate.slurm import cancel, parse_loop, submit_holder, workspace
from hpvc.bench.slurm.cluster import SlurmCluster, Submitter, private_slurm
from hpvc.bench.stats import summary
from hpvc.errors import HpvcError, InputError
from hpvc.progress import Progress, quiet

LOOPS = ("region", "move", "after", "tcp")
AT = re.compile(r"loop at (\d+) s: (\d+) round trips")
LET_GO = re.compile(r"\((\d+) processes let go in ([\d.]+) s\)")
LANES = re.compile(r"ep_cfg\[\d+\]: tag\(([^)]*)\)")
SWITCHED = re.compile(r"ivshmem: endpoint to [\d.]+ leaves the region for TCP")


def spec_text(subnet: str, mib: int) -> str:
    return (
        f'name = "migshm"\nkind = "vm"\nimage = "hpc"\n[network]\nsubnet = "{subnet}"\n'
        '[tuning]\npinning = "shared"\nhugepages = "none"\npartition = "commodity"\n'
        'locality = "shm"\n[[nodes]]\nrole = "compute"\ncount = 3\nvcpus = 1\n'
        f'memory = "{mib}MiB"\n'
    )


def _loop(c: SlurmCluster, user: Submitter, work: Path, job: int, spec: Path, secs: int,
          hosts: str) -> subprocess.Popen[str]:  # fmt: skip
    """The ping-pong between compute0 and compute1 as a step on ``hosts`` ("n1":
    both guests there; "n1,n2": one task per host), UCX's lanes logged."""
    n = "-N1" if "," not in hosts else "-N2"
    argv = ["srun", f"--jobid={job}", "--overlap", "--overcommit", n, "-n2", "-w", hosts,
            f"--hpvc={spec}", "--mpi=pmix", "/root/migloop", str(secs)]  # fmt: skip
    env = c.user_env(user) | {"UCX_LOG_LEVEL": "info"}
    return subprocess.Popen(argv, env=env, cwd=work, user=user.uid, group=user.gid,
                            extra_groups=[], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)  # fmt: skip


def _running(p: subprocess.Popen[str]) -> str:
    """The loop's output up to its "loop running" line (it has begun)."""
    assert p.stdout is not None
    head = ""
    while "loop running" not in head:
        line = p.stdout.readline()
        if not line:
            raise HpvcError("bench migrate --region: the move loop", head.strip()[-400:])
        head += line
    return head


def _result(p: subprocess.Popen[str], what: str, secs: int, head: str = "") -> dict[str, Any]:
    out, _ = p.communicate(timeout=900)
    out = head + out
    got = parse_loop(out)
    if got is None or got["wrong"] or p.returncode != 0:
        raise HpvcError(f"bench migrate --region: the {what} loop", out.strip()[-400:])
    lanes = [x.split("/")[0] for x in LANES.findall(out) if not x.startswith("self/")]
    at = {int(s): int(n) for s, n in AT.findall(out)}
    return got | {
        "per_s": got["round_trips"] / secs,
        "at": at,
        "lanes": sorted(set(lanes)),
        "switched": len(SWITCHED.findall(out)),
    }


def _migrate(c: SlurmCluster, job: int) -> dict[str, Any]:
    via = " ".join(c.on("{host}", []))
    argv = c.on("n1", [c.env["HPVC_BIN"], "node", "migrate", f"--job={job}", "--node=compute1",
                       "--to=n2", "--via", via, "--json"])  # fmt: skip
    t0 = time.perf_counter()
    r = subprocess.run(argv, env=c.env, capture_output=True, text=True, timeout=900, check=False)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise HpvcError("bench migrate --region", (r.stderr or r.stdout).strip()[-300:])
    m = LET_GO.search(r.stderr)
    if m is None:
        raise HpvcError("bench migrate --region", f"no departure in: {r.stderr.strip()[-300:]}")
    stats: dict[str, Any] = json.loads(r.stdout)["stats"]
    return stats | {"wall_s": wall, "let_go": int(m[1]), "let_go_s": float(m[2])}


def _one(c: SlurmCluster, user: Submitter, work: Path, spec: Path, mib: int, secs: int,
         rep: int) -> dict[str, Any]:  # fmt: skip
    # --exclusive: every CPU of each test host, so that compute0 and compute1 are
    # not both pinned to the one CPU a job gets by default (each round trip would
    # then wait for the scheduler to switch guests, whatever carries it).
    sbatch = ["--exclusive", f"--mem={2 * mib + 128}M"]
    job = submit_holder(c, user, work, spec, "bench migrate --region", "-N2 -n3 --overcommit",
                        sbatch)  # fmt: skip
    row: dict[str, Any] = {"rep": rep, "memory_mib": mib}
    try:
        row["region"] = _result(_loop(c, user, work, job, spec, secs, "n1"), "region", secs)
        loop = _loop(c, user, work, job, spec, 3 * secs, "n1")
        head = _running(loop)
        row["migration"] = _migrate(c, job)
        row["move"] = _result(loop, "move", 3 * secs, head)
        at = row["move"]["at"]
        if row["migration"]["wall_s"] > 2 * secs - 5 or not {2 * secs, 3 * secs} <= set(at):
            raise HpvcError("bench migrate --region", "the move outlasted the loop's first part")
        after = (at[3 * secs] - at[2 * secs]) / secs
        row["after"] = {"per_s": after, "max_gap_ms": row["move"]["max_gap_ms"]}
        row["tcp"] = _result(_loop(c, user, work, job, spec, secs, "n1,n2"), "tcp", secs)
    finally:
        cancel(c, user, work, job)
    return row


def table(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"n": len(rows)}
    for loop in LOOPS:
        out[loop] = {"round_trips_per_s": summary([r[loop]["per_s"] for r in rows])}
        if loop != "after":  # the move loop's, whole
            out[loop]["max_gap_ms"] = summary([r[loop]["max_gap_ms"] for r in rows])
    out["region_over_after"] = summary(
        [r["region"]["per_s"] / max(1e-9, r["after"]["per_s"]) for r in rows]
    )
    out["after_over_tcp"] = summary([r["after"]["per_s"] / r["tcp"]["per_s"] for r in rows])
    for key in ("total_ms", "downtime_ms", "wall_s", "let_go_s"):
        out[key] = summary([float(r["migration"][key]) for r in rows])
    return out


def run(mib: int = 512, reps: int = 3, secs: int = 20, user: str = "nobody",
        progress: Progress = quiet) -> dict[str, Any]:  # fmt: skip
    if reps < 1 or mib < 256 or secs < 5:
        raise InputError("bench migrate --region", "needs --reps >= 1, 256 MiB, 5 s or more", "")
    submitter = Submitter.named(user)
    common.require("bench migrate --region", ["mpicc", "srun", "qemu-system-x86_64"])
    common.ensure_image("hpc", progress)
    common.ensure_guest("hpc", progress)
    facts = common.host_facts(mpi=True)
    tmp, work = workspace("hpvc-bench-region-")
    rows: list[dict[str, Any]] = []
    try:
        subnet = common.free_subnets(1)[0]
        spec = work / "migshm.toml"
        spec.write_text(spec_text(subnet, mib))
        with private_slurm(tmp, subnet, progress, extra_args="kinds=container,vm", hosts=2) as c:
            for rep in range(reps):
                row = _one(c, submitter, work, spec, mib, secs, rep)
                rates = ", ".join(f"{k} {row[k]['per_s']:.0f}/s" for k in LOOPS)
                progress(f"rep {rep}: {rates}; let go in {row['migration']['let_go_s']} s")
                rows.append(row)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"benchmark": "migrate-region", **facts, "accelerator": common.accelerator(),
            "memory_mib": mib, "reps": reps, "loop_seconds": secs, "submitted_by": user,
            "runs": rows, "table": table(rows)}  # fmt: skip


def report(doc: dict[str, Any]) -> str:
    emu = " (TCG: emulation, not KVM)" if doc["accelerator"].get("vm") == "tcg" else ""
    t = doc["table"]

    def mmm(d: dict[str, float], f: str = "{:.0f}") -> str:
        return " / ".join(f.format(d[k]) for k in ("min", "median", "max"))

    lines = [
        f"# A region node leaves its host mid-job{emu}",
        "",
        f"{doc['reps']} repetitions, one job each, {doc['memory_mib']} MiB guests, loops of"
        f" {doc['loop_seconds']} s; min / median / max.",
        "",
        "| loop | round trips/s | longest round trip ms |",
        "|---|---|---|",
    ]
    for loop in LOOPS:
        gap = mmm(t[loop]["max_gap_ms"], "{:.1f}") if "max_gap_ms" in t[loop] else "(the move's)"
        lines.append(f"| {loop} | {mmm(t[loop]['round_trips_per_s'])} | {gap} |")
    lines += [
        "",
        f"- region / after (round trips): {mmm(t['region_over_after'], '{:.1f}')}",
        f"- after / UCX tcp (round trips): {mmm(t['after_over_tcp'], '{:.2f}')}",
        f"- processes let go in: {mmm(t['let_go_s'], '{:.2f}')} s",
        f"- move: total {mmm(t['total_ms'])} ms, downtime {mmm(t['downtime_ms'])} ms,"
        f" command {mmm(t['wall_s'], '{:.1f}')} s",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """``python -m hpvc.bench.migrate.region --reps 3 --out DIR``."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m hpvc.bench.migrate.region")
    ap.add_argument("--memory", type=int, default=512, help="guest MiB")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=20, help="each MPI loop's length")
    ap.add_argument("--user", default="nobody")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    doc = run(a.memory, a.reps, a.seconds, a.user, progress=lambda m: print(m, flush=True))
    common.write_results(a.out, doc, report(doc))
    print(report(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
