"""VM nodes from an image without sshd (an imported one): its base disk gets what
hpvc-init needs and nothing of the image changes, hpvc reaches its guests
through their agents, and what needs sshd or the NFS server in the image is
refused in one line before any change (issue 26; docs/vms.md, "Imported
images"). The boot itself is in tests/integration/test_vm_imported.py."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest

from hpvc.backends.qemu.backend import QemuBackend, VmState
from hpvc.backends.vm import guest as g
from hpvc.backends.vm import guest_shared
from hpvc.errors import HpvcError, InputError
from hpvc.image import guest_disk
from hpvc.image.model import Image

RSH = "/store/guest/k/builds/x/hpvc-rsh"


def _image(rootfs_parent: Path, *, source: str = "oci:/l:t") -> Image:
    return Image(
        name="bb", digest="d" * 64, path=rootfs_parent, suite="", packages=(), mirror="",
        created="", size_bytes=0, build_seconds=0.0, debootstrap_version="", source=source,
        config={"Env": ["PATH=/bin", "GREETING=hi"], "WorkingDir": "/tmp"},
    )  # fmt: skip


def test_sshd_is_found_in_the_images_own_root(tmp_path: Path) -> None:
    image = _image(tmp_path)
    (image.rootfs / "bin").mkdir(parents=True)
    assert not g.has_sshd(image)
    (image.rootfs / "usr" / "sbin").mkdir(parents=True)
    (image.rootfs / "usr" / "sbin" / "sshd").symlink_to("/bin/sshd")  # the image's /bin
    assert not g.has_sshd(image)  # a dangling link in the image, whatever the host has
    (image.rootfs / "bin" / "sshd").write_bytes(b"\x7fELF")
    assert g.has_sshd(image)


def test_the_agent_route_runs_the_argv_as_it_is_with_the_clusters_key() -> None:
    argv = g.agent_argv(RSH, Path("/c"), "10.0.0.3", ["echo", "a b"], ["X=1"], "/tmp")
    assert argv == [
        RSH, "-a", "-k", "/c/agent.key", "-e", "X=1", "-C", "/tmp", "--", "10.0.0.3", "echo", "a b"
    ]  # fmt: skip
    assert g.guest_argv(Path("/c"), "10.0.0.3", ["true"], RSH)[:4] == [
        RSH,
        "-a",
        "-k",
        "/c/agent.key",
    ]
    assert g.guest_argv(Path("/c"), "10.0.0.3", ["true"])[0] == "ssh"  # an image with sshd


@dataclass(frozen=True)
class _Node:
    name: str
    ip: str


@dataclass(frozen=True)
class _Plan:
    nodes: tuple[_Node, ...]
    image: str = "bb"


@dataclass(frozen=True)
class _Env:
    name: str
    state: VmState
    dir: Path


def test_exec_goes_through_the_agent_with_the_images_env_and_workdir(tmp_path: Path) -> None:
    rsh = tmp_path / "hpvc-rsh"
    rsh.write_bytes(b"\x7fELF")
    st = VmState(agent_rsh=str(rsh), image_env=["PATH=/bin"], image_workdir="/tmp")
    env = cast(Any, _Env("c", st, Path("/c")))
    node = cast(Any, _Node("compute0", "10.0.0.3"))
    plan = cast(Any, _Plan((node,)))
    argv = QemuBackend().exec_argv(env, plan, node, ["cat", "/marker"])
    assert argv == g.agent_argv(
        str(rsh), Path("/c"), "10.0.0.3", ["cat", "/marker"], ["PATH=/bin"], "/tmp"
    )
    ssh = cast(Any, _Env("c", VmState(), Path("/c")))
    assert QemuBackend().exec_argv(ssh, plan, node, ["true"])[0] == "ssh"
    rsh.unlink()  # its guest build removed under a running cluster: said, not a traceback
    with pytest.raises(HpvcError, match=r"how hpvc reaches a guest without sshd\) is gone"):
        QemuBackend().exec_argv(env, plan, node, ["true"])


def test_an_open_mpi_run_is_refused_where_the_image_has_no_sshd() -> None:
    env = cast(Any, _Env("c", VmState(agent_rsh=RSH), Path("/c")))
    with pytest.raises(InputError) as e:
        QemuBackend().mpi_launch(env, cast(Any, _Plan((_Node("compute0", "10.0.0.3"),))))
    line = str(e.value)
    assert "\n" not in line and e.value.exit_code == 2
    assert "has no sshd (/usr/sbin/sshd)" in line and "openssh-server" in line


@dataclass(frozen=True)
class _Shared:
    server: str


@dataclass(frozen=True)
class _Spec:
    image: str
    shared: _Shared


def test_nfs_with_an_imported_image_lacking_it_is_refused_naming_what_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    image = _image(tmp_path)
    (image.rootfs / "usr" / "bin").mkdir(parents=True)
    (image.rootfs / "usr" / "bin" / "ganesha.nfsd").write_bytes(b"")
    monkeypatch.setattr(guest_shared, "resolve_image", lambda name: image)
    with pytest.raises(InputError) as e:
        guest_shared.preflight(cast(Any, _Spec("bb", _Shared("nfs"))))
    line = str(e.value)
    assert "\n" not in line and e.value.exit_code == 2
    assert "has no /usr/sbin/sshd, /usr/sbin/rpcbind, which" in line
    assert "ganesha" not in line.split("which")[0]
    guest_shared.preflight(cast(Any, _Spec("bb", _Shared("host"))))  # no NFS: nothing needed


def test_the_base_disk_of_a_bare_image_gets_mount_points_and_init_the_image_does_not(
    tmp_path: Path,
) -> None:
    debugfs = shutil.which("debugfs") or "/sbin/debugfs"
    if not Path(debugfs).exists() or shutil.which("mkfs.ext4", path="/sbin:/usr/sbin") is None:
        pytest.skip("e2fsprogs not installed")
    rootfs = tmp_path / "rootfs"
    (rootfs / "bin").mkdir(parents=True)  # no /sbin, /dev, /proc, /etc: like a scratch image
    (rootfs / "bin" / "marker").write_text("mine\n")
    before = sorted(str(p.relative_to(rootfs)) for p in rootfs.rglob("*"))
    init = tmp_path / "hpvc-init"
    init.write_bytes(b"\x7fELF init")
    disk = tmp_path / "disk.raw"
    guest_disk.make_base_disk(rootfs, init, disk, tmp_path)
    ls = subprocess.run([debugfs, "-R", "ls -l /", str(disk)], capture_output=True, text=True)
    names = {line.split()[-1] for line in ls.stdout.splitlines() if line.split()}
    assert {"bin", "sbin", *guest_disk.MOUNT_POINTS} <= names, ls.stdout + ls.stderr
    tmp = subprocess.run([debugfs, "-R", "stat /tmp", str(disk)], capture_output=True, text=True)
    assert "Mode:  01777" in tmp.stdout
    init_stat = subprocess.run(
        [debugfs, "-R", f"stat /{guest_disk.INIT_PATH}", str(disk)], capture_output=True, text=True
    )
    assert f"Size: {init.stat().st_size}" in init_stat.stdout
    assert sorted(str(p.relative_to(rootfs)) for p in rootfs.rglob("*")) == before
    assert (rootfs / "bin" / "marker").read_text() == "mine\n"
