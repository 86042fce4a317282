"""What ``srun --hpvc`` costs: launch latency against plain ``srun``, and the
time to a usable virtual cluster inside an allocation.

Runs on a private copy of the local Slurm test cluster (scripts/slurm/up.sh in
a temporary directory, its own ports, the SPANK plugin of native/spank in its
plugstack, hpvc state in the same temporary directory), so it never disturbs
a cluster started with ``make slurm-up``. The virtual cluster is one head and
two compute containers (floating CPUs, no hugepages).

Per repetition, the order rotated:

* ``srun -N{1,3} true`` without and with ``--hpvc``: a new job each time, so
  the ``--hpvc`` figure includes bringing the job's nodes up (the teardown
  runs in the job epilog, after srun returned; the next run waits for it);
* one ``salloc -N3 --hpvc`` allocation running ``srun -N3 true`` four times:
  the first step brings the virtual cluster up (time to a usable cluster),
  the later ones find it running (the added cost of every further step); the
  same steps in a plain allocation are the reference.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hpvc.bench import common
from hpvc.bench.stats import summary
from hpvc.cluster.state import Store
from hpvc.errors import HpvcError, InputError, MissingDependency
from hpvc.progress import Progress, quiet
from hpvc.slurm import node
from hpvc.slurm.policy import parse_share_name

BINARIES = ("munged", "slurmctld", "slurmd", "srun", "salloc", "squeue", "make", "cc")
SIZES = (1, 3)
STEPS_IN_ALLOCATION = 4
TIMEOUT_S = 120


def repo_dir() -> Path:
    return common.native_dir().parent.parent


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


def free_base_port(start: int = 7917) -> int:
    """A base port with it and the next three free on 127.0.0.1 (slurmctld and
    three slurmd; a `make slurm-up` cluster may hold the default 6917-6920)."""
    for base in range(start, start + 1000, 10):
        try:
            for port in range(base, base + 4):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise HpvcError("bench slurm", f"no 4 free TCP ports in {start}-{start + 999}")


@contextmanager
def private_slurm(
    tmp: Path, store: Store, subnets: str, progress: Progress = quiet, extra_args: str = ""
) -> Iterator[dict[str, str]]:
    """A local Slurm cluster with the hpvc plugin under ``tmp`` (hpvc state in
    ``store``, jobs allowed ``subnets``); the environment to submit to it."""
    repo = repo_dir()
    progress("building the SPANK plugin")
    b = subprocess.run(
        ["make", "-s", "-C", str(repo / "native" / "spank")],
        capture_output=True,
        text=True,
        check=False,
    )
    if b.returncode != 0:
        raise HpvcError("build native/spank", (b.stderr or b.stdout).strip()[-300:])
    from hpvc.image import default_store

    # The hpvc of this Python (the venv running the benchmark), else PATH's.
    mine = Path(sys.executable).parent / "hpvc"
    hpvc_bin = str(mine) if mine.exists() else shutil.which("hpvc") or "hpvc"
    env = dict(
        os.environ,
        HPVC_SLURM_DIR=str(tmp / "slurm"),
        HPVC_SLURM_PORT=str(free_base_port()),
        HPVC_STATE_DIR=str(store.root),
        HPVC_SPANK_SO=str(repo / "native" / "spank" / "hpvc_spank.so"),
        HPVC_BIN=hpvc_bin,
        HPVC_SPANK_ARGS=f"image_dir={default_store()} subnets={subnets} {extra_args}".strip(),
    )
    scripts = repo / "scripts" / "slurm"
    progress("starting a private Slurm cluster (3 slurmd)")
    try:
        r = subprocess.run(
            ["bash", str(scripts / "up.sh")],
            env=env,
            capture_output=True,
            text=True,
            timeout=90,
            check=False,
        )
        if r.returncode != 0:
            raise HpvcError("bench slurm: up.sh", (r.stderr or r.stdout).strip()[-300:])
        env["SLURM_CONF"] = str(tmp / "slurm" / "slurm.conf")
        yield env
    finally:
        progress("stopping the private Slurm cluster")
        subprocess.run(
            ["bash", str(scripts / "down.sh")],
            env=env,
            capture_output=True,
            timeout=90,
            check=False,
        )


def _timed(env: dict[str, str], cwd: Path, argv: list[str]) -> tuple[float, str]:
    t0 = time.perf_counter()
    r = subprocess.run(
        argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT_S, check=False
    )
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise HpvcError(f"bench slurm: {' '.join(argv)}", (r.stderr or r.stdout).strip()[-300:])
    return wall, r.stdout


def _wait_clean(store: Store, timeout: float = 60) -> None:
    """The previous job's epilog takes its nodes down after srun returned."""
    deadline = time.monotonic() + timeout
    while store.names() and time.monotonic() < deadline:
        time.sleep(0.1)
    if store.names():
        raise HpvcError("bench slurm", f"job nodes still up after {timeout} s: {store.names()}")


ALLOC_SCRIPT = """
for i in $(seq {steps}); do
  t0=$(date +%s.%N); srun -N3 true || exit 1; t1=$(date +%s.%N)
  echo "step $i $t0 $t1"
done
"""


def _allocation(env: dict[str, str], cwd: Path, spec: Path | None) -> list[float]:
    """Wall seconds of each `srun -N3 true` step inside one salloc -N3 allocation."""
    argv = ["salloc", "-N3"] + ([f"--hpvc={spec}"] if spec else [])
    argv += ["sh", "-c", ALLOC_SCRIPT.format(steps=STEPS_IN_ALLOCATION)]
    _, out = _timed(env, cwd, argv)
    steps = [line.split() for line in out.splitlines() if line.startswith("step ")]
    if len(steps) != STEPS_IN_ALLOCATION:
        raise HpvcError("bench slurm: allocation", f"expected {STEPS_IN_ALLOCATION} steps: {out}")
    return [float(s[3]) - float(s[2]) for s in steps]


def one_rep(
    env: dict[str, str], cwd: Path, store: Store, spec: Path, rep: int, progress: Progress
) -> list[dict[str, Any]]:
    runs: list[tuple[str, Callable[[], list[dict[str, Any]]]]] = []
    for n in SIZES:
        for hp in (False, True):
            config = "hpvc" if hp else "plain"

            def srun(n: int = n, hp: bool = hp, config: str = config) -> list[dict[str, Any]]:
                argv = ["srun", f"-N{n}"] + ([f"--hpvc={spec}"] if hp else []) + ["true"]
                wall, _ = _timed(env, cwd, argv)
                _wait_clean(store)
                return [{"what": f"srun_N{n}", "config": config, "seconds": wall}]

            runs.append((f"srun -N{n} {config}", srun))
    for hp in (False, True):
        config = "hpvc" if hp else "plain"

        def alloc(hp: bool = hp, config: str = config) -> list[dict[str, Any]]:
            steps = _allocation(env, cwd, spec if hp else None)
            _wait_clean(store)
            return [
                {"what": "alloc_first_step_N3", "config": config, "seconds": steps[0]},
                *(
                    {"what": "alloc_later_step_N3", "config": config, "seconds": s}
                    for s in steps[1:]
                ),
            ]

        runs.append((f"salloc -N3 {config}", alloc))
    k = rep % len(runs)
    out: list[dict[str, Any]] = []
    for order, (label, fn) in enumerate(runs[k:] + runs[:k]):
        progress(f"repetition {rep + 1}: {label}")
        for row in fn():
            out.append({**row, "rep": rep, "order": order})
    return out


WHAT = {
    "srun_N1": "srun -N1 true, a new job",
    "srun_N3": "srun -N3 true, a new job",
    "alloc_first_step_N3": "first srun -N3 in a salloc -N3 allocation (virtual cluster comes up)",
    "alloc_later_step_N3": "later srun -N3 in the same allocation (virtual cluster running)",
}


def document(
    facts: dict[str, Any], rows: list[dict[str, Any]], repeat: int, version: str = "unknown"
) -> dict[str, Any]:
    table = []
    for what, describe in WHAT.items():
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
        "benchmark": "slurm-launch",
        **facts,
        "slurm": version,
        "repeat": repeat,
        "virtual_cluster": "1 head + 2 compute containers, floating CPUs, no hugepages",
        "runs": rows,
        "table": table,
        "samples": samples,
    }


def run(repeat: int = 5, progress: Progress = quiet) -> dict[str, Any]:
    if repeat < 1:
        raise InputError("--repeat", "must be at least 1", "--repeat 5")
    preflight()
    common.ensure_image("hpc", progress)
    facts = common.host_facts(mpi=False)
    tmp = Path(tempfile.mkdtemp(prefix="hpvc-bench-slurm-"))
    os.chmod(tmp, 0o755)  # munged wants its socket's directories searchable by all
    store = Store(tmp / "hpvc")
    work = tmp / "work"
    work.mkdir()
    spec = work / "cluster.toml"
    subnet = common.free_subnets(1)[0]
    spec.write_text(spec_text(subnet))
    rows: list[dict[str, Any]] = []
    try:
        with private_slurm(tmp, store, subnet, progress) as env:
            # srun needs a configuration even for --version
            r = subprocess.run(["srun", "--version"], env=env, capture_output=True, text=True)
            version = r.stdout.strip() or "unknown"
            for rep in range(repeat):
                rows += one_rep(env, work, store, spec, rep, progress)
    finally:
        for job in {p[0] for n in store.names() if (p := parse_share_name(n))}:
            node.down(job, store)
        left = store.names()
        if not left:
            shutil.rmtree(tmp, ignore_errors=True)
    if left:
        fix = f"HPVC_STATE_DIR={store.root} hpvc node ls"
        raise HpvcError("bench slurm", f"shares left: {left}", fix)
    return document(facts, rows, repeat, version)


def report_md(doc: dict[str, Any]) -> str:
    lines = [
        f"Launch latency of `srun --hpvc` against plain `srun` on the local Slurm test cluster"
        f" (3 slurmd on one machine), {doc['repeat']} repetitions, order rotated;"
        f" {doc['host']} ({doc['cpu_model']}, {doc['cpus']} CPUs), {doc['slurm']},"
        f" {doc['date']}. Virtual cluster: {doc['virtual_cluster']}.",
        "",
        "| what | plain min / median / max s | --hpvc min / median / max s | added (median) s |",
        "|---|---|---|---|",
    ]
    for t in doc["table"]:
        p, h = t["plain"], t["hpvc"]
        lines.append(
            f"| {t['describe']} | {p['min']:.3f} / {p['median']:.3f} / {p['max']:.3f}"
            f" | {h['min']:.3f} / {h['median']:.3f} / {h['max']:.3f}"
            f" | {t['added_median_s']:+.3f} |"
        )
    return "\n".join(lines) + "\n"
