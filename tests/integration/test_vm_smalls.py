"""What a user sees of a VM cluster, beyond its nodes running (issue 17, point 8).

One small VM cluster for the module (head and two computes, under TCG, which
``HPVC_ACCEL=tcg`` forces so the accelerator warning is there on every host),
driven through the CLI where the point is what a command prints: the TCG
warning shown once, no shared directory claimed that the guests do not have,
an MPI run across guests without PMIx errors, a scale down that waits for no
guest and leaves no run folder of the node it removed, a ``down`` that leaves
none. Plus the container side of the shared directory. The VM tests run in
file order on one cluster (the last two scale it down and take it down);
names and subnets are this process's own; the fixtures take everything down
even when a test fails. About 25 s here (2 cores, TCG).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from hpvc.cluster import lifecycle, ops
from hpvc.store import Store
from tests.helpers import ROOT, build_pingpong, requires
from tests.integration.test_cluster import cli_env, image_ready, leftovers, spec_file
from tests.integration.test_vm_cluster import vm_leftovers

pytestmark = pytest.mark.integration

PID = os.getpid()
TCG_LINE = "VMs run under TCG"


@dataclass
class VmCluster:
    name: str
    store: Store
    up_output: str  # stdout and stderr of `hpvc up`


def hpvc(store: Store, *args: str) -> subprocess.CompletedProcess[str]:
    """``hpvc ARGS`` on this module's state, TCG forced, wide lines (no wrapping)."""
    env = {**cli_env(store), "HPVC_ACCEL": "tcg", "COLUMNS": "250"}
    return subprocess.run(
        [sys.executable, "-m", "hpvc", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )


def _spec(tmp: Path, name: str) -> Path:
    p = tmp / f"{name}.toml"
    p.write_text(
        f'name = "{name}"\nkind = "vm"\n'
        f'[network]\nsubnet = "10.227.{PID % 250}.0/24"\nmtu = 9000\n'
        '[tuning]\npinning = "shared"\nhugepages = "none"\npartition = "commodity"\n'
        '[[nodes]]\nrole = "head"\nvcpus = 1\nmemory = "256MiB"\n'
        '[[nodes]]\nrole = "compute"\ncount = 2\nvcpus = 1\nmemory = "256MiB"\n'
    )
    return p


@pytest.fixture(scope="module")
def vmc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VmCluster]:
    requires("root", "qemu", "ip")
    image_ready()
    tmp = tmp_path_factory.mktemp("vm-smalls")
    store = Store(tmp / "state")
    name = f"vs{PID % 10000}"
    try:
        r = hpvc(store, "up", str(_spec(tmp, name)))
        assert r.returncode == 0, r.stdout + r.stderr
        yield VmCluster(name, store, r.stdout + r.stderr)
    finally:
        for left in {p.name for p in (store.root / "clusters").glob("*")}:
            lifecycle.teardown(store, left)
        store.host_journal().undo_all()
    assert vm_leftovers(name, store) == []


def test_the_tcg_warning_is_printed_once_per_command(vmc: VmCluster) -> None:
    warning = ops.status(vmc.name, vmc.store)["accelerator_warning"]
    assert warning is not None and warning.startswith(TCG_LINE)
    assert vmc.up_output.count(TCG_LINE) == 1, vmc.up_output
    r = hpvc(vmc.store, "status", vmc.name)
    assert r.returncode == 0 and (r.stdout + r.stderr).count(TCG_LINE) == 1


def test_vm_status_claims_no_shared_directory(vmc: VmCluster) -> None:
    st = ops.status(vmc.name, vmc.store)
    assert st["shared_dir"] is None
    # ... and indeed: the guests have no /shared, the host no folder for one.
    assert ops.exec_node(vmc.name, "compute0", ["test", "!", "-e", "/shared"], vmc.store) == 0
    assert not (vmc.store.cluster_dir(vmc.name) / "shared").exists()


def _copy_in(vmc: VmCluster, node: str, binary: Path) -> None:
    put = ["sh", "-c", "cat > /tmp/pingpong && chmod +x /tmp/pingpong"]
    argv = ops.exec_argv(vmc.name, node, put, vmc.store)
    with binary.open("rb") as f:
        subprocess.run(argv, stdin=f, check=True, timeout=60)


def test_vm_mpi_run_has_no_pmix_error(vmc: VmCluster, tmp_path: Path) -> None:
    requires("mpi")
    binary = Path(build_pingpong(tmp_path))
    for node in ("compute0", "compute1"):
        _copy_in(vmc, node, binary)
    r = ops.run(vmc.name, ["/tmp/pingpong", "64", "5"], 2, vmc.store, capture=True)
    assert not isinstance(r, int)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert '"bytes"' in r.stdout  # the ranks talked across the two guests
    assert "PMIX ERROR" not in out and "gds_ds" not in out, out


def test_scale_down_waits_for_no_guest_and_removes_the_node_run_folder(vmc: VmCluster) -> None:
    run = vmc.store.root / "run" / vmc.name
    assert (run / "compute1").is_dir()  # QMP and console sockets of a running node
    r = hpvc(vmc.store, "scale", vmc.name, "compute=1")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "waiting for" not in out, out
    assert out.count(TCG_LINE) == 1, out
    assert sorted(p.name for p in run.iterdir()) == ["compute0", "head0"]
    assert [n["name"] for n in ops.status(vmc.name, vmc.store)["nodes"]] == ["head0", "compute0"]


def test_down_leaves_no_run_folder(vmc: VmCluster) -> None:
    r = hpvc(vmc.store, "down", vmc.name)
    assert r.returncode == 0, r.stdout + r.stderr
    assert not (vmc.store.root / "run" / vmc.name).exists()
    assert vm_leftovers(vmc.name, vmc.store) == []


def test_container_status_shared_dir_is_seen_in_the_nodes(tmp_path: Path) -> None:
    requires("root", "crun", "ip")
    image_ready()
    store = Store(tmp_path / "state")
    name = f"cs{PID % 10000}"
    try:
        lifecycle.up(spec_file(tmp_path, name, computes=1), store)
        shared = ops.status(name, store)["shared_dir"]
        assert shared is not None and shared["server"] == "host" and shared["path"] == "/shared"
        (Path(shared["host"]) / "probe").write_text(f"from the host {PID}\n")
        argv = ["cat", f"{shared['path']}/probe"]
        argv = ops.exec_argv(name, "compute0", argv, store)
        got = subprocess.run(argv, capture_output=True, text=True, check=False)
        assert got.stdout == f"from the host {PID}\n", got.stderr
    finally:
        lifecycle.teardown(store, name)
        store.host_journal().undo_all()
    assert leftovers(name) == []
