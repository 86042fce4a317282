"""Imported images under Slurm (issue 26, item 6), submitted by an ordinary user.

Only root imports, into the site's store (here the test cluster's image_dir,
shared by its three hosts as a cluster file system would be); the site lists
the image in plugstack.conf's ``images=``; a tenant names it in a spec and
runs ``srun -N2 --hpvc=SPEC`` with container nodes on two hosts. The tasks
run the image's own userland (busybox, a marker file), with its Env and, where
the node lacks the job's directory, its WorkingDir; the same as VM nodes
(the site allows ``kinds=container,vm``), whose tasks relay to the guest's
agent. A second job uses the
stored image as it is: nothing is imported, unpacked or copied again. A
tenant cannot import, and a spec naming an image the site does not list, or a
path, is refused at submit in one line with no job queued.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpvc.bench.slurm.cluster import Submitter
from hpvc.image import Store, default_store, remove_image, resolve_image
from hpvc.image.guest import build_guest
from tests.helpers import requires
from tests.integration.conftest import slurm_env
from tests.integration.slurm_env import HOSTS, Env, last_job, spec_text
from tests.integration.test_image_import import busybox_layer, busybox_rootfs, write_layout
from tests.integration.test_slurm_vm import wait_vm_clean

IMAGE = f"slurmbox{os.getpid() % 100000}"
MISSING = f"{IMAGE}-never-imported"  # listed by the site, in no store
MARKER = f"made-for-slurm-{os.getpid()}"
GREETING = "hi-from-the-image"
WORKDIR = "/opt/app"
# One line per task: the node, the image's marker file, what /bin/sh is (the
# image's busybox; the hosts' is dash), the image's Env, where the task started.
PROBE = 'echo "$(hostname) $(cat /etc/hpvc-marker) $(readlink /bin/sh) $GREETING $PATH $(pwd)"'


@pytest.fixture(scope="module")
def slurm(tenants: tuple[Submitter, Submitter]) -> Iterator[Env]:
    """The test cluster with the site listing the test's image beside hpc, and allowing VM nodes."""
    yield from slurm_env(tenants, site=f"kinds=container,vm images=hpc,{IMAGE},{MISSING}")


@pytest.fixture(scope="module")
def imported(slurm: Env) -> Iterator[Store]:
    """Root imports the busybox image once, on host n1, into the shared store."""
    src = slurm.tmp / "image"
    rootfs = busybox_rootfs(src / "rootfs")
    (rootfs / "etc" / "hpvc-marker").write_text(MARKER + "\n")
    (rootfs / WORKDIR.lstrip("/")).mkdir(parents=True)
    env = ["PATH=/bin", f"GREETING={GREETING}"]
    write_layout(src / "layout", [busybox_layer(rootfs)], env=env, workdir=WORKDIR)
    shutil.rmtree(rootfs)
    store = Store(default_store())  # the cluster's image_dir (bench.slurm.cluster)
    try:
        hpvc = slurm.env["HPVC_BIN"]
        out = slurm.on("n1", f"{hpvc} image import {IMAGE} oci:{src / 'layout'}:t")
        assert f"image {IMAGE}:" in out, out
        yield store
    finally:
        if store.read_name(IMAGE) is not None:
            remove_image(IMAGE, store)
        shutil.rmtree(src, ignore_errors=True)


def image_spec(slurm: Env, image: str, file: str = "img.toml") -> Path:
    p = slurm.work / file
    subnet = f"10.88.{150 + os.getpid() % 50}.0/24"
    p.write_text(spec_text(subnet).replace('image = "hpc"', f'image = "{image}"'))
    return p


def store_view(store: Store, digest: str) -> list[object]:
    """What an import, an unpack or a copy would change: the image's folder and
    rootfs (inode, mtime), its name, and every entry of the store's digests and blobs."""
    d = store.digest_dir(digest)
    stats = [os.stat(p) for p in (d, d / "rootfs", d / "image.json", store.names_dir / IMAGE)]
    return [
        [(s.st_ino, s.st_mtime_ns) for s in stats],
        sorted(p.name for p in store.digests_dir.iterdir()),
        sorted(p.name for p in (store.blobs_dir / "sha256").iterdir()),
    ]


def newest_job(slurm: Env) -> int:
    """The newest job slurmctld knows, 0 for none."""
    r = slurm.run("squeue", "-h", "-t", "all", "-o", "%i")
    return max((int(x) for x in r.stdout.split() if x.isdigit()), default=0)


def probe_rows(stdout: str) -> list[list[str]]:
    return sorted(line.split() for line in stdout.splitlines())


def test_a_tenants_job_runs_in_nodes_of_the_imported_image_and_a_second_reuses_it(
    slurm: Env, imported: Store
) -> None:
    digest = resolve_image(IMAGE, imported).digest
    before = store_view(imported, digest)
    spec = image_spec(slurm, IMAGE)

    # From a folder the nodes do not have (not under the site's binds): the
    # tasks start in the image's WorkingDir.
    elsewhere = slurm.tmp / "elsewhere"
    elsewhere.mkdir()
    os.chown(elsewhere, slurm.user.uid, slurm.user.gid)
    argv = ["srun", "-N2", "-n2", f"--hpvc={spec}", "/bin/sh", "-c", PROBE]
    r = slurm.cluster.submit(slurm.user, argv, elsewhere, 90)
    assert r.returncode == 0, r.stderr
    rows = probe_rows(r.stdout)
    assert rows == [
        [node, MARKER, "busybox", GREETING, "/bin", WORKDIR] for node in ("compute0", "compute1")
    ], r.stdout
    first = last_job(slurm)
    slurm.wait_clean(first)

    # A second job, a sleeping one on both hosts: its shares record the image's
    # digest (node ls), a step from the tenant's directory (shared with the
    # nodes) starts there, and the store is as the import left it.
    r = slurm.run(
        "sbatch", "--parsable", "-N2", f"--hpvc={spec}", "-o", "/dev/null", "--wrap",
        "srun /bin/sleep 300",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    job = int(r.stdout.strip().split(";")[0])
    try:
        deadline = time.monotonic() + 60
        while len(slurm.running(job)) < 2 and time.monotonic() < deadline:
            time.sleep(0.3)
        assert len(slurm.running(job)) == 2, f"job {job} shares: {slurm.shares(job)}"
        hpvc = slurm.env["HPVC_BIN"]
        for host in HOSTS[:2]:
            listed = slurm.on(host, f"{hpvc} node ls")
            assert f"job {job} " in listed and f"image {IMAGE} {digest[:12]}" in listed, listed
        r = slurm.run(
            "srun", f"--jobid={job}", "--overlap", "-N2", "-n2", f"--hpvc={spec}",
            "/bin/sh", "-c", PROBE,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        assert [row[-1] for row in probe_rows(r.stdout)] == [str(slurm.work)] * 2, r.stdout
    finally:
        slurm.run("scancel", str(job))
    slurm.wait_clean(job)
    assert store_view(imported, digest) == before  # not imported, unpacked or copied again


def test_a_tenants_vm_node_runs_the_imported_image_with_its_env_and_workdir(
    slurm: Env, imported: Store
) -> None:
    """kind = "vm": the task relays to the guest's agent and runs the image's
    busybox with its Env (PATH included, under Slurm's variables) and, the
    guest lacking the job's directory, in its WorkingDir."""
    requires("qemu")
    build_guest(resolve_image(IMAGE, imported))  # else the job's `hpvc node up` builds it
    spec = image_spec(slurm, IMAGE, "vm.toml")
    text = spec.read_text().replace('kind = "container"', 'kind = "vm"')
    node = '[[nodes]]\nrole = "compute"\nvcpus = 1\nmemory = "384MiB"\n'
    text = text.split("[[nodes]]")[0] + node
    spec.write_text(text)
    elsewhere = slurm.tmp / "elsewhere-vm"  # on the host; no guest has it
    elsewhere.mkdir()
    os.chown(elsewhere, slurm.user.uid, slurm.user.gid)
    probe = PROBE.replace('$(pwd)"', '$(pwd) $SLURM_PROCID ${HOME:-none} $(cat /proc/1/comm)"')
    argv = ["srun", "-N1", "-n1", "--mem=384M", f"--hpvc={spec}", "/bin/sh", "-c", probe]
    r = slurm.cluster.submit(slurm.user, argv, elsewhere, 180)
    assert r.returncode == 0, r.stderr
    # HOME is the agent's (the host's stays on the host); PID 1 is the guest's init.
    want = ["compute0", MARKER, "busybox", GREETING, "/bin", WORKDIR, "0", "/root", "hpvc-init"]
    assert r.stdout.split() == want, (r.stdout, r.stderr)
    wait_vm_clean(slurm, last_job(slurm))


def test_only_root_imports(slurm: Env, imported: Store) -> None:
    """A tenant's import is one line, exit 2, and writes nothing to the store."""
    names = sorted(imported.all_names())
    digests = sorted(p.name for p in imported.digests_dir.iterdir())
    r = slurm.run(slurm.env["HPVC_BIN"], "image", "import", "mine", f"dir:{slurm.work}")
    assert r.returncode == 2, r
    assert r.stderr.strip().splitlines() == [r.stderr.strip()], r.stderr
    assert r.stderr.startswith("hpvc: image import: needs root ("), r.stderr
    assert sorted(imported.all_names()) == names
    assert sorted(p.name for p in imported.digests_dir.iterdir()) == digests


def test_a_listed_image_the_host_lacks_fails_in_one_line_leaving_nothing(
    slurm: Env, imported: Store
) -> None:
    spec = image_spec(slurm, MISSING, "missing.toml")
    r = slurm.run("srun", "-N1", f"--hpvc={spec}", "/bin/echo", "ran")
    assert r.stdout.strip() == ""  # (srun 22.05 exits 0 when a task's launch fails)
    said = [line for line in r.stderr.splitlines() if "does not have it" in line]
    assert len(said) == 1 and f"image {MISSING!r}: the site allows it" in said[0], r.stderr
    assert str(imported.root) in said[0] and "hpvc image build or import" in said[0]
    slurm.wait_clean(last_job(slurm))


@pytest.mark.parametrize(
    ("image", "why"),
    [
        ("notlisted", "not allowed on this site"),
        ("../x", "is not an image name"),
        ("/tmp/x", "is not an image name"),
        ("a/b", "is not an image name"),
    ],
)
def test_an_image_the_site_does_not_list_or_a_path_starts_no_job(
    slurm: Env, image: str, why: str
) -> None:
    spec = image_spec(slurm, image, "refused.toml")
    before = newest_job(slurm)
    r = slurm.run("srun", "-N1", f"--hpvc={spec}", "/bin/true")
    assert r.returncode != 0
    # hpvc's one line (`hpvc node check`, as the user), then the plugin's and srun's
    said = [line for line in r.stderr.splitlines() if why in line]
    assert len(said) == 1 and said[0].startswith(f"srun: error: hpvc: {spec}: image"), r.stderr
    assert "no job was started" in r.stderr
    assert newest_job(slurm) == before
    check = slurm.run(slurm.env["HPVC_BIN"], "node", "check", str(spec), "--site", "images=hpc")
    assert check.returncode == 2 and len(check.stderr.strip().splitlines()) == 1, check
