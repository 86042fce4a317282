"""The Slurm integration tests' view of a private Slurm test cluster with
hpvc's SPANK plugin, and the tenants who submit to it (tests/tenants.py).

Used by tests/integration/conftest.py's ``slurm`` fixture and the tests of
test_slurm_spank.py and test_slurm_hardening.py.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from hpvc.bench.slurm import cluster as bench_slurm
from hpvc.plan.network import filter_table, vxlan_link_name
from hpvc.plan.overlay import vni_for
from hpvc.slurm import node, policy
from tests.integration.test_cluster import hpvc_cgroups

HOSTS = bench_slurm.HOSTS
NFT_TABLES = "nft list tables | awk '{print $3}'"


class Env:
    """A private Slurm test cluster and the two tenants who submit to it.

    ``run`` submits as the first tenant from their own directory (``work``,
    shared with the nodes through the site's ``binds=``); ``run_as`` as either.
    Only the checks of what happened on a host run as root."""

    def __init__(
        self,
        tmp: Path,
        cluster: bench_slurm.SlurmCluster,
        shared: Path,
        users: tuple[bench_slurm.Submitter, bench_slurm.Submitter],
    ) -> None:
        self.tmp, self.cluster, self.shared, self.users = tmp, cluster, shared, users
        self.user, self.other = users
        self.env = cluster.env
        for u in users:
            d = self.home(u)
            d.mkdir(exist_ok=True)
            os.chown(d, u.uid, u.gid)
        self.work = self.home(self.user)

    def home(self, user: bench_slurm.Submitter) -> Path:
        """The user's directory on the shared file system."""
        return self.shared / user.name

    def run(
        self, *argv: str, timeout: float = 90, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """``argv`` submitted by the first tenant, from their directory."""
        return self.run_as(self.user, *argv, timeout=timeout, env=env)

    def run_as(
        self,
        user: bench_slurm.Submitter,
        *argv: str,
        timeout: float = 90,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        return self.cluster.submit(user, list(argv), self.home(user), timeout, env)

    def site(self, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """``argv`` as the site's root on this machine, with the test cluster's
        Slurm (``scontrol update``, ``hpvc node checkpoint``)."""
        return subprocess.run(list(argv), env=self.env, capture_output=True, text=True,
                              timeout=timeout, check=False)  # fmt: skip

    def on(self, host: str, script: str) -> str:
        """``sh -c script`` on ``host``: in its namespaces, with its HPVC_STATE_DIR."""
        return self.cluster.run_on(host, ["sh", "-c", script])

    def shares(self, job: int) -> dict[str, list[str]]:
        """The job's shares recorded on each host (its own state directory)."""
        return {h: node.job_shares(self.cluster.store(h), job) for h in self.cluster.hosts}

    def running(self, job: int) -> list[str]:
        """The job's shares that are up: their join records (written last by
        `hpvc node up`) in their hosts' state directories."""
        return [
            f"{h}: {p.name}"
            for h in self.cluster.hosts
            for p in (self.cluster.store(h).root / "jobs").glob(f"j{job}-*.join")
        ]

    def sleeping_job(self, spec: Path) -> int:
        """A two-host job whose step sleeps; returns once both shares are up."""
        r = self.run(
            "sbatch", "--parsable", "-N2", f"--hpvc={spec}", "-o", "/dev/null", "--wrap",
            "srun sleep 300",
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        job = int(r.stdout.strip().split(";")[0])
        deadline = time.monotonic() + 60
        while len(self.running(job)) < 2 and time.monotonic() < deadline:
            time.sleep(0.3)
        assert len(self.running(job)) == 2, f"job {job} shares: {self.shares(job)}"
        return job

    def host_leftovers(self, host: str, job: int) -> list[str]:
        """What the job's shares could have left on ``host``, looked at from
        inside it: records, lock and join cache in its state directory; its
        containers (crun in its /run), network namespaces, the job's bridge
        and the overlay mounts in its mount namespace."""
        store = self.cluster.store(host)
        found = [f"{host}: record {n}" for n in node.job_shares(store, job)]
        if (store.root / "jobs" / f"{job}.lock").exists():
            found.append(f"{host}: lock of job {job}")
        found += [f"{host}: {p}" for p in (store.root / "jobs").glob(f"j{job}-*.join")]
        sep = "; echo --; "
        view = self.on(
            host,
            sep.join(
                ["crun list -q", "ls /run/netns", "ip -o link", "cat /proc/mounts", NFT_TABLES]
            ),
        )
        containers, netns, links, mounts, tables = view.split("--\n")
        share = f"hpvc-j{job}-"
        found += [f"{host}: container {c}" for c in containers.split() if c.startswith(share)]
        found += [f"{host}: netns {n}" for n in netns.split() if n.startswith(share)]
        if f" hpvc-j{job}:" in links or f" hpvc-j{job}@" in links:
            found.append(f"{host}: bridge hpvc-j{job}")
        found += [
            f"{host}: mount {line.split()[1]}"
            for line in mounts.splitlines()
            if f"/clusters/j{job}-" in line
        ]
        vx = [vxlan_link_name(policy.share_name(job, i)) for i in range(len(self.cluster.hosts))]
        found += [f"{host}: VXLAN {v}" for v in vx if f" {v}:" in links or f" {v}@" in links]
        table = filter_table(vni_for(f"slurm-job-{job}"))
        if table in tables.split():
            found.append(f"{host}: nftables table {table}")
        return found

    def job_leftovers(self, job: int) -> list[str]:
        """What the job could have left on any host, or on this machine as a
        whole (cgroups; a bridge in the root namespace)."""
        found = [x for h in self.cluster.hosts for x in self.host_leftovers(h, job)]
        found += hpvc_cgroups(f"j{job}-*")
        links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True)
        if f" hpvc-j{job}:" in links.stdout:
            found.append(f"root namespace: bridge hpvc-j{job}")
        return found

    def wait_clean(self, job: int, timeout: float = 30) -> None:
        """The epilog runs after the job ends: wait for it to have cleaned up."""
        deadline = time.monotonic() + timeout
        left = self.job_leftovers(job)
        while left and time.monotonic() < deadline:
            time.sleep(0.3)
            left = self.job_leftovers(job)
        assert left == [], f"job {job} left behind: {left}"


def spec_text(subnet: str, computes: int = 2) -> str:
    return (
        f'name = "sl"\nkind = "container"\nimage = "hpc"\n'
        f'[network]\nsubnet = "{subnet}"\n'
        '[tuning]\npinning = "shared"\nhugepages = "none"\npartition = "commodity"\n'
        '[[nodes]]\nrole = "head"\nmemory = "128MiB"\n'
        f'[[nodes]]\nrole = "compute"\ncount = {computes}\nmemory = "256MiB"\n'
    )


def job_id(stderr_or_out: str) -> int:
    for word in stderr_or_out.replace(":", " ").split():
        if word.isdigit():
            return int(word)
    raise AssertionError(f"no job id in {stderr_or_out!r}")


def last_job(slurm: Env) -> int:
    r = slurm.run("squeue", "-h", "-t", "all", "-o", "%i")
    ids = [int(x) for x in r.stdout.split() if x.isdigit()]
    assert ids, f"no job known to slurmctld: {r.stdout} {r.stderr}"
    return max(ids)
