#!/usr/bin/env python3
"""libuct_ivshmem.so against UCX's own posix shared memory and TCP, on one host.

    python3 scripts/bench/ucx_ivshmem_host.py OUT_DIR [--reps N]

Two ucx_perftest processes on this host, each pinned to a CPU of its own, the module loaded with LD_PRELOAD and a
zero-filled 64 MiB region file in /dev/shm; UCX_TLS names one transport per run
(``ivshmem``, ``posix`` or ``tcp`` over loopback), so a run that could not use it
fails instead of measuring another. Latency is tag_lat (half round trip, the median
of the run's iterations), bandwidth tag_bw, 8 B to 4 MiB. Transports are alternated
inside each repetition (the order rotates), so machine noise falls on all of them.
UCX_MAX_RNDV_LANES=0 for all three, as ``hpvc run`` sets it in guests.
Writes OUT_DIR/raw.csv (every run) and OUT_DIR/summary.md (min/median/max per
transport and size, and each one's median ratio to posix measured in the same runs).

This measures the transport's own cost on a host, both processes native: it is not
the guests' figure (that is ``hpvc bench locality --kind vm``), and it sets the floor
the guests can reach.
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TRANSPORTS = ["ivshmem", "posix", "tcp"]
SIZES = [8, 1024, 65536, 4 << 20]
# Final: iterations, latency 50%ile / average / overall (us), bandwidth average (MB/s), ...
FINAL = re.compile(r"Final:\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)")
LANE = re.compile(r"ep_cfg\[\d+\]: tag\((\w+)/")
# Server and client on CPUs of their own: two busy-polling processes that share a CPU
# stream only while both are scheduled (unpinned runs were bimodal, 0.06 or 150 MB/s).
_cpus = sorted(os.sched_getaffinity(0))
PIN = (["taskset", "-c", str(_cpus[0])], ["taskset", "-c", str(_cpus[-1])]) if len(_cpus) > 1 else ([], [])


def iterations(test: str, size: int) -> int:
    if test == "tag_lat":
        return 2000 if size <= 65536 else 50
    return 1000 if size <= 65536 else 50


def listening(port: int) -> bool:
    with open("/proc/net/tcp") as f:
        rows = [line.split() for line in f.readlines()[1:]]
    return any(r[1].endswith(f":{port:04X}") and r[3] == "0A" for r in rows)


def one(env: dict[str, str], test: str, size: int) -> tuple[float, float, str]:
    """(median latency us, bandwidth MB/s, lane) of one client/server run; a run that
    does not end in 120 s (the machine's CPUs taken by others) counts as NaN."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [*PIN[0], "ucx_perftest", "-p", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        while not listening(port) and server.poll() is None:
            time.sleep(0.02)
        try:
            client = subprocess.run(
                [*PIN[1], "ucx_perftest", "127.0.0.1", "-p", str(port), "-t", test, "-s",
                 str(size), "-n", str(iterations(test, size))],  # fmt: skip
                env=env, capture_output=True, text=True, timeout=120,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            return float("nan"), float("nan"), env["UCX_TLS"]
        server.wait(timeout=60)
    finally:
        if server.poll() is None:
            os.kill(server.pid, 9)
            server.wait()
    out = client.stdout + client.stderr
    final, lanes = FINAL.search(out), set(LANE.findall(out))
    if client.returncode != 0 or final is None:
        sys.exit(f"ucx_perftest {test} {size}: failed:\n{out}")
    return float(final.group(2)), float(final.group(5)), ",".join(sorted(lanes))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    build = Path(tempfile.mkdtemp(prefix="hpvc-ucxbench-"))
    region = Path("/dev/shm") / f"hpvc-ucxbench-{os.getpid()}"
    try:
        subprocess.run(["make", "-s", "-C", str(ROOT / "native" / "ucx"), f"OUT={build}"], check=True)
        with region.open("wb") as f:
            f.truncate(64 << 20)
        rows = measure(build / "libuct_ivshmem.so", region, args.reps)
    finally:
        region.unlink(missing_ok=True)
        subprocess.run(["rm", "-rf", str(build)], check=False)
    with (args.out / "raw.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["rep", "transport", "test", "size", "latency_us", "bandwidth_mbs", "lane"])
        w.writerows(rows)
    (args.out / "summary.md").write_text(summary(rows, args.reps))
    print((args.out / "summary.md").read_text())


def measure(module: Path, region: Path, reps: int) -> list[list[object]]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("UCX_")}
    base |= {"LD_PRELOAD": str(module), "UCX_IVSHMEM_PATH": str(region), "UCX_LOG_LEVEL": "info"}
    base["UCX_MAX_RNDV_LANES"] = "0"  # as hpvc run sets it in guests (docs/vms.md), for all three
    rows: list[list[object]] = []
    for rep in range(reps):
        order = TRANSPORTS[rep % 3 :] + TRANSPORTS[: rep % 3]
        for test in ("tag_lat", "tag_bw"):
            for size in SIZES:
                for tl in order:
                    lat, bw, lane = one(base | {"UCX_TLS": tl}, test, size)
                    if lane != tl:
                        sys.exit(f"{tl}: UCX used {lane}")
                    rows.append([rep, tl, test, size, lat, bw, lane])
    return rows


def summary(rows: list[list[object]], reps: int) -> str:
    def pick(tl: str, test: str, size: int, col: int) -> list[float]:
        return [float(r[col]) for r in rows if r[1] == tl and r[2] == test and r[3] == size]  # type: ignore[arg-type]

    timeouts = sum(1 for r in rows if r[4] != r[4])
    lines = [
        f"{reps} alternated repetitions; min / median / max; ratio = median / posix's median;"
        f" {timeouts} runs did not end in 120 s (left out)\n"
    ]
    for test, col, unit in (("tag_lat", 4, "us"), ("tag_bw", 5, "MB/s")):
        lines.append(f"\n{test} ({unit})\n\n| size | " + " | ".join(TRANSPORTS) + " | ivshmem/posix | tcp/ivshmem |")
        lines.append("|---" * (len(TRANSPORTS) + 3) + "|")
        for size in SIZES:
            cells, med = [], {}
            for tl in TRANSPORTS:
                v = [x for x in pick(tl, test, size, col) if x == x] or [float("nan")]
                med[tl] = statistics.median(v)
                cells.append(f"{min(v):.3g} / {med[tl]:.3g} / {max(v):.3g}")
            lines.append(
                f"| {size} | " + " | ".join(cells)
                + f" | {med['ivshmem'] / med['posix']:.2f} | {med['tcp'] / med['ivshmem']:.2f} |"
            )  # fmt: skip
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
