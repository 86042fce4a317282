"""Native hpcc at one N with OpenBLAS and with the reference BLAS, alternated.

Run from the repository root as root: .venv/bin/python docs/results/hpcc-blas-ab-2026-11-26/ab.py
Writes results.json beside this file: every run's HPL and DGEMM, wall time and the BLAS
read from rank 0's /proc/PID/maps (hpvc.bench.hpcc.blas).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from hpvc.bench.hpcc import blas, runner
from hpvc.bench.hpcc.input import NB, grid, input_text
from hpvc.bench.hpcc.parse import checked

N, PROCS, REPEAT = int(sys.argv[1]) if len(sys.argv) > 1 else 3072, 2, 3
tmp = Path(tempfile.mkdtemp(prefix="hpvc-blas-ab-"))
rows = []
try:
    for rep in range(REPEAT):
        order = ["openblas", "system"] if rep % 2 == 0 else ["system", "openblas"]
        for choice in order:
            t0 = time.perf_counter()
            text = runner.run_native(tmp / choice, PROCS, input_text(N, NB, *grid(PROCS)), choice)
            wall = time.perf_counter() - t0
            v = checked(text, N, choice)
            rows.append({"rep": rep, "choice": choice, "wall_s": wall, "HPL": v["HPL"],
                         "DGEMM": v["DGEMM"], "blas": blas.identify(blas.mapped_paths(text))})
            print(rows[-1], flush=True)
finally:
    shutil.rmtree(tmp, ignore_errors=True)
out = {"n": N, "procs": PROCS, "loadavg_end": list(os.getloadavg()),
       "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "runs": rows}
(Path(__file__).parent / "results.json").write_text(json.dumps(out, indent=1) + "\n")
