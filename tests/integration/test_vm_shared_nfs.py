"""A VM cluster's shared directory over NFS, for real (TCG here): NFS-Ganesha in
the head's guest on its backing disk, the kernel's NFS client in every guest.

Both VM backends: QEMU started directly, and libvirt (a private libvirtd,
tests/integration/test_vm_libvirt.py), each with two small VMs at a time on
the test's own bridge (10.236.<pid>.0/24); the fixture tears down whatever is
left and checks that no QEMU, tap, bridge, image file or loop device stays.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpvc.cluster import lifecycle, ops
from hpvc.errors import HpvcError, InputError
from hpvc.image import DEFAULT_PACKAGES, build_image, resolve_image
from hpvc.image.model import NFS_SERVER_PACKAGES
from hpvc.store import Store
from tests.helpers import requires
from tests.integration.test_cluster import clean_up, image_ready
from tests.integration.test_vm_cluster import vm_leftovers
from tests.integration.test_vm_libvirt import PrivateLibvirtd, running_libvirtd

pytestmark = pytest.mark.integration

NFS_IMAGE = "nfs"  # the default packages plus the NFS server (what preflight asks for)


def nfs_image_ready() -> None:
    requires("debootstrap")
    try:
        ok = set(NFS_SERVER_PACKAGES) <= set(resolve_image(NFS_IMAGE).packages)
    except HpvcError:
        ok = False
    if not ok:  # the first run on a machine builds it (cached afterwards)
        build_image(NFS_IMAGE, [*DEFAULT_PACKAGES, *NFS_SERVER_PACKAGES])


def loop_devices(root: Path) -> list[str]:
    """Loop devices whose backing file lies under ``root``."""
    found = []
    for backing in Path("/sys/block").glob("loop*/loop/backing_file"):
        text = backing.read_text().strip()
        if text.startswith(str(root)):
            found.append(f"{backing.parts[3]} on {text}")
    return found


def leftovers(name: str, store: Store) -> list[str]:
    found = vm_leftovers(name, store)
    found += [f"tap {t}" for t in taps(name)]
    found += [str(p) for p in (store.root / "shared").glob(f"{name}.img*")]
    return found + loop_devices(store.root)


def taps(name: str) -> list[str]:
    """The cluster's taps, if any are still enslaved to a bridge named for it."""
    r = subprocess.run(
        ["ip", "-o", "link", "show", "master", f"hpvc-{name}"],
        capture_output=True,
        text=True,
        check=False,
    )
    return [line.split(":")[1].strip() for line in r.stdout.splitlines()]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    requires("root", "qemu", "ip")
    s = Store(tmp_path / "state")
    yield s
    clean_up(s, lambda name: leftovers(name, s))


@pytest.fixture
def libvirtd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateLibvirtd]:
    with running_libvirtd(tmp_path_factory.mktemp("libvirtd")) as daemon:
        yield daemon


def spec_file(
    tmp_path: Path, name: str, image: str, backend: str = "qemu", keep: bool = False
) -> str:
    p = tmp_path / f"{name}.toml"
    p.write_text(
        f'name = "{name}"\nkind = "vm"\nbackend = "{backend}"\nimage = "{image}"\n'
        f'[network]\nsubnet = "10.236.{os.getpid() % 250}.0/24"\n'
        '[tuning]\npinning = "shared"\nhugepages = "none"\npartition = "commodity"\n'
        f'[shared]\nserver = "nfs"\nsize = "256MiB"\nkeep = {str(keep).lower()}\n'
        '[[nodes]]\nrole = "head"\nvcpus = 1\nmemory = "256MiB"\n'
        '[[nodes]]\nrole = "compute"\nvcpus = 1\nmemory = "256MiB"\n'
    )
    return str(p)


def out_of(capfd: pytest.CaptureFixture[str], code: int) -> str:
    captured = capfd.readouterr()
    assert code == 0, captured.err
    return captured.out


def test_an_image_without_the_nfs_server_is_refused_before_any_change(
    store: Store, tmp_path: Path
) -> None:
    image_ready()  # "hpc": the default packages, no Ganesha
    name = f"m{os.getpid() % 10000}"
    with pytest.raises(InputError, match="hpvc image build hpc --packages nfs-ganesha"):
        lifecycle.up(spec_file(tmp_path, name, "hpc"), store)
    assert store.names() == [] and leftovers(name, store) == []


def test_vm_nodes_share_a_directory_over_nfs(
    store: Store, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    nfs_image_ready()
    shares_over_nfs(store, tmp_path, capfd, f"n{os.getpid() % 10000}", "qemu")


def test_libvirt_nodes_share_a_directory_over_nfs(
    libvirtd: PrivateLibvirtd,  # first: it stops after `store` has torn the cluster down
    store: Store,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nfs_image_ready()
    monkeypatch.setenv("HPVC_LIBVIRT_URI", libvirtd.uri)
    shares_over_nfs(store, tmp_path, capfd, f"l{os.getpid() % 10000}", "libvirt")


def shares_over_nfs(
    store: Store, tmp_path: Path, capfd: pytest.CaptureFixture[str], name: str, backend: str
) -> None:
    """Up, a file written on compute0 read on head0, the mounts, status, down."""
    lifecycle.up(spec_file(tmp_path, name, NFS_IMAGE, backend), store)
    rec = store.get(name)
    plan = rec.the_plan()
    server = plan.node("head0").ip
    image = store.cluster_dir(name) / "export.img"
    assert image.is_file() and loop_devices(store.root) == []  # the guest's disk, not the host's
    assert "shared" in rec.phases
    capfd.readouterr()

    # Written on compute0, read on head0 (the server, through its own mount).
    text = f"hello from compute0 of {name}"
    write = ["sh", "-c", f"echo '{text}' > /shared/hello && sync"]
    out_of(capfd, ops.exec_node(name, "compute0", write, store))
    assert out_of(capfd, ops.exec_node(name, "head0", ["cat", "/shared/hello"], store)) == (
        text + "\n"
    )
    for node in ("compute0", "head0"):  # the kernel's NFSv3 client, from the server's address
        mounts = out_of(capfd, ops.exec_node(name, node, ["cat", "/proc/mounts"], store))
        line = next(m for m in mounts.splitlines() if m.split()[1] == "/shared")
        source, _, kind, opts = line.split()[:4]
        assert (source, kind) == (f"{server}:/shared", "nfs"), line
        assert "vers=3" in opts and "proto=tcp" in opts and f"addr={server}" in opts
    # The file lives on the server's backing disk.
    out = out_of(capfd, ops.exec_node(name, "head0", ["cat", "/srv/hpvc-shared/hello"], store))
    assert out == text + "\n"

    st = ops.status(name, store)["shared_dir"]
    assert st["server"] == "nfs" and st["node"] == "head0" and st["path"] == "/shared"
    assert st["export"] == f"{server}:/shared" and st["backing"] == str(image)
    assert st["mounts"] == {"head0": "ok", "compute0": "ok"}
    assert 200 << 20 < st["size_bytes"] <= 256 << 20 and 0 < st["used_bytes"] < st["size_bytes"]

    lifecycle.down(name, store)
    assert leftovers(name, store) == []
    assert not image.exists()


def test_kept_data_survives_down_and_the_next_up_finds_it(
    store: Store, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    nfs_image_ready()
    name = f"k{os.getpid() % 10000}"
    spec = spec_file(tmp_path, name, NFS_IMAGE, keep=True)
    image = store.root / "shared" / f"{name}.img"
    lifecycle.up(spec, store)
    capfd.readouterr()
    write = ["sh", "-c", "echo kept > /shared/data && sync"]
    out_of(capfd, ops.exec_node(name, "compute0", write, store))
    lifecycle.down(name, store)
    assert image.is_file() and vm_leftovers(name, store) == [] and loop_devices(store.root) == []
    lifecycle.up(spec, store)
    capfd.readouterr()
    assert out_of(capfd, ops.exec_node(name, "head0", ["cat", "/shared/data"], store)) == "kept\n"
    assert ops.status(name, store)["shared_dir"]["backing"] == str(image)
    lifecycle.down(name, store)
    assert image.is_file()
    image.unlink()  # the test's own: a site removes kept data by hand
    assert leftovers(name, store) == []
