"""A Spark virtual cluster of VM nodes as a Slurm job across two hosts (issue 31 item 2).

A tenant's ``sbatch -N2`` with examples/spark-slurm.toml's shape as VMs
(``kind = "vm"``, one compute node, TCG here): head0 on the first host serves
NFS from its guest and runs the Spark master, compute0 on the second host
mounts the export with its own NFS client and runs a worker. Each host's
first step returns only once the master lists that host's workers alive
(``cluster/spark.py``); ``hpvc status`` of each share then shows the mounts
answering in its guests, and the master, asked from the first host, the
worker of the second. In VM guests the daemons run as root, as the tasks do
(the guest's root is the job's user: docs/slurm.md). ``scancel`` leaves
nothing on any host.

TeraSort itself in these guests is measured, not tested here: 1000 rows took
678 s from ``sbatch`` to the end under TCG on this machine (docs/slurm.md),
beyond what an integration test may take.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hpvc.bench.common import ensure_image
from hpvc.bench.slurm import cluster as bench_slurm
from hpvc.image import resolve_image
from hpvc.image.guest import build_guest
from tests.helpers import ROOT, requires
from tests.integration.conftest import slurm_env
from tests.integration.slurm_env import Env
from tests.integration.test_slurm_vm import wait_vm_clean

pytestmark = pytest.mark.integration

SPEC = (
    (Path(ROOT) / "examples" / "spark-slurm.toml")
    .read_text()
    .replace('kind = "container"', 'kind = "vm"')
    .replace("count = 3", "count = 1")
)
UP_WAIT_S = 420  # two guests booting and their JVMs starting under TCG


def vm_spark_env(
    tenants: tuple[bench_slurm.Submitter, bench_slurm.Submitter],
    site: str = "kinds=container,vm images=hpc,spark",
) -> Iterator[Env]:
    """The private Slurm cluster with VM Spark jobs allowed, the guest built."""
    requires("root", "qemu")
    ensure_image("spark")  # built once (about 70 s), then reused from the store
    build_guest(resolve_image("spark"))
    yield from slurm_env(tenants, site)


@pytest.fixture(scope="module")
def slurm(tenants: tuple[bench_slurm.Submitter, bench_slurm.Submitter]) -> Iterator[Env]:
    yield from vm_spark_env(tenants)


def status(slurm: Env, host: str, share: str) -> dict[str, Any]:
    argv = [slurm.env["HPVC_BIN"], "status", share, "--json"]
    doc = json.loads(slurm.cluster.run_on(host, argv, timeout=120))
    assert isinstance(doc, dict)
    return doc


def test_vm_guests_on_two_hosts_mount_nfs_and_register_their_workers(slurm: Env) -> None:
    spec = slurm.work / "spark-vm.toml"
    spec.write_text(SPEC)
    out = slurm.work / "spark-vm.out"
    r = slurm.run(
        "sbatch", "--parsable", "-N2", "--mem=3G", f"--hpvc={spec}", "-o", str(out), "--wrap",
        "srun -N2 --ntasks-per-node=1 sh -c 'hostname; sleep 600'",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    job = int(r.stdout.strip().split(";")[0])
    try:
        t0 = time.monotonic()
        while len(slurm.running(job)) < 2 and time.monotonic() < t0 + UP_WAIT_S:
            time.sleep(1)
        up_s = time.monotonic() - t0
        text = out.read_text() if out.exists() else ""
        assert len(slurm.running(job)) == 2, f"{slurm.shares(job)}\n{text}"
        first, second = slurm.cluster.hosts[:2]
        st0, st1 = status(slurm, first, f"j{job}-0"), status(slurm, second, f"j{job}-1")
        assert st0["shared_dir"]["mounts"] == {"head0": "ok"}, st0["shared_dir"]
        assert st1["shared_dir"]["mounts"] == {"compute0": "ok"}, st1["shared_dir"]
        assert st1["shared_dir"]["node"] == "head0"
        workers = st0["spark"]["workers"]
        assert len(workers) == 1 and st0["spark"]["master_status"] == "ALIVE", st0["spark"]
        compute0 = next(n for n in st1["nodes"] if n["name"] == "compute0")
        assert workers[0]["host"] == compute0["network"]["address"], (workers, compute0)
        # Each guest's daemon maps its class-data archive (hpvc.spark.cds): the
        # explicit class path matched on the guest's own disk.
        for host, share, node, role in ((first, f"j{job}-0", "head0", "master"),
                                        (second, f"j{job}-1", "compute0", "worker")):  # fmt: skip
            maps = f"grep -ls /opt/hpvc/cds/{role}.jsa /proc/[0-9]*/maps"
            argv = [slurm.env["HPVC_BIN"], "exec", share, node, "--", "sh", "-c", maps]
            assert "/maps" in slurm.cluster.run_on(host, argv, timeout=120), (node, role)
        print(f"job {job}: both shares up, the worker registered, {up_s:.1f} s after sbatch")
    finally:
        slurm.run("scancel", str(job))
        wait_vm_clean(slurm, job, timeout=120)
