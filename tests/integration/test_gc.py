"""`hpvc gc` sweeps what a cluster left when its state (record and journals) is lost.

A real container cluster is brought up, with its shared directory served
over NFS from the host (Ganesha and rpcbind in its ``nfs-server`` cgroup, the
export on a loop device), its state directory is then removed by hand except
for the mounts in it (as a user deleting /var/lib/hpvc would leave them), and
`hpvc gc` must leave nothing of it on the host while a second, healthy
cluster keeps running untouched.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from hpvc.cluster import gc, lifecycle, ops
from hpvc.store import Store
from tests.helpers import ROOT, requires
from tests.integration.test_cluster import cli_env, image_ready, leftovers, spec_file, store

__all__ = ["store"]  # the fixture, shared with test_cluster


def holders(name: str) -> list[int]:
    """Namespace holder processes started for cluster ``name``."""
    out = []
    for p in Path("/proc").iterdir():
        try:
            env = (p / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"HPVC_HOLDER={name}".encode() in env:
            out.append(int(p.name))
    return out


def server_pids(name: str) -> set[int]:
    """The processes in cluster ``name``'s NFS server cgroup (any hierarchy)."""
    out: set[int] = set()
    for procs in Path("/sys/fs/cgroup").glob(f"**/hpvc/{name}/nfs-server/cgroup.procs"):
        out |= {int(p) for p in procs.read_text().split()}
    return out


def alive(pid: int) -> bool:
    """Running, not a zombie (the server's parent is this test process: ``up`` ran here)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def loops_of(cdir: Path) -> list[str]:
    """Loop devices whose backing file lies in the cluster's folder."""
    r = subprocess.run(["losetup", "-a"], capture_output=True, text=True, check=True)
    return [line for line in r.stdout.splitlines() if f"{cdir}/" in line]


def test_gc_removes_a_lost_cluster_and_keeps_a_running_one(store: Store, tmp_path: Path) -> None:
    requires("ganesha")
    image_ready()
    lost, kept = f"gl{os.getpid() % 10000}", f"gk{os.getpid() % 10000}"
    nfs = '[shared]\nserver = "nfs"\nsize = "64MiB"\n'
    try:
        lifecycle.up(spec_file(tmp_path, lost, extra=nfs, computes=1), store)
        servers = server_pids(lost)
        assert servers, "the lost cluster's NFS server should run in its cgroup"
        other = Path(spec_file(tmp_path, kept, computes=1))
        other.write_text(other.read_text().replace("10.214.", "10.215."))
        lifecycle.up(str(other), store)
        assert holders(lost), "the lost cluster's namespace holder should run"

        # Lose the state: every file of the cluster's directory, but not its mounts.
        cdir = store.cluster_dir(lost)
        for f in cdir.rglob("*.json*"):
            f.unlink()
        shutil.rmtree(cdir / "nodes" / "head0" / "upper", ignore_errors=True)
        (cdir / "cluster.json").unlink(missing_ok=True)
        assert store.names() == [kept] and leftovers(lost) != []

        hpvc = [sys.executable, "-m", "hpvc"]
        env = cli_env(store)
        dry = subprocess.run(
            [*hpvc, "gc", "--dry-run", "--json"], env=env, cwd=ROOT, capture_output=True, text=True
        )
        assert dry.returncode == 0, dry.stderr
        found = json.loads(dry.stdout)["found"]
        kinds = {o["kind"] for o in found}
        assert {"container", "netns", "link", "cgroup", "mount", "holder", "server"} <= kinds, found
        assert {int(o["name"]) for o in found if o["kind"] == "server"} == servers
        assert leftovers(lost) != []  # a dry run removes nothing
        assert not any(kept in o["name"] or kept in o["detail"] for o in found)

        r = subprocess.run(
            [*hpvc, "gc", "--json"], env=env, cwd=ROOT, capture_output=True, text=True
        )
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["errors"] == []
        assert leftovers(lost) == [] and holders(lost) == []
        assert not [p for p in servers if alive(p)], servers
        assert loops_of(cdir) == []
        # The healthy cluster is untouched and still works.
        assert ops.exec_node(kept, "compute0", ["true"], store) == 0
        assert [n["state"] for n in ops.status(kept, store)["nodes"]] == ["running"] * 2
        shutil.rmtree(cdir, ignore_errors=True)
        lifecycle.down(kept, store)
        assert leftovers(kept) == []
    finally:  # a failure above: what the lost cluster left goes, so the fixture's clean-up runs
        gc.sweep(store, prefix=lost)
