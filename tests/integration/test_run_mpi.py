"""``hpvc run`` with the image's own MPI, for real: an MPICH image and an Open MPI one.

The MPICH image is built here by hpvc's own builder (Debian minbase and the
``mpich`` package alone: no Open MPI, no bash beyond minbase's, cached after
the first build on a machine); the Open MPI one is the default ``hpc``.
Both run as two-node container clusters with ``locality = "shm"`` (the
default: co-resident nodes share IPC, PID namespace and /dev/shm), where
MPICH's ranks run under hpvc's PMI (``hpvc.cluster.pmi``) and share memory
across the two nodes; MPICH with ``locality = "none"`` runs under the image's
hydra and shares none.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpvc.cluster import lifecycle, ops
from hpvc.errors import HpvcError
from hpvc.store import Store
from tests.helpers import ROOT, requires
from tests.integration.test_cluster import cli_env, image_ready, spec_file, store

__all__ = ["store"]  # the fixture, shared with test_cluster

MPICH_IMAGE = "mpich"
MPICH_PACKAGES = ["mpich", "procps", "iproute2"]


def mpich_ready() -> None:
    from hpvc.image import build_image, resolve_image
    from hpvc.image.mpi import MPICH, find_mpi

    requires("debootstrap")
    try:
        image = resolve_image(MPICH_IMAGE)
        found = find_mpi(image.rootfs, image.env)
        if found is not None and found.kind == MPICH:
            return
    except HpvcError:
        pass
    build_image(MPICH_IMAGE, MPICH_PACKAGES)  # ~30 s the first time, cached afterwards


def hpvc_run(store: Store, name: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hpvc", "run", name, *argv],
        env=cli_env(store),
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


SPLIT_C = """
#include <mpi.h>
#include <stdio.h>

int main(int argc, char **argv)
{
    MPI_Comm local;
    MPI_Win win;
    MPI_Aint bytes;
    int rank, size, lrank, unit, *mine, *peer;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local);
    MPI_Comm_size(local, &size);
    MPI_Comm_rank(local, &lrank);
    MPI_Win_allocate_shared(sizeof(int), sizeof(int), MPI_INFO_NULL, local, &mine, &win);
    MPI_Win_lock_all(MPI_MODE_NOCHECK, win);
    *mine = 100 + rank;
    MPI_Win_sync(win);
    MPI_Barrier(local);
    MPI_Win_sync(win);
    MPI_Win_shared_query(win, (lrank + 1) % size, &bytes, &unit, &peer);
    printf("%d:%d:%d\\n", rank, size, *peer);
    MPI_Win_unlock_all(win);
    MPI_Win_free(&win);
    MPI_Comm_free(&local);
    MPI_Finalize();
    return 0;
}
"""


def shared_sizes(store: Store, name: str, finalize_may_hang: bool = False) -> list[str]:
    """``rank:size:seen`` of each rank: the size of its MPI_COMM_TYPE_SHARED
    communicator (the ranks MPICH counts as sharing memory with it) and what it
    reads, through a shared-memory window on that communicator, in the next
    rank's memory there (100 + that rank; its own where it is alone). The
    program is built on the host against the host's MPICH (libmpich-dev, the
    same 4.0.2 as the image's) and run from the cluster's /shared.

    ``finalize_may_hang``: ranks in two hosts (to MPICH) of Debian's MPICH 4.0.2
    (ch4:ucx) hang in MPI_Finalize about one job in ten: each flushes its UCX
    endpoints and then waits in the PMI barrier, where it no longer progresses
    UCX, while the other's flush waits for it (``MPIDI_UCX_mpi_finalize_hook``,
    src/mpid/ch4/netmod/ucx/ucx_init.c). The answer is printed before that:
    read it, then end a job that hangs there (``down`` ends what is left)."""
    requires("mpicc.mpich")
    shared = Path(ops.status(name, store)["shared_dir"]["host"])
    (shared / "split.c").write_text(SPLIT_C)
    cc = ["mpicc.mpich", "-O2", "-o", str(shared / "split"), str(shared / "split.c")]
    subprocess.run(cc, check=True, capture_output=True)
    out = shared / "split.out"
    with out.open("w") as sink:
        job = subprocess.Popen(
            [sys.executable, "-m", "hpvc", "run", name, "-n", "2", "--", "/shared/split"],
            env=cli_env(store),
            cwd=ROOT,
            stdout=sink,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    deadline = time.monotonic() + 60
    while job.poll() is None and time.monotonic() < deadline:
        if finalize_may_hang and len(out.read_text().split()) == 2:
            deadline = min(deadline, time.monotonic() + 10)
        time.sleep(0.2)
    if job.poll() is None:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
        assert finalize_may_hang, "the MPICH job did not end"
    else:
        assert job.returncode == 0, out.read_text()
    return sorted(out.read_text().split())


def test_mpich_image_runs_its_own_mpich(store: Store, tmp_path: Path) -> None:
    mpich_ready()
    name = f"mh{os.getpid() % 10000}"
    spec = spec_file(tmp_path, name, extra="")
    text = (
        Path(spec)
        .read_text()
        .replace('kind = "container"\n', 'kind = "container"\nimage = "mpich"\n')
    )
    Path(spec).write_text(text)
    lifecycle.up(spec, store)
    # no Open MPI anywhere in the image: what runs is MPICH's
    assert ops.exec_node(name, "compute0", ["sh", "-c", "! command -v ompi_info"], store) == 0

    r = hpvc_run(store, name, "-n", "2", "--", "hostname")
    assert r.returncode == 0, r.stderr
    assert "mpi: MPICH 4." in r.stderr and "(image mpich" in r.stderr
    assert sorted(r.stdout.split()) == ["compute0", "compute1"]

    # every rank is an MPI process of one job: its PMI (hpvc's here) gave each its rank and size
    script = 'echo "$PMI_RANK/$PMI_SIZE $(hostname)"'
    done = ops.run(name, ["sh", "-c", script], 2, store, capture=True)
    assert not isinstance(done, int) and done.returncode == 0, done
    assert sorted(done.stdout.splitlines()) == ["0/2 compute0", "1/2 compute1"]

    # a failing rank fails the job
    bad = ops.run(name, ["sh", "-c", "exit 3"], 2, store, capture=True)
    assert not isinstance(bad, int) and bad.returncode != 0

    # co-resident nodes still share /dev/shm (locality = "shm"): what one writes the other sees
    assert ops.exec_node(name, "compute0", ["sh", "-c", "echo hi > /dev/shm/hpvc-t"], store) == 0
    seen = ops.run(name, ["cat", "/dev/shm/hpvc-t"], 2, store, capture=True)
    assert not isinstance(seen, int) and seen.stdout.split() == ["hi", "hi"]

    # MPICH itself counts the two co-resident nodes as one host: each rank reads
    # what the other, in the other node, wrote into its shared-memory window
    assert shared_sizes(store, name) == ["0:2:101", "1:2:100"]
    lifecycle.down(name, store)


def test_open_mpi_image_says_so(store: Store, tmp_path: Path) -> None:
    image_ready()
    name = f"mo{os.getpid() % 10000}"
    lifecycle.up(spec_file(tmp_path, name), store)
    r = hpvc_run(store, name, "-n", "2", "--", "hostname")
    assert r.returncode == 0, r.stderr
    assert "mpi: Open MPI 4." in r.stderr and "(image hpc" in r.stderr
    assert sorted(r.stdout.split()) == ["compute0", "compute1"]
    lifecycle.down(name, store)


@pytest.mark.parametrize("locality", ["none"])
def test_mpich_without_locality(store: Store, tmp_path: Path, locality: str) -> None:
    """Fully isolated nodes: MPICH runs over the bridge alone."""
    mpich_ready()
    name = f"mn{os.getpid() % 10000}"
    spec = spec_file(tmp_path, name)
    text = (
        Path(spec)
        .read_text()
        .replace('kind = "container"\n', 'kind = "container"\nimage = "mpich"\n')
    )
    text = text.replace("[tuning]\n", f'[tuning]\nlocality = "{locality}"\n')
    Path(spec).write_text(text)
    lifecycle.up(spec, store)
    done = ops.run(name, ["hostname"], 2, store, capture=True)
    assert not isinstance(done, int) and sorted(done.stdout.split()) == ["compute0", "compute1"]
    # ... and shares no memory: each rank alone on its host, reading its own window
    assert shared_sizes(store, name, finalize_may_hang=True) == ["0:1:100", "1:1:101"]
    lifecycle.down(name, store)
