#!/usr/bin/env python3
"""MPICH ping-pong between two co-resident container nodes (locality "shm"),
launched both ways, alternated: the image's hydra, each node a host of its own
to MPICH (how `hpvc run` ran MPICH before hpvc.cluster.pmi), and hpvc's PMI,
both nodes one host. One cluster, ROUNDS rounds, the order swapped every round;
prints min/median/max per launcher and writes the samples to OUT/results.json.
  usage: .venv/bin/python scripts/bench/mpich-coresident.py [ROUNDS] [OUT]
Run as root, from the checkout (builds the `mpich` image first if missing).
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from hpvc.bench import common
from hpvc.bench.locality import runner
from hpvc.cluster import hydra, ops
from hpvc.cluster.lifecycle import open_env
from hpvc.image import resolve_image
from hpvc.image.mpi import find_mpi

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 7
OUT = Path(sys.argv[2] if len(sys.argv) > 2 else tempfile.mkdtemp(prefix="/tmp/mpich-coresident."))


def sizes(stdout: str) -> dict[int, dict[str, Any]]:
    rows = [json.loads(x) for x in stdout.splitlines() if x.startswith("{")]
    return {int(r["bytes"]): r for r in rows}


def main() -> None:
    mpich = runner.MPIS["mpich"]
    runner.preflight(mpich)
    runner.ensure_image(mpich, print)
    image = resolve_image(mpich.image)
    mpi = find_mpi(image.rootfs, image.env)
    assert mpi is not None
    with common.scratch_state("mpich-coresident", print) as (tmp, store):
        binary = common.build_native("pingpong", tmp, mpich.mpicc)
        by_pmi = runner.bring_up(tmp, store, "shm", common.free_subnets(1)[0], binary, mpich.image)
        name = store.names()[0]
        rec = store.get(name)
        plan = rec.the_plan()
        backend, env = open_env(store, rec)
        args = runner.pingpong_args(str(store.cluster_dir(name) / "mpi" / binary.name))

        def by_hydra() -> str:
            done = hydra.run(
                lambda node, a: backend.exec_argv(env, plan, node, a),
                mpi.launcher,
                ops.node_counts(plan, 2),
                args,
                capture=True,
            )
            assert not isinstance(done, int) and done.returncode == 0, done
            return done.stdout

        launchers = {"hydra": by_hydra, "hpvc-pmi": by_pmi}
        samples: dict[str, list[dict[int, dict[str, Any]]]] = {k: [] for k in launchers}
        for r in range(ROUNDS):
            order = list(launchers) if r % 2 == 0 else list(reversed(launchers))
            for which in order:
                print(f"round {r + 1}/{ROUNDS}: {which}", file=sys.stderr)
                samples[which].append(sizes(launchers[which]()))
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "results.json").write_text(json.dumps(samples, indent=1))
    print("| metric | launcher | min | median | max |\n|---|---|---|---|---|")
    for m in runner.METRICS:
        for which, runs in samples.items():
            xs = [float(run[m.bytes][m.field]) for run in runs]
            cells = [runner.fmt(v, m) for v in (min(xs), statistics.median(xs), max(xs))]
            print(f"| {m.key} ({m.unit}) | {which} | " + " | ".join(cells) + " |")
    print(f"samples: {OUT / 'results.json'}", file=sys.stderr)


if __name__ == "__main__":
    main()
