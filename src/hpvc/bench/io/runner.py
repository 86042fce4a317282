"""Block-I/O limits of container nodes, measured with fio: throttles, weights, overhead.

The benchmark makes its own disk: a sparse file on a loop device, ext4,
mounted as a throw-away state directory, so the nodes' files and the limits
hpvc puts on the state directory's disk are on a device nobody else uses.
One container cluster (image "hpc", shared pinning, no hugepages, commodity)
holds six 1-vCPU compute nodes, in this order:

- ``t10`` (read 10 MB/s, write 5 MB/s) and ``t20`` (read and write 20 MB/s):
  throttle accuracy, measured against the target (error in %, goal within 5%);
- ``w100`` and ``w900`` (bfq weights 100 and 900): both read at the same time
  (sequential 256 KiB and random 4 KiB), the split against the 1:9 target;
- ``open`` (no limits) and ``high`` (10 GB/s, far above what the device
  gives): the cost of the limits when they do not bite, against fio run
  natively on the host on the same file system.

Every fio job runs with direct I/O and psync on a file of its own, laid out
beforehand from the host (the host's writes are not throttled) in the
cluster's shared directory, which every node sees at ``/shared``: all sides
read the same kind of file on the same file system, through no overlay.
Each repetition runs the three parts in a rotating order.

This module runs it; the nodes and fio jobs are ``io.jobs``', the disk
``io.disk``'s and the document and report ``io.report``'s.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from hpvc.bench import common
from hpvc.bench.io.disk import device_facts, loop_state
from hpvc.bench.io.jobs import (
    FILE_MIB,
    MB,
    MEMORY,
    NODES,
    OVERHEAD_CONFIGS,
    PARTS,
    SEQ_READ,
    SEQ_WRITE,
    WEIGHT_JOBS,
    Job,
    Side,
    fio_argv,
    node_names,
    parse_fio,
    rotate,
    throttle_targets,
)
from hpvc.bench.io.report import document
from hpvc.cluster import lifecycle, ops
from hpvc.errors import HpvcError, InputError, MissingDependency
from hpvc.progress import Progress, quiet
from hpvc.store import Store

TOOLS = {"fio": "fio", "losetup": "mount", "mkfs.ext4": "e2fsprogs", "umount": "mount"}


def preflight() -> None:
    common.require("bench io", ["crun", "ip"])
    for tool, pkg in TOOLS.items():
        if shutil.which(tool) is None:
            raise MissingDependency("bench io", f"{tool} not found", f"apt-get install {pkg}")


def check_seconds(seconds: int) -> None:
    if seconds < 1:
        raise InputError("--seconds", f"{seconds} is not a positive number of seconds", "")


# --- the cluster -----------------------------------------------------------------


def spec_text(name: str, subnet: str) -> str:
    """One compute node per entry of NODES, in order (compute0 = NODES[0], ...)."""
    lines = [common.cluster_spec(name, subnet, [], locality="none").rstrip("\n")]
    for n in NODES:
        lines += ["[[nodes]]", 'role = "compute"', "count = 1", "vcpus = 1", f'memory = "{MEMORY}"']
        if n.io:
            fields = ", ".join(f"{k} = {v}" for k, v in n.io.items())
            lines.append(f"io = {{ {fields} }}")
    return "\n".join(lines) + "\n"


def bring_up(tmp: Path, store: Store, progress: Progress) -> str:
    name = f"bio{os.getpid() % 100000}"
    subnet = common.free_subnets(1)[0]
    spec = tmp / f"{name}.toml"
    spec.write_text(spec_text(name, subnet))
    progress(f"cluster {name}: up, {len(NODES)} nodes ({subnet})")
    lifecycle.up(str(spec), store)
    return name


def limits_read_back(store: Store, name: str) -> dict[str, Any]:
    """Each node's throttles and weight as the kernel reports them; check they are set."""
    by_node = {n["name"]: n["limits"] for n in ops.status(name, store)["nodes"]}
    out: dict[str, Any] = {}
    for label, node in node_names().items():
        lim = by_node[node]
        got = {
            "read_bps": sorted(lim.get("io", {}).get("read_bps", {}).values()),
            "write_bps": sorted(lim.get("io", {}).get("write_bps", {}).values()),
            "weight": lim.get("io_weight"),
        }
        want = next(n.io for n in NODES if n.label == label)
        for key, value in want.items():
            have = got[key] if key == "weight" else (got[key] or [None])[0]
            if have != value:
                raise HpvcError(f"node {label} ({node})", f"{key} is {have}, not {value}")
        out[label] = {"node": node, **got}
    return out


def sides(store: Store, name: str) -> dict[str, Side]:
    """Every node and the host, each with its own data file in the shared directory."""
    shared = store.cluster_dir(name) / "shared"
    out = {
        label: Side(label, tuple(ops.exec_argv(name, node, [], store)), f"/shared/{label}")
        for label, node in node_names().items()
    }
    out["native"] = Side("native", (), str(shared / "native"))
    return out


def layout_files(store: Store, name: str, progress: Progress) -> None:
    """Write every side's file from the host (direct I/O: real blocks, not throttled)."""
    shared = store.cluster_dir(name) / "shared"
    progress(f"laying out {len(NODES) + 1} files of {FILE_MIB} MiB")
    for label in [*node_names(), "native"]:
        argv = ["fio", "--name=layout", f"--filename={shared / label}", "--rw=write"]
        argv += ["--bs=1M", f"--size={FILE_MIB}M", "--direct=1", "--ioengine=psync"]
        common.sh(argv, f"fio layout of {label}")


# --- fio -------------------------------------------------------------------------


def _finish(p: subprocess.Popen[str], side: Side, job: Job, timeout: float) -> dict[str, float]:
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        raise HpvcError(
            f"fio {job.key} in {side.label}", f"still running after {timeout:.0f} s"
        ) from None
    if p.returncode != 0:
        lines = [x for x in (err or out).strip().splitlines() if x.strip()]
        why = lines[-1] if lines else f"exit code {p.returncode}"
        raise HpvcError(f"fio {job.key} in {side.label}", why)
    return parse_fio(out, job)


def fio_together(todo: list[Side], job: Job, seconds: int) -> list[dict[str, float]]:
    """The same job on several sides, all started at once; results in order."""
    procs = [
        subprocess.Popen(
            fio_argv(s, job, seconds), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for s in todo
    ]
    timeout = seconds + job.ramp_s + 120
    try:
        return [_finish(p, s, job, timeout) for p, s in zip(procs, todo, strict=True)]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def fio(side: Side, job: Job, seconds: int) -> dict[str, float]:
    return fio_together([side], job, seconds)[0]


# --- the three parts, one repetition each ------------------------------------------


def throttle_once(s: dict[str, Side], seconds: int, rep: int, progress: Progress) -> list[Any]:
    out = []
    for label, job, target in rotate(throttle_targets(), rep):
        r = fio(s[label], job, seconds)
        err = (r["bw_bytes"] - target) / target * 100
        progress(
            f"  throttle {label} {job.direction}: {r['bw_bytes'] / MB:.2f} MB/s"
            f" (target {target / MB:g}, {err:+.1f}%)"
        )
        out.append({"rep": rep, "node": label, "job": job.key, "target_bps": target, **r})
    return out


def weight_once(s: dict[str, Side], seconds: int, rep: int, progress: Progress) -> list[Any]:
    out = []
    for job in rotate(list(WEIGHT_JOBS), rep):
        low, high = fio_together([s["w100"], s["w900"]], job, seconds)
        ratio = high["bw_bytes"] / low["bw_bytes"]
        progress(
            f"  weight {job.key}: w100 {low['bw_bytes'] / MB:.1f} MB/s,"
            f" w900 {high['bw_bytes'] / MB:.1f} MB/s, 1:{ratio:.2f}"
        )
        out.append({"rep": rep, "job": job.key, "w100": low, "w900": high, "ratio": ratio})
    return out


def overhead_once(s: dict[str, Side], seconds: int, rep: int, progress: Progress) -> list[Any]:
    out = []
    for job in rotate([SEQ_READ, SEQ_WRITE], rep):
        for i, config in enumerate(rotate(list(OVERHEAD_CONFIGS), rep)):
            r = fio(s[config], job, seconds)
            progress(f"  overhead {job.key} {config}: {r['bw_bytes'] / MB:.0f} MB/s")
            out.append({"rep": rep, "order": i, "job": job.key, "config": config, **r})
    return out


PART_RUNNERS = {"throttle": throttle_once, "weight": weight_once, "overhead": overhead_once}


def repetitions(
    s: dict[str, Side], repeat: int, seconds: int, progress: Progress
) -> dict[str, list[Any]]:
    samples: dict[str, list[Any]] = {p: [] for p in PARTS}
    for rep in range(repeat):
        for part in rotate(list(PARTS), rep):
            progress(f"repetition {rep + 1}/{repeat}: {part}")
            samples[part] += PART_RUNNERS[part](s, seconds, rep, progress)
    return samples


def node_fio_version(s: Side) -> str:
    try:
        return common.sh([*s.prefix, "fio", "--version"], "fio --version in a node")
    except HpvcError as e:
        return f"unknown ({e.why})"


def run(repeat: int = 3, seconds: int = 5, progress: Progress = quiet) -> dict[str, Any]:
    """Measure throttles, weights and overhead ``repeat`` times; return the results document."""
    if repeat < 1:
        raise InputError("--repeat", f"{repeat} is not a positive count", "")
    check_seconds(seconds)
    preflight()
    common.ensure_image("hpc", progress)
    facts = common.host_facts(mpi=False)
    facts["fio"] = common.sh(["fio", "--version"], "fio --version")
    t0 = time.perf_counter()
    with loop_state(progress) as (tmp, store, dev):
        name = bring_up(tmp, store, progress)
        facts["limits_read_back"] = limits_read_back(store, name)
        s = sides(store, name)
        facts["fio_in_nodes"] = node_fio_version(s["open"])
        layout_files(store, name, progress)
        facts["disk"] = device_facts(dev, tmp)
        samples = repetitions(s, repeat, seconds, progress)
        progress("tearing the cluster down")
    facts["wall_s"] = time.perf_counter() - t0
    return document(facts, seconds, repeat, samples, list(os.getloadavg()))
