#!/usr/bin/env python3
"""An MPI job inside container nodes across a checkpoint, as a user runs it.

Per repetition, both ways container nodes are made (locality "shm", nodes
sharing the cluster's namespaces, and "none"), their order swapped every
other repetition: a cluster of three nodes (head0, compute0, compute1, 256
MiB each) is brought up, tests/data/mpi/pingpong.c is built on the host into
its /shared and started by mpirun in compute0 (its second rank in compute1,
through the nodes' hpvc-agent: docs/containers.md "MPI started inside the
nodes"), every output line stamped with the node's clock as it arrives;
at round 200 the CLI cuts the cluster with `hpvc checkpoint --stop` and
brings it back with `hpvc restore`, each timed as a user waits for it (CLI
start included). Recorded: both commands' wall time, the nodes' frozen time
the checkpoint reports, its size, the job's own pause (the largest gap
between its stamped lines less the usual gap: what the job saw of the cut,
the down and the restore), and whether it finished with the right sum.

There is no peer to run beside it: Podman checkpoints containers one by one,
and the TCP job of `hpvc bench checkpoint` never survived its restore there.

  usage: .venv/bin/python scripts/bench/checkpoint-mpi.py [REPS] [OUT]
Run as root, from the checkout (the `hpc` image is built if missing).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from hpvc.bench import common
from hpvc.image import default_store

LOCALITIES = ("shm", "none")
ROUNDS, DELAY_US, CUT_AT = 1000, 10000, 200
SOURCE = Path(__file__).parents[2] / "tests" / "data" / "mpi" / "pingpong.c"
JOB = (
    "cd /shared && setsid sh -c 'mpirun --allow-run-as-root -np 2 --host compute0,compute1"
    f" ./pingpong {ROUNDS} {DELAY_US} 2>&1 | while read -r l; do"
    ' echo "$(date +%s.%N) $l"; done > /root/pp.out'
    "' < /dev/null > /dev/null 2>&1 &"
)


def _cli(env: dict[str, str], *argv: str) -> tuple[float, str]:
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "hpvc", *argv], env=env, capture_output=True,
                          text=True, check=False)  # fmt: skip
    took = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"hpvc {' '.join(argv)}: {done.stderr.strip()[-400:]}")
    return took, done.stdout


def _out(env: dict[str, str], name: str) -> str:
    return _cli(env, "exec", name, "compute0", "--", "cat", "/root/pp.out")[1]


def _wait(env: dict[str, str], name: str, pattern: str, seconds: float) -> str:
    deadline = time.monotonic() + seconds
    while not re.search(pattern, out := _out(env, name)):
        if time.monotonic() > deadline:
            raise SystemExit(f"{name}: no {pattern!r} in the job's output: {out[-400:]}")
        time.sleep(0.2)
    return out


def _pause(out: str) -> float:
    """The largest gap between the job's stamped lines, less the usual gap."""
    stamps = [float(ln.split()[0]) for ln in out.splitlines() if " round " in ln]
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    return max(gaps) - statistics.median(gaps)


def one(tmp: Path, env: dict[str, str], name: str, locality: str) -> dict[str, float | bool]:
    groups = [{"role": "head", "count": 1, "memory": "256MiB"},
              {"role": "compute", "count": 2, "memory": "256MiB"}]  # fmt: skip
    spec = tmp / f"{name}.toml"
    spec.write_text(common.cluster_spec(name, common.free_subnets(1)[0], groups, locality=locality))
    _cli(env, "up", str(spec))
    shared = Path(env["HPVC_STATE_DIR"]) / "clusters" / name / "shared"
    subprocess.run(["mpicc.openmpi", "-O2", "-o", str(shared / "pingpong"), str(SOURCE)],
                   check=True)  # fmt: skip
    _cli(env, "exec", name, "compute0", "--", "sh", "-c", JOB)
    _wait(env, name, rf" round {CUT_AT}\b", 60)
    dest = tmp / f"{name}.ckpt"
    ck_s, doc = _cli(env, "checkpoint", name, "--out", str(dest), "--stop", "--json")
    summary = json.loads(doc)
    restore_s, _ = _cli(env, "restore", str(dest))
    out = _wait(env, name, r"DONE \d+ \d+", 120)
    _cli(env, "down", name)
    subprocess.run(["rm", "-rf", str(dest)], check=True)
    return {
        "checkpoint_s": ck_s,
        "frozen_s": float(summary["frozen_s"]),
        "size": int(summary["size"]),
        "restore_s": restore_s,
        "job_pause_s": _pause(out),
        "finished_right": f"DONE {ROUNDS} {ROUNDS * ROUNDS}" in out,
    }


def _mmm(v: list[float]) -> str:
    return f"{min(v):.2f} / {statistics.median(v):.2f} / {max(v):.2f}"


def main() -> None:
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    out = Path(sys.argv[2] if len(sys.argv) > 2 else "bench/results/checkpoint-mpi")
    common.ensure_image("hpc")
    samples: dict[str, list[dict[str, float | bool]]] = {x: [] for x in LOCALITIES}
    with common.scratch_state("checkpoint-mpi") as (tmp, store):
        env = {**os.environ, "HPVC_STATE_DIR": str(store.root),
               "HPVC_IMAGE_DIR": str(default_store())}  # fmt: skip
        for i in range(reps):
            for loc in LOCALITIES if i % 2 == 0 else tuple(reversed(LOCALITIES)):
                print(f"repetition {i + 1}/{reps}, locality {loc}", flush=True)
                samples[loc].append(one(tmp, env, f"bxmpi{loc}{i}", loc))
    doc = {"host": common.host_facts(mpi=True), "reps": reps, "rounds": ROUNDS,
           "delay_us": DELAY_US, "cut_at": CUT_AT, "samples": samples}  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(doc, indent=2) + "\n")
    lines = [
        "# An MPI job inside container nodes across `hpvc checkpoint --stop` and `hpvc restore`",
        "",
        f"{doc['host']['date']}, {doc['host']['cpu_model']}, {doc['host']['cpus']} CPUs;"
        f" 3 nodes x 256 MiB, {reps} repetitions, localities alternated; min / median / max.",
        "",
        "| locality | checkpoint s (CLI) | nodes frozen s | size MiB | restore s (CLI) |"
        " job paused s | finished right |",
        "|---|---|---|---|---|---|---|",
    ]
    for loc in LOCALITIES:
        s = samples[loc]

        def col(k: str, s: list[dict[str, float | bool]] = s) -> list[float]:
            return [float(x[k]) for x in s]

        lines.append(
            f"| {loc} | {_mmm(col('checkpoint_s'))} | {_mmm(col('frozen_s'))} |"
            f" {_mmm([v / 2**20 for v in col('size')])} | {_mmm(col('restore_s'))} |"
            f" {_mmm(col('job_pause_s'))} | {sum(bool(x['finished_right']) for x in s)}/{len(s)} |"
        )
    (out / "report.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
