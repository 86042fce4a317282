"""Debian's MPICH under srun --mpi=pmi2 in VM guests on two hosts (issue 30
item 2), with test_slurm_vm_pmix.py's cluster and helpers: run by hand,
``pytest tests/integration/slurm_vm_mpich.py`` (the file name keeps it out of
``make test``).

Why not in CI: Debian 12's MPICH 4.0.2 (ch4:ucx) can hang in MPI_Finalize.
Its ``MPIDI_UCX_mpi_finalize_hook`` (src/mpid/ch4/netmod/ucx/ucx_init.c) waits
for every ``ucp_disconnect_nb`` and then enters the PMI barrier; a rank already
in the barrier stops progressing UCX, and the other rank's disconnect can wait
on it for ever. MPICH removed that barrier upstream (pmodels/mpich#6596, 2023,
in 4.2). Both ranks print their results and then one hangs: the project's CI
run for stop 36 (the job overran its 300 s) and this host's clean-clone run of
2026-11-26 12:41 (it overran 500 s) hung so, the barrier before MPI_Finalize
that RING_C has did not prevent the second, and the runs here in between
passed. docs/slurm.md says so ("Known problem: MPICH 4.0.2 ...").
"""

from __future__ import annotations

import subprocess

from tests.integration.slurm_env import Env
from tests.integration.test_slurm_vm import VM_SPEC, submit, wait_done, wait_vm_clean
from tests.integration.test_slurm_vm_pmix import RING_C, sections, slurm  # noqa: F401

MPICH_JOB = """set -u
srun -N2 -n2 --input=all sh -c 'cat > /root/ring && chmod +x /root/ring' < ring-mpich
echo "step mpich:"
srun -N2 -n2 --mpi=pmi2 /root/ring
echo "mpich status $?"
"""


def test_debians_mpich_runs_under_srun_mpi_pmi2_in_the_guests(slurm: Env) -> None:  # noqa: F811
    """The mpich image's MPICH 4.0.2, a rank in each host's guest with
    Slurm's pmi2 as its process manager (PMI_FD carried by the relays): both
    report, the allreduce and the ring across the hosts are right."""
    (slurm.work / "ring.c").write_text(RING_C)
    cc = ["mpicc.mpich", "-O2", "-o", str(slurm.work / "ring-mpich"), str(slurm.work / "ring.c")]
    subprocess.run(cc, check=True)
    spec = slurm.work / "vm-mpich.toml"
    spec.write_text(VM_SPEC.replace('image = "hpc"', 'image = "mpich"'))
    out = slurm.work / "mpich-job.out"
    job = submit(slurm, spec, MPICH_JOB, out)
    wait_done(slurm, job, timeout=500, out=out)
    text = out.read_text()
    part = sections(text)
    ranks = sorted(ln for ln in part["mpich"].splitlines() if ln.startswith("rank "))
    assert ranks == [
        "rank 0 of 2 on compute0 sum 1 token 101",
        "rank 1 of 2 on compute1 sum 1 token 0",
    ], text
    assert "mpich status 0" in part["mpich"], text
    wait_vm_clean(slurm, job)
