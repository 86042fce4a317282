"""``hpvc jobs``: the MPI jobs ``hpvc run --detach`` started in a cluster's nodes."""

from __future__ import annotations

import sys
import time

import typer

from hpvc.cli.common import console, err_console, print_json
from hpvc.errors import InputError

JOBS_HELP = """List the MPI jobs hpvc run --detach started in a cluster; show or wait for one.

Each job's launcher runs in the cluster's first MPI node, which keeps what
hpvc knows of it (its command, when it started, its output and exit code:
/root/.hpvc/jobs/ID there), so a job checkpointed and restored with the
cluster is listed and waited for as before. States: running, exited (with
its exit code), lost (its launcher's shell is gone with no exit code: the
node was restarted), starting.

With ID: the job's output so far; the exit code is the job's once it ended
(0 while it runs). With --wait: its output as it comes until it ends (a
short command in the node each second, nothing attached in between: a
checkpoint can cut the job meanwhile), then exit with its exit code. With
--kill: SIGTERM to its launcher, which ends the ranks in every node (with
--wait, then wait for that).

Examples:

  hpvc jobs small

  hpvc jobs small 1

  hpvc jobs small 1 --wait --json

  hpvc jobs small 1 --kill --wait
"""


def _progress(msg: str) -> None:
    err_console.print(f"[dim]{msg}[/dim]")


def _when(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t is not None else "-"


def jobs_cmd(
    name: str = typer.Argument(..., help="Cluster name."),
    job: int | None = typer.Argument(None, help="A job's number (hpvc run --detach gave it)."),
    wait: bool = typer.Option(
        False, "--wait", "-w", help="Wait for the job to end, its output shown as it comes."
    ),
    kill: bool = typer.Option(
        False, "--kill", help="Send SIGTERM to the job's launcher (its ranks end with it)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print as JSON (the output included)."),
) -> None:
    from hpvc.cluster import jobs as j
    from hpvc.store import Store

    store = Store()
    if job is None:
        if wait or kill:
            flag = "--wait" if wait else "--kill"
            raise InputError(f"hpvc jobs {flag}", "names no job", f"hpvc jobs {name} ID {flag}")
        backend, env, plan = j.require(store, name)
        found = j.listing(backend, env, plan)
        if as_json:
            print_json({"cluster": name, "jobs": [x.to_json() for x in found]})
            return
        from rich.table import Table

        table = Table("job", "node", "state", "exit", "started", "command", box=None)
        for x in found:
            code = "" if x.exit_code is None else str(x.exit_code)
            table.add_row(str(x.job), x.node, x.state, code, _when(x.started), x.command)
        console.print(table)
        if not found:
            console.print(f"no detached jobs in {name}: hpvc run {name} --detach -- CMD")
        return
    backend, env, plan = j.require(store, name)
    found_job = j.find(backend, env, plan, job)
    if kill:
        j.kill(backend, env, plan, found_job)
        _progress(f"job {job} of {name}: SIGTERM sent to its launcher in {found_job.node}")
    got: list[bytes] = []
    if wait:
        # The output as it comes (every byte once), or gathered for --json.
        def show(part: bytes) -> None:
            got.append(part)
            if not as_json:
                sys.stdout.buffer.write(part)
                sys.stdout.flush()

        found_job = j.wait(store, name, job, progress=_progress, on_output=show)
    else:
        got.append(j.output(backend, env, plan, found_job) or b"")
        if not as_json:
            sys.stdout.buffer.write(got[-1])
            sys.stdout.flush()
    if as_json:
        out = b"".join(got).decode(errors="replace")
        print_json({"cluster": name, **found_job.to_json(), "output": out})
    elif found_job.state != "exited":
        _progress(f"job {job} of {name} is {found_job.state}")
    if found_job.state == "lost":
        raise typer.Exit(1)
    raise typer.Exit(found_job.exit_code or 0)


def register(app: typer.Typer) -> None:
    app.command("jobs", help=JOBS_HELP)(jobs_cmd)
