"""Teardown that meets a failure finishes later, and a full state disk does not stop it.

- libvirt: ``hpvc down`` while the cluster's libvirtd is stopped must not touch
  the node's folder (its disk, its journal) while the domain runs: it fails
  with ``down NAME: not finished: libvirt domain ... (libvirtd unreachable:
  ...)``, exit 1, the record kept as ``deleting``; a second ``down`` says the
  same; once libvirtd is back, ``down`` finishes and neither the domain, its
  QEMU nor its tap is left. The libvirtd is a private one
  (``tests/integration/test_vm_libvirt.PrivateLibvirtd``) that this test stops
  and starts again (libvirtd alone, by PID; its virtlogd and the domain's
  QEMU keep running meanwhile, as with a restarted system daemon).
- a full state disk: the state directory is a tmpfs of ``FULL_DISK_MIB``
  (``size=``), filled by a job inside a container node (its writable layer
  lives there); ``hpvc scale`` down and ``hpvc down`` must still work, each
  with exit 0 and no traceback, and leave nothing on the host.

Commands run through the CLI (``python -m hpvc``) for their exit code and
output. Addresses: 10.241.<pid>.0/24 (libvirt) and 10.242.<pid>.0/24
(containers), bridges this test's clusters make; traffic only inside them.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpvc.backends.libvirt import domain as vm_libvirt
from hpvc.cluster import lifecycle, ops
from hpvc.errors import MissingDependency
from hpvc.render.context import tap_name
from hpvc.store import Store
from tests.helpers import ROOT, requires
from tests.integration.test_cluster import cli_env, image_ready, leftovers
from tests.integration.test_vm_cluster import vm_leftovers
from tests.integration.test_vm_libvirt import (
    DAEMON_START_S,
    PrivateLibvirtd,
    domain_names,
    running_libvirtd,
)

pytestmark = pytest.mark.integration

PID = os.getpid()
FULL_DISK_MIB = 48  # the tmpfs state directory: a container's layer fills it in a moment
# libvirtd alone, in a new mount namespace over the same private directories;
# the virtlogd started with the first one still runs and is reached by socket.
RESTART_SCRIPT = r"""
root=$1
for pair in etc:/etc/libvirt run:/run/libvirt lib:/var/lib/libvirt \
            cache:/var/cache/libvirt log:/var/log/libvirt; do
  mount --bind "$root/${pair%%:*}" "${pair#*:}"
done
mount --bind "$root/passwd" /etc/passwd
mount --bind "$root/group" /etc/group
exec libvirtd --config "$root/etc/libvirtd.conf" --pid-file "$root/libvirtd.pid"
"""


def hpvc(
    store: Store, *args: str, extra: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hpvc", *args],
        cwd=ROOT,
        env={**cli_env(store), **(extra or {})},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


# --- libvirtd stopped and started again ----------------------------------------------


def stop_libvirtd(daemon: PrivateLibvirtd) -> None:
    """SIGTERM libvirtd (the process the fixture started, by PID); its domains run on."""
    assert daemon.proc is not None
    daemon.proc.terminate()
    daemon.proc.wait(30)


def restart_libvirtd(daemon: PrivateLibvirtd) -> None:
    env = {**os.environ, "LIBVIRT_DRIVER_DIR": str(daemon.root / "drivers")}
    with open(daemon.root / "daemon-logs" / "stdio.log", "ab") as out:
        daemon.proc = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "--",
             "sh", "-ec", RESTART_SCRIPT, "sh", str(daemon.root)],
            stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env, start_new_session=True,
        )  # fmt: skip
    deadline = time.monotonic() + DAEMON_START_S
    while True:
        assert daemon.proc.poll() is None, f"libvirtd exited: {daemon.logs()}"
        try:
            vm_libvirt.connect(daemon.uri).close()
            return
        except MissingDependency:
            assert time.monotonic() < deadline, f"libvirtd did not answer: {daemon.logs()}"
            time.sleep(0.1)


@pytest.fixture
def libvirtd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateLibvirtd]:
    """A private libvirtd of this test alone (it is stopped and started again;
    a test that failed half-way leaves it stopped: restarted, its domains go)."""
    with running_libvirtd(tmp_path_factory.mktemp("libvirtd"), restart_libvirtd) as daemon:
        yield daemon


def libvirt_spec(tmp_path: Path, name: str) -> Path:
    p = tmp_path / f"{name}.toml"
    p.write_text(
        f'name = "{name}"\nkind = "vm"\nbackend = "libvirt"\n'
        f'[network]\nsubnet = "10.241.{PID % 250}.0/24"\nmtu = 9000\n'
        '[tuning]\npinning = "shared"\nhugepages = "none"\npartition = "commodity"\n'
        '[[nodes]]\nrole = "head"\nvcpus = 1\nmemory = "256MiB"\n'
    )
    return p


def test_down_with_libvirtd_stopped_keeps_the_node_and_finishes_once_it_is_back(
    libvirtd: PrivateLibvirtd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    requires("root", "qemu", "ip")
    image_ready()
    monkeypatch.setenv("HPVC_LIBVIRT_URI", libvirtd.uri)
    store = Store(tmp_path / "state")
    name = f"tf{PID % 10000}"
    domain, tap = f"hpvc-{name}-head0", tap_name(name, "head0")
    uri = {"HPVC_LIBVIRT_URI": libvirtd.uri}
    try:
        lifecycle.up(str(libvirt_spec(tmp_path, name)), store)
        assert domain_names(libvirtd) == [domain]
        node = store.node_dir(name, "head0")
        journal = store.node_journal(name, "head0")
        kinds = [c.kind for c in journal.entries()]
        assert kinds[-1] == "libvirt-domain" and "tree" in kinds
        uuid = journal.entries()[-1].args["uuid"]
        qemu = vm_libvirt.find_pid(domain, uuid)
        assert qemu is not None

        stop_libvirtd(libvirtd)
        for _ in range(2):  # and a second down does not pretend to have finished
            r = hpvc(store, "down", name, extra=uri)
            assert r.returncode == 1, r.stdout + r.stderr
            assert "Traceback" not in r.stderr
            lines = r.stderr.strip().splitlines()
            assert len(lines) == 1, r.stderr
            assert lines[0].startswith(
                f"hpvc: down {name}: not finished: libvirt domain {domain} (libvirtd unreachable: "
            ), lines[0]
            # Nothing the running domain needs went: its QEMU, tap, disk, journal, record.
            assert vm_libvirt.find_pid(domain, uuid) == qemu
            assert os.path.exists(f"/sys/class/net/{tap}")
            assert (node / "disk.qcow2").exists() and journal.entries()[-1].kind == "libvirt-domain"
            assert store.get(name).status == "deleting"
            assert store.journal(name).entries()  # the bridge waits for the node

        restart_libvirtd(libvirtd)
        r = hpvc(store, "down", name, extra=uri)
        assert r.returncode == 0, r.stdout + r.stderr
        assert f"cluster {name} down" in r.stdout
        assert domain_names(libvirtd) == []
        assert vm_libvirt.find_pid(domain, uuid) is None
        assert not os.path.exists(f"/sys/class/net/{tap}")
        assert vm_leftovers(name, store) == []
    finally:
        if libvirtd.proc is not None and libvirtd.proc.poll() is not None:
            restart_libvirtd(libvirtd)
        for n in {p.name for p in (store.root / "clusters").glob("*")}:
            lifecycle.teardown(store, n)
        store.host_journal().undo_all()


# --- a full state disk ----------------------------------------------------------------


@pytest.fixture
def small_store(tmp_path: Path) -> Iterator[Store]:
    """A state directory on a tmpfs of FULL_DISK_MIB; everything on it torn down, then unmounted."""
    requires("root", "crun", "ip")
    root = tmp_path / "state"
    root.mkdir(mode=0o700)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={FULL_DISK_MIB}m,mode=0700", "hpvc-test", str(root)],
        check=True,
    )
    store = Store(root)
    try:
        yield store
    finally:
        try:
            for fill in [*root.glob("fill-*"), *root.glob("clusters/*/nodes/*/*/fill-*")]:
                fill.unlink()  # room for the teardown of a test that failed
            names = {p.name for p in (root / "clusters").glob("*")}
            for name in names:
                lifecycle.teardown(store, name)
            store.host_journal().undo_all()
            left = {n: leftovers(n) for n in names}
        finally:
            subprocess.run(["umount", "-l", str(root)], check=False)
        assert all(not v for v in left.values()), left


def fill(store: Store, name: str, node: str, tag: str) -> None:
    """A job inside ``node`` writes until it cannot (its layer is in the state
    directory); whatever room a limit on the node's layer left, the host fills."""
    cmd = f"dd if=/dev/zero of=/fill-{tag} bs=64k 2>/dev/null; sync; true"
    assert ops.exec_node(name, node, ["sh", "-c", cmd], store) == 0
    with contextlib.suppress(OSError), (store.root / f"fill-{tag}").open("wb") as f:
        while True:
            f.write(bytes(64 << 10))
            f.flush()
    probe = store.root / "probe"
    with pytest.raises(OSError) as e, probe.open("wb") as f:  # not a byte more
        f.write(b"x" * 4096)
        f.flush()
    probe.unlink(missing_ok=True)
    assert e.value.errno == errno.ENOSPC


def test_scale_and_down_work_on_a_full_state_disk(small_store: Store, tmp_path: Path) -> None:
    image_ready()
    store, name = small_store, f"df{PID % 10000}"
    spec = tmp_path / f"{name}.toml"
    spec.write_text(
        f'name = "{name}"\nkind = "container"\n'
        f'[network]\nsubnet = "10.242.{PID % 250}.0/24"\nmtu = 9000\n'
        '[tuning]\npinning = "shared"\nhugepages = "none"\npartition = "commodity"\n'
        '[[nodes]]\nrole = "head"\nvcpus = 1\nmemory = "256MiB"\n'
        '[[nodes]]\nrole = "compute"\ncount = 2\nvcpus = 1\nmemory = "256MiB"\n'
    )
    lifecycle.up(str(spec), store)
    fill(store, name, "compute0", "a")

    r = hpvc(store, "scale", name, "compute=1")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stdout + r.stderr
    rec = store.get(name)
    assert rec.status == "running"
    assert [n["name"] for n in rec.plan["nodes"]] == ["head0", "compute0"]
    assert not store.node_dir(name, "compute1").exists()
    assert not any(name in c and "compute1" in c for c in leftovers(name))

    fill(store, name, "compute0", "b")  # full again, the reserve spent on the scale
    with contextlib.suppress(OSError):
        (store.root / "space-reserve").unlink()  # and no reserve at all: down still works
    r = hpvc(store, "down", name)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stdout + r.stderr
    assert f"cluster {name} down" in r.stdout
    assert store.load(name) is None and not store.cluster_dir(name).exists()
    assert leftovers(name) == []
    assert not list(store.root.glob("clusters/*/nodes/*/*/fill-*"))  # the layer went too
