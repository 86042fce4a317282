"""``srun --pty`` into a VM guest (issue 30 item 3), on the namespace test
cluster with VM nodes (TCG here), as an ordinary user: the task's relay
(native/spank/vm.c) asks the guest's agent for a pty ('t' frame,
native/agent/pty.c), puts Slurm's pty raw and passes window sizes on ('w').

Driven through a real terminal (tests/terminal.py): ``tty`` names a /dev/pts
device in the guest, ``stty size`` follows a resize of the outer terminal,
Ctrl-C and Ctrl-Z reach the guest's foreground job (the shell lives on, and
``jobs`` lists the stopped one), and ``exit 7`` is srun's exit status; the
same inside ``salloc``. The job leaves nothing behind on any host.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.slurm_env import Env, last_job
from tests.integration.test_slurm_vm import (
    VM_SPEC,
    slurm,  # noqa: F401 (its fixture: VM nodes allowed)
    wait_vm_clean,
)
from tests.terminal import Terminal, scenario

pytestmark = pytest.mark.integration

STEP_S = 90  # one step of the scenario in a guest under TCG
BOOT_S = 400  # the job's guests boot before the first prompt


@pytest.fixture
def one_guest(slurm: Env) -> Path:  # noqa: F811
    """One compute VM: -N1 jobs boot one guest."""
    p = slurm.work / "pty-vm.toml"
    p.write_text(VM_SPEC.replace("count = 2", "count = 1"))
    return p


@pytest.mark.parametrize("how", ["srun", "salloc"])
def test_srun_pty_into_a_vm_guest(slurm: Env, one_guest: Path, how: str) -> None:  # noqa: F811
    srun = ["srun", "--pty", "-N1", "-n1", f"--hpvc={one_guest}", "bash", "-i"]
    argv = srun if how == "srun" else ["salloc", "-N1", f"--hpvc={one_guest}", *srun]
    env = {**slurm.cluster.user_env(slurm.user), "TERM": "xterm"}
    term = Terminal(argv, env=env, cwd=slurm.work, uid=slurm.user.uid, gid=slurm.user.gid)
    status = None
    try:
        status = scenario(term, STEP_S, start_s=BOOT_S, host="compute0")
    finally:
        term.close()
        if status != 7:  # what a failed run left: the job, by its owner
            slurm.run("scancel", f"--user={slurm.user.name}")
    screen = term.out.decode(errors="replace")
    print(screen[-3000:])  # what the terminal showed (pytest -rP)
    assert status == 7, screen[-1500:]
    assert "not a tty" not in screen
    wait_vm_clean(slurm, last_job(slurm), timeout=120)
