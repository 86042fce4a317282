#!/usr/bin/env python3
"""Open MPI in VM guests under Slurm, launched both ways, alternated (issue 30
Figures): Slurm as the launcher (`srun --mpi=pmix`, each rank's PMIx carried
by its task relay, native/agent/chan.c) against `mpirun` inside the guests
(its daemons started through the agents by hpvc-rsh), in the same job, the
same two guests (one per host of the private test cluster, TCG here).

Per round, in an order swapped every round:
  pingpong  ranks 0 and 1 on the two hosts' guests (TCP between them, Open
            MPI's default both ways), native/bench/pingpong 65536 100;
  start     wall time of a 4-rank MPI_Init + MPI_Finalize program: the step
            `srun -N2 -n4 --mpi=pmix` against `srun -N1 -n1 mpirun -np 4`.
Prints min/median/max per launcher and the ratios of medians; writes every
sample to OUT/results.json.
  usage: .venv/bin/python scripts/bench/vm-pmix.py [ROUNDS] [OUT] [USER]
Run as root, from the checkout (the `hpc` image and its guest are built first
if missing); the jobs are submitted by USER (default nobody).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from hpvc.bench.slurm import cluster as bench_slurm
from hpvc.image import resolve_image
from hpvc.image.guest import build_guest

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 5
OUT = Path(sys.argv[2] if len(sys.argv) > 2 else tempfile.mkdtemp(prefix="/tmp/vm-pmix."))
USER = sys.argv[3] if len(sys.argv) > 3 else "nobody"
REPO = Path(__file__).resolve().parents[2]

SPEC = """name = "pmixb"
kind = "vm"
image = "hpc"
[network]
subnet = "10.88.61.0/24"
[tuning]
pinning = "shared"
hugepages = "none"
partition = "commodity"
[[nodes]]
role = "compute"
count = 2
vcpus = 1
memory = "384MiB"
"""

HELLO_C = """#include <mpi.h>
int main(int argc, char **argv) { MPI_Init(&argc, &argv); MPI_Finalize(); return 0; }
"""

# Open MPI's defaults both ways: TCP between the guests, shared memory within one.
MPIRUN = "srun -N1 -n1 mpirun"
STEPS = {
    "pingpong srun-pmix": "srun -N2 -n2 --mpi=pmix /root/pingpong 65536 100",
    "pingpong mpirun": f"{MPIRUN} -np 2 --host compute0,compute1 /root/pingpong 65536 100",
    "start srun-pmix": "srun -N2 -n4 --overcommit --mpi=pmix /root/hello",
    "start mpirun": f"{MPIRUN} -np 4 --host compute0:2,compute1:2 /root/hello",
}


def job_script() -> str:
    lines = [
        "set -u",
        "srun -N2 -n2 hostname",  # boots the guests
        *(
            f"srun -N2 -n2 --input=all sh -c 'cat > /root/{b}; chmod +x /root/{b}' < {b}"
            for b in ("pingpong", "hello")
        ),
    ]
    names = list(STEPS)
    for r in range(ROUNDS):
        order = names if r % 2 == 0 else names[::-1]
        for name in order:
            lines += [
                f'echo "@@ {name} {r} $(date +%s.%N)"',
                STEPS[name],
                f'echo "@@ end {name} {r} $? $(date +%s.%N)"',
            ]
    return "\n".join(lines) + "\n"


def parse(text: str) -> dict[str, list[dict[str, Any]]]:
    samples: dict[str, list[dict[str, Any]]] = {n: [] for n in STEPS}
    blocks = re.findall(
        r"^@@ (\S+ \S+) (\d+) ([\d.]+)\n(.*?)^@@ end \1 \2 (\d+) ([\d.]+)$", text, re.M | re.S
    )
    for name, r, t0, body, rc, t1 in blocks:
        rows = {int(x["bytes"]): x for x in map(json.loads, re.findall(r"^\{.*\}$", body, re.M))}
        samples[name].append(
            {"round": int(r), "rc": int(rc), "wall_s": float(t1) - float(t0), "pingpong": rows}
        )
    return samples


def stats(xs: list[float]) -> dict[str, float]:
    return {"min": min(xs), "median": statistics.median(xs), "max": max(xs)}


def main() -> None:
    build_guest(resolve_image("hpc"))
    user = bench_slurm.Submitter.named(USER)
    tmp = Path(tempfile.mkdtemp(prefix="hpvc-vm-pmix-"))
    os.chmod(tmp, 0o755)
    work = tmp / "work"
    work.mkdir()
    os.chown(work, user.uid, user.gid)
    try:
        make = ["make", "-s", "-C", str(REPO / "native" / "bench"), f"OUT={work}"]
        subprocess.run(make, check=True)
        (work / "hello.c").write_text(HELLO_C)
        cc = ["mpicc", "-O2", "-o", str(work / "hello"), str(work / "hello.c")]
        subprocess.run(cc, check=True)
        (work / "vm.toml").write_text(SPEC)
        (work / "job.sh").write_text("#!/bin/bash\n" + job_script())
        for p in work.iterdir():
            os.chown(p, user.uid, user.gid)
        args = f"binds={work} kinds=container,vm"
        with bench_slurm.private_slurm(tmp, "10.88.0.0/16", print, extra_args=args) as c:
            out = work / "job.out"
            argv = ["sbatch", "--parsable", "-N2", f"--hpvc={work / 'vm.toml'}", "-o", str(out)]
            r = c.submit(user, [*argv, str(work / "job.sh")], work)
            assert r.returncode == 0, r.stderr
            job = r.stdout.strip().split(";")[0]
            deadline = time.monotonic() + 1800
            while time.monotonic() < deadline:
                q = c.submit(user, ["squeue", "-h", "-j", job, "-o", "%T"], work)
                if q.stdout.strip() == "":
                    break
                time.sleep(2)
            text = out.read_text()
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / "job.out").write_text(text)
        samples = parse(text)
        assert all(len(v) == ROUNDS and all(s["rc"] == 0 for s in v) for v in samples.values()), (
            text
        )
        summary: dict[str, Any] = {}
        for name, v in samples.items():
            if name.startswith("pingpong"):
                for size in (1, 1024, 65536):
                    summary[f"{name} latency_us {size}"] = stats(
                        [s["pingpong"][size]["latency_us"] for s in v]
                    )
                summary[f"{name} bandwidth_MBps 65536"] = stats(
                    [s["pingpong"][65536]["bandwidth_MBps"] for s in v]
                )
            else:
                summary[f"{name} wall_s"] = stats([s["wall_s"] for s in v])
        ratios = {
            k.replace("srun-pmix", "srun-pmix/mpirun"): summary[k]["median"]
            / summary[k.replace("srun-pmix", "mpirun")]["median"]
            for k in summary
            if "srun-pmix" in k
        }
        result = {"rounds": ROUNDS, "user": USER, "summary": summary, "ratios": ratios,
                  "samples": samples}  # fmt: skip
        (OUT / "results.json").write_text(json.dumps(result, indent=1) + "\n")
        for k, s in summary.items():
            print(f"{k:45s} min {s['min']:10.2f} median {s['median']:10.2f} max {s['max']:10.2f}")
        for k, x in ratios.items():
            print(f"{k:45s} ratio of medians {x:.3f}")
        print(f"results: {OUT / 'results.json'}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
