#!/usr/bin/env python3
"""What `hpvc run --detach` costs an MPI job against `hpvc run`, measured together.

One container cluster of two 1-vCPU compute nodes sharing the cluster's
namespaces and /dev/shm (locality "shm", the default), Open MPI (image `hpc`),
native/bench/pingpong.c (latency and bandwidth per message size, the locality
benchmark's program and sizes), three ways per repetition, the order rotated
each time:

- native: the host's mpirun, two ranks on the host (vader: shared memory);
- attached: `hpvc run NAME -n 2` (the host's mpirun, each rank exec'd into its
  node, both nodes one host to Open MPI: vader between the nodes);
- detached: `hpvc run NAME -n 2 --detach` through the CLI, as a user runs it,
  then `hpvc.cluster.jobs.wait` and its output (the image's mpirun in
  compute0, rank 1 sent to compute1 through its agent, both ranks one host's
  to Open MPI: hpvc.cluster.jobs_onehost; before that module each node was a
  host of its own, and the ranks talked TCP over the cluster bridge: the
  2026-11-28 08:4x run in docs/benchmarks.md, taken with it switched off).

Also recorded: how long `hpvc run --detach` takes to return (Python's start
included), the CLI's wall time. Ratios per repetition against native (latency
native/x, bandwidth x/native: 1.0 = as fast as native); min/median/max.

  usage: .venv/bin/python scripts/bench/detach-pingpong.py [REPS] [OUT]
Run as root, from the checkout (the `hpc` image is built if missing).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from hpvc.bench import common
from hpvc.bench.locality import runner
from hpvc.bench.stats import summary
from hpvc.cluster import jobs
from hpvc.cluster.status import open_cluster
from hpvc.image import default_store

REPS = int(sys.argv[1]) if len(sys.argv) > 1 else 7
OUT = Path(sys.argv[2] if len(sys.argv) > 2 else tempfile.mkdtemp(prefix="/tmp/detach-pp."))


def detached(store: Any, name: str, binary: Path, starts: list[float]) -> str:
    env = {**os.environ, "HPVC_STATE_DIR": str(store.root), "HPVC_IMAGE_DIR": str(default_store())}
    argv = [sys.executable, "-m", "hpvc", "run", name, "-n", "2", "--detach", "--json", "--"]
    t0 = time.perf_counter()
    done = subprocess.run([*argv, *runner.pingpong_args(str(binary))], env=env,
                          capture_output=True, text=True, check=False)  # fmt: skip
    starts.append(time.perf_counter() - t0)
    if done.returncode != 0:
        raise SystemExit(f"hpvc run --detach: {done.stderr.strip()[-400:]}")
    num = int(json.loads(done.stdout)["job"])
    # Waited for as `hpvc jobs --wait` does (a look each second): looking more often
    # took CPU from the job on this 2-CPU machine (1 MiB at 0.84 of native, 0.2 s).
    job = jobs.wait(store, name, num, poll_s=1.0)
    if (job.state, job.exit_code) != ("exited", 0):
        raise SystemExit(f"detached job {num}: {job.state} {job.exit_code}")
    backend, cenv, plan = open_cluster(name, store)
    return jobs.output(backend, cenv, plan, job)


def main() -> None:
    mpi = runner.MPIS["openmpi"]
    runner.preflight(mpi)
    runner.ensure_image(mpi, print)
    facts = common.host_facts(mpi=True)
    starts: list[float] = []
    with common.scratch_state("detach-pingpong", print) as (tmp, store):
        binary = common.build_native("pingpong", tmp, mpi.mpicc)
        attached = runner.bring_up(tmp, store, "shm", common.free_subnets(1)[0], binary)
        name = store.names()[0]
        inside = store.cluster_dir(name) / "mpi" / binary.name
        runners: dict[str, Callable[[], str]] = {
            "native": partial(runner.run_native, mpi, binary),
            "attached": attached,
            "detached": partial(detached, store, name, inside, starts),
        }
        runs = runner.repetitions(runners, REPS, lambda m: print(m, file=sys.stderr))
    doc: dict[str, Any] = {
        "benchmark": "detach-pingpong",
        **facts,
        "repeat": REPS,
        "pingpong": {"max_bytes": runner.MAX_BYTES, "iterations": runner.ITERATIONS},
        "loadavg_end": list(os.getloadavg()),
        "configs": {c: {"runs": r, "metrics": runner.metrics_of(r)} for c, r in runs.items()},
        "ratios": {c: runner.ratios_of(runs["native"], runs[c]) for c in ("attached", "detached")},
        "detach_cli_s": {"samples": starts, **summary(starts)},
    }
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "results.json").write_text(json.dumps(doc, indent=1))
    lines = ["| metric | config | min | median | max | ratio to native (median) |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for m in runner.METRICS:
        for c in runs:
            s = doc["configs"][c]["metrics"][m.key]
            ratio = doc["ratios"][c][m.key]["median"] if c != "native" else 1.0
            cells = [runner.fmt(s[k], m) for k in ("min", "median", "max")]
            lines.append(f"| {m.key} ({m.unit}) | {c} | {' | '.join(cells)} | {ratio:.2f} |")
    q = doc["detach_cli_s"]
    lines.append(
        f"\n`hpvc run --detach` returned in {q['min']:.2f} / {q['median']:.2f} /"
        f" {q['max']:.2f} s (min / median / max, CLI start included)."
    )
    (OUT / "report.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    walls = {c: round(statistics.median(x["wall_s"] for x in r), 2) for c, r in runs.items()}
    print(f"median wall s per run: {walls}")
    print(f"results: {OUT / 'results.json'}", file=sys.stderr)


if __name__ == "__main__":
    main()
