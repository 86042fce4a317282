"""What ``srun --hpvc`` costs: launch latency against plain ``srun``, and the
time to a usable virtual cluster inside an allocation.

Runs on a private copy of the local Slurm test cluster (scripts/slurm/up.sh in
a temporary directory, its own fabric, three hosts apart in their own
namespaces, the SPANK plugin of native/spank in its plugstack, each host's
hpvc state in the same temporary directory), so it never disturbs a cluster
started with ``make slurm-up``. The virtual cluster is one head and
two compute containers (floating CPUs, no hugepages).

Per repetition, the order rotated:

* ``srun -N{1,3}`` of one short task per host (an ``echo`` of the timings
  below) without and with ``--hpvc``: a new job each time, so
  the ``--hpvc`` figure includes bringing the job's nodes up (the teardown
  runs in the job epilog, after srun returned; the next run waits for it);
* one ``salloc -N3 --hpvc`` allocation running such an ``srun -N3`` four times:
  the first step brings the virtual cluster up (time to a usable cluster),
  the later ones find it running (the added cost of every further step); the
  same steps in a plain allocation are the reference.

Each task prints what the plugin and ``hpvc node up`` measured (HPVC_CHECK_S,
HPVC_NODE_UP_S, HPVC_UP_TIMES), so a step that brings the share up is broken
down into its phases (``breakdown``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpvc.bench import common
from hpvc.bench.slurm.cluster import SlurmCluster, Submitter, private_slurm
from hpvc.bench.slurm.report import phase_table
from hpvc.bench.slurm.report import report_md as report_md
from hpvc.bench.stats import summary
from hpvc.errors import HpvcError, InputError, MissingDependency
from hpvc.host.accel import accelerator
from hpvc.progress import Progress, quiet

BINARIES = ("munged", "slurmctld", "slurmd", "srun", "salloc", "squeue", "make", "cc")
SIZES = (1, 3)
STEPS_IN_ALLOCATION = 4
TIMEOUT_S = 120


def preflight() -> None:
    if os.geteuid() != 0:
        raise MissingDependency("bench slurm", "needs root (slurmd, containers)", "run as root")
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if missing:
        raise MissingDependency("bench slurm", f"{', '.join(missing)} not installed", "make setup")
    if not Path("/usr/include/slurm/spank.h").exists():
        raise MissingDependency(
            "bench slurm", "slurm/spank.h not found", "apt-get install libslurm-dev"
        )


def spec_text(subnet: str) -> str:
    return (
        'name = "bs"\nkind = "container"\nimage = "hpc"\n'
        f'[network]\nsubnet = "{subnet}"\n'
        '[tuning]\npinning = "shared"\nhugepages = "none"\npartition = "commodity"\n'
        '[[nodes]]\nrole = "head"\nmemory = "128MiB"\n'
        '[[nodes]]\nrole = "compute"\ncount = 2\nmemory = "128MiB"\n'
    )


def vm_spec_text(subnet: str) -> str:
    """Two compute VMs: one host boots both (-N1), or one each (-N2)."""
    return (
        'name = "bv"\nkind = "vm"\nimage = "hpc"\n'
        f'[network]\nsubnet = "{subnet}"\n'
        '[tuning]\npinning = "shared"\nhugepages = "none"\npartition = "commodity"\n'
        '[[nodes]]\nrole = "compute"\ncount = 2\nvcpus = 1\nmemory = "384MiB"\n'
    )


@dataclass(frozen=True)
class Layout:
    """What one run of the benchmark measures: the spec, the host counts of the
    new jobs, the allocation's, and the site arguments the cluster needs."""

    kind: str
    sizes: tuple[int, ...]
    alloc: int
    spec: Callable[[str], str]
    describe: str
    site: str = ""


LAYOUTS = {
    "container": Layout(
        "container", SIZES, 3, spec_text,
        "1 head + 2 compute containers, floating CPUs, no hugepages",
    ),
    "vm": Layout(
        "vm", (1, 2), 2, vm_spec_text,
        "2 compute VMs (1 vCPU, 384 MiB, floating CPUs, no hugepages), one per host with -N2",
        "kinds=container,vm",
    ),
}  # fmt: skip


def _timed(cluster: SlurmCluster, user: Submitter, cwd: Path, argv: list[str]) -> tuple[float, str]:
    """Wall seconds of ``argv`` submitted as ``user``, and its output."""
    t0 = time.perf_counter()
    r = cluster.submit(user, argv, cwd)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise HpvcError(f"bench slurm: {' '.join(argv)}", (r.stderr or r.stdout).strip()[-300:])
    return wall, r.stdout


def _wait_clean(cluster: SlurmCluster, timeout: float = 60) -> None:
    """The previous job's epilogs take its nodes down after srun returned."""
    deadline = time.monotonic() + timeout
    while cluster.shares() and time.monotonic() < deadline:
        time.sleep(0.1)
    if cluster.shares():
        raise HpvcError("bench slurm", f"job nodes still up after {timeout} s: {cluster.shares()}")


# Every task prints what the plugin and `hpvc node up` said of their time
# (empty without --hpvc): the check in srun, node up's wall clock on its host,
# and node up's own phases. A step is timed around all of it.
TASK = 'echo "hpvc-times $HPVC_STEP ${HPVC_CHECK_S:--} ${HPVC_NODE_UP_S:--} ${HPVC_UP_TIMES:--}"'

ALLOC_SCRIPT = """
for i in $(seq {steps}); do
  t0=$(date +%s.%N); HPVC_STEP=$i srun -N{nodes} sh -c '{task}' || exit 1; t1=$(date +%s.%N)
  echo "step $i $t0 $t1"
done
"""


def breakdown(out: str, step: str, wall: float, checked: bool = True) -> dict[str, float] | None:
    """Where a step's time went, from its tasks' ``hpvc-times`` lines: ``check``
    (srun's `hpvc node check`), ``node_up`` (the slowest host's `hpvc node up`,
    start to exit) split into ``start`` (interpreter and first imports, to the
    CLI's first line), ``cli`` and node up's own phases, and ``rest`` (Slurm
    and the tasks' join: the step's wall clock less check and node up).
    None when the step ran no `hpvc node up` (a share found running, or no
    --hpvc). ``checked``: the check ran inside this step's wall clock (a new
    job's srun); in an allocation it ran at salloc, before the step."""
    hosts = []
    for line in out.splitlines():
        f = line.split()
        if len(f) == 5 and f[0] == "hpvc-times" and f[1] == step and f[3] != "-":
            # A VM backend's "start" (disks, taps, QEMU) is not the interpreter's.
            parts = {
                ("qemu" if k == "start" else k): float(v)
                for k, v in (kv.split("=") for kv in f[4].split(","))
            }
            hosts.append((float(f[3]), float(f[2]) if f[2] != "-" else 0.0, parts))
    if not hosts:
        return None
    node_up, check, parts = max(hosts, key=lambda h: h[0])
    inner = sum(parts.values())
    return {
        **({"check": check} if checked else {}),
        "node_up": node_up,
        "start": max(0.0, node_up - inner),
        **parts,
        "rest": max(0.0, wall - (check if checked else 0.0) - node_up),
    }


def _allocation(
    cluster: SlurmCluster, user: Submitter, cwd: Path, spec: Path | None, nodes: int
) -> list[tuple[float, dict[str, float] | None]]:
    """Wall seconds (and breakdown) of each `srun -N<nodes>` step inside one
    salloc -N<nodes> allocation."""
    argv = ["salloc", f"-N{nodes}"] + ([f"--hpvc={spec}"] if spec else [])
    script = ALLOC_SCRIPT.format(steps=STEPS_IN_ALLOCATION, task=TASK, nodes=nodes)
    _, out = _timed(cluster, user, cwd, [*argv, "sh", "-c", script])
    steps = [line.split() for line in out.splitlines() if line.startswith("step ")]
    if len(steps) != STEPS_IN_ALLOCATION:
        raise HpvcError("bench slurm: allocation", f"expected {STEPS_IN_ALLOCATION} steps: {out}")
    walls = [(s[1], float(s[3]) - float(s[2])) for s in steps]
    return [(w, breakdown(out, i, w, checked=False)) for i, w in walls]


def one_rep(
    cluster: SlurmCluster,
    user: Submitter,
    cwd: Path,
    spec: Path,
    rep: int,
    progress: Progress,
    layout: Layout = LAYOUTS["container"],
) -> list[dict[str, Any]]:
    runs: list[tuple[str, Callable[[], list[dict[str, Any]]]]] = []
    for n in layout.sizes:
        for hp in (False, True):
            config = "hpvc" if hp else "plain"

            def srun(n: int = n, hp: bool = hp, config: str = config) -> list[dict[str, Any]]:
                argv = ["srun", f"-N{n}"] + ([f"--hpvc={spec}"] if hp else [])
                argv += ["sh", "-c", TASK.replace("$HPVC_STEP", "1")]
                wall, out = _timed(cluster, user, cwd, argv)
                _wait_clean(cluster)
                row = {"what": f"srun_N{n}", "config": config, "seconds": wall}
                return [{**row, "phases": breakdown(out, "1", wall)}]

            runs.append((f"srun -N{n} {config}", srun))
    a = layout.alloc
    for hp in (False, True):
        config = "hpvc" if hp else "plain"

        def alloc(hp: bool = hp, config: str = config) -> list[dict[str, Any]]:
            steps = _allocation(cluster, user, cwd, spec if hp else None, a)
            _wait_clean(cluster)
            first, phases = steps[0]
            return [
                {"what": f"alloc_first_step_N{a}", "config": config, "seconds": first,
                 "phases": phases},
                *(
                    {"what": f"alloc_later_step_N{a}", "config": config, "seconds": s,
                     "phases": p}
                    for s, p in steps[1:]
                ),
            ]  # fmt: skip

        runs.append((f"salloc -N{a} {config}", alloc))
    k = rep % len(runs)
    out: list[dict[str, Any]] = []
    for order, (label, fn) in enumerate(runs[k:] + runs[:k]):
        progress(f"repetition {rep + 1}: {label}")
        for row in fn():
            out.append({**row, "rep": rep, "order": order})
    return out


def what_labels(sizes: tuple[int, ...], alloc: int) -> dict[str, str]:
    """The measured steps' keys and what each is, for a layout."""
    out = {f"srun_N{n}": f"srun -N{n} (one echo per host), a new job" for n in sizes}
    out[f"alloc_first_step_N{alloc}"] = (
        f"first srun -N{alloc} in a salloc -N{alloc} allocation (virtual cluster comes up)"
    )
    out[f"alloc_later_step_N{alloc}"] = (
        f"later srun -N{alloc} in the same allocation (virtual cluster running)"
    )
    return out


WHAT = what_labels(SIZES, 3)


def document(
    facts: dict[str, Any],
    rows: list[dict[str, Any]],
    repeat: int,
    version: str = "unknown",
    user: str = "nobody",
    layout: Layout = LAYOUTS["container"],
) -> dict[str, Any]:
    table = []
    labels = what_labels(layout.sizes, layout.alloc)
    for what, describe in labels.items():
        per: dict[str, dict[str, Any]] = {}
        medians: dict[str, float] = {}
        for config in ("plain", "hpvc"):
            xs = [float(r["seconds"]) for r in rows if r["what"] == what and r["config"] == config]
            s = summary(xs)
            per[config] = {"samples": xs, **s}
            medians[config] = s["median"]
        table.append(
            {
                "what": what,
                "describe": describe,
                **per,
                "added_median_s": medians["hpvc"] - medians["plain"],
            }
        )
    samples = [
        {
            "suite": "slurm",
            "config": r["config"],
            "metric": r["what"] + "_s",
            "unit": "s",
            "higher_is_better": False,
            "rep": r["rep"],
            "order": r["order"],
            "value": r["seconds"],
        }
        for r in rows
    ]
    return {
        "phases": phase_table(rows, labels),
        "kind": layout.kind,
        "what": labels,
        "benchmark": "slurm-launch",
        **facts,
        "slurm": version,
        "repeat": repeat,
        "submitted_by": user,
        "virtual_cluster": layout.describe,
        "runs": rows,
        "table": table,
        "samples": samples,
    }


def run(
    repeat: int = 5,
    progress: Progress = quiet,
    user: str = "nobody",
    resident: bool = True,
    kind: str = "container",
) -> dict[str, Any]:
    """Both paths, ``repeat`` alternated repetitions, every job submitted by
    ``user`` (an ordinary user, as on a site; nobody by default), with
    container or VM nodes (``kind``)."""
    if repeat < 1:
        raise InputError("--repeat", "must be at least 1", "--repeat 5")
    if kind not in LAYOUTS:
        raise InputError(f"--kind {kind}", "unknown", "--kind container or --kind vm")
    layout = LAYOUTS[kind]
    submitter = Submitter.named(user)
    preflight()
    common.ensure_image("hpc", progress)
    facts = common.host_facts(mpi=False)
    tmp = Path(tempfile.mkdtemp(prefix="hpvc-bench-slurm-"))
    os.chmod(tmp, 0o755)  # munged wants its socket's directories searchable by all
    work = tmp / "work"
    work.mkdir()
    spec = work / "cluster.toml"
    subnet = common.free_subnets(1)[0]
    spec.write_text(layout.spec(subnet))
    if kind == "vm":
        common.ensure_guest("hpc", progress)
    rows: list[dict[str, Any]] = []
    left: list[tuple[str, str]] = []
    try:
        with private_slurm(
            tmp, subnet, progress, extra_args=layout.site, resident=resident
        ) as cluster:
            # srun needs a configuration even for --version
            r = subprocess.run(
                ["srun", "--version"], env=cluster.env, capture_output=True, text=True
            )
            version = r.stdout.strip() or "unknown"
            for rep in range(repeat):
                rows += one_rep(cluster, submitter, work, spec, rep, progress, layout)
            left = cluster.sweep(cluster.env["HPVC_BIN"])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if left:
        raise HpvcError("bench slurm", f"shares left after the runs: {left}", "")
    doc = document(facts, rows, repeat, version, submitter.name, layout)
    accel = {"accelerator": accelerator().name} if kind == "vm" else {}
    return doc | {"resident": resident} | accel
