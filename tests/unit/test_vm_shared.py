"""The NFS shared directory of VM clusters: spec, rendering, preflight, the guests' scripts.

Pure, apart from ``disk_image``, which makes a small ext4 image in tmp_path
with e2fsprogs (no mount, no loop device).
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from hpvc.backends.base import ClusterEnv, State
from hpvc.backends.vm import guest_shared
from hpvc.errors import HpvcError, InputError
from hpvc.host import nfs_backing, nfs_server
from hpvc.host.journal import Journal
from hpvc.image.guest import GuestArtifacts
from hpvc.image.model import DEFAULT_PACKAGES, NFS_SERVER_PACKAGES
from hpvc.plan import Plan, Reservations, plan_cluster
from hpvc.render import render_domain_xml
from hpvc.render.context import SHARED_DISK_SERIAL, RenderContext
from hpvc.render.qemu import qemu_argv
from hpvc.spec import Spec, parse_spec
from hpvc.store import ClusterRecord, Store
from tests.helpers import requires
from tests.unit.test_guest import fake_image
from tests.unit.topogen import make_topology

BASE = "/var/lib/hpvc"


def vm_spec(**shared: Any) -> Spec:
    return parse_spec(
        {
            "name": "nv",
            "kind": "vm",
            "tuning": {"pinning": "shared", "hugepages": "none"},
            "nodes": [
                {"role": "head", "memory": "256MiB"},
                {"role": "compute", "count": 2, "memory": "256MiB"},
            ],
            "shared": {"server": "nfs", **shared},
        },
        "t.toml",
    )


def vm_plan(**shared: Any) -> Plan:
    return plan_cluster(vm_spec(**shared), [("h", make_topology())], Reservations())


def ctx(**kw: Any) -> RenderContext:
    return RenderContext(base_dir=BASE, kernel="/k/vmlinuz", initrd="/k/initrd.img", **kw)


def drives(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == "-drive"]


# --- spec and plan ----------------------------------------------------------------------


def test_the_spec_takes_nfs_for_vms_and_the_plan_names_the_server() -> None:
    p = vm_plan()
    assert p.shared is not None
    assert (p.shared.server, p.shared.node, p.shared.address) == ("nfs", "head0", "10.88.0.2")
    assert p.shared.size_mib == 4096  # no size in the spec: the VM default


# --- rendering: the backing disk on the server node only -------------------------------


def test_qemu_gives_the_backing_disk_to_the_server_node_only() -> None:
    p = vm_plan()
    server = qemu_argv(p, p.node("head0"), ctx())
    disk = f"{BASE}/clusters/nv/export.img"
    assert drives(server)[1] == (f"file={disk},if=none,id=disk1,format=raw,cache=none,aio=native")
    assert f"virtio-blk-pci,drive=disk1,serial={SHARED_DISK_SERIAL}" in server
    for name in ("compute0", "compute1"):
        argv = qemu_argv(p, p.node(name), ctx())
        assert len(drives(argv)) == 1 and not any(SHARED_DISK_SERIAL in a for a in argv)


def test_the_backing_disk_path_follows_keep_or_the_backends_choice() -> None:
    kept = vm_plan(keep=True)
    assert drives(qemu_argv(kept, kept.node("head0"), ctx()))[1].startswith(
        f"file={BASE}/shared/nv.img,"
    )
    given = ctx(shared_image="/x/a,b.img")
    assert drives(qemu_argv(kept, kept.node("head0"), given))[1].startswith("file=/x/a,,b.img,")
    host = dataclasses.replace(kept, shared=dataclasses.replace(kept.shared, server="host"))
    assert len(drives(qemu_argv(host, host.node("head0"), ctx()))) == 1


def _disks(xml: str) -> list[ET.Element]:
    return ET.fromstring(xml).findall("devices/disk")


def test_libvirt_gives_the_backing_disk_to_the_server_node_only() -> None:
    p = vm_plan()
    disks = _disks(render_domain_xml(p, p.node("head0"), ctx()))
    assert [d.find("target").get("dev") for d in disks] == ["vda", "vdb"]  # type: ignore[union-attr]
    shared = disks[1]
    assert shared.find("source").get("file") == f"{BASE}/clusters/nv/export.img"  # type: ignore[union-attr]
    assert shared.findtext("serial") == SHARED_DISK_SERIAL
    driver = shared.find("driver")
    assert driver is not None and (driver.get("type"), driver.get("cache")) == ("raw", "none")
    for name in ("compute0", "compute1"):
        assert len(_disks(render_domain_xml(p, p.node(name), ctx()))) == 1


def test_libvirt_xml_with_the_backing_disk_validates(tmp_path: Path) -> None:
    requires("virt-xml-validate")
    p = vm_plan(keep=True)
    for c in (ctx(), ctx(accel="kvm"), RenderContext()):
        for node in p.nodes:
            path = tmp_path / f"{node.name}.xml"
            path.write_text(render_domain_xml(p, node, c))
            r = subprocess.run(
                ["virt-xml-validate", str(path), "domain"], capture_output=True, text=True
            )
            assert r.returncode == 0, f"{path}: {r.stdout}{r.stderr}"


# --- preflight ------------------------------------------------------------------------


def test_preflight_refuses_an_image_without_the_nfs_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bare = dataclasses.replace(fake_image(tmp_path), packages=DEFAULT_PACKAGES)
    monkeypatch.setattr(guest_shared, "resolve_image", lambda name: bare)
    with pytest.raises(InputError) as e:
        guest_shared.preflight(vm_spec())
    line = e.value.line()
    assert "nfs-ganesha, nfs-ganesha-vfs, rpcbind" in line and "\n" not in line
    assert "(hpvc image build hpc --packages nfs-ganesha,nfs-ganesha-vfs,rpcbind)" in line
    served = dataclasses.replace(bare, packages=(*DEFAULT_PACKAGES, *NFS_SERVER_PACKAGES))
    monkeypatch.setattr(guest_shared, "resolve_image", lambda name: served)
    guest_shared.preflight(vm_spec())
    monkeypatch.setattr(guest_shared, "resolve_image", lambda name: pytest.fail("asked"))
    host = {"name": "h", "kind": "vm", "nodes": [{"role": "head"}]}
    guest_shared.preflight(parse_spec(host, "t.toml"))


def test_the_fix_rebuilds_the_image_with_its_own_packages_and_extras(tmp_path: Path) -> None:
    image = dataclasses.replace(
        fake_image(tmp_path), name="tools", packages=(*DEFAULT_PACKAGES, "strace")
    )
    rebuild = guest_shared.rebuild_with_nfs
    assert rebuild(image) == (
        "hpvc image build tools --packages nfs-ganesha,nfs-ganesha-vfs,rpcbind,strace"
    )
    bare = dataclasses.replace(image, packages=("busybox",), extras=("spark-3.5.3",))
    assert rebuild(bare) == (
        "hpvc image build tools --packages busybox,nfs-ganesha,nfs-ganesha-vfs,rpcbind"
        " --no-defaults --extras spark-3.5.3"
    )  # a Spark image built before its recipe had the NFS server: the preset has it now
    spark = dataclasses.replace(image, name="spark", extras=("spark-3.5.3",))
    assert rebuild(spark) == "hpvc image build spark: its recipe has them now"


# --- the backend's pieces -------------------------------------------------------------


class _State(State):
    pass


def env_of(tmp_path: Path, plan: Plan, tenant: bool = False) -> ClusterEnv:
    rec = ClusterRecord(
        name=plan.cluster, spec={}, spec_path="", plan=plan.to_json(), status="running",
        created=0.0, updated=0.0, tenant=tenant,
    )  # fmt: skip
    return ClusterEnv(Store(tmp_path / "state"), rec, _State())


def test_the_backend_passes_the_nfs_initramfs_and_the_image_the_renderer_expects(
    tmp_path: Path,
) -> None:
    for keep in (False, True):
        p = vm_plan(keep=keep)
        env = env_of(tmp_path, p)
        art = GuestArtifacts(
            kernel=Path("/k"), initrd=Path("/i"), disk=Path("/d"), kernel_version="v",
            initrd_nfs=Path("/i-nfs"),
        )  # fmt: skip
        base = RenderContext(base_dir=str(env.store.root), initrd="/i")
        c = guest_shared.context(env, p, art, base)
        assert c.initrd == "/i-nfs"
        default = base.shared_disk(p.cluster, "head0", p.shared)
        assert c.shared_image == default == str(guest_shared.image_path(env, p.shared))  # type: ignore[arg-type]
    host = dataclasses.replace(p, shared=None)
    assert guest_shared.context(env, host, art, base) is base


def test_the_server_script_serves_the_containers_config_and_waits() -> None:
    p = vm_plan()
    assert p.shared is not None
    text = guest_shared.server_script(p, p.shared, root_squash=False)
    conf = nfs_server.render_config(
        export_dir=guest_shared.EXPORT_DIR, folder=guest_shared.FOLDER,
        subnet=p.network.subnet, address="10.88.0.2", root_squash=False,
    )  # fmt: skip
    assert f"<<'HPVC_EOF'\n{conf}HPVC_EOF\n" in text
    assert f"= {SHARED_DISK_SERIAL} ] && dev=/dev/$" in text
    assert "listening 0801 && listening 4E50" in text  # 2049 and 20048 in /proc/net/tcp
    assert "ganesha.nfsd -F" in text and "rpcbind" in text
    squashed = guest_shared.server_script(p, p.shared, root_squash=True)
    assert "Squash = root_squash;" in squashed


def test_the_mount_is_the_kernels_own_nfsv3_without_helper_or_portmapper() -> None:
    p = vm_plan(path="/data")
    assert p.shared is not None
    text = guest_shared.mount_script(p.shared)
    opts = "vers=3,proto=tcp,port=2049,mountport=20048,mountproto=tcp,nolock,hard,addr=10.88.0.2"
    assert f"mount -i -t nfs -o {opts} 10.88.0.2:/shared /data" in text
    assert "grep -q ' /data nfs ' /proc/mounts" in text


def test_status_has_the_containers_shape_with_mounts_read_in_the_guests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = vm_plan(size="1GiB")
    env = env_of(tmp_path, p)
    asked: dict[str, str] = {}

    def ssh_all(env: ClusterEnv, plan: Plan, scripts: dict[str, str], wait_s: float) -> Any:
        asked.update(scripts)
        return {
            "head0": (0, "ok\nbacking 4096 262144 200000\n", ""),
            "compute0": (0, "not answering (no reply in 5 s)\n", ""),
        }

    monkeypatch.setattr(guest_shared, "_ssh_all", ssh_all)
    st = guest_shared.status(env, p, ["head0", "compute0"])
    assert sorted(asked) == ["compute0", "head0"]
    assert "/srv/hpvc-shared" in asked["head0"] and "/srv/hpvc-shared" not in asked["compute0"]
    assert st == {
        "server": "nfs",
        "path": "/shared",
        "keep": False,
        "node": "head0",
        "export": "10.88.0.2:/shared",
        "backing": str(env.dir / "export.img"),
        "size_mib": 1024,
        "size_bytes": 262144 * 4096,
        "used_bytes": (262144 - 200000) * 4096,
        "mounts": {
            "head0": "ok",
            "compute0": "not answering (no reply in 5 s)",
            "compute1": "not running",
        },
    }
    assert guest_shared.status(env, dataclasses.replace(p, shared=None), []) is None


def test_a_failed_server_is_reported_before_its_clients(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = vm_plan()
    env = env_of(tmp_path, p)
    done = {
        "compute0": (1, "", "mount 10.88.0.2:/shared on /shared: Connection refused\n"),
        "head0": (1, "", "NFS-Ganesha is not listening: bad config\n"),
        "compute1": (0, "", ""),
    }
    monkeypatch.setattr(guest_shared, "_ssh_all", lambda *a: done)
    with pytest.raises(HpvcError, match="head0: NFS-Ganesha is not listening: bad config"):
        guest_shared.start(env, p, ["compute0", "head0", "compute1"], lambda _m: None)
    monkeypatch.setattr(guest_shared, "_ssh_all", lambda *a: {"compute1": (0, "", "")})
    assert guest_shared.start(env, p, ["compute1"], lambda _m: None) is not None


def test_a_failed_ssh_is_tried_again_with_that_nodes_script_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = vm_plan()
    env = env_of(tmp_path, p)
    calls: list[list[str]] = []

    def ssh_all(env: ClusterEnv, plan: Plan, scripts: dict[str, str], wait_s: float) -> Any:
        calls.append(sorted(scripts))
        first = len(calls) == 1
        return {n: (255 if first and n == "compute1" else 0, "", "") for n in scripts}

    monkeypatch.setattr(guest_shared, "_ssh_all", ssh_all)
    monkeypatch.setattr(guest_shared.time, "sleep", lambda _s: None)
    assert (
        guest_shared.start(env, p, ["head0", "compute0", "compute1"], lambda _m: None) is not None
    )
    assert calls == [["compute0", "compute1", "head0"], ["compute1"]]


# --- the backing image ----------------------------------------------------------------


def test_disk_image_is_an_unmounted_ext4_owned_by_everyone_and_kept_on_request(
    tmp_path: Path,
) -> None:
    for tool in ("mkfs.ext4", "debugfs"):  # e2fsprogs: on every Debian
        if shutil.which(tool, path="/usr/sbin:/sbin:/usr/bin") is None:
            pytest.skip(f"{tool} not installed")
    image = tmp_path / "c1.img"
    j = Journal(tmp_path / "j")
    assert nfs_backing.disk_image(j, image=image, size_mib=32, keep=False) == image
    assert image.stat().st_size == 32 << 20 and image.stat().st_blocks * 512 < 8 << 20  # sparse
    root = subprocess.run(
        ["debugfs", "-R", "stat /", str(image)], capture_output=True, text=True, check=True
    )
    assert "Mode:  01777" in root.stdout
    assert str(image) not in Path("/proc/self/mounts").read_text()
    j.undo_all()
    assert not image.exists()
    kept = Journal(tmp_path / "k")
    nfs_backing.disk_image(kept, image=image, size_mib=32, keep=True)
    kept.undo_all()
    assert image.exists()  # kept; the next up uses it as it is, and leaves it
    again = Journal(tmp_path / "again")
    image.write_bytes(b"data")  # (any content: it is not made again)
    nfs_backing.disk_image(again, image=image, size_mib=32, keep=False)
    again.undo_all()
    assert image.read_bytes() == b"data"
    with pytest.raises(HpvcError, match="too small"):
        nfs_backing.disk_image(j, image=tmp_path / "tiny.img", size_mib=8, keep=False)
