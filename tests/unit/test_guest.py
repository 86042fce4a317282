"""The VM guest boot chain without root or QEMU: kernel command line, module order,
initramfs layout, cache keys and reuse, disk sizes, per-node raw disks, hpvc-init's
compile flags. The real boot is in tests/integration/test_guest_boot.py."""

from __future__ import annotations

import base64
import gzip
import json
import lzma
import os
import subprocess
from pathlib import Path

import pytest

from hpvc.errors import HpvcError, InputError
from hpvc.image import guest, guest_kernel, ucx
from hpvc.image.guest import (
    CMDLINE_MAX,
    CmdlineError,
    GuestArtifacts,
    build_guest,
    cache_key,
    init_sources,
    kernel_cmdline,
    node_disk,
)
from hpvc.image.guest_disk import disk_size, in_tree
from hpvc.image.guest_initramfs import (
    initramfs_members,
    list_initramfs,
    module_order,
    pack_initramfs,
)
from hpvc.image.guest_kernel import (
    ALL_MODULES,
    BIND_MODULES,
    MODULES,
    NFS_MODULES,
    Kernel,
    check_order,
    decompress,
    modinfo_depends,
    parse_apt_depends,
    resolve_version,
)
from hpvc.image.model import Image

KVER = "6.1.0-56-cloud-amd64"
ED25519 = (
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAIRhvuTEsYB1rUU+OuTwaFOHI312+KA/BkLLdP1fDk6 hpvc test key"
)
# What `apt-cache depends linux-image-cloud-amd64` printed on bookworm.
APT_DEPENDS = "linux-image-cloud-amd64\n  Depends: linux-image-6.1.0-56-cloud-amd64\n"
# The depends= of each module in linux-image-6.1.0-56-cloud-amd64 (modinfo).
REAL_DEPENDS: dict[str, tuple[str, ...]] = {
    "virtio_ring": (),
    "virtio": (),
    "virtio_pci_modern_dev": (),
    "virtio_pci_legacy_dev": (),
    "virtio_pci": ("virtio_ring", "virtio_pci_modern_dev", "virtio_pci_legacy_dev", "virtio"),
    "virtio_blk": ("virtio_ring", "virtio"),
    "failover": (),
    "net_failover": ("failover",),
    "virtio_net": ("virtio_ring", "virtio", "net_failover"),
    "qemu_fw_cfg": (),
}
# The same for the NFS client's modules (the kernel asks for none of them by itself).
REAL_NFS_DEPENDS: dict[str, tuple[str, ...]] = {
    "sunrpc": (),
    "grace": (),
    "lockd": ("sunrpc", "grace"),
    "nfs_acl": ("sunrpc",),
    "netfs": (),
    "fscache": ("netfs",),
    "nfs": ("sunrpc", "fscache", "lockd"),
    "nfsv3": ("nfs", "lockd", "sunrpc", "nfs_acl"),
}
# virtiofs's, as modinfo printed them (loaded only for hpvc.binds=).
REAL_BIND_DEPENDS: dict[str, tuple[str, ...]] = {
    "fuse": (),
    "virtiofs": ("fuse", "virtio", "virtio_ring"),
}
ALL_DEPENDS = {**REAL_DEPENDS, **REAL_NFS_DEPENDS, **REAL_BIND_DEPENDS}


def words(line: str) -> dict[str, str]:
    return dict(w.split("=", 1) if "=" in w else (w, "") for w in line.split())


# ---- kernel command line ----------------------------------------------------------


def test_cmdline_has_the_boot_words_and_every_hpvc_key() -> None:
    line = kernel_cmdline("node-1", "10.88.0.3/24", 9000, ED25519)
    w = words(line)
    for word in ("console", "root", "rw", "no_timer_check"):
        assert word in w
    assert (w["console"], w["root"]) == ("ttyS0", "/dev/vda")
    assert (w["hpvc.name"], w["hpvc.ip"], w["hpvc.mtu"]) == ("node-1", "10.88.0.3/24", "9000")
    assert base64.b64decode(w["hpvc.key"]).decode() == ED25519
    assert " " not in w["hpvc.key"]


def test_cmdline_leaves_out_what_is_not_given() -> None:
    line = kernel_cmdline("testnode", None, None, None)
    assert "hpvc.name=testnode" in line
    assert "hpvc.ip" not in line and "hpvc.mtu" not in line and "hpvc.key" not in line


def test_cmdline_carries_the_binds_as_tag_and_path_lines() -> None:
    """hpvc-init mounts each tag at its path (native/guest/init.c, mount_binds)."""
    binds = (("hpvcfs0", "/home"), ("hpvcfs1", "/scratch/with space"))
    w = words(kernel_cmdline("n", "10.0.0.2/8", None, None, binds=binds))
    text = base64.b64decode(w["hpvc.binds"]).decode()
    assert text == "hpvcfs0 /home\nhpvcfs1 /scratch/with space\n"
    assert "hpvc.binds" not in kernel_cmdline("n", None, None, None)


@pytest.mark.parametrize(
    "binds", [(("fs 0", "/home"),), (("hpvcfs0", "home"),), (("hpvcfs0", "/a\nb"),)]
)
def test_cmdline_refuses_bad_binds(binds: tuple[tuple[str, str], ...]) -> None:
    with pytest.raises(CmdlineError):
        kernel_cmdline("n", None, None, None, binds=binds)


def test_cmdline_strips_a_trailing_newline_of_the_key() -> None:
    w = words(kernel_cmdline("n", "10.0.0.2/8", None, ED25519 + "\n"))
    assert base64.b64decode(w["hpvc.key"]).decode() == ED25519


def test_cmdline_takes_an_rsa_4096_key() -> None:
    blob = base64.b64encode(os.urandom(535)).decode()  # the size of a 4096-bit key blob
    line = kernel_cmdline("n" * 63, "10.255.255.254/16", 65520, f"ssh-rsa {blob} user@host")
    assert len(line.encode()) < CMDLINE_MAX


def test_cmdline_of_2048_bytes_or_more_is_refused() -> None:
    key = "ssh-rsa " + "A" * 1440  # with a 1-byte name the line has 2023 bytes
    encoded = base64.b64encode(key.encode()).decode()
    lengths = set()
    for n in range(1, 64):  # one byte longer each time, across the limit
        name = "n" * n
        length = len(" ".join([*guest.BASE_CMDLINE, f"hpvc.name={name}", f"hpvc.key={encoded}"]))
        lengths.add(length)
        if length < CMDLINE_MAX:
            assert len(kernel_cmdline(name, None, None, key)) == length
        else:
            with pytest.raises(ValueError, match="fewer than 2048"):
                kernel_cmdline(name, None, None, key)
    assert {CMDLINE_MAX - 1, CMDLINE_MAX} <= lengths


@pytest.mark.parametrize(
    ("name", "ip", "mtu", "key"),
    [
        ("Node", None, None, None),
        ("a b", None, None, None),
        ("-n", None, None, None),
        ("n" * 64, None, None, None),
        ("n", "10.0.0.300/24", None, None),
        ("n", "10.0.0.3", None, None),
        ("n", "fd00::3/64", None, None),
        ("n", None, 67, None),
        ("n", None, 65536, None),
        ("n", None, None, "not a key"),
        ("n", None, None, ED25519 + "\nssh-ed25519 AAAA second"),
    ],
)
def test_cmdline_refuses_bad_values(name: str, ip: str | None, mtu: int | None, key: str) -> None:
    with pytest.raises(ValueError) as info:
        kernel_cmdline(name, ip, mtu, key)
    assert isinstance(info.value, InputError)  # the CLI prints it as one line


# ---- kernel: version, module order -------------------------------------------------


def test_parse_apt_depends() -> None:
    assert parse_apt_depends(APT_DEPENDS) == KVER
    assert parse_apt_depends("linux-image-cloud-amd64\n") is None
    assert parse_apt_depends("x\n |Depends: linux-image-6.1.0-57-cloud-amd64\n") == (
        "6.1.0-57-cloud-amd64"
    )


def test_modinfo_depends_reads_the_modinfo_strings() -> None:
    blob = b"\x7fELF...\0license=GPL\0depends=virtio_ring,virtio,net-failover\0name=virtio_net\0"
    assert modinfo_depends(blob) == ("virtio_ring", "virtio", "net_failover")
    assert modinfo_depends(b"\0depends=\0name=virtio\0") == ()


def test_module_order_loads_every_dependency_first() -> None:
    assert set(MODULES) == set(REAL_DEPENDS)
    check_order(REAL_DEPENDS, MODULES)
    swapped = list(MODULES)
    swapped[4], swapped[0] = swapped[0], swapped[4]  # virtio_pci before virtio_ring
    with pytest.raises(HpvcError, match="virtio_pci"):
        check_order(REAL_DEPENDS, swapped)


def test_nfs_modules_load_after_the_virtio_ones_each_after_its_dependencies() -> None:
    assert set(NFS_MODULES) == set(REAL_NFS_DEPENDS) and set(BIND_MODULES) == set(REAL_BIND_DEPENDS)
    assert ALL_MODULES == MODULES + NFS_MODULES + BIND_MODULES
    check_order(ALL_DEPENDS, ALL_MODULES)
    check_order(ALL_DEPENDS, MODULES + BIND_MODULES)  # the plain initramfs, with hpvc.binds=
    with pytest.raises(HpvcError, match="virtiofs"):
        check_order(ALL_DEPENDS, [*MODULES, "virtiofs", "fuse"])
    with pytest.raises(HpvcError, match="nfsv3"):
        check_order(REAL_NFS_DEPENDS, ["sunrpc", "grace", "lockd", "nfs_acl", "nfsv3"])


def test_a_kernel_fetched_with_fewer_modules_is_completed_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An older hpvc kept only the virtio modules: the NFS ones are added to its
    folder, and its guest builds (base disks in use by running VMs) stay."""
    kdir = tmp_path / KVER
    (kdir / "modules").mkdir(parents=True)
    (kdir / "builds" / "k").mkdir(parents=True)
    (kdir / "vmlinuz").write_bytes(b"kernel")
    (kdir / "kernel.json").write_text(json.dumps({"version": KVER, "modules": list(MODULES)}))
    assert not Kernel(KVER, kdir).is_complete()
    depends = ALL_DEPENDS

    def unpack(kver: str, tmp: Path) -> tuple[Path, str]:
        tree = tmp / "tree"
        mods = tree / "lib" / "modules" / kver / "kernel"
        mods.mkdir(parents=True)
        (tree / "boot").mkdir()
        (tree / "boot" / f"vmlinuz-{kver}").write_bytes(b"kernel")
        (tree / "boot" / f"config-{kver}").write_text("CONFIG_NFS_FS=m\n")
        for name in ALL_MODULES:
            blob = f"\0depends={','.join(depends[name])}\0name={name}\0".encode()
            (mods / f"{name}.ko").write_bytes(blob)
        (tmp / "deb").mkdir(exist_ok=True)
        return tree, "6.1.192-2"

    monkeypatch.setattr(guest_kernel, "_unpack", unpack)
    kernel = guest_kernel.ensure_kernel(tmp_path, KVER, lambda _m: None)
    assert kernel.is_complete()
    assert (kdir / "builds" / "k").is_dir()
    assert sorted(p.name for p in (kdir / "modules").iterdir()) == sorted(
        f"{m}.ko" for m in ALL_MODULES
    )
    assert [p.name for p in kernel.nfs_modules] == [f"{m}.ko" for m in MODULES + NFS_MODULES]
    assert [p.name for p in kernel.bind_modules] == ["fuse.ko", "virtiofs.ko"]
    assert not list(tmp_path.glob(f"{KVER}.tmp-*"))


def test_compressed_modules_are_decompressed(tmp_path: Path) -> None:
    data = b"\x7fELF module bytes" * 100
    (tmp_path / "a.ko.xz").write_bytes(lzma.compress(data, format=lzma.FORMAT_XZ))
    (tmp_path / "b.ko.gz").write_bytes(gzip.compress(data))
    (tmp_path / "c.ko").write_bytes(data)
    for name in ("a.ko.xz", "b.ko.gz", "c.ko"):
        assert decompress(tmp_path / name) == data


def test_resolve_version_asks_apt_once_per_change_of_its_lists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lists = tmp_path / "lists"
    lists.mkdir()
    asked: list[int] = []

    def candidate() -> str | None:
        asked.append(1)
        return KVER

    monkeypatch.setattr(guest_kernel, "_apt_candidate", candidate)
    assert resolve_version(tmp_path / "guest", lists) == KVER
    assert resolve_version(tmp_path / "guest", lists) == KVER
    assert len(asked) == 1
    os.utime(lists, ns=(0, 12345))
    assert resolve_version(tmp_path / "guest", lists) == KVER
    assert len(asked) == 2


def test_resolve_version_falls_back_to_a_fetched_kernel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(guest_kernel, "_apt_candidate", lambda: None)
    with pytest.raises(InputError, match="apt-get update"):
        resolve_version(tmp_path / "guest", tmp_path / "no-lists")
    fake_kernel(tmp_path / "guest")
    assert resolve_version(tmp_path / "guest", tmp_path / "no-lists") == KVER


# ---- initramfs ---------------------------------------------------------------------


def fake_modules(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in MODULES:
        path = directory / f"{name}.ko"
        path.write_bytes(f"module {name}".encode())
        paths.append(path)
    return paths


def test_initramfs_holds_init_and_the_modules_in_load_order(tmp_path: Path) -> None:
    init = tmp_path / "hpvc-init"
    init.write_bytes(b"\x7fELF init")
    dest = tmp_path / "initrd.img"
    members = pack_initramfs(init, fake_modules(tmp_path / "mods"), dest, tmp_path)
    assert members == initramfs_members(MODULES)
    assert list_initramfs(dest) == members
    assert members[:3] == ["dev", "init", "modules"]
    assert members[3 : 3 + len(MODULES)] == [f"modules/{m}.ko" for m in MODULES]
    assert {"newroot", "proc", "sys", "modules/order"} <= set(members)
    assert module_order(MODULES).splitlines() == [f"{m}.ko" for m in MODULES]
    assert not (tmp_path / "initramfs").exists()  # the scratch stage is gone


def test_initramfs_lists_the_bind_modules_apart_after_the_others(tmp_path: Path) -> None:
    """virtiofs's modules are packed after modules/order, in modules/binds, which
    hpvc-init loads only for a command line with hpvc.binds=."""
    init = tmp_path / "hpvc-init"
    init.write_bytes(b"\x7fELF init")
    binds = []
    for name in BIND_MODULES:
        binds.append(tmp_path / "bmods" / f"{name}.ko")
        binds[-1].parent.mkdir(exist_ok=True)
        binds[-1].write_bytes(name.encode())
    dest = tmp_path / "initrd.img"
    members = pack_initramfs(init, fake_modules(tmp_path / "mods"), dest, tmp_path, binds)
    assert members == initramfs_members(MODULES, BIND_MODULES) == list_initramfs(dest)
    order = members.index("modules/order")
    assert members[order + 1 : order + 4] == [
        "modules/fuse.ko",
        "modules/virtiofs.ko",
        "modules/binds",
    ]
    assert "modules/binds" not in initramfs_members(MODULES)


def test_initramfs_members_are_root_owned_and_the_archive_reproducible(tmp_path: Path) -> None:
    init = tmp_path / "hpvc-init"
    init.write_bytes(b"\x7fELF init")
    mods = fake_modules(tmp_path / "mods")
    pack_initramfs(init, mods, tmp_path / "a.img", tmp_path)
    pack_initramfs(init, mods, tmp_path / "b.img", tmp_path)
    assert (tmp_path / "a.img").read_bytes() == (tmp_path / "b.img").read_bytes()
    listing = subprocess.run(
        ["cpio", "-tv", "--quiet"],
        input=gzip.decompress((tmp_path / "a.img").read_bytes()),
        capture_output=True,
        check=True,
    ).stdout.decode()
    init_line = next(line for line in listing.splitlines() if line.endswith(" init"))
    assert init_line.startswith("-rwxr-xr-x")
    assert all(" root " in line for line in listing.splitlines())
    order = subprocess.run(
        ["cpio", "-i", "--to-stdout", "--quiet", "modules/order"],
        input=gzip.decompress((tmp_path / "a.img").read_bytes()),
        capture_output=True,
        check=True,
    ).stdout.decode()
    assert order == module_order(MODULES)


# ---- cache keys and reuse ----------------------------------------------------------


SOURCES = {"init.c": "a" * 64, "Makefile": "b" * 64}


def test_cache_key_depends_on_image_kernel_and_init() -> None:
    key = cache_key("d" * 64, KVER, SOURCES)
    assert key == cache_key("d" * 64, KVER, dict(reversed(list(SOURCES.items()))))
    assert len(key) == 64
    others = {
        cache_key("e" * 64, KVER, SOURCES),
        cache_key("d" * 64, "6.1.0-57-cloud-amd64", SOURCES),
        cache_key("d" * 64, KVER, {**SOURCES, "init.c": "c" * 64}),
        cache_key("d" * 64, KVER, {**SOURCES, "Makefile": "c" * 64}),
    }
    assert key not in others and len(others) == 4


def test_init_sources_hash_init_c_the_agent_and_their_makefile() -> None:
    sources = init_sources()
    assert set(sources) == {
        "init.c", "shmtool.c", "Makefile",
        "agent/agent.h", "agent/frames.c", "agent/auth.c", "agent/client.c", "agent/server.c",
        "agent/rsh.c", "agent/chan.c", "agent/pmixhs.c", "agent/tty.c", "agent/pty.c",
        "agent/Makefile",
        # the UCX transport over the ivshmem region, whatever files native/ucx holds
        *(f"ucx/{p.name}" for p in ucx.module_sources()),
    }  # fmt: skip
    assert all(len(h) == 64 for h in sources.values())


def fake_image(tmp_path: Path) -> Image:
    return Image(
        name="hpc",
        digest="d" * 64,
        path=tmp_path / "image",
        suite="bookworm",
        packages=("openssh-server",),
        mirror="http://deb.debian.org/debian",
        created="2026-01-01T00:00:00+00:00",
        size_bytes=1,
        build_seconds=1.0,
        debootstrap_version="1",
    )


def fake_kernel(guest_dir: Path) -> Path:
    kdir = guest_dir / KVER
    kdir.mkdir(parents=True)
    (kdir / "kernel.json").write_text(json.dumps({"version": KVER, "modules": ALL_MODULES}))
    return kdir


def test_a_finished_build_is_reused_without_any_tool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kdir = fake_kernel(tmp_path / "store" / "guest")
    key = cache_key("d" * 64, KVER, init_sources())
    build = kdir / "builds" / key
    build.mkdir(parents=True)
    (build / "guest.json").write_text("{}")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no make, gcc, apt, cpio, mkfs
    art = build_guest(fake_image(tmp_path), store=tmp_path / "store", kernel_version=KVER)
    assert art == GuestArtifacts(
        kernel=kdir / "vmlinuz",
        initrd=build / "initrd.img",
        disk=build / "disk.raw",
        kernel_version=KVER,
        key=key,
        initrd_nfs=build / "initrd-nfs.img",
    )
    assert art.reused


def test_a_missing_compiler_is_named_with_its_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_kernel(tmp_path / "store" / "guest")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(InputError, match="apt-get install make"):
        build_guest(fake_image(tmp_path), store=tmp_path / "store", kernel_version=KVER)
    assert not (tmp_path / "store" / "guest" / KVER / "builds").exists()


def test_a_failed_build_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_kernel(tmp_path / "store" / "guest")

    def broken(dest_dir: Path) -> Path:
        (dest_dir / "half-written").write_text("x")
        raise HpvcError("compile hpvc-init", "broken on purpose")

    monkeypatch.setattr(guest, "compile_init", broken)
    monkeypatch.setattr(guest, "_check_tools", lambda: None)
    with pytest.raises(HpvcError, match="broken on purpose"):
        build_guest(fake_image(tmp_path), store=tmp_path / "store", kernel_version=KVER)
    builds = tmp_path / "store" / "guest" / KVER / "builds"
    assert [p.name for p in builds.iterdir() if not p.name.endswith(".lock")] == []


def test_a_bad_kernel_version_is_refused(tmp_path: Path) -> None:
    with pytest.raises(HpvcError, match="cloud kernel"):
        build_guest(fake_image(tmp_path), store=tmp_path, kernel_version="../../etc")


# ---- disks -------------------------------------------------------------------------


def test_disk_size_adds_headroom_and_rounds_to_64_mib() -> None:
    mib = 1 << 20
    assert disk_size(0) == 512 * mib
    assert disk_size(1) == 576 * mib
    assert disk_size(301 * mib) == 832 * mib
    assert disk_size(320 * mib) == 832 * mib


def test_in_tree_follows_symlinks_without_leaving_the_tree(tmp_path: Path) -> None:
    top = tmp_path / "root"
    (top / "usr" / "sbin").mkdir(parents=True)
    (top / "sbin").symlink_to("usr/sbin")
    (top / "etc").symlink_to("/usr/etc")  # absolute: means top/usr/etc, never the host's
    (top / "up").symlink_to("../../../../..")
    assert in_tree(top, "sbin") == top / "usr" / "sbin"
    assert in_tree(top, "etc/ssh") == top / "usr" / "etc" / "ssh"
    assert in_tree(top, "up/x") == top / "x"


def test_raw_node_disk_is_a_sparse_private_copy(tmp_path: Path) -> None:
    base = tmp_path / "base.raw"
    with open(base, "wb") as f:
        f.write(b"ext4")
        f.truncate(64 << 20)
    dest = node_disk(base, tmp_path / "n0.raw", "raw")
    assert dest.read_bytes()[:4] == b"ext4" and dest.stat().st_size == 64 << 20
    assert dest.stat().st_blocks * 512 < 1 << 20  # sparse
    assert dest.stat().st_mode & 0o777 == 0o600
    with pytest.raises(InputError, match="already exists"):
        node_disk(base, dest, "raw")
    with pytest.raises(InputError, match="raw or qcow2"):
        node_disk(base, tmp_path / "n1", "vmdk")  # type: ignore[arg-type]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base.raw", "n0.raw"]


# ---- hpvc-init ---------------------------------------------------------------------


def test_hpvc_init_compiles_hardened_and_refuses_to_run_outside_a_guest(tmp_path: Path) -> None:
    binary = guest.compile_init(tmp_path)
    assert binary.is_file()
    out = subprocess.run(["file", "-b", str(binary)], capture_output=True, text=True)
    if out.returncode == 0:
        assert "statically linked" in out.stdout
    done = subprocess.run([str(binary)], capture_output=True, text=True)
    assert done.returncode == 2
    assert "must run as PID 1" in done.stderr


def test_the_command_line_carries_the_clusters_hosts_and_arp_while_they_fit() -> None:
    from hpvc.image.guest import CMDLINE_MAX, CmdlineError, kernel_cmdline, peers_text

    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGm8Lq1vJ9Yd0u6yqkQ7QhT7bq3hW3nO1cB2bqHq9n4X hpvc"
    nodes = [(f"10.88.1.{i + 2}", f"52:54:00:00:01:{i + 2:02x}", f"compute{i}") for i in range(3)]
    text = peers_text("demo", nodes)
    assert text == (
        "demo\n10.88.1.2 52:54:00:00:01:02 compute0\n"
        "10.88.1.3 52:54:00:00:01:03 compute1\n10.88.1.4 52:54:00:00:01:04 compute2\n"
    )
    line = kernel_cmdline("compute0", "10.88.1.2/24", 9000, key, peers=text)
    [word] = [w for w in line.split() if w.startswith("hpvc.peers=")]
    assert base64.b64decode(word.removeprefix("hpvc.peers=")).decode() == text
    many = [(f"10.88.0.{i + 2}", "52:54:00:00:00:01", f"compute{i}") for i in range(60)]
    with pytest.raises(CmdlineError, match=f"fewer than {CMDLINE_MAX}"):
        kernel_cmdline("compute0", "10.88.0.2/16", 9000, key, peers=peers_text("big", many))
    with pytest.raises(CmdlineError, match="not a host name"):
        peers_text("demo", [("10.88.1.2", "52:54:00:00:01:02", "Bad_Name")])
