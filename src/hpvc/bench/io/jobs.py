"""What the block-I/O benchmark measures: its nodes and their limits, fio's jobs and argv.

Six 1-vCPU compute nodes, in this order: ``t10`` and ``t20`` (throttles,
measured against the target), ``w100`` and ``w900`` (bfq weights, their split
against 1:9), ``open`` and ``high`` (no limits, and limits far above what the
device gives: the cost of limits that do not bite, against fio on the host).
Every fio job runs with direct I/O and psync on a file of its own. Pure.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from hpvc.errors import HpvcError

GOAL_ERROR_PCT = 5.0
WEIGHT_TARGET = 9.0
FILE_MIB = 64
MEMORY = "256MiB"
MB = 1_000_000
HIGH_BPS = 10_000 * MB  # 10 GB/s: far above what a loop device gives
PARTS = ("throttle", "weight", "overhead")


@dataclass(frozen=True)
class Node:
    """A node of the benchmark cluster: its role in the benchmark and its io limits."""

    label: str
    io: dict[str, int]
    describe: str


NODES = (
    Node("t10", {"read_bps": 10 * MB, "write_bps": 5 * MB}, "throttle: read 10 MB/s, write 5 MB/s"),
    Node("t20", {"read_bps": 20 * MB, "write_bps": 20 * MB}, "throttle: read and write 20 MB/s"),
    Node("w100", {"weight": 100}, "bfq weight 100"),
    Node("w900", {"weight": 900}, "bfq weight 900"),
    Node("open", {}, "no limits"),
    Node("high", {"read_bps": HIGH_BPS, "write_bps": HIGH_BPS}, "throttles at 10 GB/s"),
)


@dataclass(frozen=True)
class Job:
    """One fio job: what it does to its file (always direct I/O, psync)."""

    key: str
    rw: str
    bs: str
    ramp_s: int = 0

    @property
    def direction(self) -> str:
        return "write" if "write" in self.rw else "read"


SEQ_READ = Job("seq_read_256k", "read", "256k")
SEQ_WRITE = Job("seq_write_256k", "write", "256k")
# Weight runs skip their first second: the two fio start some ms apart.
WEIGHT_JOBS = (Job("seq_read_256k", "read", "256k", 1), Job("rand_read_4k", "randread", "4k", 1))
OVERHEAD_CONFIGS = {
    "native": "fio on the host, same file system",
    "open": "fio in a node without limits",
    "high": "fio in a node with read/write throttles at 10 GB/s",
}


@dataclass(frozen=True)
class Side:
    """Where fio runs: in a node (``crun exec``) or on the host; the file it uses there."""

    label: str
    prefix: tuple[str, ...]
    file: str


def node_names() -> dict[str, str]:
    """Benchmark label -> hpvc node name."""
    return {n.label: f"compute{i}" for i, n in enumerate(NODES)}


def fio_argv(side: Side, job: Job, seconds: int) -> list[str]:
    argv = [*side.prefix, "fio", f"--name={job.key}", f"--filename={side.file}"]
    argv += [f"--rw={job.rw}", f"--bs={job.bs}", f"--size={FILE_MIB}M", "--direct=1"]
    argv += ["--ioengine=psync", f"--runtime={seconds}", "--time_based"]
    if job.ramp_s:
        argv.append(f"--ramp_time={job.ramp_s}")
    return [*argv, "--output-format=json"]


def parse_fio(out: str, job: Job) -> dict[str, float]:
    """Bandwidth (bytes/s), IOPS and runtime (ms) of fio's one job."""
    start = out.find("{")
    if start < 0:
        raise HpvcError(f"fio {job.key}", "no JSON in fio's output")
    side = json.loads(out[start:])["jobs"][0][job.direction]
    return {
        "bw_bytes": float(side["bw_bytes"]),
        "iops": float(side["iops"]),
        "runtime_ms": float(side["runtime"]),
    }


def rotate(items: list[Any], rep: int) -> list[Any]:
    k = rep % len(items)
    return items[k:] + items[:k]


def throttle_targets() -> list[tuple[str, Job, int]]:
    """(node label, job, target bytes/s) for every throttle under test."""
    out: list[tuple[str, Job, int]] = []
    for n in NODES[:2]:
        out += [(n.label, SEQ_READ, n.io["read_bps"]), (n.label, SEQ_WRITE, n.io["write_bps"])]
    return out
