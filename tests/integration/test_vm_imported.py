"""VM nodes booted from an imported image that has no sshd, no bash, no apt (issue 26).

The image is the busybox-only root filesystem tests/integration/test_image_import.py
makes (its helpers), with a marker file, imported as an OCI layout into the shared
image store (where the guest kernel is cached) under this process's own name and
removed after (its guest build stays cached, as every image's does). A two-node
VM cluster under TCG comes up from it; ``hpvc exec`` reaches the nodes through
their agents (the image has no sshd) and runs the image's own busybox with its
Env and WorkingDir; status and ls name the image's digest for each node; the
image's files are the same after ``down`` as before ``up``. A shared directory
over NFS, which needs sshd and Ganesha in the image, is refused in one line
before anything changes. The same image boots as a one-node cluster of the
libvirt backend (a private libvirtd, as tests/integration/test_vm_libvirt.py
starts). Then hpvc-rsh's argv mode, which ``exec`` uses, against the agent on
the host (no VM). About 40 s here (2 cores, TCG).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpvc.cluster import lifecycle
from hpvc.image import Store as ImageStore
from hpvc.image import remove_image
from hpvc.image.importer import import_image
from hpvc.store import Store
from tests.agent_driver import AGENT, build
from tests.helpers import ROOT, requires
from tests.integration.test_cluster import cli_env
from tests.integration.test_image_import import busybox_layer, busybox_rootfs, write_layout
from tests.integration.test_vm_cluster import vm_leftovers

pytestmark = pytest.mark.integration

PID = os.getpid()
# The same on every run: the same image digest, so its guest build is made once.
MARKER = "from the imported busybox image\n"


def hpvc(store: Store, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**cli_env(store), "HPVC_ACCEL": "tcg", "COLUMNS": "250"}
    return subprocess.run(
        [sys.executable, "-m", "hpvc", *args],
        env=env, cwd=ROOT, capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip


def snapshot(root: Path) -> dict[str, tuple[int, int, int, int, str]]:
    """Every path under ``root``: inode, mode, size, mtime (ns), link target."""
    out = {}
    for p in [root, *root.rglob("*")]:
        st = p.lstat()
        link = os.readlink(p) if p.is_symlink() else ""
        out[str(p.relative_to(root))] = (st.st_ino, st.st_mode, st.st_size, st.st_mtime_ns, link)
    return out


@pytest.fixture
def image(tmp_path: Path) -> Iterator[str]:
    """The busybox image (no sshd, no bash), in the shared store; removed after."""
    requires("root", "qemu", "ip", "skopeo", "umoci", "busybox")
    rootfs = busybox_rootfs(tmp_path / "rootfs")
    (rootfs / "etc" / "hpvc-marker").write_text(MARKER)
    write_layout(tmp_path / "l", [busybox_layer(rootfs)], env=["PATH=/bin", "GREETING=hi"])
    name = f"bbvm{PID % 100000}"
    images = ImageStore()
    import_image(name, f"oci:{tmp_path / 'l'}:t", store=images)
    try:
        yield name
    finally:
        remove_image(name, images)


def _spec(
    tmp: Path, name: str, image: str, extra: str = "", *, count: int = 2, head: str = ""
) -> Path:
    p = tmp / f"{name}.toml"
    p.write_text(
        f'name = "{name}"\nkind = "vm"\n{head}image = "{image}"\n'
        f'[network]\nsubnet = "10.229.{PID % 250}.0/24"\n'
        '[tuning]\npinning = "shared"\nhugepages = "none"\npartition = "commodity"\n'
        f"{extra}"
        f'[[nodes]]\nrole = "compute"\ncount = {count}\nvcpus = 1\nmemory = "256MiB"\n'
    )
    return p


def test_a_vm_cluster_from_an_image_without_sshd(image: str, tmp_path: Path) -> None:
    from hpvc.image import resolve_image

    store = Store(tmp_path / "state")
    name = f"vi{PID % 10000}"
    img = resolve_image(image)
    before = snapshot(img.rootfs)
    try:
        # NFS needs sshd and Ganesha in the image: one line, exit 2, nothing made.
        nfs = _spec(tmp_path, name, image, '[shared]\nserver = "nfs"\npath = "/shared"\n')
        r = hpvc(store, "up", str(nfs))
        assert r.returncode == 2, r.stdout + r.stderr
        line = r.stderr.strip()
        assert line.startswith(f"hpvc: image '{image}': has no /usr/sbin/sshd") and "\n" not in line
        assert vm_leftovers(name, store) == [] and store.names() == []

        r = hpvc(store, "up", str(_spec(tmp_path, name, image)))
        assert r.returncode == 0, r.stdout + r.stderr
        for node in ("compute0", "compute1"):
            r = hpvc(store, "exec", name, node, "--", "cat", "/etc/hpvc-marker")
            assert (r.returncode, r.stdout) == (0, MARKER), r.stderr
        # The image's busybox, its Env and WorkingDir, the cluster's hosts; no sshd.
        script = 'echo "$GREETING $(pwd) $(hostname)"; readlink /bin/sh; grep -c compute /etc/hosts'
        r = hpvc(store, "exec", name, "compute1", "--", "sh", "-c", script)
        assert r.stdout.split() == ["hi", "/tmp", "compute1", "busybox", "2"], r.stderr
        r = hpvc(store, "exec", name, "compute0", "--", "ls", "/usr/sbin/sshd")
        assert r.returncode == 1, r.stdout + r.stderr
        r = hpvc(store, "exec", name, "compute0", "--", "no-such-command")
        assert r.returncode == 127, r.stderr

        r = hpvc(store, "status", name, "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["image_digests"] == {img.digest: ["compute0", "compute1"]}
        r = hpvc(store, "ls", "--json")
        assert r.returncode == 0, r.stderr
        (row,) = [c for c in json.loads(r.stdout) if c["name"] == name]
        assert row["image_digests"] == {img.digest: ["compute0", "compute1"]}

        r = hpvc(store, "down", name)
        assert r.returncode == 0, r.stdout + r.stderr
    finally:
        for left in {p.name for p in (store.root / "clusters").glob("*")}:
            lifecycle.teardown(store, left)
        store.host_journal().undo_all()
    assert vm_leftovers(name, store) == []
    assert snapshot(img.rootfs) == before
    assert (img.rootfs / "etc" / "hpvc-marker").read_text() == MARKER


def test_a_libvirt_node_from_an_image_without_sshd(
    image: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.integration.test_vm_libvirt import domain_names, running_libvirtd

    store = Store(tmp_path / "state")
    name = f"vl{PID % 10000}"
    spec = _spec(tmp_path, name, image, count=1, head='backend = "libvirt"\n')
    with running_libvirtd(tmp_path / "libvirtd") as daemon:
        monkeypatch.setenv("HPVC_LIBVIRT_URI", daemon.uri)
        try:
            r = hpvc(store, "up", str(spec))
            assert r.returncode == 0, r.stdout + r.stderr
            assert domain_names(daemon) == [f"hpvc-{name}-compute0"]
            r = hpvc(store, "exec", name, "compute0", "--", "cat", "/etc/hpvc-marker")
            assert (r.returncode, r.stdout) == (0, MARKER), r.stderr
            r = hpvc(store, "down", name)
            assert r.returncode == 0, r.stdout + r.stderr
            assert domain_names(daemon) == []
        finally:
            for left in {p.name for p in (store.root / "clusters").glob("*")}:
                lifecycle.teardown(store, left)
            store.host_journal().undo_all()
    assert vm_leftovers(name, store) == []


def test_hpvc_rsh_runs_an_argv_as_it_is_with_env_and_directory(tmp_path: Path) -> None:
    """What ``hpvc exec`` runs on the host for such a node, against the agent in a
    network namespace of this test's (loopback only): words with spaces stay
    words, no shell, the environment and directory given, the exit status kept."""
    requires("root")
    drv = build(tmp_path / "build")
    subprocess.run(
        ["make", "-s", "-C", str(AGENT), f"OUT={tmp_path / 'build'}", f"BIN={tmp_path}"],
        check=True,
    )
    rsh = tmp_path / "hpvc-rsh"
    key = tmp_path / "key"
    fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, os.urandom(32))
    os.close(fd)
    ip = "10.231.78.1"
    script = f"""
set -u
ip link set lo up && ip addr add {ip}/24 dev lo || exit 90
{drv} serve {ip}/24 {key} > {tmp_path}/serve.out &
for i in $(seq 100); do grep -q ready {tmp_path}/serve.out 2>/dev/null && break; sleep 0.05; done
{rsh} -a -k {key} -e WHO=agent -C /tmp -- {ip} printf '<%s>' "two words" '$WHO' > {tmp_path}/a.out
{rsh} -a -k {key} -e WHO=agent -- {ip} sh -c 'echo $WHO $(pwd); exit 7' > {tmp_path}/b.out
echo $? > {tmp_path}/b.rc
kill $(cut -d' ' -f2 {tmp_path}/serve.out)
"""
    subprocess.run(["unshare", "--net", "--fork", "--kill-child", "sh", "-c", script],
                   check=True, timeout=60)  # fmt: skip
    assert (tmp_path / "a.out").read_text() == "<two words><$WHO>"
    assert (tmp_path / "b.out").read_text() == "agent /root\n"  # the agent's default
    assert (tmp_path / "b.rc").read_text().strip() == "7"
