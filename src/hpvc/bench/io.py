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
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpvc.backends import container as ct
from hpvc.bench import common
from hpvc.bench.stats import summary
from hpvc.cluster import lifecycle, ops
from hpvc.cluster.state import Store
from hpvc.errors import HpvcError, InputError, MissingDependency

Progress = Callable[[str], None]

GOAL_ERROR_PCT = 5.0
WEIGHT_TARGET = 9.0
DISK_BYTES = 2 << 30
FILE_MIB = 64
MEMORY = "256MiB"
MB = 1_000_000
HIGH_BPS = 10_000 * MB  # 10 GB/s: far above what a loop device gives
TOOLS = {"fio": "fio", "losetup": "mount", "mkfs.ext4": "e2fsprogs", "umount": "mount"}
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


def _quiet(_: str) -> None:
    pass


def preflight() -> None:
    common.require("bench io", ["crun", "ip"])
    for tool, pkg in TOOLS.items():
        if shutil.which(tool) is None:
            raise MissingDependency("bench io", f"{tool} not found", f"apt-get install {pkg}")


def check_seconds(seconds: int) -> None:
    if seconds < 1:
        raise InputError("--seconds", f"{seconds} is not a positive number of seconds", "")


# --- the loop-device state directory --------------------------------------------


def _sh(argv: list[str], what: str) -> str:
    r = subprocess.run(argv, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        lines = (r.stderr or r.stdout).strip().splitlines()
        raise HpvcError(what, lines[-1] if lines else f"exit code {r.returncode}")
    return r.stdout.strip()


def _release(tmp: Path, mnt: Path, dev: str | None, mounted: bool, progress: Progress) -> str:
    """Tear down the clusters, unmount, detach, remove; return what failed ("" if none)."""
    if mounted:
        errors = common.teardown_all(Store(mnt), progress)
        if errors:
            return f"{errors[0]} (kept: {mnt} mounted from {dev})"
        progress(f"unmounting {mnt}")
        r = subprocess.run(["umount", str(mnt)], capture_output=True, text=True, check=False)
        if r.returncode != 0:
            return f"umount {mnt}: {r.stderr.strip()} (kept: {dev})"
    if dev is not None:
        r = subprocess.run(["losetup", "-d", dev], capture_output=True, text=True, check=False)
        if r.returncode != 0:
            return f"losetup -d {dev}: {r.stderr.strip()} (kept: {tmp})"
    shutil.rmtree(tmp, ignore_errors=True)
    return ""


@contextmanager
def loop_state(progress: Progress = _quiet) -> Iterator[tuple[Path, Store, str]]:
    """A state directory on a fresh loop device (sparse file, ext4); all undone at the end.

    Yields (temporary directory, store, loop device).
    """
    tmp = Path(tempfile.mkdtemp(prefix="hpvc-bench-io-"))
    mnt, backing = tmp / "state", tmp / "disk.img"
    dev: str | None = None
    mounted = False
    failed = True
    try:
        with open(backing, "wb") as f:
            f.truncate(DISK_BYTES)
        dev = _sh(["losetup", "-f", "--show", str(backing)], f"loop device for {backing}")
        progress(f"loop device {dev}: ext4 on a {DISK_BYTES >> 30} GiB sparse file")
        _sh(["mkfs.ext4", "-q", "-F", dev], f"mkfs.ext4 {dev}")
        mnt.mkdir()
        _sh(["mount", dev, str(mnt)], f"mount {dev}")
        mounted = True
        yield tmp, Store(mnt), dev
        failed = False
    finally:
        left = _release(tmp, mnt, dev, mounted, progress)
        if left and failed:
            progress(f"clean-up failed: {left}")
    if left:
        raise HpvcError("bench io: clean-up", left, f"HPVC_STATE_DIR={mnt} hpvc down NAME")


def device_facts(dev: str, tmp: Path) -> dict[str, Any]:
    """The loop device as the kernel shows it now (scheduler, direct-I/O of the loop)."""
    name = Path(dev).name
    sysfs = Path("/sys/block") / name

    def read(rel: str) -> str | None:
        try:
            return (sysfs / rel).read_text().strip()
        except OSError:
            return None

    backing_fs = _sh(["df", "--output=fstype", str(tmp)], "df").splitlines()[-1].strip()
    return {
        "device": dev,
        "major_minor": read("dev"),
        "kind": "loop device on a sparse file, ext4",
        "size_bytes": DISK_BYTES,
        "backing_file_fs": backing_fs,
        "loop_direct_io": read("loop/dio"),
        "scheduler": _active(read("queue/scheduler")),
        "rotational": read("queue/rotational"),
    }


def _active(schedulers: str | None) -> str | None:
    """``none mq-deadline [bfq]`` -> ``bfq``."""
    for word in (schedulers or "").split():
        if word.startswith("["):
            return word.strip("[]")
    return schedulers


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


def node_names() -> dict[str, str]:
    """Benchmark label -> hpvc node name."""
    return {n.label: f"compute{i}" for i, n in enumerate(NODES)}


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
        label: Side(label, tuple(ct.exec_argv(ct.container_id(name, node), [])), f"/shared/{label}")
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
        _sh(argv, f"fio layout of {label}")


# --- fio -------------------------------------------------------------------------


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


def rotate(items: list[Any], rep: int) -> list[Any]:
    k = rep % len(items)
    return items[k:] + items[:k]


def throttle_targets() -> list[tuple[str, Job, int]]:
    """(node label, job, target bytes/s) for every throttle under test."""
    out: list[tuple[str, Job, int]] = []
    for n in NODES[:2]:
        out += [(n.label, SEQ_READ, n.io["read_bps"]), (n.label, SEQ_WRITE, n.io["write_bps"])]
    return out


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


# --- the results document ---------------------------------------------------------


def throttle_doc(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for label, job, target in throttle_targets():
        mine = [x for x in samples if x["node"] == label and x["job"] == job.key]
        bw = [float(x["bw_bytes"]) for x in mine]
        err = [(b - target) / target * 100 for b in bw]
        med = summary(err)["median"]
        out.append(
            {
                "node": label,
                "job": job.key,
                "direction": job.direction,
                "target_bps": target,
                "measured_bps": summary(bw),
                "error_pct": summary(err),
                "worst_abs_error_pct": max(abs(e) for e in err),
                "meets_goal": abs(med) <= GOAL_ERROR_PCT,
                "samples": mine,
            }
        )
    return out


def weight_doc(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for job in WEIGHT_JOBS:
        mine = [x for x in samples if x["job"] == job.key]
        out.append(
            {
                "job": job.key,
                "rw": job.rw,
                "bs": job.bs,
                "target_ratio": WEIGHT_TARGET,
                "ratio": summary([x["ratio"] for x in mine]),
                "w100_bps": summary([x["w100"]["bw_bytes"] for x in mine]),
                "w900_bps": summary([x["w900"]["bw_bytes"] for x in mine]),
                "samples": mine,
            }
        )
    return out


def _bw(samples: list[dict[str, Any]], job: str, config: str) -> list[float]:
    rows = sorted((x for x in samples if x["job"] == job and x["config"] == config),
                  key=lambda x: int(x["rep"]))  # fmt: skip
    return [float(x["bw_bytes"]) for x in rows]


def overhead_doc(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per job: bandwidth per config, and per-repetition ratios (1.0 = no overhead)."""
    pairs = {"open/native": ("open", "native"), "high/native": ("high", "native")}
    pairs["high/open"] = ("high", "open")
    out = []
    for job in (SEQ_READ, SEQ_WRITE):
        bw = {c: _bw(samples, job.key, c) for c in OVERHEAD_CONFIGS}
        ratios = {}
        for key, (a, b) in pairs.items():
            r = [x / y for x, y in zip(bw[a], bw[b], strict=True)]
            ratios[key] = {"samples": r, **summary(r)}
        out.append(
            {
                "job": job.key,
                "bps": {c: {"samples": v, **summary(v)} for c, v in bw.items()},
                "ratios": ratios,
                "samples": [x for x in samples if x["job"] == job.key],
            }
        )
    return out


def fio_settings(seconds: int) -> dict[str, Any]:
    return {
        "ioengine": "psync",
        "direct": 1,
        "file_mib": FILE_MIB,
        "runtime_s": seconds,
        "time_based": True,
        "weight_ramp_s": WEIGHT_JOBS[0].ramp_s,
        "files": "one per side, laid out from the host, in the cluster's shared directory"
        " (/shared in the nodes): same ext4 on the loop device, no overlay",
    }


def document(
    facts: dict[str, Any], seconds: int, repeat: int, samples: dict[str, list[Any]]
) -> dict[str, Any]:
    throttle = throttle_doc(samples["throttle"])
    return {
        "benchmark": "block-io",
        **facts,
        "repeat": repeat,
        "fio_job": fio_settings(seconds),
        "nodes": {n.label: {"io": n.io, "describe": n.describe} for n in NODES},
        "goal": {"throttle_abs_error_pct_at_most": GOAL_ERROR_PCT, "of": "median error"},
        "meets_goal": all(t["meets_goal"] for t in throttle),
        "throttle": throttle,
        "weight": weight_doc(samples["weight"]),
        "overhead": {
            "configs": OVERHEAD_CONFIGS,
            "ratio": "bandwidth a / bandwidth b per repetition; 1.0 = no overhead",
            "jobs": overhead_doc(samples["overhead"]),
        },
        "loadavg_end": list(os.getloadavg()),
    }


def node_fio_version(s: Side) -> str:
    try:
        return _sh([*s.prefix, "fio", "--version"], "fio --version in a node")
    except HpvcError as e:
        return f"unknown ({e.why})"


def run(repeat: int = 3, seconds: int = 5, progress: Progress = _quiet) -> dict[str, Any]:
    """Measure throttles, weights and overhead ``repeat`` times; return the results document."""
    if repeat < 1:
        raise InputError("--repeat", f"{repeat} is not a positive count", "")
    check_seconds(seconds)
    preflight()
    common.ensure_image("hpc", progress)
    facts = common.host_facts(mpi=False)
    facts["fio"] = _sh(["fio", "--version"], "fio --version")
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
    return document(facts, seconds, repeat, samples)


# --- the report --------------------------------------------------------------------


def _mb(v: float) -> str:
    return f"{v / MB:.2f}"


def _triple(s: dict[str, float], f: Callable[[float], str]) -> str:
    return f"{f(s['min'])} / {f(s['median'])} / {f(s['max'])}"


def _throttle_md(doc: dict[str, Any]) -> list[str]:
    lines = [
        "### Throttle accuracy (one node at a time)",
        "",
        "| node | job | target MB/s | measured MB/s min / median / max"
        " | error % min / median / max | goal met |",
        "|---|---|---|---|---|---|",
    ]
    for t in doc["throttle"]:
        err = _triple(t["error_pct"], lambda v: f"{v:+.1f}")
        met = "yes" if t["meets_goal"] else "no"
        lines.append(
            f"| {t['node']} | {t['job']} | {t['target_bps'] / MB:g}"
            f" | {_triple(t['measured_bps'], _mb)} | {err} | {met} |"
        )
    return lines


def _weight_md(doc: dict[str, Any]) -> list[str]:
    lines = [
        "### Weight split (bfq weights 100 and 900, both nodes reading at once; target 1:9)",
        "",
        "| job | w100 MB/s median | w900 MB/s median | ratio 1:x min / median / max | target |",
        "|---|---|---|---|---|",
    ]
    for w in doc["weight"]:
        lines.append(
            f"| {w['job']} | {_mb(w['w100_bps']['median'])} | {_mb(w['w900_bps']['median'])}"
            f" | {_triple(w['ratio'], lambda v: f'{v:.2f}')} | 1:{w['target_ratio']:g} |"
        )
    return lines


def _overhead_md(doc: dict[str, Any]) -> list[str]:
    ov = doc["overhead"]
    cfgs = list(ov["configs"])
    lines = [
        "### Overhead of idle limits (ratio = bandwidth a / b per repetition, 1.0 = none)",
        "",
        "| job | " + " | ".join(f"{c} MB/s median" for c in cfgs) + " | "
        + " | ".join(f"{k} min / median / max" for k in ov["jobs"][0]["ratios"]) + " |",
        "|---|" + "---|" * (len(cfgs) + len(ov["jobs"][0]["ratios"])),
    ]  # fmt: skip
    for j in ov["jobs"]:
        bws = " | ".join(f"{j['bps'][c]['median'] / MB:.0f}" for c in cfgs)
        rs = " | ".join(_triple(r, lambda v: f"{v:.3f}") for r in j["ratios"].values())
        lines.append(f"| {j['job']} | {bws} | {rs} |")
    lines += ["", *(f"- {c}: {d}" for c, d in ov["configs"].items())]
    return lines


def _page_cache_note(disk: dict[str, Any]) -> list[str]:
    if disk.get("loop_direct_io") != "0":
        return []
    return [
        "The loop device reads and writes its backing file through the host's page cache"
        " (loop direct I/O 0), so unthrottled bandwidth is bounded by memory and CPU, not"
        " by a disk: the overhead ratios compare CPU paths and are noisy on a shared machine.",
        "",
    ]


def report_md(doc: dict[str, Any]) -> str:
    disk, job = doc["disk"], doc["fio_job"]
    lines = [
        f"Block I/O of container nodes, fio ({doc['fio']}; in the nodes {doc['fio_in_nodes']}),"
        f" {doc['repeat']} repetitions (parts alternated), {job['runtime_s']} s per fio run,"
        f" direct I/O, psync, on {doc['host']} ({doc['cpu_model']}, {doc['cpus']} CPUs),"
        f" kernel {doc['kernel']}, {doc['crun']}, {doc['date']}.",
        "",
        f"Device: {disk['device']} ({disk['kind']}, {disk['size_bytes'] >> 30} GiB, backing"
        f" file on {disk['backing_file_fs']}, loop direct I/O {disk['loop_direct_io']}),"
        f" scheduler `{disk['scheduler']}`. Goal: throttles within"
        f" {GOAL_ERROR_PCT:g}% of target (median error):"
        f" {'met' if doc['meets_goal'] else 'NOT met'}.",
        "",
        *_page_cache_note(disk),
        *_throttle_md(doc),
        "",
        *_weight_md(doc),
        "",
        *_overhead_md(doc),
    ]
    return "\n".join(lines) + "\n"


def summary_rows(doc: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    """(part, what, target, median, min / max) for the CLI's table."""
    rows = []
    for t in doc["throttle"]:
        m, e = t["measured_bps"], t["error_pct"]
        rows.append(
            (
                "throttle",
                f"{t['node']} {t['direction']}",
                f"{t['target_bps'] / MB:g} MB/s",
                f"{_mb(m['median'])} MB/s ({e['median']:+.1f}%)",
                f"{_mb(m['min'])} / {_mb(m['max'])}",
            )
        )
    for w in doc["weight"]:
        r = w["ratio"]
        rows.append(
            ("weight", w["job"], "1:9", f"1:{r['median']:.2f}", f"{r['min']:.2f} / {r['max']:.2f}")
        )
    for j in doc["overhead"]["jobs"]:
        for key, r in j["ratios"].items():
            rows.append(
                ("overhead", f"{j['job']} {key}", "1.0", f"{r['median']:.3f}",
                 f"{r['min']:.3f} / {r['max']:.3f}")
            )  # fmt: skip
    return rows
