"""``hpvc run --detach`` and ``hpvc jobs``: MPI jobs whose launcher runs in a node.

``hpvc run`` keeps the job's process manager on the host (Open MPI's mpirun,
or hpvc's PMI server for MPICH) with a client attached to every node, which
is what a cut of the cluster cannot take (docs/checkpoint.md). A detached job
runs the image's own launcher inside the first MPI node instead, in the
background, in a session of its own: it starts its daemons in the other nodes
through their hpvc-agent (``Backend.in_node_launch``: hpvc-rsh), so the whole
job lives in the nodes' own process trees, and ``hpvc checkpoint`` cuts it
with them. Nothing of it stays on the host: ``hpvc run --detach`` returns
once the launcher is started.

What hpvc knows of the job is kept in that node, beside it
(``/root/.hpvc/jobs/<id>/``: ``cmd``, ``started``, ``cwd``, ``pid``, the
output ``out`` and, once it ended, its exit code ``rc``), so it is saved and
restored with the node, and ``hpvc jobs`` reads it there through
``Backend.exec_argv``: short commands, nothing left attached between them.
The ranks are laid out as ``hpvc run`` lays them out (one per vCPU, the
nodes in order; hpvc.cluster.ops), and the job runs in ``/shared`` when the
nodes have it, else in root's home.

The scripts run by the node's ``/bin/sh`` with shell builtins and ``mkdir``,
``mv`` and ``cat`` only (an imported image may have little more; ``cat`` is
replaced by a ``read`` loop where it is missing).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

from hpvc.backends.base import Backend, ClusterEnv, InNodeLaunch
from hpvc.cluster import jobs_onehost as onehost
from hpvc.cluster import ucx
from hpvc.errors import HpvcError, InputError, require_root
from hpvc.image.mpi import MPICH, OPEN_MPI, ImageMpi
from hpvc.plan import Plan, PlannedNode
from hpvc.progress import Progress, quiet
from hpvc.render.files import mpi_nodes
from hpvc.store import Store

JOBS_DIR = "/root/.hpvc/jobs"
EXEC_TIMEOUT_S = 60  # one short command in a node (a guest's agent under TCG included)

# $1: the jobs' folder, $2: when (host clock), $3: the command as shown, $4 and
# $5: the ranks file and rank script of a job over nodes sharing memory ('' for
# none, hpvc.cluster.jobs_onehost; the script's path replaces @RANKEXEC@ in the
# launcher's argv); then the launcher's argv. Prints the job's number. mkdir is
# the lock: two at once get two.
START = r"""
base=$1 started=$2 shown=$3 ranks=$4 rankexec=$5; shift 5
mkdir -p "$base" || exit 1
i=1
while ! mkdir "$base/$i" 2>/dev/null; do
  i=$((i + 1)); [ "$i" -le 100000 ] || exit 1
done
d=$base/$i
if [ -n "$rankexec" ]; then
  printf '%s' "$ranks" > "$d/ranks"; printf '%s' "$rankexec" > "$d/rankexec"
  n=$#
  while [ "$n" -gt 0 ]; do
    a=$1; shift; [ "$a" = @RANKEXEC@ ] && a=$d/rankexec; set -- "$@" "$a"; n=$((n - 1))
  done
fi
cd /shared 2>/dev/null || cd "${HOME:-/root}" 2>/dev/null || cd /
printf '%s\n' "$shown" > "$d/cmd"; printf '%s\n' "$started" > "$d/started"; pwd > "$d/cwd"
s=; command -v setsid > /dev/null 2>&1 && s=setsid
$s sh -c 'd=$1; shift
  "$@" > "$d/out" 2>&1 < /dev/null &
  c=$!
  trap "kill -TERM $c 2> /dev/null" TERM INT HUP
  while :; do wait "$c"; rc=$?; kill -0 "$c" 2> /dev/null || break; done
  echo "$rc" > "$d/rc.new"; mv "$d/rc.new" "$d/rc"' sh "$d" "$@" > /dev/null 2>&1 < /dev/null &
echo $! > "$d/pid.new"; mv "$d/pid.new" "$d/pid"
echo "$i"
"""

# $1: the jobs' folder. A line per job: number, state, exit code, started, command.
# A job without its pid is starting; with it, running while that process is.
LIST = r"""
base=$1
[ -d "$base" ] || exit 0
for d in "$base"/*; do
  i=${d##*/}
  case $i in ''|*[!0-9]*) continue ;; esac
  rc= started= shown=
  read -r started < "$d/started" 2> /dev/null
  read -r shown < "$d/cmd" 2> /dev/null
  if [ -f "$d/rc" ]; then read -r rc < "$d/rc"; st=exited
  elif [ ! -f "$d/pid" ]; then st=starting
  elif read -r p < "$d/pid" && kill -0 "$p" 2> /dev/null; then st=running
  else st=lost; fi
  printf '%s\t%s\t%s\t%s\t%s\n' "$i" "$st" "$rc" "$started" "$shown"
done
"""

# $1: a file, $2: bytes of it already shown. From there with tail (exit 4 where
# there is none); all of it with cat, or line by line where there is no cat.
SHOW = r"""
[ -f "$1" ] || exit 3
if [ "${2:-0}" -gt 0 ]; then
  command -v tail > /dev/null 2>&1 || exit 4
  exec tail -c "+$(($2 + 1))" "$1"
fi
if command -v cat > /dev/null 2>&1; then exec cat "$1"; fi
while IFS= read -r l || [ -n "$l" ]; do printf '%s\n' "$l"; done < "$1"
"""

# $1: a job's folder: its launcher's shell, which hands SIGTERM on to the launcher.
KILL = r"""read -r p < "$1/pid" && kill -TERM "$p" """
STARTING_S = 60.0  # a job still without its pid after this is lost (its start died)


@dataclass(frozen=True)
class Job:
    """A detached job as its node's folder tells it."""

    job: int
    node: str
    state: str  # starting, running, exited or lost (its shell gone with no exit code)
    exit_code: int | None
    started: float | None  # host clock, seconds since the epoch
    command: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def launcher_argv(
    mpi: ImageMpi, launch: InNodeLaunch, layout: list[tuple[PlannedNode, int]], argv: list[str]
) -> list[str]:
    """The image's launcher over ``layout``'s nodes (by name, as the nodes' hosts
    files know them), reaching the others through hpvc-rsh."""
    hosts = ",".join(f"{node.name}:{count}" for node, count in layout)
    n = str(sum(c for _, c in layout))
    env = ["env", *launch.env] if launch.env else []
    if mpi.kind == MPICH:  # hydra
        rsh = ["-launcher", "rsh", "-launcher-exec", launch.rsh]
        return [*env, mpi.launcher, *rsh, "-hosts", hosts, "-n", n, *argv]
    # Not bound to cores: each node's mpirun numbers its own node's cores from 0, so
    # co-resident nodes' ranks were bound to one host CPU and took turns on it
    # (4.2 ms a round trip, the scheduler's tick); hpvc pins the nodes itself, as
    # hpvc run's host mpirun is told too (``ops.mpirun_argv``).
    rsh = ["--mca", "plm_rsh_agent", launch.rsh, "--bind-to", "none"]
    return [*env, mpi.launcher, "--allow-run-as-root", *rsh, "-np", n, "--host", hosts, *argv]


def parse_list(node: str, text: str) -> list[Job]:
    """``LIST``'s lines; a line that does not parse is skipped (not hpvc's)."""
    out = []
    for line in text.splitlines():
        parts = line.split("\t", 4)
        if len(parts) != 5 or not parts[0].isdigit():
            continue
        num, state, rc, started, shown = parts
        try:
            when = float(started) if started else None
        except ValueError:
            when = None
        code = int(rc) if rc.lstrip("-").isdigit() else None
        out.append(Job(int(num), node, state, code, when, shown))
    return sorted(out, key=lambda j: j.job)


def _in_node(
    backend: Backend, env: ClusterEnv, plan: Plan, node: PlannedNode, argv: list[str]
) -> subprocess.CompletedProcess[bytes]:
    """One short command in ``node``, its output as bytes (a job's may be anything)."""
    cmd = backend.exec_argv(env, plan, node, argv)
    try:
        return subprocess.run(cmd, capture_output=True, timeout=EXEC_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise HpvcError(
            f"node {node.name} of {env.name}",
            f"did not answer within {EXEC_TIMEOUT_S} s",
            f"hpvc status {env.name}",
        ) from None


def one_host(backend: Backend, env: ClusterEnv, mpi: ImageMpi) -> bool:
    """Whether the job's ranks may share memory across nodes, as ``hpvc run``'s do
    (the backend says; the spec's locality): Open MPI is then told they are one
    host's. MPICH's hydra keeps each node a host (its PMI is an inherited socket)."""
    if mpi.kind != OPEN_MPI or not backend.capabilities.shared_memory:
        return False
    return bool(env.rec.spec.get("tuning", {}).get("locality", "shm") == "shm")


def _last_line(stderr: bytes, rc: int) -> str:
    """What a node said last on stderr, for a one-line error."""
    return (stderr.decode(errors="replace").strip().splitlines() or [f"exit {rc}"])[-1]


def launch_node(plan: Plan) -> PlannedNode:
    """Where a detached job's launcher runs, and its folder is: the first MPI node."""
    return mpi_nodes(plan)[0]


def start(
    backend: Backend,
    env: ClusterEnv,
    plan: Plan,
    mpi: ImageMpi,
    layout: list[tuple[PlannedNode, int]],
    argv: list[str],
    shown: str,
    verbose: bool = False,
    progress: Progress = quiet,
) -> Job:
    """Start the job in the background in ``launch_node``; its record as it started."""
    launch = backend.in_node_launch(env, plan)
    if launch is None:
        raise InputError(
            f"hpvc run --detach {env.name}",
            "its nodes run no hpvc-agent to start ranks in each other"
            " (a tenant's cluster, one across hosts, or one made before the agent)",
            f"run it attached: hpvc run {env.name} -- CMD",
        )
    # Co-resident guests' ivshmem region through UCX, as an attached job gets it.
    argv = ucx.job_argv(env.store.root, plan, layout, argv, verbose, progress)
    node = launch_node(plan)
    now = time.time()
    ranks = rankexec = ""
    if one_host(backend, env, mpi) and len(layout) > 1:  # ranks share memory (jobs_onehost)
        ranks, rankexec = onehost.ranks_text(layout, node), onehost.rank_script(launch)
        launcher = onehost.launcher_argv(mpi, launch, layout, node, argv)
    else:
        launcher = launcher_argv(mpi, launch, layout, argv)
    script = ["sh", "-c", START, "hpvc-run", JOBS_DIR, f"{now:.3f}", shown, ranks, rankexec]
    r = _in_node(backend, env, plan, node, [*script, *launcher])
    num = r.stdout.decode(errors="replace").strip().splitlines()[-1:] if r.returncode == 0 else []
    if not num or not num[0].isdigit():
        said = _last_line(r.stderr, r.returncode)
        raise HpvcError(f"hpvc run --detach {env.name}", f"{node.name} said: {said}", "")
    return Job(int(num[0]), node.name, "running", None, now, shown)


def listing(backend: Backend, env: ClusterEnv, plan: Plan) -> list[Job]:
    """Every detached job of the cluster, oldest first."""
    node = launch_node(plan)
    r = _in_node(backend, env, plan, node, ["sh", "-c", LIST, "hpvc-jobs", JOBS_DIR])
    if r.returncode != 0:
        said = _last_line(r.stderr, r.returncode)
        raise HpvcError(f"hpvc jobs {env.name}", f"{node.name} said: {said}", "")
    return parse_list(node.name, r.stdout.decode(errors="replace"))


def find(backend: Backend, env: ClusterEnv, plan: Plan, num: int) -> Job:
    for job in listing(backend, env, plan):
        if job.job == num:
            return job
    raise InputError(f"job {num}", f"not a detached job of {env.name}", f"hpvc jobs {env.name}")


def output(backend: Backend, env: ClusterEnv, plan: Plan, job: Job, skip: int = 0) -> bytes | None:
    """What the job printed (stdout and stderr, as they came) past its first ``skip``
    bytes; None where the node cannot give a part (no ``tail`` in its image)."""
    out = f"{JOBS_DIR}/{job.job}/out"
    r = _in_node(
        backend, env, plan, plan.node(job.node), ["sh", "-c", SHOW, "hpvc-jobs", out, str(skip)]
    )
    if r.returncode == 3:  # not written yet: the launcher is starting
        return b""
    if r.returncode == 4 and skip:
        return None
    if r.returncode != 0:
        said = _last_line(r.stderr, r.returncode)
        raise HpvcError(f"job {job.job} of {env.name}", f"{job.node} said: {said}", "")
    return r.stdout


def kill(backend: Backend, env: ClusterEnv, plan: Plan, job: Job) -> None:
    """SIGTERM to a running job's launcher (mpirun ends its ranks in every node)."""
    if job.state != "running":
        raise InputError(f"job {job.job} of {env.name}", f"is {job.state}", f"hpvc jobs {env.name}")
    r = _in_node(
        backend,
        env,
        plan,
        plan.node(job.node),
        ["sh", "-c", KILL, "hpvc-jobs", f"{JOBS_DIR}/{job.job}"],
    )
    if r.returncode != 0:
        said = _last_line(r.stderr, r.returncode)
        raise HpvcError(f"job {job.job} of {env.name}", f"{job.node} said: {said}", "")


def wait(
    store: Store,
    name: str,
    num: int,
    poll_s: float = 1.0,
    progress: Progress = quiet,
    on_output: Callable[[bytes], None] | None = None,
) -> Job:
    """Wait for job ``num`` to end (a short command in its node each ``poll_s``, so
    nothing stays attached to the cluster and a checkpoint can cut it meanwhile);
    its record once it has. ``on_output`` gets the job's output as it comes, every
    byte once. Exit 1 when the cluster goes away meanwhile."""
    from hpvc.cluster.status import open_cluster

    said = False
    shown, streaming = 0, True
    while True:
        rec = store.load(name)
        if rec is None or rec.status != "running":
            where = "taken down" if rec is None else rec.status
            raise HpvcError(
                f"waiting for job {num} of {name}",
                f"the cluster went away ({where}, a checkpoint --stop?)",
                f"once it is back (hpvc restore): hpvc jobs {name} {num} --wait",
            )
        backend, env, plan = open_cluster(name, store)
        job = find(backend, env, plan, num)
        late = job.started is not None and time.time() - job.started > STARTING_S
        if job.state == "starting" and late:
            job = replace(job, state="lost")
        ended = job.state in ("exited", "lost")
        if on_output is not None and (streaming or ended):
            part = output(backend, env, plan, job, shown if streaming else 0)
            if part is None:  # no tail in the image: all of it once it ended
                streaming = False
            else:
                part = part if streaming else part[shown:]
                shown += len(part)
                if part:
                    on_output(part)
        if ended:
            return job
        if not said:
            progress(f"job {num} of {name} runs in {job.node}: waiting for it to end")
            said = True
        time.sleep(poll_s)


def require(store: Store, name: str) -> tuple[Backend, ClusterEnv, Plan]:
    """A running cluster's backend, state and plan (as root), or one line."""
    from hpvc.cluster.status import open_cluster

    require_root("hpvc jobs")
    rec = store.get(name)
    if rec.status != "running":
        raise InputError(f"cluster {name!r}", f"is {rec.status}", "wait for it, or hpvc up")
    return open_cluster(name, store)
