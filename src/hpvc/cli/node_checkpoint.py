"""``hpvc node checkpoint``: one consistent cut of a Slurm job's whole virtual
cluster, across its hosts; and its steps (hidden: ``checkpoint-share`` on each
host, ``checkpoint-timer`` for periodic cuts, ``checkpoint-latest`` for the
plugin). The work is in ``hpvc.slurm.checkpoint``; docs/checkpoint.md "Under Slurm".
"""

from __future__ import annotations

import os
from pathlib import Path

import typer

from hpvc.cli.common import console, err_console, print_json
from hpvc.errors import InputError

CHECKPOINT_HELP = """Checkpoint a running Slurm job's virtual cluster on all its hosts: one cut.

Run as root (the site's). Every host's share is frozen before any is saved,
then all run on (or with --stop are taken down). The cut goes into
--out DIR/<UTC time>, default the site's checkpoints=<dir>/<job> (give
--site checkpoints=DIR as in plugstack.conf); the newest 2 are kept. When
Slurm requeues the job, its shares come back from the newest (docs/checkpoint.md).
Refused (exit 2): a job that is not running, has no hpvc share, a share that
cannot be saved. A failure anywhere thaws every host and removes the cut (exit 1).

The other hosts' hpvc is run through --via (default $HPVC_REMOTE, else
'ssh -o BatchMode=yes {host}').

Examples:

  hpvc node checkpoint --job 42 --out /shared/ckpt/42

  hpvc node checkpoint --job 42 --site checkpoints=/shared/ckpt --json \
      --via 'scripts/slurm/on.sh {host}'
"""


def _progress(msg: str) -> None:
    err_console.print(f"[dim]{msg}[/dim]")


def _site(items: list[str] | None) -> object:
    from hpvc.slurm import policy

    return policy.Site.parse(items or [])


def checkpoint_cmd(
    job: int = typer.Option(..., min=1, help="Slurm job id."),
    out: Path | None = typer.Option(None, "--out", help="The job's checkpoint folder."),
    via: str = typer.Option("", "--via", help="Command template reaching a host as root."),
    hosts: str = typer.Option("", "--hosts", help="The job's hosts (default: scontrol's)."),
    stop: bool = typer.Option(False, "--stop", help="Take the shares down after the cut."),
    site: list[str] = typer.Option(None, "--site", help="Site rule key=value (checkpoints=DIR)."),
    as_json: bool = typer.Option(False, "--json", help="Print the outcome as JSON."),
) -> None:
    from hpvc.slurm import checkpoint as jck
    from hpvc.slurm import migrate, policy

    if os.geteuid() != 0:
        raise InputError("hpvc node checkpoint", "needs root", "run it as root (the site's)")
    s: policy.Site = _site(site)  # type: ignore[assignment]
    if out is None and not s.checkpoints:
        raise InputError(
            "hpvc node checkpoint",
            "no folder for the checkpoints",
            "give --out DIR, or --site checkpoints=DIR",
        )
    root = (out or jck.job_dir(s.checkpoints, job)).absolute()
    names = policy.job_hosts(hosts) if hosts else jck.running_hosts(jck.job_info(job), job)
    template = via or os.environ.get("HPVC_REMOTE") or migrate.DEFAULT_VIA
    taken = jck.take(job, names, root, template, stop=stop, progress=_progress)
    if as_json:
        print_json(taken.as_dict())
        return
    size = sum(s.size for s in taken.manifest.shares) >> 20
    console.print(
        f"job {job}: {taken.dir} ({len(names)} host(s), {size} MiB, frozen"
        f" {taken.manifest.frozen_s:.2f} s)"
    )


def share_cmd(job: int = typer.Option(..., min=1), cut: Path = typer.Option(..., "--dir")) -> None:
    """Every host: this host's share's part of the cut (a line protocol on stdin/stdout)."""
    from hpvc.slurm import checkpoint_share
    from hpvc.store import Store

    checkpoint_share.serve(Store(), job, cut)


def timer_cmd(
    job: int = typer.Option(..., min=1),
    every: int = typer.Option(..., min=1),
    nodelist: str = typer.Option(..., "--nodelist"),
    site: list[str] = typer.Option(None, "--site"),
) -> None:
    """The job's first host: a cut every --every seconds while its share is here."""
    from hpvc.slurm import checkpoint_timer
    from hpvc.store import Store

    def log(msg: str) -> None:
        print(msg, flush=True)

    checkpoint_timer.run(Store(), job, every, nodelist, _site(site), log)  # type: ignore[arg-type]


def latest_cmd(
    job: int = typer.Option(..., min=1), site: list[str] = typer.Option(None, "--site")
) -> None:
    """The plugin, in a requeued job's batch step: the cut its shares come back from."""
    from hpvc.slurm import checkpoint_share

    found = checkpoint_share.restorable(_site(site), job)  # type: ignore[arg-type]
    print(found or "")


def register(app: typer.Typer) -> None:
    app.command("checkpoint", help=CHECKPOINT_HELP)(checkpoint_cmd)
    app.command("checkpoint-share", hidden=True)(share_cmd)
    app.command("checkpoint-timer", hidden=True)(timer_cmd)
    app.command("checkpoint-latest", hidden=True)(latest_cmd)
