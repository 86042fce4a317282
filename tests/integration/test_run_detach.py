"""``hpvc run --detach`` and ``hpvc jobs`` in container nodes (hpvc.cluster.jobs).

The image's own launcher runs in the first MPI node, in the background,
reaching the other nodes through their hpvc-agent: nothing of the job stays
on the host or attached to a node, so ``hpvc checkpoint --stop`` cuts it
mid-run and after ``hpvc restore`` (by another host of the test cluster: a
state root of its own) ``hpvc jobs NAME ID --wait`` sees it end with the right
result (the ping-pong of test_checkpoint_mpi_containers, every
answer checked). The job's record (command, output, exit code) lives in that
node and comes back with it. All through the CLI, as a user types it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from hpvc.store import Store
from tests.integration.test_checkpoint_container import store as store  # the fixture
from tests.integration.test_checkpoint_mpi_containers import PINGPONG
from tests.integration.test_cluster import clean_up, cli_env, leftovers, spec_file
from tests.integration.test_run_mpi import mpich_ready

ROUNDS, DELAY_US = 400, 10000  # about 4 s of ping-pong
VADER = "OMPI_MCA_btl=vader,self"  # shared memory, no network


def _hpvc(store: Store, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hpvc", *argv],
        capture_output=True, text=True, env=cli_env(store), timeout=180, check=False,
    )  # fmt: skip


def _jobs(store: Store, name: str) -> list[dict[str, object]]:
    r = _hpvc(store, "jobs", name, "--json")
    assert r.returncode == 0, r.stderr
    jobs: list[dict[str, object]] = json.loads(r.stdout)["jobs"]
    return jobs


def _output(store: Store, name: str, job: int) -> str:
    r = _hpvc(store, "jobs", name, str(job))
    assert r.returncode == 0, r.stderr
    return r.stdout


def _wait_for(store: Store, name: str, job: int, pattern: str, seconds: float = 60) -> str:
    deadline = time.monotonic() + seconds
    while not re.search(pattern, out := _output(store, name, job)):
        assert time.monotonic() < deadline, f"no {pattern!r} in job {job}'s output: {out[-600:]}"
        time.sleep(0.3)
    return out


@contextmanager
def _brief_exec(store: Store, name: str, node: str) -> Iterator[None]:
    """An ``hpvc exec`` of a second, running as the block starts: the cut waits for
    its client to end (hpvc.backends.crun.cutcheck) instead of refusing."""
    argv = [sys.executable, "-m", "hpvc", "exec", name, node, "--", "sleep", "1"]
    brief = subprocess.Popen(argv, env=cli_env(store))
    try:
        time.sleep(0.5)  # the client started (Python and crun exec: about 0.3 s)
        assert brief.poll() is None, "the exec ended before the cut"
        yield
    finally:
        assert brief.wait(timeout=30) == 0


def test_detached_job_is_cut_restored_and_waited_for(store: Store, tmp_path: Path) -> None:
    name = "rdetach"
    spec = Path(spec_file(tmp_path, name))  # head0, compute0, compute1; shared namespaces
    assert _hpvc(store, "up", str(spec)).returncode == 0
    shared = store.cluster_dir(name) / "shared"
    subprocess.run(["mpicc.openmpi", "-O2", "-o", str(shared / "pingpong"), str(PINGPONG)],
                   check=True)  # fmt: skip

    # Bad input first: exit 2, no job started.
    no_cmd = _hpvc(store, "run", name, "--detach")
    assert no_cmd.returncode == 2 and "no command given" in no_cmd.stderr, no_cmd.stderr
    too_many = _hpvc(store, "run", name, "--detach", "-n", "3", "--", "true")
    assert too_many.returncode == 2 and "have 2 vCPUs" in too_many.stderr, too_many.stderr
    attached_json = _hpvc(store, "run", name, "--json", "--", "true")
    assert attached_json.returncode == 2 and "is for --detach" in attached_json.stderr
    missing = _hpvc(store, "jobs", name, "7")
    assert missing.returncode == 2 and "not a detached job" in missing.stderr, missing.stderr
    assert _jobs(store, name) == []

    # Shared memory only (vader): the ranks, in two nodes sharing /dev/shm, are one
    # host's to Open MPI (hpvc.cluster.jobs_onehost), or the job fails.
    started = _hpvc(store, "run", name, "--detach", "--json", "--", "env", VADER,
                    "./pingpong", str(ROUNDS), str(DELAY_US))  # fmt: skip
    assert started.returncode == 0, started.stderr
    job = json.loads(started.stdout)
    assert (job["job"], job["node"], job["state"]) == (1, "compute0", "running"), job
    assert job["command"] == f"env {VADER} ./pingpong {ROUNDS} {DELAY_US}"
    ranks = _hpvc(store, "exec", name, "compute0", "--", "cat", "/root/.hpvc/jobs/1/ranks")
    ip = {n.name: n.ip for n in store.get(name).the_plan().nodes}["compute1"]
    assert ranks.stdout == f"self\n{ip}\n", ranks  # rank 1 sent to compute1's agent
    _wait_for(store, name, 1, r"round 100\b")
    [listed] = _jobs(store, name)
    assert (listed["job"], listed["state"], listed["exit_code"]) == (1, "running", None)
    # The launcher and a rank in compute0, the other rank in compute1: none on the host.
    procs = _hpvc(store, "exec", name, "compute1", "--", "ps", "-eo", "args=").stdout
    assert "pingpong" in procs, procs

    ck = tmp_path / "ck"
    with _brief_exec(store, name, "head0"):  # as a look of hpvc jobs --wait: waited out
        cut = _hpvc(store, "checkpoint", name, "--out", str(ck), "--stop")
    assert cut.returncode == 0, cut.stderr  # nothing attached: the cut takes the job
    assert leftovers(name) == []
    gone = _hpvc(store, "jobs", name)
    assert gone.returncode == 2 and "no such cluster" in gone.stderr, gone.stderr
    # Restored by another host of the test cluster (a state root of its own, as
    # the Slurm test cluster's hosts are): the checkpoint's folder is all it needs.
    other = Store(tmp_path / "n2")
    try:
        _restored_elsewhere(other, name, ck)
    finally:
        clean_up(other)


def _restored_elsewhere(store: Store, name: str, ck: Path) -> None:
    assert _hpvc(store, "restore", str(ck)).returncode == 0
    waited = _hpvc(store, "jobs", name, "1", "--wait", "--json")
    assert waited.returncode == 0, waited.stderr
    done = json.loads(waited.stdout)
    assert (done["state"], done["exit_code"]) == ("exited", 0), done
    assert f"DONE {ROUNDS} {ROUNDS * ROUNDS}\n" in done["output"], done["output"][-600:]
    rounds = re.findall(r"round (\d+)", done["output"])
    assert rounds == [str(r) for r in range(0, ROUNDS, 50)], rounds  # went on, not again

    # A failing job: its exit code is the launcher's, and --wait exits with it.
    bad = _hpvc(store, "run", name, "-d", "--", "sh", "-c", "exit 3")
    assert bad.returncode == 0 and "job 2 started in compute0" in bad.stdout, bad
    waited = _hpvc(store, "jobs", name, "2", "--wait")
    assert waited.returncode != 0, waited
    assert [(j["job"], j["state"]) for j in _jobs(store, name)] == [(1, "exited"), (2, "exited")]

    # --kill: SIGTERM to the launcher, which ends both ranks (one through compute1's
    # agent); --wait then sees it end, with the launcher's exit code.
    long = _hpvc(store, "run", name, "-d", "--", "./pingpong", "100000", "10000")
    assert "job 3 started" in long.stdout, long
    _wait_for(store, name, 3, r"round 0\b")
    killed = _hpvc(store, "jobs", name, "3", "--kill", "--wait")
    assert killed.returncode != 0 and "SIGTERM sent" in killed.stderr, killed
    assert [j["state"] for j in _jobs(store, name)] == ["exited"] * 3
    for node in ("compute0", "compute1"):
        procs = _hpvc(store, "exec", name, node, "--", "ps", "-eo", "args=").stdout
        assert "pingpong" not in procs, (node, procs)
    again = _hpvc(store, "jobs", name, "3", "--kill")
    assert again.returncode == 2 and "is exited" in again.stderr, again
    assert _hpvc(store, "down", name).returncode == 0
    assert leftovers(name) == []


def test_detached_mpich_job_and_a_cluster_without_agents(store: Store, tmp_path: Path) -> None:
    """MPICH's hydra in nodes sharing namespaces; then a cluster whose record says
    its nodes have no agent (one made before it, as a tenant's has none): refused
    in one line, exit 2, nothing started."""
    mpich_ready()
    name = "rdetachm"
    spec = Path(spec_file(tmp_path, name))
    spec.write_text('image = "mpich"\n' + spec.read_text())
    assert _hpvc(store, "up", str(spec)).returncode == 0
    shared = store.cluster_dir(name) / "shared"
    subprocess.run(["mpicc.mpich", "-O2", "-o", str(shared / "pingpong"), str(PINGPONG)],
                   check=True)  # fmt: skip
    started = _hpvc(store, "run", name, "-d", "--", "./pingpong", "200", "15000")
    assert started.returncode == 0 and "job 1 started" in started.stdout, started
    # Its output shown as it comes (about 3 s: several looks), every line once.
    waited = _hpvc(store, "jobs", name, "1", "--wait")
    assert waited.returncode == 0, waited
    assert waited.stdout.endswith("DONE 200 40000\n"), waited.stdout[-600:]
    assert re.findall(r"round (\d+)", waited.stdout) == ["0", "50", "100", "150"], waited

    rec = store.get(name)
    rec.backend_state["agent"] = False
    store.save(rec)
    refused = _hpvc(store, "run", name, "--detach", "--", "./pingpong", "3", "0")
    assert refused.returncode == 2, refused
    assert "run no hpvc-agent" in refused.stderr and len(refused.stderr.splitlines()) <= 2
    assert [j["job"] for j in _jobs(store, name)] == [1]
    assert _hpvc(store, "down", name).returncode == 0
    assert leftovers(name) == []


def test_attached_job_is_refused_by_the_cut_and_a_detached_one_taken(
    store: Store, tmp_path: Path
) -> None:
    """Nodes of their own (``locality = "none"``): ranks ``hpvc run`` started through
    ``crun exec`` have their client outside the node's tree and the host's stdio,
    on which CRIU failed after the freeze (exit 1); the cut now refuses them before
    it (exit 2, nothing written, the job goes on). The same job detached is cut
    without ``--stop`` and ends right."""
    name = "rdetachn"
    spec = Path(spec_file(tmp_path, name, 'locality = "none"\n'))
    assert _hpvc(store, "up", str(spec)).returncode == 0
    shared = store.cluster_dir(name) / "shared"
    subprocess.run(["mpicc.openmpi", "-O2", "-o", str(shared / "pingpong"), str(PINGPONG)],
                   check=True)  # fmt: skip
    attached = subprocess.Popen(
        [sys.executable, "-m", "hpvc", "run", name, "--", "/shared/pingpong", "800", "10000"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=cli_env(store),
    )  # fmt: skip
    try:
        assert attached.stdout is not None
        assert attached.stdout.readline() == "round 0\n"
        ck = tmp_path / "ck"
        refused = _hpvc(store, "checkpoint", name, "--out", str(ck))
        assert refused.returncode == 2, refused.stderr
        assert "still attached" in refused.stderr and "--detach" in refused.stderr, refused
        assert not ck.exists()
        rest, _ = attached.communicate(timeout=60)
        assert attached.returncode == 0 and "DONE 800 640000\n" in rest, rest[-400:]
    finally:
        if attached.poll() is None:
            attached.kill()
            attached.wait()

    assert _hpvc(store, "run", name, "-d", "--", "./pingpong", "300", "10000").returncode == 0
    _wait_for(store, name, 1, r"round 50\b")
    with _brief_exec(store, name, "compute1"):  # waited out here too
        cut = _hpvc(store, "checkpoint", name, "--out", str(tmp_path / "ck2"))
    assert cut.returncode == 0, cut.stderr  # not stopped: the job goes on
    # Nodes of their own: each a host to Open MPI (TCP), no rank script.
    solo = _hpvc(store, "exec", name, "compute0", "--", "ls", "/root/.hpvc/jobs/1")
    assert solo.stdout.split() == ["cmd", "cwd", "out", "pid", "started"], solo
    waited = _hpvc(store, "jobs", name, "1", "--wait")
    assert waited.returncode == 0 and "DONE 300 90000\n" in waited.stdout, waited
    assert _hpvc(store, "down", name).returncode == 0
    assert leftovers(name) == []
