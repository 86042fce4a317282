"""What the SPANK plugin takes away from a task, on the private Slurm test cluster.

Jobs are submitted by an ordinary user (the ``slurm`` fixture's first tenant,
tests/tenants.py); only the checks of what happened on a host run as root.

* A task inside a virtual node runs with no_new_privs and an empty capability
  bounding set, so a setuid binary in the node's image gives it nothing.
* Killing a step's slurmstepd kills the task inside the node (the relay the
  plugin leaves behind is root, keeps its parent-death signal, and kills it).
* A join cache whose node process is not the one it names (another start
  time) is not trusted: the step asks `hpvc node up` again and still runs in
  the right node.
* `hpvc node up`/`down` run as root in "/", with a fixed environment and no
  open file descriptor but stdin, stdout and stderr; the submit-time `hpvc
  node check` runs as the user with the user's environment.
* The memory Slurm gave the job is passed on: a spec whose host share does
  not fit is refused by srun before any step starts.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.integration.slurm_env import Env, last_job, spec_text
from tests.integration.test_slurm_cluster import wait_state

# Run by a task: the status lines of a program started with its stdout and
# stderr on a full pipe, so it blocks on its first message while we look.
PROBE = """#!/bin/sh
set -u
d=$(mktemp -d /tmp/probe.XXXXXX)
mkfifo "$d/p"
exec 3<>"$d/p"
dd if=/dev/zero of=/proc/self/fd/3 bs=4096 count=64 oflag=nonblock 2>/dev/null
"$@" </dev/null >&3 2>&3 &
pid=$!
sleep 1
grep -E '^(Uid|CapEff|NoNewPrivs):' /proc/$pid/status || echo "exited"
kill -9 $pid 2>/dev/null
rm -rf "$d"
"""


def status_fields(text: str) -> dict[str, str]:
    return {k: v.strip() for k, _, v in (x.partition(":") for x in text.splitlines()) if v}


def test_task_has_no_new_privs_and_no_bounding_set(slurm: Env, spec: Path) -> None:
    r = slurm.run(
        "srun", "-N1", "-n1", f"--hpvc={spec}", "sh", "-c",
        "echo host=$(hostname) uid=$(id -u);"
        " grep -E '^(NoNewPrivs|Cap[A-Za-z]+):' /proc/self/status",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert f"host=compute0 uid={slurm.user.uid}" in r.stdout, r.stdout
    st = status_fields(r.stdout)
    assert st["NoNewPrivs"] == "1", r.stdout
    assert st["CapBnd"] == "0000000000000000", r.stdout
    assert st["CapEff"] == st["CapPrm"] == st["CapAmb"] == "0000000000000000", r.stdout
    slurm.wait_clean(last_job(slurm))


SUID_DIR = "/dev/hpvc-suid"  # a tmpfs mounted with setuid honoured, inside the node


def test_setuid_binary_gives_no_root(slurm: Env, spec: Path) -> None:
    """For an ordinary user's job hpvc mounts the node's root and binds nosuid;
    the plugin's own layer (no_new_privs, no bounding set) must hold without
    that. The test mounts, inside the running node, a tmpfs that honours
    setuid, holding a setuid-root copy of the image's su. The probe run in the
    node as the user but not through Slurm (nsenter, setpriv) sees su with
    euid 0; run by the next step's task, su keeps the user's ids."""
    probe = slurm.work / "probe.sh"
    probe.write_text(PROBE)
    probe.chmod(0o755)
    go, done = slurm.work / f"go-su-{os.getpid()}", slurm.work / f"done-su-{os.getpid()}"
    out = slurm.work / f"su-{os.getpid()}.out"
    for p in (go, done):
        p.unlink(missing_ok=True)
    script = (
        "srun -N1 -n1 sh -c 'test -u /bin/su && echo first setuid-su'\n"
        f"while [ ! -e {go} ]; do sleep 0.2; done\n"
        f"srun -N1 -n1 sh {probe} {SUID_DIR}/su -c id root\n"
        f"while [ ! -e {done} ]; do sleep 0.2; done\n"
    )
    r = slurm.run("sbatch", "--parsable", "-N1", f"--hpvc={spec}", "-o", str(out), "--wrap", script)
    assert r.returncode == 0, r.stderr
    job = int(r.stdout.strip().split(";")[0])
    try:
        text = wait_for(out, "first")
        assert "first setuid-su" in text, text  # the image's su is setuid root
        (cache,) = job_caches(slurm, job)
        (pid,) = re.findall(r"^node 0 (\d+) ", cache.read_text(), re.M)
        setup = (
            f"mkdir -p {SUID_DIR} && mount -t tmpfs -o mode=755,suid tmpfs {SUID_DIR}"
            f" && cp /bin/su {SUID_DIR}/su && chmod 4755 {SUID_DIR}/su"
        )
        subprocess.run(["nsenter", "-t", pid, "-m", "sh", "-c", setup], check=True)
        u = slurm.user
        control = subprocess.run(
            ["nsenter", "-t", pid, "-m", "-u", "-i", "-n", "-p", "--wd=/tmp",
             "setpriv", f"--reuid={u.uid}", f"--regid={u.gid}", "--clear-groups",
             "sh", str(probe), f"{SUID_DIR}/su", "-c", "id", "root"],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        uid = status_fields(control.stdout).get("Uid", "").split()
        assert uid[:2] == [str(u.uid), "0"], f"no setuid seen in the node: {control}"
        go.touch()
        st = status_fields(wait_for(out, "NoNewPrivs"))
        assert "Uid" in st, f"su exited before it could be looked at: {out.read_text()}"
        assert st["Uid"].split() == [str(u.uid)] * 4, st  # real, effective, saved, fs
        assert st["CapEff"] == "0000000000000000" and st["NoNewPrivs"] == "1", st
        done.touch()
        wait_state(slurm.env, str(job), {"COMPLETED"}, timeout=60)
    finally:
        for p in (go, done):
            p.unlink(missing_ok=True)
        slurm.run("scancel", str(job))
    slurm.wait_clean(job)


def wait_for(out: Path, word: str, timeout: float = 60) -> str:
    """The batch output ``out`` once it holds ``word`` (or after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not (out.exists() and word in out.read_text()):
        time.sleep(0.2)
    return out.read_text() if out.exists() else ""


def job_caches(slurm: Env, job: int) -> list[Path]:
    """The join caches of the job's first share, on whichever host it runs."""
    return [
        p
        for h in ("n1", "n2", "n3")
        for p in (slurm.cluster.store(h).root / "jobs").glob(f"j{job}-0.*.join")
    ]


def proc_stat(pid: int) -> list[str]:
    """Fields 3.. of /proc/PID/stat (after the command name)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rindex(")") + 2 :].split()


def ppid(pid: int) -> int:
    return int(proc_stat(pid)[1])


def comm(pid: int) -> str:
    return Path(f"/proc/{pid}/comm").read_text().strip()


def find_processes(argv: list[str], uid: int, count: int, timeout: float = 60) -> list[int]:
    """The PIDs (in this machine's PID namespace) of the ``count`` processes
    running argv as uid (srun may have made argv[0] a full path)."""
    deadline = time.monotonic() + timeout
    found: list[int] = []
    while time.monotonic() < deadline:
        found = []
        for p in Path("/proc").iterdir():
            if not p.name.isdigit():
                continue
            try:
                got = (p / "cmdline").read_text().split("\0")[:-1]
                if (
                    len(got) == len(argv)
                    and os.path.basename(got[0]) == argv[0]
                    and got[1:] == argv[1:]
                    and p.stat().st_uid == uid
                ):
                    found.append(int(p.name))
            except OSError:
                continue
        if len(found) == count:
            return sorted(found)
        time.sleep(0.2)
    raise AssertionError(
        f"{len(found)} processes {argv} of uid {uid}, not {count}, after {timeout} s"
    )


def gone(pid: int, start: str) -> bool:
    """The process is dead (or a zombie, or its PID went to another process)."""
    try:
        st = proc_stat(pid)
    except OSError:
        return True
    return st[0] == "Z" or st[19] != start


@pytest.fixture
def resume_hosts(slurm: Env) -> Iterator[None]:
    """A killed slurmstepd may leave its host drained: give it back afterwards."""
    yield
    for host in ("n1", "n2", "n3"):
        slurm.site("scontrol", "update", f"nodename={host}", "state=resume")


def test_killing_slurmstepd_kills_the_task_in_the_node(
    slurm: Env, spec: Path, resume_hosts: None
) -> None:
    """Two tasks on one host, each below its relay: SIGKILL to the step's
    slurmstepd ends both programs and both relays within 5 s."""
    seconds = str(3000 + os.getpid() % 997)
    r = slurm.run(
        "sbatch", "--parsable", "-N1", "-n2", f"--hpvc={spec}", "-o", "/dev/null", "--wrap",
        f"srun -N1 -n2 sleep {seconds}",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    job = int(r.stdout.strip().split(";")[0])
    try:
        tasks = find_processes(["sleep", seconds], slurm.user.uid, 2)
        watch = {}
        stepds = set()
        for task in tasks:
            # In the node's PID namespace (two PIDs), below the plugin's relay
            # (root), below the step's slurmstepd.
            status = status_fields(Path(f"/proc/{task}/status").read_text())
            assert len(status["NSpid"].split()) == 2, status["NSpid"]
            relay = ppid(task)
            assert comm(relay) == "hpvc-relay" and Path(f"/proc/{relay}").stat().st_uid == 0
            stepds.add(ppid(relay))
            watch[task] = proc_stat(task)[19]
            watch[relay] = proc_stat(relay)[19]
        (stepd,) = stepds
        assert comm(stepd) == "slurmstepd", comm(stepd)
        os.kill(stepd, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not all(gone(p, t) for p, t in watch.items()):
            time.sleep(0.1)
        left = [p for p, t in watch.items() if not gone(p, t)]
        assert left == [], f"still running 5 s after their slurmstepd was killed: {left}"
    finally:
        slurm.run("scancel", str(job))
    wait_state(slurm.env, str(job), {"CANCELLED", "COMPLETED", "FAILED", "NODE_FAIL"}, timeout=60)
    slurm.wait_clean(job, timeout=60)


def test_stale_join_cache_is_not_trusted(slurm: Env, spec: Path) -> None:
    """A join record whose node process has another start time than the cache
    says (its PID could be another process's by now) is not used: the next step
    runs `hpvc node up` again, which rewrites the cache, and runs in its node."""
    go = slurm.work / f"go-{os.getpid()}"
    done = slurm.work / f"done-{os.getpid()}"
    out = slurm.work / f"stale-{os.getpid()}.out"
    for p in (go, done):
        p.unlink(missing_ok=True)
    script = (
        "srun -N1 -n1 sh -c 'echo first $(hostname)'\n"
        f"while [ ! -e {go} ]; do sleep 0.2; done\n"
        "srun -N1 -n1 sh -c 'echo second $(hostname) $HPVC_NODE'\n"
        f"while [ ! -e {done} ]; do sleep 0.2; done\n"
    )
    r = slurm.run("sbatch", "--parsable", "-N1", f"--hpvc={spec}", "-o", str(out), "--wrap", script)
    assert r.returncode == 0, r.stderr
    job = int(r.stdout.strip().split(";")[0])

    try:
        assert "first compute0" in wait_for(out, "first").splitlines()
        (cache,) = job_caches(slurm, job)
        text = cache.read_text()
        nodes = re.findall(r"^node (\d+) (\d+) (\d+) (\S+) (\S+)$", text, re.M)
        assert nodes, f"no node lines in the new format: {text}"
        for _, pid, start, _, _ in nodes:
            assert proc_stat(int(pid))[19] == start, (pid, start)
        stale = re.sub(
            r"^node (\d+) (\d+) (\d+) ",
            lambda m: f"node {m[1]} {m[2]} {int(m[3]) + 4242} ",
            text,
            flags=re.M,
        )
        cache.write_text(stale)  # still root's, mode 0600: only the start times lie
        assert cache.stat().st_uid == 0 and cache.stat().st_mode & 0o077 == 0
        go.touch()
        lines = wait_for(out, "second").splitlines()
        assert "second compute0 compute0" in lines, lines
        assert cache.read_text() == text  # `hpvc node up` wrote the true records again
        done.touch()
        wait_state(slurm.env, str(job), {"COMPLETED"}, timeout=60)
    finally:
        for p in (go, done):
            p.unlink(missing_ok=True)
        slurm.run("scancel", str(job))
    slurm.wait_clean(job)


# Logs what it was started with, then runs the real hpvc.
WRAPPER = """#!/usr/bin/python3 -I
import json, os, sys
fds = []
for fd in sorted(int(f) for f in os.listdir("/proc/self/fd")):
    try:
        fds.append([fd, os.readlink(f"/proc/self/fd/{fd}")])
    except OSError:
        pass  # the listing's own descriptor, closed by now
mask = os.umask(0); os.umask(mask)
rec = {"argv": sys.argv[1:], "uid": os.getuid(), "euid": os.geteuid(), "cwd": os.getcwd(),
       "env": dict(os.environ), "fds": fds, "umask": mask}
with open(os.path.join(LOG, f"{os.getpid()}.json"), "w") as f:
    json.dump(rec, f)
os.execv(REAL, [REAL] + sys.argv[1:])
"""


@contextmanager
def logged_hpvc(slurm: Env) -> Iterator[Path]:
    """plugstack.conf's hpvc= pointed at WRAPPER while in the block; yields the
    folder of its records (one JSON file per start)."""
    conf = Path(slurm.env["SLURM_CONF"]).parent / "plugstack.conf"
    before = conf.read_text()
    real = re.search(r" hpvc=(\S+)", before)
    assert real, before
    log = slurm.tmp / f"wrapper-log-{os.getpid()}-{time.monotonic_ns()}"
    log.mkdir()
    log.chmod(0o1777)
    wrapper = log.with_name(log.name + ".py")
    wrapper.write_text(WRAPPER.replace("LOG", repr(str(log))).replace("REAL", repr(real[1])))
    wrapper.chmod(0o755)
    try:
        conf.write_text(before.replace(real[0], f" hpvc={wrapper}"))
        yield log
    finally:
        conf.write_text(before)


def test_later_steps_join_from_the_cache_without_hpvc(slurm: Env, spec: Path) -> None:
    """In an allocation of an ordinary user, the first step brings the shares up
    (one `hpvc node up` per host); the later steps read the root-only join
    records (a fork that takes root back, no exec) and start no hpvc at all."""
    with logged_hpvc(slurm) as log:
        script = "srun -N2 -n2 hostname; srun -N2 -n2 hostname; srun -N2 -n2 hostname"
        r = slurm.run("salloc", "-N2", "-n2", f"--hpvc={spec}", "sh", "-c", script)
        assert r.returncode == 0, r.stderr
        job = last_job(slurm)
        slurm.wait_clean(job)
    assert sorted(r.stdout.split()) == ["compute0"] * 3 + ["compute1"] * 3, r.stdout
    ups = [
        rec["argv"]
        for p in log.glob("*.json")
        if (rec := json.loads(p.read_text()))["argv"][:2] == ["node", "up"]
    ]
    assert len(ups) == 2, ups  # the first step's, one per host; none for steps 2 and 3


def test_node_commands_run_with_a_fixed_environment(slurm: Env, spec: Path) -> None:
    """plugstack.conf's hpvc= pointed at a wrapper that logs how it was started
    (srun and slurmstepd read the file at every step, the epilog too)."""
    with logged_hpvc(slurm) as log:
        r = slurm.run(
            "srun", "-N1", "-n1", f"--hpvc={spec}", "hostname", env={"HPVC_CANARY": "from-user"},
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == "compute0", r.stdout
        job = last_job(slurm)
        slurm.wait_clean(job)
        # The epilog's `hpvc node down` succeeded (a failed epilog drains the host).
        wait_state(slurm.env, str(job), {"COMPLETED"}, timeout=30)
        nodes = slurm.run("sinfo", "-h", "-N", "-o", "%N %T")
        assert "drain" not in nodes.stdout, nodes.stdout
    recs = [json.loads(p.read_text()) for p in sorted(log.glob("*.json"))]
    by_cmd: dict[str, list[dict[str, Any]]] = {}
    for rec in recs:
        by_cmd.setdefault(rec["argv"][1], []).append(rec)
    assert set(by_cmd) >= {"check", "up", "down"}, [r["argv"] for r in recs]
    for rec in by_cmd["check"]:  # srun's checks: the user, with the user's environment
        assert rec["uid"] == rec["euid"] == slurm.user.uid
        assert rec["env"].get("HPVC_CANARY") == "from-user", rec["env"]
        assert rec["cwd"] == str(slurm.work)
    allowed = {"HPVC_STATE_DIR", "HPVC_IMAGE_DIR", "PATH", "LC_ALL", "HPVC_SPEC_B64"}
    for rec in by_cmd["up"] + by_cmd["down"]:
        assert rec["uid"] == rec["euid"] == 0
        assert set(rec["env"]) <= allowed, sorted(rec["env"])
        assert rec["env"]["LC_ALL"] == "C.UTF-8"
        assert rec["cwd"] == "/"
        assert rec["umask"] == 0o022
        assert [fd for fd, _ in rec["fds"]] == [0, 1, 2], rec["fds"]
    (up,) = by_cmd["up"]
    assert "HPVC_SPEC_B64" in up["env"]
    # --verbose: its progress goes to the user's srun (issue 32 item 12)
    assert up["argv"][:4] == ["node", "up", "--verbose", "--job"], up["argv"]


def test_spec_bigger_than_the_job_memory_is_refused_before_a_step(slurm: Env) -> None:
    """srun --mem=100 (MB per node): the spec's one-host share (a head of 128 MiB
    and two computes of 256 MiB) does not fit: srun refuses before any task, and
    no share comes up anywhere."""
    big = slurm.work / "big.toml"
    big.write_text(spec_text(f"10.88.{100 + os.getpid() % 100}.0/24"))
    r = slurm.run("srun", "-N1", "--mem=100", f"--hpvc={big}", "hostname")
    assert r.returncode != 0
    assert r.stdout.strip() == "", r.stdout
    assert "has 100 MiB" in r.stderr and "no step was started" in r.stderr, r.stderr
    job = last_job(slurm)
    assert slurm.running(job) == []
    slurm.wait_clean(job)
    # The same job with memory enough runs.
    ok = slurm.run("srun", "-N1", "--mem=900", f"--hpvc={big}", "hostname")
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip() == "compute0"
    slurm.wait_clean(last_job(slurm))


def test_node_up_refuses_a_share_bigger_than_the_job_memory(slurm: Env) -> None:
    """sbatch checks nothing about memory (no allocation yet): the first step's
    `hpvc node up --mem-mib` on the host refuses before it changes anything."""
    big = slurm.work / "big-batch.toml"
    big.write_text(spec_text(f"10.88.{100 + os.getpid() % 100}.0/24"))
    out = slurm.work / f"mem-{os.getpid()}.out"
    r = slurm.run(
        "sbatch", "--parsable", "-N1", "--mem=100", f"--hpvc={big}", "-o", str(out),
        "--wrap", "srun hostname",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    job = int(r.stdout.strip().split(";")[0])
    wait_state(slurm.env, str(job), {"COMPLETED", "FAILED"}, timeout=60)
    text = out.read_text()
    assert "compute0" not in text.splitlines(), text  # hostname never ran
    assert "has 100 MiB" in text and "did not come up" in text, text
    slurm.wait_clean(job)


def test_the_node_commands_start_from_the_resident_hpvc(slurm: Env, spec: Path) -> None:
    """up.sh runs `hpvc serve` beside each slurmd and one for the submitting
    side: srun's check runs there as the user, each host's node up as root."""
    logs = slurm.cluster.dir / "log"
    before = {p.name: p.read_text() for p in logs.glob("hpvc-serve-*.log")}
    assert set(before) == {"hpvc-serve-login.log"} | {f"hpvc-serve-n{i}.log" for i in (1, 2, 3)}
    r = slurm.run("srun", "-N2", "-n2", f"--hpvc={spec}", "hostname")
    assert r.returncode == 0, r.stderr
    slurm.wait_clean(last_job(slurm))
    new = {
        name: (logs / name).read_text()[len(text) :].splitlines() for name, text in before.items()
    }
    checks = [line for line in new["hpvc-serve-login.log"] if ": node check " in line]
    assert len(checks) == 1 and f"uid {slurm.user.uid}: node check" in checks[0], new
    assert checks[0].split(" -> ")[1].startswith("0 ")
    ups = [line for n in (1, 2, 3) for line in new[f"hpvc-serve-n{n}.log"] if ": node up " in line]
    assert len(ups) == 2 and all("uid 0: node up" in line for line in ups), new
