#!/usr/bin/env python3
"""What the departure bookkeeping costs the region transport: this tree's module
against the module at an earlier git revision, on one host.

    python3 scripts/bench/ucx_fallback_cost.py OUT_DIR --base REV [--reps N]

Both modules are built from their own sources (``git archive REV native/ucx``)
against the installed UCX, each with a region file of its own (their headers
differ in version). Two ucx_perftest processes pinned to CPUs of their own, as in
ucx_ivshmem_host.py (whose ``one`` runs each measurement), UCX_TLS=ivshmem:
tag_lat 8 B and 1 KiB (median half round trip), tag_bw 64 KiB and 4 MiB. The two
modules alternate inside each repetition, the order flipping every repetition.
Writes OUT_DIR/raw.csv and OUT_DIR/summary.md (min/median/max, and the ratio of
the medians, this tree's over the base's).
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import io
import os
import statistics
import subprocess
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "host_bench", ROOT / "scripts/bench/ucx_ivshmem_host.py"
)
assert _spec and _spec.loader
host_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(host_bench)

CASES = [("tag_lat", 8), ("tag_lat", 1024), ("tag_bw", 65536), ("tag_bw", 4 << 20)]


def build(src: Path, out: Path) -> Path:
    subprocess.run(
        ["make", "-s", "-C", str(src), f"OUT={out}", f"{out}/libuct_ivshmem.so"], check=True
    )
    return out / "libuct_ivshmem.so"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--base", required=True, help="git revision of the module to compare with")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="hpvc-ucxcost-"))
    regions = {}
    try:
        tar = subprocess.run(
            ["git", "-C", str(ROOT), "archive", args.base, "native/ucx"],
            check=True,
            capture_output=True,
        ).stdout
        with tarfile.open(fileobj=io.BytesIO(tar)) as t:
            t.extractall(work / "base", filter="data")
        modules = {
            "base": build(work / "base" / "native" / "ucx", work / "base-out"),
            "now": build(ROOT / "native" / "ucx", work / "now-out"),
        }
        rows = []
        for rep in range(args.reps):
            order = ["base", "now"] if rep % 2 == 0 else ["now", "base"]
            for test, size in CASES:
                for label in order:
                    region = Path("/dev/shm") / f"hpvc-ucxcost-{os.getpid()}-{label}-{rep}"
                    regions[label] = region
                    with region.open("wb") as f:
                        f.truncate(64 << 20)
                    env = {k: v for k, v in os.environ.items() if not k.startswith("UCX_")}
                    env |= {
                        "LD_PRELOAD": str(modules[label]),
                        "UCX_IVSHMEM_PATH": str(region),
                        "UCX_LOG_LEVEL": "info",
                        "UCX_TLS": "ivshmem",
                        "UCX_MAX_RNDV_LANES": "0",
                    }
                    lat, bw, lane = host_bench.one(env, test, size)
                    region.unlink()
                    assert lane == "ivshmem", f"{label}: UCX used {lane}"
                    rows.append([rep, label, test, size, lat, bw])
    finally:
        for r in regions.values():
            r.unlink(missing_ok=True)
        subprocess.run(["rm", "-rf", str(work)], check=False)
    with (args.out / "raw.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["rep", "module", "test", "size", "latency_us", "bandwidth_mbs"])
        w.writerows(rows)
    lines = [
        f"{args.reps} alternated repetitions; base = {args.base}; min / median / max\n",
        "| test | size | base | now | now/base (medians) |",
        "|---|---|---|---|---|",
    ]
    for test, size in CASES:
        col = 4 if test == "tag_lat" else 5
        med, cells = {}, []
        for label in ("base", "now"):
            v = [float(r[col]) for r in rows if r[1] == label and r[2] == test and r[3] == size]
            v = [x for x in v if x == x] or [float("nan")]
            med[label] = statistics.median(v)
            cells.append(f"{min(v):.3g} / {med[label]:.3g} / {max(v):.3g}")
        unit = "us" if test == "tag_lat" else "MB/s"
        ratio = med["now"] / med["base"]
        lines.append(f"| {test} ({unit}) | {size} | {cells[0]} | {cells[1]} | {ratio:.3f} |")
    (args.out / "summary.md").write_text("\n".join(lines) + "\n")
    print((args.out / "summary.md").read_text())


if __name__ == "__main__":
    main()
