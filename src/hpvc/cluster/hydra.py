"""``hpvc run`` with an image whose MPI is MPICH: its own hydra launcher, in a node.

The image's ``mpiexec`` runs inside the first MPI node (``Backend.exec_argv``),
given the nodes as ``-hosts ADDR:RANKS,...`` and ``-launcher manual``: hydra
then prints the command line of each host's proxy (``HYDRA_LAUNCH: ...``, in
host order, then ``HYDRA_LAUNCH_END``) instead of reaching the hosts itself
(there is no ssh in a node, and no bash assumed there), and hpvc starts each
proxy inside its node the same way. The proxies connect back to ``mpiexec``
over the cluster network and forward the ranks' output to it, so the job's
output is ``mpiexec``'s. Nothing of the host's MPI is used.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from collections.abc import Callable
from typing import IO, Any

from hpvc.errors import HpvcError
from hpvc.plan import PlannedNode

LAUNCH = "HYDRA_LAUNCH: "
LAUNCH_END = "HYDRA_LAUNCH_END"

ExecArgv = Callable[[PlannedNode, list[str]], list[str]]


def hosts_arg(layout: list[tuple[PlannedNode, int]]) -> str:
    """``10.0.0.2:2,10.0.0.3:2``: hydra's host list, each node's ranks in order."""
    return ",".join(f"{node.ip}:{count}" for node, count in layout)


def mpiexec_argv(
    launcher: str, layout: list[tuple[PlannedNode, int]], argv: list[str]
) -> list[str]:
    """The image's mpiexec with the manual launcher over ``layout``'s nodes."""
    n = sum(c for _, c in layout)
    return [launcher, "-launcher", "manual", "-hosts", hosts_arg(layout), "-n", str(n), *argv]


def read_launches(stream: IO[str]) -> list[list[str]]:
    """The proxies' command lines hydra prints, up to its end marker."""
    out: list[list[str]] = []
    for line in stream:
        line = line.rstrip("\n")
        if line.startswith(LAUNCH):
            out.append(shlex.split(line[len(LAUNCH) :]))
        elif line.strip() == LAUNCH_END:
            return out
    raise HpvcError("hpvc run", "the image's mpiexec ended before it named its proxies", "")


def run(
    exec_argv: ExecArgv,
    launcher: str,
    layout: list[tuple[PlannedNode, int]],
    argv: list[str],
    capture: bool = False,
) -> int | subprocess.CompletedProcess[str]:
    """Run the job; its exit code (with ``capture``, mpiexec's finished process)."""
    first = layout[0][0]
    cmd = exec_argv(first, mpiexec_argv(launcher, layout, argv))
    main = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE if capture else None,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    assert main.stdout is not None
    proxies: list[subprocess.Popen[bytes]] = []
    try:
        launches = read_launches(main.stdout)
        if len(launches) != len(layout):
            raise HpvcError(
                "hpvc run",
                f"the image's mpiexec named {len(launches)} proxies for {len(layout)} nodes",
                "",
            )
        for (node, _), proxy in zip(layout, launches, strict=True):
            proxies.append(subprocess.Popen(exec_argv(node, proxy), stdin=subprocess.DEVNULL))
        if capture:
            out, err = main.communicate()
        else:
            for line in main.stdout:
                sys.stdout.write(line)
                sys.stdout.flush()
            out, err = "", ""
            main.wait()
    finally:
        # Interrupted, or the job over: what is left is asked to end first (crun exec
        # hands the signal on to the process in the node), then killed.
        end_process(main, 0)
        for p in proxies:
            end_process(p, 10)
    if capture:
        return subprocess.CompletedProcess(cmd, main.returncode, out, err or "")
    return main.returncode


def end_process(proc: subprocess.Popen[Any], grace: float) -> None:
    """Wait ``grace`` seconds for ``proc`` (one hpvc started), then SIGTERM, then
    SIGKILL after 5 s (crun exec hands the signal to the process in the node)."""
    try:
        proc.wait(timeout=grace)
        return
    except subprocess.TimeoutExpired:
        proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
