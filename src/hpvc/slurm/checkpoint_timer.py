"""Periodic checkpoints of a Slurm job (``sbatch --hpvc-checkpoint=SECONDS``;
docs/checkpoint.md "Under Slurm").

When the job's first host brings its share up (``hpvc node up``, index 0) and
the job asked for a period, ``start`` spawns ``hpvc node checkpoint-timer`` as
root in a session of its own: every period it takes ``hpvc node checkpoint``'s
cut of the whole job (``hpvc.slurm.checkpoint.take``, which keeps the newest
two). It ends by itself within a second of the share leaving this host (the
epilog's ``hpvc node down``, a requeue, ``--stop``), so nothing has to find it
by name; one lock file keeps a second timer of the same job from running.

When the job ends for good, the epilog's ``hpvc node down --ended`` removes the
job's checkpoints (``remove``); on a requeue the plugin says ``--requeued`` and
they stay for the shares to come back from.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from hpvc.errors import HpvcError, InputError
from hpvc.progress import Progress, quiet
from hpvc.slurm import checkpoint as jck
from hpvc.slurm.migrate import DEFAULT_VIA
from hpvc.slurm.node import Request, jobs_dir
from hpvc.slurm.policy import Site, job_hosts, share_name
from hpvc.store import Store


def check_every(every: int, site: Site) -> None:
    """A job's period, refused in one line when the site does not allow it."""
    if every == 0:
        return
    if not site.checkpoints:
        raise InputError(
            f"--hpvc-checkpoint={every}",
            "this site keeps no checkpoints",
            "ask the site for plugstack.conf checkpoints=DIR, or drop it",
        )
    if every < site.checkpoint_min_s:
        raise InputError(
            f"--hpvc-checkpoint={every}",
            "more often than the site allows",
            f"give {site.checkpoint_min_s} seconds or more",
        )


def via(site: Site) -> str:
    return f"{site.checkpoint_via} {{host}}" if site.checkpoint_via else DEFAULT_VIA


def site_args(site: Site) -> list[str]:
    args = [
        f"--site=checkpoints={site.checkpoints}",
        f"--site=checkpoint_min={site.checkpoint_min_s}",
    ]
    return args + ([f"--site=checkpoint_via={site.checkpoint_via}"] if site.checkpoint_via else [])


def start(store: Store, req: Request, site: Site, every: int) -> int | None:
    """Spawn the job's timer on its first host (the PID), or nothing to do."""
    if every == 0 or req.index != 0 or not site.checkpoints:
        return None
    log = jobs_dir(store) / f"{req.job}.timer.log"
    argv = [
        sys.executable,
        "-m",
        "hpvc",
        "node",
        "checkpoint-timer",
        f"--job={req.job}",
        f"--every={every}",
        f"--nodelist={req.nodelist}",
        *site_args(site),
    ]
    with open(log, "ab") as out:
        child = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True, cwd="/"
        )
    return child.pid


def run(
    store: Store, job: int, every: int, nodelist: str, site: Site, progress: Progress = quiet
) -> None:
    """The timer's loop: a cut every ``every`` seconds while the job's first share is here."""
    lock = os.open(
        jobs_dir(store) / f"{job}.timer.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600
    )
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        progress(f"job {job}: a checkpoint timer runs already")
        return
    hosts = job_hosts(nodelist)
    root = jck.job_dir(site.checkpoints, job)
    name = share_name(job, 0)
    try:
        while True:
            due = time.monotonic() + every
            while time.monotonic() < due:
                if store.load(name) is None:
                    return
                time.sleep(1)
            try:
                t = jck.take(job, hosts, root, via(site), progress=progress)
                progress(f"job {job}: checkpoint {t.dir.name} in {t.seconds:.1f} s")
            except HpvcError as e:
                progress(f"job {job}: checkpoint failed: {e}")
    finally:
        os.close(lock)


def forget(store: Store, job: int) -> None:
    """The job's timer files on this host (its shares are gone: the timer ends)."""
    for suffix in ("timer.lock", "timer.log"):
        (jobs_dir(store) / f"{job}.{suffix}").unlink(missing_ok=True)
    for marker in jobs_dir(store).glob(f"j{job}-*.restored"):
        marker.unlink(missing_ok=True)


def remove(site: Site, job: int) -> Path | None:
    """The job ended for good: its checkpoints go (the folder, or None if none)."""
    if not site.checkpoints:
        return None
    d = jck.job_dir(site.checkpoints, job)
    if not d.exists():
        return None
    shutil.rmtree(d, ignore_errors=True)
    return d
