"""What the SPANK plugin takes from Slurm and never from the job's environment
(issue 25, item 7), on the private Slurm test cluster.

A job's hosts decide its VXLAN peers and the size of the subnet cut from the
site's pool. The plugin read them from SLURM_JOB_NODELIST and
SLURM_STEP_NODELIST, which are the user's: a tenant exporting a longer list
picked peers outside the job and, with enough names, a subnet as large as
the whole pool. Now slurmstepd asks slurmctld. The job is submitted by an
ordinary user (tests/tenants.py); only the reading of the records is root's.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.integration.slurm_env import Env, last_job
from tests.integration.test_slurm_hardening import logged_hpvc

FORGED = "n[1-3],x[1-200]"


def test_a_forged_node_list_in_the_environment_is_not_used(slurm: Env, spec: Path) -> None:
    """In a two-host allocation the tenant exports a node list of 203 hosts
    (the third host of the cluster and 200 that do not exist) before each
    srun: the step's tasks see the forged list, but `hpvc node up` on each
    host is told the job's two hosts, as slurmctld has them."""
    forge = (
        f"export SLURM_JOB_NODELIST='{FORGED}' SLURM_STEP_NODELIST='{FORGED}'"
        f" SLURM_NODELIST='{FORGED}' SLURM_JOB_NUM_NODES=203 SLURM_NNODES=203; "
    )
    real_nodes = 'echo "REAL=$(squeue -h -j $SLURM_JOB_ID -o %N)"; '
    script = real_nodes + forge + "srun -N2 -n2 printenv SLURM_JOB_NODELIST; srun -N2 -n2 hostname"
    with logged_hpvc(slurm) as log:
        r = slurm.run("salloc", "-N2", "-n2", f"--hpvc={spec}", "sh", "-c", script)
        job = last_job(slurm)
        try:
            assert r.returncode == 0, r.stderr
        finally:
            slurm.run("scancel", str(job))
            slurm.wait_clean(job)
    lines = r.stdout.split()
    real = lines.pop(0).removeprefix("REAL=")  # the job's hosts, while it ran
    assert real in {"n[1-2]", "n[1,3]", "n[2-3]"}, r.stdout
    # The attack reached the step: its tasks carry the forged list ...
    assert lines.count(FORGED) == 2, (r.stdout, r.stderr)
    # ... and hpvc ran the job's own nodes, not 203 hosts' worth.
    assert sorted(x for x in lines if x != FORGED) == ["compute0", "compute1"], r.stdout
    ups = [
        rec["argv"]
        for p in log.glob("*.json")
        if (rec := json.loads(p.read_text()))["argv"][:2] == ["node", "up"]
    ]
    assert len(ups) == 2, ups
    for argv in ups:
        # `node up --verbose --job J --nodelist ...`: the flag, then option/value pairs
        assert argv[2] == "--verbose", argv
        told = dict(zip(argv[3::2], argv[4::2], strict=False))
        assert told["--nodelist"] == real, argv
        assert told["--hosts"] == "2", argv
    assert sorted(dict(zip(a[3::2], a[4::2], strict=False))["--index"] for a in ups) == ["0", "1"]
