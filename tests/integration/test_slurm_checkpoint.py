"""A Slurm job's virtual cluster checkpointed across its hosts, and restored when
Slurm requeues the job on other hosts (issue 28 item 4; docs/checkpoint.md
"Under Slurm").

One private three-host test cluster for the module, whose plugstack keeps
checkpoints (``checkpoints=``, ``checkpoint_min=5``, ``checkpoint_via=`` a
wrapper of scripts/slurm/on.sh). The tenant submits with ``--requeue`` a
two-host job of two 1-vCPU VM nodes (TCG): head0 on the
first host, compute0 on the second, a TCP counter between them over VXLAN
(the client in head0 checks every echo: a message lost, doubled or reordered
stops it with ``BAD``). Root then:

1. ``hpvc node checkpoint --job J``: one cut of both hosts' shares, the job
   runs on;
2. ``scontrol requeue J`` with n1 excluded: the job comes back on n2 and n3,
   its batch script sees ``HPVC_RESTORED=1``, its shares come back from the
   cut (head0 now on n2), and the counter goes on from where the cut was,
   over the same connection;
3. the job ends; its checkpoints and everything of it on every host are gone.

The counter runs in VM nodes here; the batch script waits on its host, not
in a step. Container nodes are cut too
(``test_container_shares_are_cut_with_what_their_steps_left_running``): what
a step left running in the background is taken, a running step's tasks are
refused (docs/checkpoint.md "Under Slurm").

In this module: the refusals (a job that does not exist, a job without
``--hpvc``: exit 2, no cut left) and the container cut. The requeue path
(1-3 above) and periodic cuts (``--hpvc-checkpoint=5``: a cut appears, only
two are kept, none after the job ends) are in
test_slurm_checkpoint_requeue.py (docs/checkpoint.md "Under Slurm"); both
modules run in ``make test``.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpvc.bench.slurm import cluster as bench_slurm
from hpvc.host import cgroups, criu, freezer, nodeprocs, procfs
from hpvc.image import resolve_image
from hpvc.image.guest import build_guest
from hpvc.slurm import checkpoint as jck
from tests.helpers import requires
from tests.integration.slurm_env import Env
from tests.integration.test_cluster import image_ready
from tests.integration.test_slurm_cluster import requires_slurm
from tests.integration.test_slurm_vm import wait_done

SPEC = """name = "ck"
kind = "vm"
image = "hpc"
[network]
subnet = "10.88.64.0/24"
[tuning]
pinning = "shared"
hugepages = "none"
partition = "commodity"
locality = "none"
[[nodes]]
role = "head"
vcpus = 1
memory = "256MiB"
[[nodes]]
role = "compute"
count = 1
vcpus = 1
memory = "256MiB"
"""

PROG = """
import os, socket, sys, time
if sys.argv[1] == "server":
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", 7400)); s.listen(1); c, _ = s.accept()
    while (d := c.recv(16)):
        c.sendall(d)
    raise SystemExit("BAD: server saw the connection close")
for _ in range(100):
    try:
        c = socket.create_connection(("compute0", 7400)); break
    except OSError:
        time.sleep(0.2)
n = 0
while True:
    n += 1
    c.sendall(b"%015d\\n" % n)
    got = b""
    while len(got) < 16:
        d = c.recv(16 - len(got))
        if not d:
            raise SystemExit("BAD: connection closed at %d" % n)
        got += d
    if int(got) != n:
        raise SystemExit("BAD: sent %d, echo %d" % (n, int(got)))
    open("/tmp/ck/count.new", "w").write(str(n)); os.rename("/tmp/ck/count.new", "/tmp/ck/count")
    time.sleep(0.02)
"""

START = """echo $PROG | base64 -d > p.py
srun -N2 -n2 --input=all sh -c 'mkdir -p /tmp/ck; cat > /tmp/ck/p.py' < p.py
srun -N2 -n2 sh -c '
if [ "$HPVC_NODE" = compute0 ]; then role=server; else role=client; sleep 1; fi
setsid python3 /tmp/ck/p.py $role </dev/null >>/tmp/ck/job.log 2>&1 &
sleep 0.5'"""

JOB = """#!/bin/bash
set -u
export PROG={prog}
echo "start restored=${{HPVC_RESTORED:-0}} restarts=${{SLURM_RESTART_COUNT:-0}} on $(hostname)"
inside=$(srun -N2 -n2 sh -c 'echo ${{HPVC_RESTORED:-0}}' | sort -u | tr -d '\n')
echo "nodes restored=$inside"
if [ "$inside" = 1 ]; then
  :
else
  {start}
fi
echo "loop running"
sleep 600
"""


@pytest.fixture(scope="module")
def slurm(tenants: tuple[bench_slurm.Submitter, bench_slurm.Submitter]) -> Iterator[Env]:
    """Three hosts, no site binds (a share with binds is not checkpointed), the
    site keeping checkpoints in ``ckpt`` (every host sees it: one machine)."""
    requires("root", "crun", "qemu", "ip")
    requires_slurm()
    image_ready()
    build_guest(resolve_image("hpc"))
    if not criu.check().ok:  # not a skip: make setup installs CRIU 4.2
        pytest.fail(f"CRIU cannot run here: {criu.check().error}")
    tmp = Path(tempfile.mkdtemp(prefix="hpvc-slurm-ckpt-test-"))
    os.chmod(tmp, 0o755)
    shared = tmp / "work"
    shared.mkdir()
    ckpt = tmp / "ckpt"
    via = tmp / "via.sh"
    left: list[tuple[str, str]] = []
    try:
        extra = f"kinds=container,vm checkpoints={ckpt} checkpoint_min=5 checkpoint_via={via}"
        with bench_slurm.private_slurm(tmp, "10.88.0.0/16", extra_args=extra, hosts=3) as c:
            keep = {k: v for k, v in c.env.items() if k.startswith(("HPVC_SLURM", "SLURM_CONF"))}
            exports = "".join(f"export {k}='{v}'\n" for k, v in keep.items())
            on = bench_slurm.repo_dir() / "scripts" / "slurm" / "on.sh"
            via.write_text(f'#!/bin/sh\n{exports}exec bash {on} "$@"\n')
            via.chmod(0o755)
            try:
                yield Env(tmp, c, shared, tenants)
            finally:
                left = c.sweep(c.env["HPVC_BIN"])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    assert left == [], f"shares left after the module: {left}"


def _checkpoint(slurm: Env, job: int, *extra: str) -> subprocess.CompletedProcess[str]:
    c = slurm.cluster
    via = str(slurm.tmp / "via.sh") + " {host}"
    site = f"--site=checkpoints={slurm.tmp / 'ckpt'}"
    return slurm.site(c.env["HPVC_BIN"], "node", "checkpoint", f"--job={job}", site,
                      "--via", via, *extra, timeout=300)  # fmt: skip


def _job_dir(slurm: Env, job: int) -> Path:
    return jck.job_dir(slurm.tmp / "ckpt", job)


def _host_of(slurm: Env, job: int, node: str) -> str:
    for host in slurm.cluster.hosts:
        out = slurm.cluster.run_on(host, [slurm.cluster.env["HPVC_BIN"], "node", "ls", "--json"])
        if any(s["job"] == job and node in s["nodes"] for s in json.loads(out)):
            return host
    return ""


def _in_node(slurm: Env, job: int, node: str, script: str) -> str:
    host = _host_of(slurm, job, node)
    assert host, f"{node} of job {job} runs nowhere"
    argv = [slurm.cluster.env["HPVC_BIN"], "node", "enter", f"--job={job}", f"--node={node}",
            "--", "sh", "-c", script]  # fmt: skip
    return slurm.cluster.run_on(host, argv)


def _count(slurm: Env, job: int) -> int:
    out = _in_node(slurm, job, "head0", "cat /tmp/ck/count; echo; cat /tmp/ck/job.log; true")
    assert "BAD" not in out and "Error" not in out, out
    first = out.split("\n", 1)[0].strip()
    return int(first) if first.isdigit() else 0


def _goes_on(slurm: Env, job: int, past: int = 0, timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    start = max(_count(slurm, job), past)
    while (now := _count(slurm, job)) <= start:
        assert time.monotonic() < deadline, f"the count stayed at {now}"
        time.sleep(0.5)
    return now


def _wait_for(out: Path, text: str, times: int = 1, timeout: float = 180) -> str:
    deadline = time.monotonic() + timeout
    while True:
        now = out.read_text() if out.exists() else ""
        if now.count(text) >= times:
            return now
        assert time.monotonic() < deadline, f"no {text!r} x{times} in:\n{now[-2000:]}"
        time.sleep(1)


def _state(slurm: Env, job: int) -> tuple[str, str]:
    info = jck.parse_scontrol(slurm.site("scontrol", "show", "job", "-o", str(job)).stdout)
    return info.get("JobState", ""), info.get("NodeList", "")


def _stamp(ahead_s: float) -> str:
    """Slurm's local time ``ahead_s`` seconds from now."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() + ahead_s))


def _steer_requeued(slurm: Env, job: int, timeout: float = 120) -> None:
    """Start the requeued job soon, away from n1. Slurm holds a requeued batch
    job: when its epilog ends (``batch_requeue_fini``) it sets the begin time
    to CredExpire + 1 s (121 s) ahead, over an earlier update; so the hold is
    lifted each time it shows. Not to ``now``: slurmd refuses a batch launch
    whose credential is from the same second as the job's kill ("Job N already
    killed, do not launch batch job": the credential counts as revoked), and
    the job then ends instead of running again (seen 2026-11-27, the kill at
    06:44:07, the launch at 06:44:07.644). Two seconds ahead is past it."""
    deadline = time.monotonic() + timeout
    excluded = False
    while True:
        info = jck.parse_scontrol(slurm.site("scontrol", "show", "job", "-o", str(job)).stdout)
        state = info.get("JobState", "")
        if state in ("RUNNING", "CONFIGURING") and excluded:
            return
        held = info.get("EligibleTime", "") > _stamp(5)  # Slurm's hold, not our 2 s
        if state == "PENDING" and (not excluded or held):
            ex = slurm.site("scontrol", "update", f"jobid={job}", "ExcNodeList=n1",
                            f"StartTime={_stamp(2)}")  # fmt: skip
            assert ex.returncode == 0, ex.stderr
            excluded = True
        assert time.monotonic() < deadline, info
        time.sleep(0.5)


def test_refusals_leave_no_cut(slurm: Env) -> None:
    nope = _checkpoint(slurm, 999999)
    assert nope.returncode == 2, nope.stderr
    assert len(nope.stderr.strip().splitlines()) <= 2, nope.stderr
    r = slurm.run("sbatch", "--parsable", "-N2", "-o", "/dev/null", "--wrap", "sleep 120")
    assert r.returncode == 0, r.stderr
    job = int(r.stdout.strip().split(";")[0])
    try:
        deadline = time.monotonic() + 60
        while _state(slurm, job)[0] != "RUNNING":
            assert time.monotonic() < deadline, _state(slurm, job)
            time.sleep(0.5)
        plain = _checkpoint(slurm, job)
        assert plain.returncode == 2, plain.stderr
        assert "no hpvc share" in plain.stderr, plain.stderr
        assert not _job_dir(slurm, job).exists()  # the cut's folder and the job's went
    finally:
        slurm.run("scancel", str(job))
    wait_done(slurm, job, timeout=60)


CT_SPEC = SPEC.replace('kind = "vm"', 'kind = "container"').replace("10.88.64.", "10.88.66.")

# The container job: the counter started as in JOB, then a step that runs
# until the test cancels it (the cut is refused while it runs).
CT_JOB = """#!/bin/bash
set -u
export PROG={prog}
{start}
echo "loop running"
srun -N2 -n2 sleep 1000
echo "step over"
sleep 600
"""


def _step_of(slurm: Env, job: int, name: str) -> str:
    """The id (``J.S``) of ``job``'s running step named ``name``, or ""."""
    r = slurm.run("squeue", "-h", "-s", "-j", str(job), "-o", "%i %j")
    return next((ln.split()[0] for ln in r.stdout.splitlines() if ln.split()[1:] == [name]), "")


def test_container_shares_are_cut_with_what_their_steps_left_running(slurm: Env) -> None:
    """Container nodes (docs/checkpoint.md "Under Slurm"): the counter a step
    started in the background (``setsid ... &``) was adopted by the node's
    init but sits in Slurm's freezer cgroup; the cut moves it into the node's
    (checked: the counter is then in head0's freezer cgroup). While a step's
    tasks run in the nodes the cut is refused (exit 2, nothing frozen, no
    cut). Once the step ends, the cut is taken and the counter goes on, where
    root holds CAP_SYS_RESOURCE (CRIU reads the tenant's processes' limits
    with prlimit); where it does not (this sandbox), the cut is refused in one
    line before any freeze. The dump of a process moved back into its node is
    tested in test_checkpoint_container.py (root's processes)."""
    spec = slurm.work / "ckc.toml"
    spec.write_text(CT_SPEC)
    prog = base64.b64encode(PROG.encode()).decode()
    (slurm.work / "ct.sh").write_text(CT_JOB.format(prog=prog, start=START))
    out = slurm.work / "ct.out"
    r = slurm.run("sbatch", "--parsable", "-N2", "-x", "n3", f"--hpvc={spec}", "-o", str(out),
                  str(slurm.work / "ct.sh"))  # fmt: skip
    assert r.returncode == 0, r.stderr
    job = int(r.stdout.strip().split(";")[0])
    try:
        _wait_for(out, "loop running")
        _goes_on(slurm, job)
        deadline = time.monotonic() + 60
        while not (step := _step_of(slurm, job, "sleep")):
            assert time.monotonic() < deadline, "the sleep step never ran"
            time.sleep(0.5)
        seen = ""
        while "sleep\0001000" not in seen:  # its task in head0's PID namespace
            assert time.monotonic() < deadline, seen
            seen = _in_node(slurm, job, "head0", "cat /proc/[0-9]*/cmdline; true")
            time.sleep(0.5)

        refused = _checkpoint(slurm, job)
        assert refused.returncode == 2, refused.stderr
        assert "runs processes its freeze would not stop" in refused.stderr, refused.stderr
        assert "sleep 1000)" in refused.stderr, refused.stderr  # named by its command
        assert jck.cuts(_job_dir(slurm, job)) == []
        _goes_on(slurm, job)  # nothing was left frozen

        cancel = slurm.run("scancel", step)
        assert cancel.returncode == 0, cancel.stderr
        _wait_for(out, "step over", timeout=60)
        took = _checkpoint(slurm, job, "--json")
        # The counter, left by its step, is now in head0's freezer cgroup.
        counter = [p for p in procfs.pids() if (procfs.cmdline(p) or [])[1:3] == [
            "/tmp/ck/p.py", "client"]]  # fmt: skip
        assert len(counter) == 1, counter
        assert counter[0] in freezer.members(cgroups.node_path(f"j{job}-0", "head0"))
        if nodeprocs.has_capability(nodeprocs.CAP_SYS_RESOURCE):
            assert took.returncode == 0, took.stderr
            report = json.loads(took.stdout)
            m = jck.read_job(Path(report["dir"]))
            assert [(s.index, s.host, s.nodes) for s in m.shares] == [
                (0, "n1", ("head0",)),
                (1, "n2", ("compute0",)),
            ]
        else:
            # This machine's root lacks CAP_SYS_RESOURCE (a sandbox), without
            # which CRIU cannot read the limits of the tenant's counter: refused
            # before any freeze (docs/checkpoint.md, Containers).
            assert took.returncode == 2, took.stderr
            assert "lacks CAP_SYS_RESOURCE" in took.stderr, took.stderr
            assert jck.cuts(_job_dir(slurm, job)) == []
        _goes_on(slurm, job, _count(slurm, job))  # thawed (or never frozen), one connection
    finally:
        print(out.read_text()[-2000:] if out.exists() else "(no output)")
        slurm.run("scancel", str(job))
        slurm.wait_clean(job, timeout=90)
    wait_done(slurm, job, timeout=60)


def test_what_a_step_left_in_nodes_sharing_namespaces_is_refused(slurm: Env) -> None:
    """Container shares with ``locality = "shm"``: a step's task enters its node
    from outside, so the counter it left running in the background is adopted
    by the shared PID namespace's init, in no node's tree: the cut across the
    job's hosts is refused in one line naming it (exit 2), no cut is left and
    nothing stays frozen (docs/checkpoint.md "Under Slurm")."""
    spec = slurm.work / "ckcs.toml"
    spec.write_text(
        CT_SPEC.replace('locality = "none"', 'locality = "shm"').replace("10.88.66.", "10.88.67.")
    )
    prog = base64.b64encode(PROG.encode()).decode()
    # The program goes in with `srun --input=all` in a later step of the job,
    # as in the VM job (its tasks' relays used to hold their stdin pipes'
    # writers: test_slurm_stdin_shm.py).
    (slurm.work / "cs.sh").write_text(JOB.format(prog=prog, start=START))
    out = slurm.work / "cs.out"
    r = slurm.run("sbatch", "--parsable", "-N2", "-x", "n3", f"--hpvc={spec}", "-o", str(out),
                  str(slurm.work / "cs.sh"))  # fmt: skip
    assert r.returncode == 0, r.stderr
    job = int(r.stdout.strip().split(";")[0])
    try:
        _wait_for(out, "loop running")
        _goes_on(slurm, job)
        refused = _checkpoint(slurm, job)
        assert refused.returncode == 2, refused.stderr
        errors = [ln for ln in refused.stderr.splitlines() if ln.startswith("hpvc: ")]
        assert len(errors) == 1 and "in no node's tree" in errors[0], refused.stderr
        assert "/tmp/ck/p.py" in errors[0], errors  # the counter, named by its command
        assert jck.cuts(_job_dir(slurm, job)) == []
        _goes_on(slurm, job)  # nothing was left frozen
    finally:
        print(out.read_text()[-2000:] if out.exists() else "(no output)")
        slurm.run("scancel", str(job))
        slurm.wait_clean(job, timeout=90)
    wait_done(slurm, job, timeout=60)
