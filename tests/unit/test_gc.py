"""``hpvc gc`` asks every backend what its nodes left (``Backend.orphans``) and
the host layer what any cluster leaves, without a host to spare: libvirt
domains on libvirt's in-process test driver (``test:///default``, as in
test_vm_libvirt.py), QEMU processes and namespace holders as stand-ins (a
program whose name and command line are what hpvc looks for). Every sweep
here is limited to a prefix no other cluster on the machine has, so nothing
but these tests' objects is ever considered.

The whole path on a real container cluster is tests/integration/test_gc.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hpvc.backends import registry
from hpvc.cli import main
from hpvc.cluster import gc
from hpvc.host import procfs
from hpvc.plan import plan_cluster
from hpvc.render.libvirt import node_uuid, owner_of
from hpvc.spec import parse_spec
from hpvc.store import ClusterRecord, Store
from tests.unit.test_vm_libvirt import conn, domain_names, lv
from tests.unit.topogen import make_topology

__all__ = ["conn", "lv"]  # the fixtures, shared with test_vm_libvirt

PREFIX = f"gcu{os.getpid() % 100000}"
LOST, KEPT = f"{PREFIX}-lost", f"{PREFIX}k"  # a '-' in a name: the UUID tells where it ends


# --- which domains are hpvc's --------------------------------------------------------


def test_a_domain_is_hpvcs_when_its_name_and_uuid_agree() -> None:
    assert owner_of("hpvc-a-b-head0", node_uuid("a-b", "head0")) == ("a-b", "head0")
    assert owner_of("hpvc-a-b-head0", node_uuid("a", "b-head0")) == ("a", "b-head0")
    assert owner_of("hpvc-a-b-head0", node_uuid("a-b", "head0").upper()) == ("a-b", "head0")
    assert owner_of("hpvc-a-b-head0", "c4342c97-a8dd-5b1e-8402-3c5e3d8ba76a") is None
    assert owner_of("web-a-head0", node_uuid("a", "head0")) is None  # not an hpvc name
    assert owner_of("hpvc-", node_uuid("", "")) is None


# --- a state directory with one cluster kept -----------------------------------------


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Store:
    """A state directory holding a record for KEPT only; libvirt at the test driver."""
    spec = {
        "name": KEPT,
        "tuning": {"pinning": "shared", "hugepages": "none", "partition": "commodity"},
        "nodes": [{"role": "head", "vcpus": 1, "memory": "256MiB"}],
    }
    plan = plan_cluster(parse_spec(spec), [("h0", make_topology())], None)
    s = Store(tmp_path / "state")
    now = time.time()
    s.save(ClusterRecord(KEPT, spec, "k.toml", plan.to_json(), "running", now, now, backend="crun"))
    monkeypatch.setenv("HPVC_STATE_DIR", str(s.root))
    monkeypatch.setenv("HPVC_LIBVIRT_URI", "test:///default")
    return s


def define(c: Any, cluster: str, node: str, uuid: str | None = None, run: bool = True) -> str:
    name = f"hpvc-{cluster}-{node}"
    xml = (
        f'<domain type="test"><name>{name}</name><uuid>{uuid or node_uuid(cluster, node)}</uuid>'
        '<memory unit="KiB">65536</memory><os><type arch="x86_64">hvm</type></os></domain>'
    )
    dom = c.defineXML(xml)
    if run:
        dom.create()
    return name


def test_gc_removes_a_lost_clusters_domains_and_keeps_the_others(store: Store, conn: Any) -> None:
    lost = [define(conn, LOST, "head0"), define(conn, LOST, "compute0", run=False)]
    kept = define(conn, KEPT, "head0")
    foreign = define(conn, LOST, "web", uuid="c4342c97-a8dd-5b1e-8402-3c5e3d8ba76a")
    found, errors = gc.sweep(store, PREFIX, dry_run=True)
    assert sorted((o.kind, o.name) for o in found) == [("libvirt-domain", n) for n in sorted(lost)]
    assert errors == [] and set(lost) <= set(domain_names(conn))  # a dry run removes nothing

    found, errors = gc.sweep(store, PREFIX)
    assert errors == [] and len(found) == 2
    assert domain_names(conn) == sorted([foreign, kept, "test"])
    assert conn.lookupByName(kept).isActive()


def test_without_libvirtd_gc_finds_no_domain_and_says_nothing(
    store: Store, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HPVC_LIBVIRT_URI", f"qemu:///system?socket={tmp_path}/none-sock")
    libvirt = registry.get("libvirt")
    assert libvirt.orphans(gc.keep(store), PREFIX) == []
    assert gc.sweep(store, PREFIX) == ([], [])


# --- processes: a QEMU and a namespace holder, as their names are --------------------


def stand_in(tmp_path: Path, program: str, *args: str, env: dict[str, str] | None = None) -> Any:
    """A sleeping Python whose argv[0] is ``program`` (what gc looks at), with ``args``."""
    link = tmp_path / program
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(sys.executable)
    code = "import time; time.sleep(120)"
    return subprocess.Popen([str(link), "-c", code, *args], env={**os.environ, **(env or {})})


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """QEMUs and holders of LOST and KEPT; killed at the end, whatever gc did."""
    qemu, unshare = "qemu-system-x86_64", "unshare"
    made = {
        "qemu lost": stand_in(tmp_path / "a", qemu, "-name", f"hpvc-{LOST}-head0,debug-threads=on"),
        "qemu kept": stand_in(tmp_path / "b", qemu, "-name", f"guest=hpvc-{KEPT}-head0,x=y"),
        "holder lost": stand_in(tmp_path / "c", unshare, env={"HPVC_HOLDER": LOST}),
        "holder kept": stand_in(tmp_path / "d", unshare, env={"HPVC_HOLDER": KEPT}),
    }
    deadline = time.monotonic() + 10  # until each has exec'd (its command line is ours)
    while time.monotonic() < deadline and not all(
        os.path.basename((procfs.cmdline(p.pid) or [""])[0]) in (qemu, unshare)
        for p in made.values()
    ):
        time.sleep(0.01)
    yield made
    for p in made.values():
        p.kill()
        p.wait()


def test_gc_stops_a_lost_clusters_qemu_and_holder_and_keeps_the_others(
    store: Store, procs: dict[str, Any]
) -> None:
    found, errors = gc.sweep(store, PREFIX, dry_run=True)
    lost = {"qemu": procs["qemu lost"].pid, "holder": procs["holder lost"].pid}
    assert [(o.kind, o.name, o.detail) for o in found] == [
        ("holder", str(lost["holder"]), LOST),  # the container backend's, then the QEMU one's
        ("qemu", str(lost["qemu"]), f"hpvc-{LOST}-head0"),
    ]
    found, errors = gc.sweep(store, PREFIX)
    assert errors == [] and len(found) == 2
    assert procs["qemu lost"].wait(5) is not None and procs["holder lost"].wait(5) is not None
    assert procs["qemu kept"].poll() is None and procs["holder kept"].poll() is None


def test_a_pid_that_runs_something_else_now_is_left_alone(
    store: Store, procs: dict[str, Any]
) -> None:
    found, _ = gc.sweep(store, PREFIX, dry_run=True)
    qemu = next(o for o in found if o.kind == "qemu")
    holder = next(o for o in found if o.kind == "holder")
    stale = [type(qemu)(qemu.kind, str(procs["qemu kept"].pid), qemu.detail)]
    stale.append(type(holder)(holder.kind, str(procs["holder kept"].pid), holder.detail))
    registry.get("qemu").remove_orphan(stale[0])
    registry.get("crun").remove_orphan(stale[1])
    assert procs["qemu kept"].poll() is None and procs["holder kept"].poll() is None


def test_hpvc_gc_json_keeps_its_shape(
    store: Store, conn: Any, procs: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    define(conn, LOST, "head0")
    with pytest.raises(SystemExit) as e:
        main(["gc", "--dry-run", "--json", "--prefix", PREFIX])
    assert e.value.code == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) == {"removed", "found", "errors"} and doc["removed"] == []
    assert [set(o) for o in doc["found"]] == [{"kind", "name", "detail"}] * 3
    assert [o["kind"] for o in doc["found"]] == ["holder", "qemu", "libvirt-domain"]
