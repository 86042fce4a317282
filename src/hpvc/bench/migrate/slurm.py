"""Live migration across two hosts of the Slurm test cluster (issue 27 Figures).

A private two-host Slurm test cluster (``hpvc.bench.slurm.cluster``); per
guest size one job, submitted by an ordinary user, of two 1-vCPU VM guests
(compute0 on n1, compute1 on n2); compute1 then moves to the other host and
back, as root with ``hpvc node migrate``, alternating per repetition:

- ``idle``: nothing runs in the guests;
- ``mpi``: an Open MPI ping-pong with a checked answer between compute0 and
  compute1 (``native/bench/migloop.c``) runs through the move; the same
  loop just before without a move is its baseline (alternated in the same
  repetition): slowdown = baseline round trips / round trips with the move,
  and the longest round trip rank 0 saw (its guest is not the one paused, so
  its clock keeps time: the downtime as the MPI job sees it).

Per move: QEMU's total time, downtime and bytes sent (``--json``), and the
command's wall time. min/median/max per size and load. Under TCG the figures
are emulation's, labelled so in the report. Architecture: docs/architecture.md
(``bench/``); the figures go to docs/benchmarks.md "Live migration".
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from hpvc.bench import common
from hpvc.bench.slurm.cluster import SlurmCluster, Submitter, private_slurm
from hpvc.bench.stats import summary
from hpvc.errors import HpvcError, InputError
from hpvc.progress import Progress, quiet

CFLAGS = ["-O2", "-Wall", "-Wextra", "-Werror", "-D_FORTIFY_SOURCE=2", "-fstack-protector-strong"]
LOOP_RE = re.compile(r"loop done: (\d+) round trips, (\d+) wrong, max gap ([\d.]+) ms")


def build_loop(out: Path, mpicc: str = "mpicc") -> Path:
    """native/bench/migloop.c built into ``out`` (readable by all)."""
    src = common.native_dir() / "migloop.c"
    exe = out / "migloop"
    common.sh([mpicc, *CFLAGS, "-o", str(exe), str(src)], "build migloop")
    os.chmod(exe, 0o755)
    return exe


def spec_text(subnet: str, mib: int) -> str:
    return (
        f'name = "mig"\nkind = "vm"\nimage = "hpc"\n[network]\nsubnet = "{subnet}"\n'
        '[tuning]\npinning = "shared"\nhugepages = "none"\npartition = "commodity"\n'
        'locality = "none"\n[[nodes]]\nrole = "compute"\ncount = 2\nvcpus = 1\n'
        f'memory = "{mib}MiB"\n'
    )


def parse_loop(text: str) -> dict[str, float] | None:
    m = LOOP_RE.search(text)
    if m is None:
        return None
    return {"round_trips": int(m[1]), "wrong": int(m[2]), "max_gap_ms": float(m[3])}


def _migrate(c: SlurmCluster, job: int, source: str, target: str) -> tuple[dict[str, Any], float]:
    via = " ".join(c.on("{host}", []))
    argv = c.on(source, [c.env["HPVC_BIN"], "node", "migrate", f"--job={job}", "--node=compute1",
                         f"--to={target}", "--via", via, "--json"])  # fmt: skip
    t0 = time.perf_counter()
    r = subprocess.run(argv, env=c.env, capture_output=True, text=True, timeout=900, check=False)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise HpvcError("bench migrate --slurm", (r.stderr or r.stdout).strip()[-300:])
    return json.loads(r.stdout), wall


def _loop(c: SlurmCluster, user: Submitter, work: Path, job: int, spec: Path, secs: int,
          ) -> subprocess.Popen[str]:  # fmt: skip
    argv = ["srun", f"--jobid={job}", "--overlap", "-N1", "-n1", "-w", "n1", f"--hpvc={spec}",
            "mpirun", "-np", "2", "--host", "compute0,compute1", "--mca", "btl", "tcp,self",
            "/root/migloop", str(secs)]  # fmt: skip
    return subprocess.Popen(argv, env=c.user_env(user), cwd=work, user=user.uid, group=user.gid,
                            extra_groups=[], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)  # fmt: skip


def _loop_result(p: subprocess.Popen[str], timeout: float) -> dict[str, float]:
    out, _ = p.communicate(timeout=timeout)
    got = parse_loop(out)
    if got is None or got["wrong"] or p.returncode != 0:
        raise HpvcError("bench migrate --slurm: the MPI loop", out.strip()[-300:])
    return got


def submit_holder(c: SlurmCluster, user: Submitter, work: Path, spec: Path, what: str,
                  tasks: str, sbatch: list[str]) -> int:  # fmt: skip
    """As ``user``, a job on both test hosts that copies migloop into its guests
    (``tasks``: its srun's ``-N2 -n...``) and then holds them up; its id once the
    copy is done. ``sbatch``: the job's own options (memory, CPUs)."""
    script = work / "job.sh"
    script.write_text("#!/bin/bash\nset -e\n"
                      f"srun {tasks} --input=all sh -c"
                      " 'cat > /root/migloop && chmod +x /root/migloop' < migloop\n"
                      "touch ready\nsleep 3600\n")  # fmt: skip
    (work / "ready").unlink(missing_ok=True)
    r = c.submit(user, ["sbatch", "--parsable", "-N2", *sbatch, f"--hpvc={spec}",
                        "-o", str(work / "job.out"), str(script)], work)  # fmt: skip
    if r.returncode != 0:
        raise HpvcError(f"{what}: sbatch", r.stderr.strip()[-300:])
    job = int(r.stdout.strip().split(";")[0])
    deadline = time.monotonic() + 600
    while not (work / "ready").exists():
        if time.monotonic() > deadline:
            out = (work / "job.out").read_text() if (work / "job.out").exists() else ""
            raise HpvcError(what, f"job {job} not ready: {out[-300:]}")
        time.sleep(1)
    return job


def cancel(c: SlurmCluster, user: Submitter, work: Path, job: int) -> None:
    """Cancel ``job`` and wait (2 minutes at most) until Slurm forgets it: its
    epilog frees the job's subnet for the next."""
    c.submit(user, ["scancel", str(job)], work)
    deadline = time.monotonic() + 120
    while (
        time.monotonic() < deadline
        and c.submit(user, ["squeue", "-h", "-j", str(job)], work).stdout.strip()
    ):
        time.sleep(1)


def workspace(prefix: str) -> tuple[Path, Path]:
    """A fresh folder and its ``work`` folder (the submitting user writes its job's
    files there), migloop built in it."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(tmp, 0o755)
    work = tmp / "work"
    work.mkdir()
    os.chmod(work, 0o777)
    build_loop(work)
    return tmp, work


def _one_size(c: SlurmCluster, user: Submitter, work: Path, subnet: str, mib: int, reps: int,
              secs: int, progress: Progress) -> list[dict[str, Any]]:  # fmt: skip
    spec = work / f"mig-{mib}.toml"
    spec.write_text(spec_text(subnet, mib))
    job = submit_holder(c, user, work, spec, "bench migrate --slurm", "-N2 -n2",
                        [f"--mem={2 * mib + 64}M"])  # fmt: skip
    rows: list[dict[str, Any]] = []
    where = "n2"
    move_s = 0.0  # the longest move of this size so far
    try:
        for rep in range(reps):
            for load in ("idle", "mpi") if rep % 2 == 0 else ("mpi", "idle"):
                target = "n1" if where == "n2" else "n2"
                row: dict[str, Any] = {"memory_mib": mib, "load": load, "rep": rep,
                                       "from": where, "to": target}  # fmt: skip
                span = secs + math.ceil(move_s)  # the loop outlasts the move (its pause is last)
                if load == "mpi":
                    row["baseline"] = _loop_result(_loop(c, user, work, job, spec, span), 600)
                    loop = _loop(c, user, work, job, spec, span)
                    time.sleep(min(5, secs / 4))
                report, wall = _migrate(c, job, where, target)
                row |= report["stats"] | {"wall_s": wall}
                move_s = max(move_s, wall)
                if load == "mpi":
                    row["load_spans_move"] = loop.poll() is None
                    row["loop"] = _loop_result(loop, 600)
                    row["slowdown"] = row["baseline"]["round_trips"] / max(
                        1, row["loop"]["round_trips"]
                    )
                where = target
                progress(
                    f"{mib} MiB {load} rep {rep}: {row['total_ms']} ms,"
                    f" downtime {row['downtime_ms']} ms"
                )
                rows.append(row)
    finally:
        cancel(c, user, work, job)
    return rows


def table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for mib in sorted({r["memory_mib"] for r in rows}):
        for load in ("idle", "mpi"):
            mine = [r for r in rows if r["memory_mib"] == mib and r["load"] == load]
            if not mine:
                continue
            entry: dict[str, Any] = {"memory_mib": mib, "load": load, "n": len(mine)}
            for key in ("total_ms", "downtime_ms", "wall_s"):
                entry[key] = summary([float(r[key]) for r in mine])
            entry["sent_mib"] = summary([r["bytes_sent"] / (1 << 20) for r in mine])
            if load == "mpi":  # from loops still running after the switch (they saw the pause)
                spans = [r for r in mine if r.get("load_spans_move", True)] or mine
                entry["spans"] = sum(1 for r in mine if r.get("load_spans_move", True))
                entry["slowdown"] = summary([r["slowdown"] for r in spans])
                entry["mpi_max_gap_ms"] = summary([r["loop"]["max_gap_ms"] for r in spans])
                entry["baseline_max_gap_ms"] = summary([r["baseline"]["max_gap_ms"] for r in spans])
            out.append(entry)
    return out


def run(sizes: list[int], reps: int = 3, secs: int = 30, user: str = "nobody",
        progress: Progress = quiet) -> dict[str, Any]:  # fmt: skip
    if reps < 1 or not sizes or min(sizes) < 128:
        raise InputError(
            "bench migrate --slurm", "needs --reps >= 1 and sizes of 128 MiB or more", ""
        )
    submitter = Submitter.named(user)
    common.require("bench migrate --slurm", ["mpicc", "srun", "qemu-system-x86_64"])
    common.ensure_image("hpc", progress)
    common.ensure_guest("hpc", progress)
    facts = common.host_facts(mpi=True)
    tmp, work = workspace("hpvc-bench-migrate-")
    rows: list[dict[str, Any]] = []
    try:
        subnet = common.free_subnets(1)[0]
        with private_slurm(tmp, subnet, progress, extra_args="kinds=container,vm", hosts=2) as c:
            for mib in sizes:
                rows += _one_size(c, submitter, work, subnet, mib, reps, secs, progress)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"benchmark": "migrate-slurm", **facts, "accelerator": common.accelerator(),
            "sizes_mib": sizes, "reps": reps, "loop_seconds": secs, "submitted_by": user,
            "runs": rows, "table": table(rows)}  # fmt: skip


def report(doc: dict[str, Any]) -> str:
    """The table of ``run``'s document as markdown."""
    emu = " (TCG: emulation, not KVM)" if doc["accelerator"].get("vm") == "tcg" else ""
    lines = [
        f"# Live migration across two hosts of the Slurm test cluster{emu}",
        "",
        f"{doc['reps']} alternated repetitions per size and load; min / median / max.",
        "",
        "| guest | load | total ms | downtime ms | sent MiB | wall s | MPI slowdown |"
        " MPI max gap ms (baseline) | loop through the move |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def mmm(d: dict[str, float], f: str = "{:.0f}") -> str:
        return " / ".join(f.format(d[k]) for k in ("min", "median", "max"))

    for e in doc["table"]:
        mpi = e["load"] == "mpi"
        slow = mmm(e["slowdown"], "{:.2f}") if mpi else ""
        gap = f"{mmm(e['mpi_max_gap_ms'])} ({mmm(e['baseline_max_gap_ms'])})" if mpi else ""
        spans = f"{e.get('spans', e['n'])} of {e['n']}" if mpi else ""
        lines.append(
            f"| {e['memory_mib']} MiB | {e['load']} | {mmm(e['total_ms'])} | "
            f"{mmm(e['downtime_ms'])} | {mmm(e['sent_mib'])} | {mmm(e['wall_s'], '{:.1f}')} | "
            f"{slow} | {gap} | {spans} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """``python -m hpvc.bench.migrate.slurm --sizes 1024 --reps 3 --out DIR`` (until
    ``hpvc bench migrate`` offers it)."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m hpvc.bench.migrate.slurm")
    ap.add_argument("--sizes", default="1024", help="guest MiB, comma-separated")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=30, help="each MPI loop's length")
    ap.add_argument("--user", default="nobody")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    sizes = [int(x) for x in a.sizes.split(",") if x]
    doc = run(sizes, a.reps, a.seconds, a.user, progress=lambda m: print(m, flush=True))
    common.write_results(a.out, doc, report(doc))
    print(report(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
