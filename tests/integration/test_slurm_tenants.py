"""Two tenants on one Slurm host (issue 13): each job held to what Slurm gave
it, and neither able to reach the other's nodes.

Jobs are submitted by the two unprivileged tenants of the session
(tests/tenants.py) to a private Slurm test cluster with hpvc's plugin
(conftest.py's ``slurm``); only the checks of what a host holds run as root,
and the cross-tenant checks run as the other tenant.
"""

from __future__ import annotations

import ipaddress
import subprocess
import time
from pathlib import Path

from hpvc.bench.slurm.cluster import Submitter
from hpvc.host import cgroups
from hpvc.host.cgroupfs import manager
from hpvc.slurm import node
from hpvc.sysroot import HOST
from tests.integration.slurm_env import HOSTS, Env, last_job, spec_text

HUGE = (
    'name = "big"\nkind = "container"\nimage = "hpc"\n'
    '[tuning]\npinning = "shared"\nhugepages = "2M"\npartition = "commodity"\n'
    '[[nodes]]\nrole = "compute"\nmemory = "6GiB"\nhugepage_memory = "4GiB"\n'
)


def hugepages_total() -> int:
    return int(Path("/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages").read_text())


def sleeping(slurm: Env, user: Submitter, spec: Path, host: str) -> int:
    """A one-host job of ``user`` on ``host`` whose step sleeps, once its share is up."""
    r = slurm.run_as(
        user, "sbatch", "--parsable", "-N1", "-n1", "-w", host, f"--hpvc={spec}",
        "-o", "/dev/null", "--wrap", "srun sleep 300",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    job = int(r.stdout.strip().split(";")[0])
    deadline = time.monotonic() + 60
    while not slurm.running(job) and time.monotonic() < deadline:
        time.sleep(0.3)
    assert slurm.running(job), f"job {job} of {user.name} did not come up: {slurm.shares(job)}"
    return job


def as_user(user: Submitter, script: str) -> subprocess.CompletedProcess[str]:
    """``sh -c script`` as ``user`` on this machine (another user on the host)."""
    return subprocess.run(
        ["sh", "-c", script], user=user.uid, group=user.gid, extra_groups=[],
        env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip


def test_memory_beyond_the_allocation_is_refused_before_the_host_changes(slurm: Env) -> None:
    """A 6 GiB node backed by 2M hugepages in a job given 100 MiB: refused with
    the numbers, no hugepage taken, nothing made on any host."""
    spec = slurm.work / "huge.toml"
    spec.write_text(HUGE)
    pages = hugepages_total()
    r = slurm.run("srun", "-N1", "--mem=100M", f"--hpvc={spec}", "hostname")
    assert r.returncode != 0
    assert "need 6144 MiB" in r.stderr and "100 MiB" in r.stderr, r.stderr
    assert "--mem=6144M" in r.stderr, r.stderr
    assert r.stdout.strip() == ""
    assert hugepages_total() == pages
    job = last_job(slurm)
    assert not any(slurm.shares(job).values()), slurm.shares(job)


def test_memory_within_the_allocation_runs(slurm: Env, spec: Path) -> None:
    """head0 + compute0 + compute1 (640 MiB) on one host in a job given 650 MiB."""
    r = slurm.run("srun", "-N1", "-n1", "--mem=650M", f"--hpvc={spec}", "hostname")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["compute0"]
    slurm.wait_clean(last_job(slurm))


def test_tasks_leave_slurms_tracking_hierarchies_alone(slurm: Env, spec: Path) -> None:
    """A task moves into its node's cpuset, memory, cpu ... cgroups, and stays
    in the freezer and name=systemd cgroups Slurm (proctrack) put it in."""
    r = slurm.run("srun", "-N1", "-n1", f"--hpvc={spec}", "cat", "/proc/self/cgroup")
    assert r.returncode == 0, r.stderr
    job = last_job(slurm)
    lines = {ln.split(":")[1]: ln.split(":", 2)[2] for ln in r.stdout.splitlines()}
    mine = f"/hpvc/j{job}-0/compute0"
    for controllers, path in lines.items():
        keys = set(controllers.split(","))
        if keys & {"cpuset", "memory", "cpu", "blkio", "pids", "hugetlb"}:
            assert path.endswith(mine), (controllers, path)
        if keys & {"freezer", "name=systemd", "devices"}:
            assert "/hpvc/" not in path, (controllers, path)
    assert any("freezer" in c for c in lines) and any("memory" in c for c in lines), lines
    slurm.wait_clean(job)


def test_a_shares_nodes_hold_no_more_memory_together_than_their_spec(
    slurm: Env, spec: Path
) -> None:
    """Issue 25 item 4: the share's parent cgroup caps its nodes' normal memory
    at the sum of theirs (128 + 2 x 256 MiB) and their hugepages at what the
    spec gives them (none here: every page size at 0), whatever a node's own
    limits say."""
    job = sleeping(slurm, slurm.user, spec, "n1")
    try:
        m = manager(HOST)
        rel = cgroups.cluster_path(f"j{job}-0")
        mem, huge = m.dir("memory", rel), m.dir("hugetlb", rel)
        assert mem is not None and huge is not None
        assert int((mem / m.MEMORY_MAX).read_text()) == (128 + 2 * 256) << 20
        caps = {f.name: int(f.read_text()) for f in huge.glob(f"hugetlb.*.{m.HUGETLB_MAX}")}
        assert caps and set(caps.values()) == {0}, caps
    finally:
        assert slurm.run("scancel", str(job)).returncode == 0
    slurm.wait_clean(job)


def test_a_job_asking_for_the_whole_pool_blocks_no_one(slurm: Env) -> None:
    """Tenant 1 asks for 10.88.0.0/16 (all of the site's pool); tenant 2's job
    still comes up on the same host beside it: each job's subnet is cut from
    the pool for it, and the two do not overlap."""
    greedy = slurm.work / "greedy.toml"
    greedy.write_text(spec_text("10.88.0.0/16", computes=0))
    theirs = slurm.home(slurm.other) / "mine.toml"
    theirs.write_text(spec_text("10.88.0.0/16", computes=0))
    first = sleeping(slurm, slurm.user, greedy, "n1")
    try:
        second = sleeping(slurm, slurm.other, theirs, "n1")
        try:
            store = slurm.cluster.store("n1")
            nets = [
                ipaddress.ip_network(store.get(f"j{j}-0").the_plan().network.subnet)
                for j in (first, second)
            ]
            assert not nets[0].overlaps(nets[1]), nets
            assert all(n.subnet_of(ipaddress.ip_network("10.88.0.0/16")) for n in nets), nets
            assert all(n.prefixlen == 24 for n in nets), nets
        finally:
            assert slurm.run_as(slurm.other, "scancel", str(second)).returncode == 0
        slurm.wait_clean(second)
    finally:
        assert slurm.run("scancel", str(first)).returncode == 0
    slurm.wait_clean(first)


def test_another_tenant_cannot_reach_a_jobs_nodes(slurm: Env, spec: Path) -> None:
    """While tenant 1's job runs on n1, tenant 2 (a user on the same host) can
    neither list nor enter its state, its nodes' roots or their /tmp and
    /dev/shm; nor see it with `hpvc node ls`; nor cancel it."""
    job = sleeping(slurm, slurm.user, spec, "n1")
    try:
        store = slurm.cluster.store("n1")
        share = store.root / "clusters" / f"j{job}-0"
        assert share.is_dir()
        targets = [store.root / "clusters", share, *sorted(share.rglob("*"))[:200]]
        reached = []
        for t in targets:
            probe = as_user(slurm.other, f'ls -a "{t}" >/dev/null 2>&1 || cat "{t}" >/dev/null')
            if probe.returncode == 0:
                reached.append(str(t))
        assert reached == [], f"tenant 2 reads {reached[:5]}"
        planted = as_user(slurm.other, f'touch "{share}/planted"')
        assert planted.returncode != 0 and not (share / "planted").exists()
        hpvc = slurm.env["HPVC_BIN"]
        ls = as_user(slurm.other, f'HPVC_STATE_DIR="{store.root}" "{hpvc}" node ls --json')
        assert ls.returncode == 2 and "permission denied" in ls.stderr, (ls.stdout, ls.stderr)
        assert f"j{job}" not in ls.stdout
        cancel = slurm.run_as(slurm.other, "scancel", str(job))
        assert slurm.running(job), (cancel.returncode, cancel.stderr)
    finally:
        assert slurm.run("scancel", str(job)).returncode == 0
    slurm.wait_clean(job)


def test_site_rules_refuse_before_a_job_exists(slurm: Env) -> None:
    """Without images= in plugstack.conf only hpvc's own image is allowed; an
    io.weight (bfq for the whole host disk) needs io_weight=yes from the site."""
    before = last_job(slurm)
    other = slurm.work / "other.toml"
    other.write_text(spec_text("10.88.7.0/24").replace('image = "hpc"', 'image = "debian"'))
    r = slurm.run("srun", "-N1", f"--hpvc={other}", "hostname")
    assert r.returncode != 0 and "not allowed on this site" in r.stderr, r.stderr
    weighted = slurm.work / "weighted.toml"
    weighted.write_text(spec_text("10.88.7.0/24") + "[nodes.io]\nweight = 800\n")
    r = slurm.run("srun", "-N1", f"--hpvc={weighted}", "hostname")
    assert r.returncode != 0 and "bfq" in r.stderr, r.stderr
    assert last_job(slurm) == before
    assert not any(node.job_shares(slurm.cluster.store(h), before + 1) for h in HOSTS)
