"""Slurm's PMIx and PMI-2 for tasks in VM guests, for real (issue 30 item 2).

An ordinary user's batch job on two hosts of the namespace test cluster, one
QEMU guest (TCG here) per host: ``srun --mpi=pmix -N2 -n4`` starts an Open MPI
program (the image's Open MPI) in the guests with Slurm as the launcher, its
PMIx connection carried by the task relay (native/agent/chan.c); ``--mpi=pmi2``
gives each guest task a PMI_FD on which a PMI-1 dialogue with Slurm's server
(init, kvsname, a barrier across both hosts, finalize) completes; a guest task
that sends anything but its own PMIx connection request through the channel
is refused on the host and gets nothing back. Debian's MPICH (the ``mpich``
image, listed by the site beside ``hpc``) runs under ``--mpi=pmi2`` too.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpvc.bench.locality import runner as locality
from hpvc.bench.slurm import cluster as bench_slurm
from hpvc.image import resolve_image
from hpvc.image.guest import build_guest
from tests.helpers import requires
from tests.integration.conftest import slurm_env
from tests.integration.slurm_env import Env
from tests.integration.test_cluster import image_ready
from tests.integration.test_slurm_vm import (  # noqa: F401 (the module's fixtures)
    VM_SPEC,
    submit,
    vm_spec,
    wait_done,
    wait_vm_clean,
)


@pytest.fixture(scope="module")
def slurm(tenants: tuple[bench_slurm.Submitter, bench_slurm.Submitter]) -> Iterator[Env]:
    """The test cluster, its site allowing VM nodes of the hpc and mpich
    images; their guests built before any job."""
    requires("root", "qemu", "mpicc.mpich")
    image_ready()
    locality.ensure_image(locality.MPIS["mpich"], print)  # Debian's mpich alone, built once
    for name in ("hpc", "mpich"):
        build_guest(resolve_image(name))
    yield from slurm_env(tenants, "kinds=container,vm images=hpc,mpich")


# Every rank: its rank, the world's size, its guest, the sum of all ranks
# (an allreduce) and, for rank 0, a token passed once round the ring (each
# rank adds its own: 100 + 1 + 2 + 3), crossing between the hosts twice; a
# barrier before MPI_Finalize.
RING_C = r"""
#include <mpi.h>
#include <stdio.h>
#include <unistd.h>
int main(int argc, char **argv)
{
	int rank, size, sum = 0, token = 100;
	char host[64] = "";
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	gethostname(host, sizeof(host) - 1);
	MPI_Allreduce(&rank, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
	if (rank == 0) {
		MPI_Send(&token, 1, MPI_INT, 1, 0, MPI_COMM_WORLD);
		MPI_Recv(&token, 1, MPI_INT, size - 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
	} else {
		MPI_Recv(&token, 1, MPI_INT, rank - 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
		token += rank;
		MPI_Send(&token, 1, MPI_INT, (rank + 1) % size, 0, MPI_COMM_WORLD);
	}
	printf("rank %d of %d on %s sum %d token %d\n", rank, size, host, sum, rank ? 0 : token);
	fflush(stdout);
	/* Every connection used both ways before MPI_Finalize: Debian's MPICH */
	/* 4.0.2 (ch4:ucx) can hang in it otherwise, one rank's endpoint flush */
	/* waiting on a peer already in the PMI barrier (docs/containers.md). */
	MPI_Barrier(MPI_COMM_WORLD);
	MPI_Finalize();
	return 0;
}
"""

# A PMI-1 client in bash on the task's PMI_FD (Slurm's pmi2 plugin speaks
# PMI-1 and PMI-2): init, its kvsname, a barrier (every task of both hosts
# must reach it), finalize; each answer printed.
PMI1 = (
    'ask() { echo "$1" >&$PMI_FD; read -r -t 120 -u $PMI_FD a || a=none; echo "$(hostname)'
    ' $PMI_RANK $a"; }; ask "cmd=init pmi_version=1 pmi_subversion=1";'
    ' ask "cmd=get_my_kvsname"; ask "cmd=barrier_in"; ask "cmd=finalize"'
)

# Through the channel, something that is not this task's PMIx request.
FOREIGN = (
    'trap "" PIPE; port=${PMIX_SERVER_URI41##*:}; exec 3<>/dev/tcp/127.0.0.1/$port &&'
    ' printf "GET / HTTP/1.0\\r\\nHost: x\\r\\n\\r\\n" >&3;'
    ' got=$(timeout 60 cat <&3 | wc -c); echo "$(hostname) port=$port answered $got"'
)

JOB = f"""set -u
echo "step boot:"
srun -N2 -n2 hostname | sort
echo "step copy:"
srun -N2 -n2 --input=all sh -c 'cat > /root/ring && chmod +x /root/ring && \\
  echo "$(hostname) has $(wc -c < /root/ring) bytes"' < ring
echo "step pmix:"
srun -N2 -n4 --overcommit --mpi=pmix /root/ring
echo "pmix status $?"
echo "step pmi2:"
srun -N2 -n4 --overcommit --mpi=pmi2 bash -c '{PMI1}'
echo "pmi2 status $?"
echo "step foreign:"
srun -N1 -n1 --mpi=pmix bash -c '{FOREIGN}'
echo "foreign status $?"
"""


def sections(text: str) -> dict[str, str]:
    """{name: output} of each "step NAME:" line's step (srun may print
    "... step creation temporarily disabled ..." in one)."""
    parts = re.split(r"^step (\w+):$", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_srun_mpi_pmix_and_pmi2_start_ranks_in_the_guests(slurm: Env, vm_spec: Path) -> None:  # noqa: F811
    """sbatch -N2 by an ordinary user: four Open MPI ranks under srun
    --mpi=pmix in the two hosts' guests all report, with the right sum and a
    ring that crossed hosts; four PMI-1 clients on PMI_FD under --mpi=pmi2
    pass Slurm's barrier; a foreign request through the channel is refused
    and answered with nothing; nothing is left on any host."""
    requires("mpi")
    (slurm.work / "ring.c").write_text(RING_C)
    cc = ["mpicc", "-O2", "-o", str(slurm.work / "ring"), str(slurm.work / "ring.c")]
    subprocess.run(cc, check=True)
    out = slurm.work / "pmix-job.out"
    job = submit(slurm, vm_spec, JOB, out)
    wait_done(slurm, job, timeout=500, out=out)
    text = out.read_text()
    part = sections(text)
    size = (slurm.work / "ring").stat().st_size
    copied = sorted(ln for ln in part["copy"].splitlines() if " has " in ln)
    assert copied == [f"compute0 has {size} bytes", f"compute1 has {size} bytes"], text
    ranks = sorted(ln for ln in part["pmix"].splitlines() if ln.startswith("rank "))
    assert ranks == [
        "rank 0 of 4 on compute0 sum 6 token 106",
        "rank 1 of 4 on compute0 sum 6 token 0",
        "rank 2 of 4 on compute1 sum 6 token 0",
        "rank 3 of 4 on compute1 sum 6 token 0",
    ], text
    assert "pmix status 0" in part["pmix"], text
    said = [ln.split(" ", 2) for ln in part["pmi2"].splitlines() if ln.startswith("compute")]
    assert sorted((h, r) for h, r, a in said if "barrier_out" in a) == [
        ("compute0", "0"), ("compute0", "1"), ("compute1", "2"), ("compute1", "3"),
    ], text  # fmt: skip
    assert sum("response_to_init" in a and "rc=0" in a for _, _, a in said) == 4, text
    assert sum("finalize_ack" in a for _, _, a in said) == 4, text
    assert "pmi2 status 0" in part["pmi2"], text
    # The guest's own listener (its port, not the host server's), refused on the host.
    m = re.search(r"compute0 port=(\d+) answered (\d+)", part["foreign"])
    assert m is not None and m.group(2) == "0", text
    assert "PMIx channel from the guest refused: not a PMIx connection request" in text, text
    wait_vm_clean(slurm, job)


REGION_JOB = """set -u
srun -n2 --input=all sh -c 'cat > /root/pingpong && chmod +x /root/pingpong' < {binary}
echo "step region:"
UCX_LOG_LEVEL=info srun -n2 --mpi={mpi} /root/pingpong 1048576 20
echo "region status $?"
"""
LANES = re.compile(r"ep_cfg\[\d+\]: tag\(([^)]*)\)")


def _one_host_pingpong(
    slurm: Env, spec_text: str, tag: str, mpi: str = "pmix", mpicc: str = "mpicc.openmpi"
) -> str:
    """An ordinary user's one-host job of two guests: the ping-pong binary (built
    with ``mpicc``) copied in, then run under srun --mpi=``mpi`` with UCX's lanes
    logged; the "region" step."""
    from hpvc.bench import common

    requires(mpicc)
    (slurm.work / tag).mkdir(exist_ok=True)  # one build per MPI: make sees no change
    binary = common.build_native("pingpong", slurm.work / tag, mpicc)
    spec = slurm.work / f"vm-{tag}.toml"
    spec.write_text(spec_text)
    out = slurm.work / f"{tag}-job.out"
    job_text = REGION_JOB.format(mpi=mpi, binary=binary)
    (slurm.work / f"{tag}.sh").write_text("#!/bin/bash\n" + job_text)
    r = slurm.run("sbatch", "--parsable", "-N1", "-n2", f"--hpvc={spec}", "-o", str(out),
                  str(slurm.work / f"{tag}.sh"))  # fmt: skip
    assert r.returncode == 0, r.stderr
    job = int(r.stdout.strip().split(";")[0])
    wait_done(slurm, job, timeout=400, out=out)
    text = out.read_text()
    wait_vm_clean(slurm, job)
    part = sections(text).get("region", "")
    assert "region status 0" in part, text
    sizes = [int(m) for m in re.findall(r'"bytes": ?(\d+)', part)]
    assert 1 << 20 in sizes, text
    return part


def test_two_guests_on_one_host_run_open_mpi_over_their_region(slurm: Env) -> None:
    """Issue 29 item 2, as a Slurm job: an ordinary user's one-host job of two
    guests (they share the share's ivshmem region); srun --mpi=pmix's two Open
    MPI ranks, one per guest, get UCX over the region from the task relay
    (hpvc.slurm.node) without asking: UCX's own lanes (UCX_LOG_LEVEL=info, the
    user's, passed into the guests) name the region for the pair, never TCP,
    and the ping-pong's sizes up to 1 MiB all come back. (Before scripts/slurm/
    install.sh copied native/ucx, the hosts' hpvc saw no module sources and gave
    the tasks no region: Open MPI then took its shared memory (vader) between
    the two guests, which Slurm's PMIx calls local, and crashed.)"""
    part = _one_host_pingpong(slurm, VM_SPEC, "region")
    lanes = [lane for lane in LANES.findall(part) if not lane.startswith("self/")]
    assert lanes and all("ivshmem/" in lane for lane in lanes), part


def test_two_guests_on_one_host_without_a_region_run_open_mpi_over_tcp(slurm: Env) -> None:
    """The same job with tuning.locality = "none" (no region): Slurm's PMIx still
    calls the two guests' ranks local, so the relay keeps Open MPI off its own
    shared memory between them (hpvc.slurm.node); the ping-pong goes over TCP."""
    spec = VM_SPEC.replace("[tuning]\n", '[tuning]\nlocality = "none"\n')
    part = _one_host_pingpong(slurm, spec, "noregion")
    lanes = [lane for lane in LANES.findall(part) if not lane.startswith("self/")]
    assert not any("ivshmem/" in lane for lane in lanes), part


def test_two_guests_on_one_host_run_mpich_under_pmi2_over_their_region(slurm: Env) -> None:
    """Issue 29 with the other MPI: the mpich image's MPICH 4.0.2 (ch4:ucx), its two
    ranks started by srun --mpi=pmi2 in two guests of one host, gets UCX over the
    region from the relay without asking: UCX's lanes for the pair name ivshmem, and
    the ping-pong's sizes up to 1 MiB all come back."""
    spec = VM_SPEC.replace('image = "hpc"', 'image = "mpich"')
    part = _one_host_pingpong(slurm, spec, "mpich-region", "pmi2", "mpicc.mpich")
    lanes = [lane for lane in LANES.findall(part) if not lane.startswith("self/")]
    assert lanes and all("ivshmem/" in lane for lane in lanes), part
