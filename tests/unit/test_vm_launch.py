"""VM backends without QEMU: what ``hpvc run`` hands mpirun, and a node's run
folder going with its journal (issue 17, point 8; the real runs are in
tests/integration/test_vm_smalls.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest

import hpvc.backends.vm.guest  # noqa: F401  (registers the undo of "node-run-dir")
from hpvc.backends.libvirt.backend import LibvirtBackend
from hpvc.backends.qemu.backend import QemuBackend, VmState
from hpvc.host.journal import Journal


@dataclass(frozen=True)
class _Node:
    name: str
    ip: str


@dataclass(frozen=True)
class _Plan:
    nodes: tuple[_Node, ...]


@dataclass(frozen=True)
class _Env:
    name: str
    state: VmState


@pytest.mark.parametrize("backend", [QemuBackend, LibvirtBackend])
def test_vm_ranks_get_job_data_over_tcp_not_the_hosts_shared_memory(
    backend: type[QemuBackend],
) -> None:
    """mpirun's PMIx server on the host must not hand guests its shared-memory
    dstore (ds21/ds12): they cannot map it, and every rank printed a gds lock error."""
    plan: Any = _Plan((_Node("compute0", "10.0.0.3"),))
    env = cast(Any, _Env("c", VmState()))  # a guest image with sshd: no agent_rsh
    launch = backend().mpi_launch(env, plan)
    assert launch.env == {"PMIX_MCA_gds": "hash"}
    assert launch.targets == {"compute0": "10.0.0.3"}


def test_a_nodes_run_folder_goes_with_its_journal(tmp_path: Path) -> None:
    run = tmp_path / "state" / "run" / "c1" / "compute1"
    run.mkdir(parents=True)
    (run / "qemu.pid").write_text("1\n")
    j = Journal(tmp_path / "journal.jsonl")
    j.record("node-run-dir", path=str(run))
    assert j.undo_all() == []
    assert not run.exists() and run.parent.is_dir()


def test_the_run_folder_undo_refuses_a_path_outside_a_run_directory(tmp_path: Path) -> None:
    elsewhere = tmp_path / "home" / "user"
    elsewhere.mkdir(parents=True)
    j = Journal(tmp_path / "journal.jsonl")
    j.record("node-run-dir", path=str(elsewhere))
    errors = j.undo_all()
    assert len(errors) == 1 and "refusing to remove" in errors[0]
    assert elsewhere.is_dir()
