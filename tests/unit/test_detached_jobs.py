"""hpvc.cluster.jobs: the launcher's command line, and the node-side scripts run by
this host's own /bin/sh in a scratch folder (what a node's sh does with them)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from hpvc.backends.base import InNodeLaunch
from hpvc.cluster import jobs
from hpvc.image.mpi import MPICH, OPEN_MPI, ImageMpi
from hpvc.plan import PlannedNode


def _layout(*counts: tuple[str, int]) -> list[tuple[PlannedNode, int]]:
    return [(cast(PlannedNode, SimpleNamespace(name=n)), c) for n, c in counts]


def test_open_mpi_launcher_reaches_the_nodes_through_hpvc_rsh() -> None:
    mpi = ImageMpi(OPEN_MPI, "4.1.4", "/usr/bin/mpiexec")
    argv = jobs.launcher_argv(
        mpi, InNodeLaunch("/dev/hpvc-rsh"), _layout(("c0", 2), ("c1", 1)), ["./a", "x y"]
    )
    assert argv == [
        "/usr/bin/mpiexec", "--allow-run-as-root", "--mca", "plm_rsh_agent", "/dev/hpvc-rsh",
        "--bind-to", "none", "-np", "3", "--host", "c0:2,c1:1", "./a", "x y",
    ]  # fmt: skip


def test_mpich_launcher_uses_hydras_rsh_launcher_and_the_backends_variables() -> None:
    mpi = ImageMpi(MPICH, "4.0.2", "/usr/bin/mpiexec.hydra")
    launch = InNodeLaunch("/usr/local/sbin/hpvc-rsh", ("A=1", "B=2"))
    argv = jobs.launcher_argv(mpi, launch, _layout(("c0", 1), ("c1", 1)), ["./a"])
    assert argv == [
        "env", "A=1", "B=2", "/usr/bin/mpiexec.hydra", "-launcher", "rsh",
        "-launcher-exec", "/usr/local/sbin/hpvc-rsh", "-hosts", "c0:1,c1:1", "-n", "2", "./a",
    ]  # fmt: skip


def test_parse_list_reads_every_state_and_skips_what_is_not_hpvcs() -> None:
    text = (
        "2\trunning\t\t1700000001.5\t./b --x\n"
        "1\texited\t3\t1700000000.000\tsh -c 'exit 3'\n"
        "junk line\n"
        "3\tlost\t\t\t./c\n"
        "4\texited\t-1\tnot-a-time\t./d\ttab\n"
    )
    got = jobs.parse_list("compute0", text)
    assert [(j.job, j.state, j.exit_code, j.started) for j in got] == [
        (1, "exited", 3, 1700000000.0),
        (2, "running", None, 1700000001.5),
        (3, "lost", None, None),
        (4, "exited", -1, None),
    ]
    assert got[0].command == "sh -c 'exit 3'" and got[3].command == "./d\ttab"
    assert {j.node for j in got} == {"compute0"}


def _sh(script: str, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["/bin/sh", "-c", script, "t", *args], capture_output=True, text=True, env=env,
        timeout=30, check=False,
    )  # fmt: skip


def _list(base: Path, env: dict[str, str]) -> list[jobs.Job]:
    r = _sh(jobs.LIST, str(base), env=env)
    assert r.returncode == 0, r.stderr
    return jobs.parse_list("n", r.stdout)


def _until(base: Path, env: dict[str, str], num: int, state: str) -> jobs.Job:
    deadline = time.monotonic() + 20
    while True:
        found = {j.job: j for j in _list(base, env)}
        if num in found and found[num].state == state:
            return found[num]
        assert time.monotonic() < deadline, found
        time.sleep(0.05)


def test_start_list_and_show_in_a_real_shell(tmp_path: Path) -> None:
    """Two jobs get two numbers; output and exit codes are kept; a job whose shell
    was killed is lost; the output is shown by cat or, without it, by read."""
    base = tmp_path / "jobs"
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}
    assert _list(base, env) == []  # no folder yet: no jobs, no error
    job = ["sh", "-c", "echo out; echo err >&2; exit 4"]
    first = _sh(jobs.START, str(base), "123.5", "first", "", "", *job, env=env)
    assert first.returncode == 0 and first.stdout == "1\n", first
    # (sleep 3 outlives its shell's kill below, and ends by itself)
    second = _sh(jobs.START, str(base), "124", "second", "", "", "sleep", "3", env=env)
    assert second.stdout == "2\n", second
    done = _until(base, env, 1, "exited")
    assert (done.exit_code, done.started, done.command) == (4, 123.5, "first")
    assert (base / "1" / "cwd").read_text() == f"{tmp_path}\n"  # no /shared here: $HOME

    running = _until(base, env, 2, "running")
    pid = int((base / "2" / "pid").read_text())
    os.kill(pid, 9)  # its shell gone before writing an exit code
    assert _until(base, env, 2, "lost").exit_code is None and running.command == "second"

    shown = _sh(jobs.SHOW, str(base / "1" / "out"), "0", env=env)
    assert shown.returncode == 0 and sorted(shown.stdout.splitlines()) == ["err", "out"]
    (tmp_path / "partial").write_text("a\nno newline at the end")
    bare = {"PATH": str(tmp_path / "empty")}  # no cat, no tail
    no_cat = _sh(jobs.SHOW, str(tmp_path / "partial"), "0", env=bare)
    assert no_cat.stdout == "a\nno newline at the end\n", no_cat
    assert _sh(jobs.SHOW, str(base / "9" / "out"), "0", env=env).returncode == 3  # not yet
    # Past what was shown already: tail; where there is none, exit 4 (all at the end).
    assert _sh(jobs.SHOW, str(tmp_path / "partial"), "2", env=env).stdout == "no newline at the end"
    assert _sh(jobs.SHOW, str(tmp_path / "partial"), "2", env=bare).returncode == 4


def test_sigterm_to_a_jobs_shell_ends_the_job_and_keeps_its_exit_code(tmp_path: Path) -> None:
    """``hpvc jobs --kill``: the launcher's shell hands SIGTERM on to the launcher,
    waits for it and writes its exit code (143: ended by SIGTERM), not lost."""
    base = tmp_path / "jobs"
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}
    begun = _sh(jobs.START, str(base), "1", "sleep", "", "", "sleep", "30", env=env)
    assert begun.stdout == "1\n", begun
    _until(base, env, 1, "running")
    t0 = time.monotonic()
    assert _sh(jobs.KILL, str(base / "1"), env=env).returncode == 0
    done = _until(base, env, 1, "exited")
    assert done.exit_code == 143 and time.monotonic() - t0 < 10, done  # not sleep's 30 s
    assert _sh(jobs.KILL, str(base / "9"), env=env).returncode != 0  # no such job


@pytest.mark.parametrize("bad", ["", "x", "-"])
def test_parse_list_takes_no_exit_code_it_cannot_read(bad: str) -> None:
    [job] = jobs.parse_list("n", f"5\texited\t{bad}\t1\tcmd\n")
    assert job.exit_code is None and job.state == "exited"
