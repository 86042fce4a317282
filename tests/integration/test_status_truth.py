"""What `hpvc status`, `run` and the commands a user may not run say when things
are not as the record has them (issue 17, points 6 and 8).

A killed `up` leaves its nodes running and its record in "creating": status
shows the nodes that run as running and says "interrupted — run hpvc down";
an `up` still under way is "coming up". Non-root `down`, `run`, `scale` and
`image rm` say "needs root" in one line (exit 2); `run` on a cluster without
compute nodes says where its ranks go; block-I/O limits that cannot apply (the
state directory on tmpfs) are said at `up` and in `status`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpvc.cluster import lifecycle, ops
from hpvc.store import Store
from tests.helpers import ROOT, requires
from tests.integration.test_cluster import (
    clean_up,
    cli_env,
    image_ready,
    leftovers,
    spec_file,
    store,
)

__all__ = ["store"]  # the fixture, used by the tests below

HPVC = [sys.executable, "-m", "hpvc"]


def hpvc(store: Store, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*HPVC, *args],
        env={**cli_env(store), **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )


def _crun_state(cid: str) -> str:
    r = subprocess.run(["crun", "state", cid], capture_output=True, text=True, check=False)
    return str(json.loads(r.stdout)["status"]) if r.returncode == 0 else "missing"


def test_status_after_a_killed_up_shows_what_runs_and_says_interrupted(
    store: Store, tmp_path: Path
) -> None:
    image_ready()
    name = f"sk{os.getpid() % 10000}"
    # Killed outright (os._exit, as kill -9) right after compute0 started.
    up = hpvc(store, "up", spec_file(tmp_path, name), HPVC_FAIL_AT="crash:node:compute0")
    assert up.returncode == 70, up.stderr

    st = hpvc(store, "status", name, "--json")
    assert st.returncode == 0, st.stderr
    got = json.loads(st.stdout)
    assert got["status"] == "creating" and got["interrupted"] is True
    assert got["note"] == f"interrupted \N{EM DASH} run hpvc down {name}"
    states = {n["name"]: n["state"] for n in got["nodes"]}
    # The nodes start side by side: which others made it before the kill
    # varies; status must say what crun says of each, never the record's hope.
    assert states == {n: _crun_state(f"hpvc-{name}-{n}") for n in states}
    assert states["compute0"] == "running" and set(states) == {"head0", "compute0", "compute1"}

    text = hpvc(store, "status", name)
    assert text.returncode == 0, text.stderr
    assert f"interrupted \N{EM DASH} run hpvc down {name}" in text.stdout
    ls = hpvc(store, "ls", "--json")
    assert [(c["name"], c["interrupted"]) for c in json.loads(ls.stdout)] == [(name, True)]

    down = hpvc(store, "down", name)
    assert down.returncode == 0, down.stderr
    assert leftovers(name) == [] and store.names() == []


def test_an_up_still_under_way_is_coming_up(store: Store, tmp_path: Path) -> None:
    image_ready()
    name = f"sc{os.getpid() % 10000}"
    up = hpvc(store, "up", spec_file(tmp_path, name, computes=1), HPVC_FAIL_AT="crash:node:head0")
    assert up.returncode == 70, up.stderr
    with store.cluster_lock(name, "hpvc up", lambda _: None):  # as a live `up` holds it
        got = ops.status(name, store)
    assert got["interrupted"] is False
    assert got["note"] == f"coming up (PID {os.getpid()} (hpvc up))"
    assert got["nodes"][0]["state"] == "running"
    assert ops.status(name, store)["interrupted"] is True  # its holder is gone
    lifecycle.down(name, store)
    assert leftovers(name) == []


def test_run_without_compute_nodes_says_where_ranks_go(store: Store, tmp_path: Path) -> None:
    image_ready()
    requires("mpi")
    name = f"sh{os.getpid() % 10000}"
    up = hpvc(store, "up", spec_file(tmp_path, name, computes=0))
    assert up.returncode == 0, up.stderr
    r = hpvc(store, "run", name, "-n", "1", "--", "hostname")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["head0"]
    assert f"cluster {name} has no compute nodes: the ranks run on head0" in r.stderr
    assert hpvc(store, "down", name).returncode == 0


@pytest.fixture
def tmpfs_store(tmp_path: Path) -> Iterator[Store]:
    """A state directory on tmpfs (no block device under the nodes' disks)."""
    requires("root", "crun", "ip")
    root = tmp_path / "tmpfs-state"
    root.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512m", "tmpfs", str(root)], check=True)
    s = Store(root)
    try:
        yield s
        for name in set(s.names() + [p.name for p in (s.root / "clusters").glob("*")]):
            lifecycle.teardown(s, name)
            assert leftovers(name) == [], f"left behind by {name}"
        s.host_journal().undo_all()
    finally:
        subprocess.run(["umount", "-l", str(root)], check=False)


def test_io_limits_on_tmpfs_are_said_at_up_and_in_status(
    tmpfs_store: Store, tmp_path: Path
) -> None:
    image_ready()
    name = f"st{os.getpid() % 10000}"
    path = Path(spec_file(tmp_path, name, computes=1))
    text = path.read_text().replace(
        'role = "compute"\n', 'role = "compute"\nio = { read_bps = "50MB", write_bps = "50MB" }\n'
    )
    path.write_text(text)
    up = hpvc(tmpfs_store, "up", str(path))
    assert up.returncode == 0, up.stderr
    said = "block-I/O limits of compute0 not applied"
    assert said in up.stderr and "is on tmpfs, no block device" in up.stderr
    st = hpvc(tmpfs_store, "status", name, "--json")
    warning = json.loads(st.stdout)["io_warning"]
    assert said in warning and "tmpfs" in warning
    assert said in hpvc(tmpfs_store, "status", name).stdout.replace("\n", " ")
    assert hpvc(tmpfs_store, "down", name).returncode == 0


@pytest.mark.parametrize(
    "args",
    [
        ["down", "nosuch"],
        ["run", "nosuch", "--", "hostname"],
        ["scale", "nosuch", "compute=2"],
        ["image", "rm", "hpc"],
    ],
)
def test_non_root_commands_say_needs_root_in_one_line(store: Store, args: list[str]) -> None:
    requires("root")
    private = store.root
    private.mkdir(parents=True, exist_ok=True)
    private.chmod(0o700)
    r = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--", *HPVC, *args],
        env=cli_env(store),
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert "needs root" in lines[0] and "run as root" in lines[0]


@pytest.fixture
def vm_store(tmp_path: Path) -> Iterator[Store]:
    from tests.integration.test_vm_cluster import vm_leftovers

    requires("root", "qemu", "ip")
    s = Store(tmp_path / "vm-state")
    yield s
    clean_up(s, lambda name: vm_leftovers(name, s))


def test_vm_status_after_a_killed_up_finds_the_qemus(vm_store: Store, tmp_path: Path) -> None:
    from tests.integration.test_vm_cluster import vm_leftovers, vm_spec

    image_ready()
    name = f"sv{os.getpid() % 10000}"
    # Killed right after compute0's QEMU started: no PID of it in the record.
    up = hpvc(vm_store, "up", vm_spec(tmp_path, name), HPVC_FAIL_AT="crash:node:compute0")
    assert up.returncode == 70, up.stderr
    st = hpvc(vm_store, "status", name, "--json")
    assert st.returncode == 0, st.stderr
    got = json.loads(st.stdout)
    assert got["interrupted"] is True and got["status"] == "creating"
    states = {n["name"]: n["state"] for n in got["nodes"]}
    assert states == {"head0": "running", "compute0": "running", "compute1": "stopped"}
    assert got["accelerator"] in ("tcg", "kvm")
    assert all("error" not in n.get("vm", {}) for n in got["nodes"] if n["state"] == "running")
    assert sum(p["in_use"] or 0 for p in got["hugepages"]) > 0  # the running guests' pages
    down = hpvc(vm_store, "down", name)
    assert down.returncode == 0, down.stderr
    assert vm_leftovers(name, vm_store) == []
