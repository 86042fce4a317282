#!/usr/bin/env python3
"""What starting a command under a node's init costs (hpvc.backends.crun.nodeinit).

One container cluster of two nodes sharing memory (locality "shm": their init
is hpvc-nodeinit). Three ways of running `true` in its head node, alternated
round by round:

- crun: `crun exec CID true`, the command forked by crun from outside the
  node (how hpvc started every command before 2026-11-28, and still does in
  clusters started before);
- nodeinit: `crun exec CID /dev/hpvc-nodeinit run -- true`, the client
  handing the command to the node's init (hpvc since 2026-11-28 for such
  nodes);
- hpvc exec: `hpvc exec NAME head0 -- true` as a user runs it, CLI start
  included (through the client).

Wall clock of each, min / median / max, into OUT/results.json and report.md.
  usage: .venv/bin/python scripts/bench/exec-nodeinit.py [ROUNDS] [OUT]
Run as root, from the checkout (the `hpc` image is built if missing).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from hpvc.backends.crun import container as ct
from hpvc.backends.crun import nodeinit
from hpvc.bench import common
from hpvc.cluster import lifecycle
from hpvc.image import default_store

MODES = ("crun", "nodeinit", "hpvc exec")


def _timed(argv: list[str], env: dict[str, str] | None = None) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, env=env, stdin=subprocess.DEVNULL,
                   stdout=subprocess.DEVNULL)  # fmt: skip
    return time.perf_counter() - t0


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    out = Path(sys.argv[2] if len(sys.argv) > 2 else "bench/results/exec-nodeinit")
    common.ensure_image("hpc")
    samples: dict[str, list[float]] = {m: [] for m in MODES}
    with common.scratch_state("exec-nodeinit") as (tmp, store):
        name = "bxni"
        groups = [{"role": "head", "count": 1, "memory": "256MiB"},
                  {"role": "compute", "count": 1, "memory": "256MiB"}]  # fmt: skip
        spec = tmp / "spec.toml"
        spec.write_text(common.cluster_spec(name, common.free_subnets(1)[0], groups))
        lifecycle.up(str(spec), store)
        cid = ct.container_id(name, "head0")
        crun = ct.runtime()
        images = str(default_store())
        env = {**os.environ, "HPVC_STATE_DIR": str(store.root), "HPVC_IMAGE_DIR": images}
        argv = {
            "crun": [crun, "exec", cid, "true"],
            "nodeinit": [crun, "exec", cid, *nodeinit.client(["true"])],
            "hpvc exec": [sys.executable, "-m", "hpvc", "exec", name, "head0", "--", "true"],
        }
        for m in MODES:  # once each, not counted: caches
            _timed(argv[m], env)
        for i in range(rounds):
            order = MODES if i % 2 == 0 else tuple(reversed(MODES))
            for m in order:
                samples[m].append(_timed(argv[m], env))
        lifecycle.down(name, store)
    doc = {"host": common.host_facts(mpi=False), "rounds": rounds, "samples_s": samples}
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(doc, indent=2) + "\n")
    base = statistics.median(samples["crun"])
    lines = [
        "# Starting a command under the node's init",
        "",
        f"{doc['host']['date']}, {doc['host']['cpu_model']}, {doc['host']['cpus']} CPUs;"
        f" {rounds} rounds, alternated; min / median / max, ms (median / crun's median).",
        "",
        "| way | ms | vs crun |",
        "|---|---|---|",
    ]
    for m in MODES:
        v = samples[m]
        lines.append(f"| {m} | {min(v) * 1e3:.1f} / {statistics.median(v) * 1e3:.1f} /"
                     f" {max(v) * 1e3:.1f} | {statistics.median(v) / base:.2f} |")  # fmt: skip
    (out / "report.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
