"""``hpvc bench coordinator``: the storage bandwidth coordinator, measured with fio.

Like the seed's "throttle rate to DFS block I/O" and its coordinator, on one
host: every cluster is one container node serving its own shared directory
over NFS (Ganesha in the cluster's NFS-server cgroup) and writing to it with
fio (direct I/O, 1 MiB, psync) through /shared. The clusters live in a
throw-away state directory (``common.scratch_state``) whose disk is declared
in a site file of the run's own (``$HPVC_IO_SITE``). Not a loop device of its
own, as ``hpvc bench io`` uses: a buffered loop device turns each of the
servers' write-through flushes into an fsync of its whole image file, and the
rates then measure that, not the coordinator.
Each repetition, the parts in a rotating order:

- ``overhead``: one cluster alone (its shared directory a loop file system),
  three sides, by the site file and ``hpvc io set``: ``unmanaged`` (the site
  file does not name its disk: hpvc without the coordinator), ``managed``
  (the site file names it, capacity 10 GB/s: the cluster alone may take it
  all, so the coordinator writes no throttle and its writes stay buffered)
  and ``enforced`` (a demand below the capacity: a write throttle that never
  bites, and its file system switched to synchronous writes, as when other
  clusters compete). Goal: managed/unmanaged >= 0.98 (< 2% loss when
  uncontended), paired per pair; enforced/managed is what enforcement costs
  a cluster, reported as is.
- ``shares``: three clusters, priorities 1:2:4, capacity ``--capacity``, all
  flat out: each one's rate (fio's, and its server cgroup's counters) against
  1/7, 2/7, 4/7, and their sum against the capacity. Then the 4 leaves
  (``hpvc down``) while the others write: the time from its record going to
  the others' new throttles in the kernel, and their rates after against
  1/3 and 2/3; then it comes back.
- ``demand``: the 4 asks 10 MB/s (``hpvc io set``, below its share): it gets
  that, the others 1:2 of the rest; also the time from the call to the
  throttles in the kernel.

Pure parts (the document, report, figure) are in ``coordinator.report``.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpvc.bench import common
from hpvc.bench.coordinator.report import MB, document
from hpvc.cluster import lifecycle, ops
from hpvc.coordinator.coordinator import set_cluster
from hpvc.coordinator.site import ENV
from hpvc.coordinator.status import counters, held
from hpvc.errors import HpvcError, InputError
from hpvc.progress import Progress, quiet
from hpvc.store import Store

PRIORITIES = {"p1": 1, "p2": 2, "p4": 4}
HIGH = 10_000 * MB  # a capacity no disk here reaches: the throttle never bites
DEMAND = 10 * MB
PARTS = ("overhead", "shares", "demand")


def rotate(items: list[Any], rep: int) -> list[Any]:
    k = rep % len(items)
    return items[k:] + items[:k]


class Run:
    """One benchmark run: its state, site file, clusters and fio."""

    def __init__(self, tmp: Path, store: Store, capacity: int, seconds: int, progress: Progress):
        self.tmp, self.store, self.capacity, self.seconds = tmp, store, capacity, seconds
        self.progress = progress
        self.site = tmp / "io.toml"
        self.tag = f"bc{os.getpid() % 1000}"

    def name(self, label: str) -> str:
        return f"{self.tag}{label}"

    def write_site(
        self, write: int | None, *, managed: bool = True, read: int | None = None
    ) -> None:
        """The site file: the state disk (or, not ``managed``, a disk that is not
        here) with these capacities, and the clusters' priorities."""
        where = f'path = "{self.store.root}"' if managed else 'device = "4095:4095"'
        rates = "".join(f'{k} = "{v}"\n' for k, v in (("write", write), ("read", read)) if v)
        prios = ", ".join(f"{self.name(k)} = {v}" for k, v in PRIORITIES.items())
        self.site.write_text(
            f"[devices.state]\n{where}\n{rates}[priority]\nclusters = {{ {prios} }}\n"
        )

    def up(self, label: str) -> None:
        name = self.name(label)
        spec = self.tmp / f"{name}.toml"
        spec.write_text(
            f'name = "{name}"\nkind = "container"\nimage = "hpc"\n'
            '[tuning]\npinning = "shared"\nhugepages = "none"\npartition = "commodity"\n'
            'locality = "none"\n[shared]\nserver = "nfs"\nsize = "256MiB"\n'
            '[[nodes]]\nrole = "head"\nmemory = "256MiB"\ndisk = "256MiB"\n'
        )
        self.progress(f"cluster {name}: up")
        lifecycle.up(str(spec), self.store)

    def down(self, label: str) -> None:
        self.progress(f"cluster {self.name(label)}: down")
        lifecycle.down(self.name(label), self.store)

    def fio(self, label: str, seconds: int) -> subprocess.Popen[str]:
        argv = ["fio", "--name=w", "--filename=/shared/f", "--rw=write", "--bs=1M"]
        argv += ["--size=64M", "--direct=1", "--ioengine=psync", "--fallocate=none"]
        argv += ["--ramp_time=1", f"--runtime={seconds}", "--time_based", "--output-format=json"]
        exec_argv = ops.exec_argv(self.name(label), "head0", argv, self.store)
        return subprocess.Popen(
            exec_argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )

    def rates(self, labels: list[str], seconds: float) -> dict[str, float]:
        """Each cluster's write rate from its server cgroup's counters over ``seconds``."""
        before, t0 = counters(self.store), time.perf_counter()
        time.sleep(seconds)
        after, t1 = counters(self.store), time.perf_counter()
        names = {label: self.name(label) for label in labels}
        return {k: (after[n]["write"] - before[n]["write"]) / (t1 - t0) for k, n in names.items()}

    def write_limit(self, label: str) -> set[int | None]:
        return {v["write"] for v in held(self.store).get(self.name(label), {}).values()}

    def flat_out(self, labels: list[str]) -> dict[str, dict[str, float]]:
        """fio in every cluster at once: fio's bandwidth and the cgroup's rate."""
        procs = {label: self.fio(label, self.seconds) for label in labels}
        time.sleep(2.0)  # exec, fio's start, its ramp
        rates = self.rates(labels, max(1.0, self.seconds - 2.0))
        return {k: {"fio_bps": finish(p, k), "cgroup_bps": rates[k]} for k, p in procs.items()}


def finish(p: subprocess.Popen[str], label: str) -> float:
    try:
        out, err = p.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        raise HpvcError(f"fio in {label}", "still running after 180 s") from None
    if p.returncode != 0:
        lines = (err or out).strip().splitlines()
        raise HpvcError(f"fio in {label}", lines[-1] if lines else f"exit {p.returncode}")
    return float(json.loads(out[out.find("{") :])["jobs"][0]["write"]["bw_bytes"])


def watch(conds: dict[str, Callable[[], bool]], action: Callable[[], None]) -> dict[str, float]:
    """Run ``action`` while polling every condition every 5 ms; when each first held."""
    seen: dict[str, float] = {}
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set() and len(seen) < len(conds):
            for key, cond in conds.items():
                if key not in seen and cond():
                    seen[key] = time.perf_counter()
            time.sleep(0.005)

    watcher = threading.Thread(target=poll)
    watcher.start()
    try:
        action()
        deadline = time.perf_counter() + 10
        while len(seen) < len(conds) and time.perf_counter() < deadline:
            time.sleep(0.01)
    finally:
        stop.set()
        watcher.join()
    missing = sorted(set(conds) - set(seen))
    if missing:
        raise HpvcError("bench coordinator", f"not seen within 10 s: {', '.join(missing)}")
    return seen


def until(cond: Callable[[], bool], timeout: float = 10.0) -> float:
    """Poll ``cond`` every 5 ms; the time it first held (perf_counter)."""
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        if cond():
            return time.perf_counter()
        time.sleep(0.005)
    raise HpvcError("bench coordinator", f"no change seen within {timeout:g} s")


# --- the parts -------------------------------------------------------------------------


def overhead_once(r: Run, rep: int) -> list[dict[str, Any]]:
    """One cluster alone, its three sides in pairs: three pairs of ``unmanaged``
    and ``managed`` in ABBA order (this 2-CPU machine is shared: one pair is too
    noisy to read a 2% difference from), then one pair of ``enforced`` and
    ``managed``. Each run starts after a ``sync``: no run writes back what an
    earlier one left in the page cache."""
    first, second = ("unmanaged", "managed") if rep % 2 == 0 else ("managed", "unmanaged")
    order = [first, second, second, first, first, second]
    order += ["enforced", "managed"] if rep % 2 == 0 else ["managed", "enforced"]
    out = []
    for i, side in enumerate(order):
        r.write_site(HIGH, managed=side != "unmanaged", read=HIGH)
        if side == "enforced":  # a demand below the capacity: limited, writes synchronous
            set_cluster(r.store, r.name("alone"), write=HIGH // 2)
        else:
            set_cluster(r.store, r.name("alone"), reset=True)
        common.sh(["sync"], "sync")
        bw = finish(r.fio("alone", r.seconds), "alone")
        r.progress(f"  overhead {side}: {bw / MB:.1f} MB/s")
        out.append({"rep": rep, "order": i, "pair": i // 2, "side": side, "fio_bps": bw})
    set_cluster(r.store, r.name("alone"), reset=True)
    return out


def shares_once(r: Run, rep: int) -> dict[str, list[dict[str, Any]]]:
    got = r.flat_out(list(PRIORITIES))
    total = sum(PRIORITIES.values())
    shares = [
        {"rep": rep, "phase": "1:2:4", "cluster": k, "target_bps": r.capacity * p / total, **got[k]}
        for k, p in PRIORITIES.items()
    ]
    r.progress("  1:2:4: " + ", ".join(f"{k} {v['fio_bps'] / MB:.1f}" for k, v in got.items()))
    procs = {k: r.fio(k, r.seconds + 8) for k in ("p1", "p2")}
    time.sleep(2.0)
    seen = watch(
        {
            "gone": lambda: r.store.load(r.name("p4")) is None,
            "applied": lambda: r.write_limit("p1") == {r.capacity // 3},
        },
        lambda: r.down("p4"),
    )
    time.sleep(1.0)
    rates = r.rates(["p1", "p2"], max(1.0, r.seconds - 2.0))
    for k, p in procs.items():
        finish(p, k)
    after = [
        {"rep": rep, "phase": "after 4 left", "cluster": k, "target_bps": r.capacity * w / 3,
         "cgroup_bps": rates[k]}
        for k, w in (("p1", 1), ("p2", 2))
    ]  # fmt: skip
    seconds = seen["applied"] - seen["gone"]
    r.progress(f"  4 left: rebalanced in {seconds * 1000:.0f} ms, then "
               + ", ".join(f"{k} {v / MB:.1f}" for k, v in rates.items()))  # fmt: skip
    r.up("p4")
    rebal = [{"rep": rep, "trigger": "cluster left (record gone -> throttles)", "seconds": seconds}]
    return {"shares": shares + after, "rebalance": rebal}


def demand_once(r: Run, rep: int) -> dict[str, list[dict[str, Any]]]:
    t0 = time.perf_counter()
    set_cluster(r.store, r.name("p4"), write=DEMAND)
    applied = until(lambda: r.write_limit("p4") == {DEMAND})
    got = r.flat_out(list(PRIORITIES))
    set_cluster(r.store, r.name("p4"), reset=True)
    rest = r.capacity - DEMAND
    targets = {"p1": rest / 3, "p2": 2 * rest / 3, "p4": DEMAND}
    r.progress("  demand: " + ", ".join(f"{k} {v['fio_bps'] / MB:.1f}" for k, v in got.items()))
    rows = [
        {"rep": rep, "phase": "p4 asks 10 MB/s", "cluster": k, "target_bps": targets[k], **got[k]}
        for k in PRIORITIES
    ]
    trigger = "hpvc io set (call -> throttles)"
    return {
        "shares": rows,
        "rebalance": [{"rep": rep, "trigger": trigger, "seconds": applied - t0}],
    }


def run(
    repeat: int = 3, seconds: int = 6, capacity: int = 70 * MB, progress: Progress = quiet
) -> dict[str, Any]:
    """Measure the coordinator ``repeat`` times; return the results document."""
    if repeat < 1 or seconds < 3:
        raise InputError("bench coordinator", "want --repeat >= 1 and --seconds >= 3")
    if capacity < 10 * MB:
        raise InputError(f"--capacity {capacity}", "want 10MB/s or more")
    common.require("bench coordinator", ["crun", "ip", "fio", "ganesha.nfsd"])
    common.ensure_image("hpc", progress)
    facts = common.host_facts(mpi=False)
    facts["fio"] = common.sh(["fio", "--version"], "fio --version")
    samples: dict[str, list[Any]] = {"overhead": [], "shares": [], "rebalance": []}
    old_env = os.environ.get(ENV)
    t0 = time.perf_counter()
    try:
        with common.scratch_state("bench coordinator", progress) as (tmp, store):
            store.root.mkdir(parents=True)
            facts["disk"] = common.sh(["df", "--output=source,fstype", str(store.root)], "df")
            os.environ[ENV] = str(tmp / "io.toml")
            r = Run(tmp, store, capacity, seconds, progress)
            r.write_site(HIGH)
            r.up("alone")
            _repeat(r, repeat, samples, only=("overhead",))
            r.down("alone")
            r.write_site(capacity)
            for label in PRIORITIES:
                r.up(label)
            _repeat(r, repeat, samples, only=("shares", "demand"))
            progress("tearing the clusters down")
    finally:
        if old_env is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = old_env
    facts["wall_s"] = time.perf_counter() - t0
    return document(facts, capacity, seconds, repeat, samples, list(os.getloadavg()))


def _repeat(r: Run, repeat: int, samples: dict[str, list[Any]], only: tuple[str, ...]) -> None:
    for rep in range(repeat):
        for part in rotate(list(only), rep):
            r.progress(f"repetition {rep + 1}/{repeat}: {part}")
            if part == "overhead":
                samples["overhead"] += overhead_once(r, rep)
                continue
            got = shares_once(r, rep) if part == "shares" else demand_once(r, rep)
            for key, rows in got.items():
                samples[key] += rows
