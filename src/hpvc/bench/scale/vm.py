"""VM nodes in ``hpvc bench scale --kind vm`` (issue 33 item 2; docs/benchmarks.md,
"Scale"): one VM per host, and an ``srun`` watched from the host while it runs.

Under TCG the tasks run in guests whose clocks are not the host's and which
do not know their Slurm host, so the host watches: when the first task's line
reaches srun's output, which hosts hold the job's lock, and each job's QEMU
resident memory (``ps``, its ``-name`` holding ``hpvc-j<job>-``), every 0.2 s.
Host reads only (``ps``, the test cluster's state directories).
"""

from __future__ import annotations

import re
import subprocess
import threading
import time
from pathlib import Path

from hpvc.bench.slurm.cluster import SlurmCluster, Submitter

QEMU_POLL_S = 0.2
TIMEOUT_S = 120

VM_KIND_NOTE = (
    "VM nodes under TCG emulation (no KVM here): one VM per host, 1 vCPU and 384 MiB each;"
    " the first task is when its line reaches srun's output on the host (guest clocks"
    " differ); the growth below is the emulator's as much as hpvc's"
)


def vm_spec_text(subnet: str, hosts: int) -> str:
    """``hosts`` compute VMs, one on each of the job's hosts."""
    return (
        f'name = "sv"\nkind = "vm"\nimage = "hpc"\n'
        f'[network]\nsubnet = "{subnet}"\n'
        '[tuning]\npinning = "shared"\nhugepages = "none"\npartition = "commodity"\n'
        f'[[nodes]]\nrole = "compute"\ncount = {hosts}\nvcpus = 1\nmemory = "384MiB"\n'
    )


def qemu_rss_mib() -> dict[str, float]:
    """Resident memory (MiB) of hpvc jobs' QEMU on the machine, per job (its
    ``-name`` holds ``hpvc-j<job>-``: other users' guests are not counted)."""
    r = subprocess.run(["ps", "-eo", "rss=,args="], capture_output=True, text=True, check=False)
    out: dict[str, float] = {}
    for line in r.stdout.splitlines():
        rss, _, args = line.strip().partition(" ")
        m = re.search(r"hpvc-j(\d+)-", args)
        if "qemu-system" in args and m and rss.isdigit():
            out[m[1]] = out.get(m[1], 0.0) + int(rss) / 1024
    return out


def job_locks(cluster: SlurmCluster) -> set[tuple[str, str]]:
    """(host, job) of every job lock on the test cluster's hosts now."""
    return {
        (h, p.stem) for h in cluster.hosts for p in (cluster.store(h).root / "jobs").glob("*.lock")
    }


def watched_submit(
    cluster: SlurmCluster, user: Submitter, argv: list[str], cwd: Path
) -> tuple[subprocess.CompletedProcess[str], float | None, dict[str, float], set[tuple[str, str]]]:
    """``cluster.submit`` of ``argv``, watched: when (monotonic) the first
    ``first-task`` line reached srun's output, the peak QEMU memory (MiB)
    of each job while it ran, and the (host, job) locks seen meanwhile (which hosts ran
    the job: its tasks in guests cannot say)."""
    proc = subprocess.Popen(
        argv,
        env=cluster.user_env(user),
        cwd=cwd,
        user=user.uid,
        group=user.gid,
        extra_groups=[],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    out: list[str] = []
    err: list[str] = []
    seen: list[float] = []

    def read_out() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if not seen and line.startswith("first-task "):
                seen.append(time.monotonic())
            out.append(line)

    readers = [
        threading.Thread(target=read_out, daemon=True),
        threading.Thread(target=lambda: err.extend(proc.stderr or []), daemon=True),
    ]
    for t in readers:
        t.start()
    peak: dict[str, float] = {}
    locks: set[tuple[str, str]] = set()
    deadline = time.monotonic() + TIMEOUT_S
    while proc.poll() is None:
        for job, mib in qemu_rss_mib().items():
            peak[job] = max(peak.get(job, 0.0), mib)
        locks |= job_locks(cluster)
        if time.monotonic() > deadline:
            proc.kill()  # the srun this function started, by its handle
            break
        time.sleep(QEMU_POLL_S)
    rc = proc.wait()
    for t in readers:
        t.join(timeout=10)
    r = subprocess.CompletedProcess(argv, rc, "".join(out), "".join(err))
    return r, (seen[0] if seen else None), peak, locks
