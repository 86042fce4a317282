"""`hpvc gc` sweeps what a cluster left when its state (record and journals) is lost.

A real container cluster is brought up, its state directory is then removed
by hand except for the mounts in it (as a user deleting /var/lib/hpvc would
leave them), and `hpvc gc` must leave nothing of it on the host while a
second, healthy cluster keeps running untouched.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from hpvc.cluster import lifecycle, ops
from hpvc.store import Store
from tests.helpers import ROOT
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


def test_gc_removes_a_lost_cluster_and_keeps_a_running_one(store: Store, tmp_path: Path) -> None:
    image_ready()
    lost, kept = f"gl{os.getpid() % 10000}", f"gk{os.getpid() % 10000}"
    lifecycle.up(spec_file(tmp_path, lost, computes=1), store)
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
    assert {"container", "netns", "link", "cgroup", "mount", "holder"} <= kinds, found
    assert leftovers(lost) != []  # a dry run removes nothing
    assert not any(kept in o["name"] or kept in o["detail"] for o in found)

    r = subprocess.run([*hpvc, "gc", "--json"], env=env, cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["errors"] == []
    assert leftovers(lost) == [] and holders(lost) == []
    # The healthy cluster is untouched and still works.
    assert ops.exec_node(kept, "compute0", ["true"], store) == 0
    assert [n["state"] for n in ops.status(kept, store)["nodes"]] == ["running"] * 2
    shutil.rmtree(cdir, ignore_errors=True)
    lifecycle.down(kept, store)
    assert leftovers(kept) == []
