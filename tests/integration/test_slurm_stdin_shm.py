"""``srun --input=all`` into container nodes gives every task its end of input
(docs/slurm.md, "What the plugin does to each task").

A task of a container node forks in ``task_init_privileged`` (a PID namespace
only applies to children): the child becomes the program, the parent stays on
the host as ``hpvc-relay``. The relay never execs, so it kept every descriptor
slurmstepd had marked close-on-exec, among them the write end of the task's
stdin pipe (and of the other local tasks'): once srun's input ended and
slurmstepd closed its own write end, ``cat`` still waited for more. It showed
on every step whose tasks started before srun's input ended: not on the step
that brings the share up (``hpvc node up`` takes long enough for a small file
to be read and closed by then), but on any later one, whatever the nodes'
``locality`` (seen first as a hang of ``cat`` in nodes with ``locality =
"shm"``, test_slurm_checkpoint.py). Here the input ends a few seconds after the
step started, after its tasks did; ``cat`` runs under ``timeout`` so that a
held pipe fails the test (exit 124) instead of hanging it.
"""

from __future__ import annotations

import pytest

from tests.integration.slurm_env import Env, spec_text
from tests.integration.test_slurm_vm import wait_done

pytestmark = pytest.mark.integration

# Each task copies its stdin into the node and says what it got.
CAT = (
    "sh -c 'timeout 60 cat > /tmp/in.$SLURM_PROCID;"
    ' echo "$HPVC_NODE $SLURM_PROCID rc=$? $(wc -c < /tmp/in.$SLURM_PROCID)"\''
)

# The first step brings the shares up; in the next ones the tasks start at
# once and the input ends 3 s later (its writer still open when they fork).
JOB = f"""#!/bin/bash
set -u
srun -N2 -n2 true
echo "step two hosts"
(cat in.txt; sleep 3) | srun -N2 -n2 --input=all {CAT}
echo "step one host"
(cat in.txt; sleep 3) | srun -N1 -n2 --overcommit --input=all {CAT}
echo "end"
"""


@pytest.mark.parametrize("locality", ["shm", "none"])
def test_input_all_ends_in_container_nodes(slurm: Env, locality: str) -> None:
    spec = slurm.work / f"stdin-{locality}.toml"
    subnet = "10.88.73.0/24" if locality == "shm" else "10.88.74.0/24"
    spec.write_text(
        spec_text(subnet, computes=1).replace("[tuning]\n", f'[tuning]\nlocality = "{locality}"\n')
    )
    data = b"".join(b"line %05d\n" % i for i in range(20000))  # 220000 bytes
    (slurm.work / "in.txt").write_bytes(data)
    script = slurm.work / f"stdin-{locality}.sh"
    script.write_text(JOB)
    out = slurm.work / f"stdin-{locality}.out"
    r = slurm.run("sbatch", "--parsable", "-N2", "-x", "n3", f"--hpvc={spec}", "-o", str(out),
                  str(script))  # fmt: skip
    assert r.returncode == 0, r.stderr
    job = int(r.stdout.strip().split(";")[0])
    try:
        wait_done(slurm, job, timeout=240, out=out)
    finally:
        slurm.run("scancel", str(job))
        slurm.wait_clean(job, timeout=90)
    text = out.read_text()
    assert text.rstrip().endswith("end"), text
    two, one = text.split("step two hosts\n", 1)[1].split("step one host\n")
    size = len(data)
    # Two hosts, one task each: head0 on the first, compute0 on the second.
    assert sorted(two.splitlines()) == [f"compute0 1 rc=0 {size}", f"head0 0 rc=0 {size}"], text
    # Two tasks on one host (the first host's share has head0 alone): each
    # relay also held the other task's stdin pipe.
    assert sorted(one.splitlines()[:2]) == [f"head0 0 rc=0 {size}", f"head0 1 rc=0 {size}"], text
