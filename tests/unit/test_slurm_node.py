"""hpvc.slurm.node's policy, without Slurm: splitting a cluster over a job's
hosts, which node each task runs in, site rules, shares planned apart that fit
together."""

from __future__ import annotations

import ipaddress
import pwd
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpvc.errors import DoesNotFit, InputError
from hpvc.plan import plan_cluster
from hpvc.plan.planner import expand
from hpvc.slurm import node, policy
from hpvc.topology import read_topology

SPEC = """
name = "sl"
image = "hpc"
[network]
subnet = "10.88.5.0/24"
[tuning]
pinning = "shared"
hugepages = "none"
partition = "commodity"
[[nodes]]
role = "head"
memory = "128MiB"
[[nodes]]
role = "compute"
count = {computes}
memory = "256MiB"
"""


def spec_of(computes: int = 2) -> str:
    return SPEC.format(computes=computes)


def test_split_is_blocks_in_spec_order() -> None:
    spec, _ = policy.load(spec_of(4), "t", policy.Site())
    assert policy.split(spec, 1) == [["head0", "compute0", "compute1", "compute2", "compute3"]]
    assert policy.split(spec, 2) == [["head0", "compute0", "compute1"], ["compute2", "compute3"]]
    assert policy.split(spec, 5) == [
        [n] for n in ["head0", "compute0", "compute1", "compute2", "compute3"]
    ]


@given(computes=st.integers(0, 40), hosts=st.integers(1, 41))
def test_split_covers_every_node_once(computes: int, hosts: int) -> None:
    spec, _ = policy.load(spec_of(computes), "t", policy.Site())
    names = [w.name for w, _ in expand(spec)]
    if hosts > len(names):
        with pytest.raises(DoesNotFit, match="at most"):
            policy.split(spec, hosts)
        return
    shares = policy.split(spec, hosts)
    assert [n for s in shares for n in s] == names
    sizes = [len(s) for s in shares]
    assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1


def test_tasks_run_in_the_compute_nodes() -> None:
    roles = {"head0": "head", "compute0": "compute", "compute1": "compute"}
    assert policy.task_pool(["head0", "compute0", "compute1"], roles) == ["compute0", "compute1"]
    assert policy.task_pool(["head0"], roles) == ["head0"]


def test_site_rules_parse_and_refuse_unknown_keys(tmp_path: Path) -> None:
    site = policy.Site.parse(["images=hpc,big", "subnets=10.1.0.0/16", f"binds={tmp_path}"])
    assert site.images == ("hpc", "big") and site.subnets == ("10.1.0.0/16",)
    assert site.binds == (str(tmp_path),)
    for bad, why in [
        (["colour=blue"], "unknown"),
        (["images"], "not key=value"),
        (["kinds=container,zone"], "not a kind of node"),
        (["subnets=10.1.0.0/33"], "not a network"),
        (["binds=relative/dir"], "not an absolute directory"),
    ]:
        with pytest.raises(InputError, match=why) as e:
            policy.Site.parse(bad)
        assert e.value.exit_code == 2


def test_load_enforces_the_site() -> None:
    site = policy.Site(images=("hpc",), subnets=("10.88.0.0/16",), user_subnets=True)
    policy.load(spec_of(), "t", site)
    with pytest.raises(InputError, match="not allowed on this site"):
        policy.load(spec_of().replace('image = "hpc"', 'image = "other"'), "t", site)
    with pytest.raises(InputError, match="outside the networks"):
        policy.load(spec_of().replace("10.88.5.0/24", "192.168.5.0/24"), "t", site)
    # Without user_subnets the job gets its subnet from the pool: the spec's is not used.
    policy.load(spec_of().replace("10.88.5.0/24", "192.168.5.0/24"), "t", policy.Site())
    with pytest.raises(InputError, match="only in container nodes"):
        policy.load('kind = "vm"\n' + spec_of(), "t", site)
    # VM nodes only where the site allows them.
    vms = replace(site, kinds=("container", "vm"))
    assert policy.load('kind = "vm"\n' + spec_of(), "t", vms)[0].kind == "vm"
    assert policy.Site.parse(["kinds=container,vm"]).kinds == ("container", "vm")
    with pytest.raises(InputError, match="not valid TOML"):
        policy.load("name = ", "t", site)
    # NFS and Spark run in container nodes (docs/slurm.md, "Spark and NFS under Slurm").
    nfs = spec_of().replace('image = "hpc"', 'image = "hpc"\n[shared]\nserver = "nfs"', 1)
    assert policy.load(nfs, "t", site)[0].shared.server == "nfs"
    spark = nfs.replace("[network]", "[spark]\n[network]", 1).replace('"256MiB"', '"2GiB"')
    assert policy.load(spark, "t", site)[0].spark is not None
    # VM guests serve and mount them too, from inside the guests (vm.guest_shared).
    loaded = policy.load('kind = "vm"\n' + spark, "t", vms)[0]
    assert (loaded.kind, loaded.shared.server, loaded.spark is not None) == ("vm", "nfs", True)
    with pytest.raises(InputError, match="ends with the job"):
        policy.load(nfs.replace('server = "nfs"', 'server = "nfs"\nkeep = true'), "t", site)
    with pytest.raises(InputError, match="larger than"):
        policy.load("#" * (policy.MAX_SPEC_BYTES + 1), "t", site)


def test_spec_round_trips_through_the_job_environment(tmp_path: Path) -> None:
    p = tmp_path / "c.toml"
    p.write_text(spec_of())
    assert policy.decode_spec(policy.check(p, policy.Site())) == spec_of()
    with pytest.raises(InputError, match="base64"):
        policy.decode_spec("not base64 !")
    with pytest.raises(InputError, match="readable spec"):
        policy.check(tmp_path / "missing.toml", policy.Site())


def test_restrict_keeps_only_the_job_cpus(snapshots: dict[str, Path]) -> None:
    topo = read_topology(snapshots["64amd64-4s2n4ca2co"])
    job = set(topo.online_cpus[:6])
    mine = policy.restrict(topo, job)
    assert set(mine.online_cpus) == job
    assert {c for n in mine.numa_nodes for c in n.cpus} == job
    assert {c for p in mine.packages for core in p.cores for c in core.cpus} == job
    with pytest.raises(InputError, match="none of"):
        policy.restrict(topo, {100000})


def test_shares_planned_apart_fit_together(snapshots: dict[str, Path]) -> None:
    """Each host plans only its share, yet names and addresses are those of the
    whole cluster: no address twice, every node once."""
    topo = read_topology(snapshots["64amd64-4s2n4ca2co"])
    spec, _ = policy.load(spec_of(5), "t", policy.Site())
    whole = plan_cluster(spec, [("h", topo)])
    seen: dict[str, str] = {}
    for i, share in enumerate(policy.split(spec, 3)):
        plan = plan_cluster(spec, [(f"h{i}", topo)], only=set(share))
        assert [n.name for n in plan.nodes] == share
        for n in plan.nodes:
            seen[n.name] = n.ip
    assert seen == {n.name: n.ip for n in whole.nodes}
    with pytest.raises(InputError):
        plan_cluster(spec, [("h", topo)], only={"compute99"})


def test_hosts_file_lists_the_whole_cluster() -> None:
    spec, _ = policy.load(spec_of(2), "t", policy.Site())
    text = policy.hosts_text(spec, 7)
    net = ipaddress.ip_network("10.88.5.0/24")
    assert f"{net.network_address + 2}\thead0" in text
    assert f"{net.network_address + 4}\tcompute1" in text
    assert "job 7" in text


def test_join_lines_are_what_the_plugin_parses() -> None:
    j = node.Join(
        1, "compute0", 4242, "98765", ("ipc", "mnt"), ("/sys/fs/cgroup/x/cgroup.procs",), ("A=b",)
    )
    assert j.lines() == [
        "node 1 4242 98765 ipc,mnt compute0",
        "cgroup 1 /sys/fs/cgroup/x/cgroup.procs",
        "env 1 A=b",
    ]


def test_a_vm_join_names_the_guests_agent() -> None:
    j = node.Join(0, "compute1", 4343, "12345", (), (), ("HPVC_NODE=compute1",), "10.88.3.4")
    assert j.lines() == ["vm 0 4343 12345 10.88.3.4 compute1", "env 0 HPVC_NODE=compute1"]


def test_a_vm_join_carries_its_images_env_and_workdir() -> None:
    """The relay sends them to the guest's agent (native/spank/vm.c)."""
    env = ("PATH=/bin", "GREETING=hi", "HPVC_NODE=compute0")
    j = node.Join(0, "compute0", 4343, "12345", (), (), env, "10.88.3.4", "/k", "/opt/app")
    assert j.lines() == [
        "vm 0 4343 12345 10.88.3.4 compute0",
        "env 0 PATH=/bin",
        "env 0 GREETING=hi",
        "env 0 HPVC_NODE=compute0",
        "cwd 0 /opt/app",
        "agentkey 0 /k",
    ]


@pytest.mark.parametrize(
    ("kind", "mpi", "relay"),
    [("container", "pmix", False), ("container", "", False), ("vm", "", True)],
)
def test_the_backend_says_how_a_task_reaches_its_node(kind: str, mpi: str, relay: bool) -> None:
    """slurm/ asks the spec's backend (through cluster/) instead of testing the kind."""
    from hpvc.cluster import backends

    spec, _ = policy.load(f'kind = "{kind}"\n' + spec_of(), "t", policy.Site(kinds=(kind,)))
    entry = backends.task_entry(spec, mpi)
    assert entry.relay is relay
    # mpirun inside a guest reaches the others through their agents, not Slurm
    assert ("OMPI_MCA_plm_rsh_agent=/usr/local/sbin/hpvc-rsh" in entry.env) is relay
    assert ("OMPI_MCA_plm=rsh" in entry.env) is relay


@pytest.mark.parametrize("mpi", ["cray_shasta", "pmi"])
def test_slurm_mpi_plugins_not_carried_are_refused_for_vm_nodes_before_the_host_changes(
    tmp_path: Path, mpi: str
) -> None:
    from hpvc.store import Store

    store = Store(tmp_path)
    site = policy.Site(kinds=("container", "vm"))
    req = node.Request(job=9, index=0, hosts=1, mpi=mpi)
    with pytest.raises(InputError, match="srun --mpi=pmix") as e:
        node.up(req, 'kind = "vm"\n' + spec_of(), site, store)
    assert e.value.exit_code == 2
    assert e.value.what == f"--mpi={mpi} with VM nodes"
    assert e.value.why == "only Slurm's pmix and pmi2 reach tasks in guests"
    assert not (tmp_path / "clusters").exists() and not (tmp_path / "jobs").exists()


@pytest.mark.parametrize(
    ("mpi", "pmix"), [("pmix", True), ("pmix_v4", True), ("pmi2", False), ("", False)]
)
def test_pmix_and_pmi2_reach_vm_tasks_with_the_guests_pmix_settings(mpi: str, pmix: bool) -> None:
    """The relay carries Slurm's PMIx and PMI-2 (native/agent/chan.c): accepted,
    and under PMIx the client asks the server over its socket (no shared-memory
    store in a guest) with native security, the one the relay carries."""
    from hpvc.cluster import backends

    spec, _ = policy.load('kind = "vm"\n' + spec_of(), "t", policy.Site(kinds=("vm",)))
    entry = backends.task_entry(spec, mpi)
    assert entry.relay
    assert ("PMIX_MCA_gds=hash" in entry.env) is pmix
    assert ("PMIX_MCA_psec=native" in entry.env) is pmix
    assert "OMPI_MCA_btl_tcp_if_include=eth0" in entry.env


def test_cache_path_only_for_plain_mpi_names(tmp_path: Path) -> None:
    from hpvc.store import Store

    store = Store(tmp_path)
    assert node.cache_path(store, "j5-0", "") == tmp_path / "jobs" / "j5-0.none.join"
    assert node.cache_path(store, "j5-0", "pmix_v4") == tmp_path / "jobs" / "j5-0.pmix_v4.join"
    assert node.cache_path(store, "j5-0", "../../etc") is None


def test_node_up_passes_the_job_node_list_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`hpvc node up --nodelist` (what the plugin passes: SLURM_JOB_NODELIST)
    reaches hpvc.slurm.node.up as Request.nodelist; without it, ""."""
    from typer.testing import CliRunner

    from hpvc.cli import app

    seen: list[node.Request] = []
    monkeypatch.setattr(node, "up", lambda req, *a, **k: seen.append(req) or [])
    monkeypatch.setattr("os.geteuid", lambda: 0)
    spec = tmp_path / "s.toml"
    spec.write_text(spec_of(2))
    base = ["node", "up", "--job", "7", "--index", "1", "--hosts", "2", "--spec", str(spec)]
    r = CliRunner().invoke(app, [*base, "--nodelist", "n[1-2]"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(app, base)
    assert r.exit_code == 0, r.output
    assert [(q.job, q.index, q.hosts, q.nodelist) for q in seen] == [
        (7, 1, 2, "n[1-2]"),
        (7, 1, 2, ""),
    ]


def test_default_site_allows_only_its_listed_images() -> None:
    """No images= in plugstack.conf is not "any image": only hpvc's own."""
    assert policy.Site().images == policy.DEFAULT_IMAGES == ("hpc",)
    with pytest.raises(InputError, match="not allowed on this site"):
        policy.load(spec_of().replace('image = "hpc"', 'image = "anything"'), "t", policy.Site())


def test_io_weight_needs_the_site_to_allow_bfq() -> None:
    weighted = spec_of() + "[nodes.io]\nweight = 500\n"
    with pytest.raises(InputError, match="bfq") as e:
        policy.load(weighted, "t", policy.Site())
    assert e.value.exit_code == 2
    policy.load(weighted, "t", policy.Site.parse(["io_weight=yes"]))
    limited = spec_of() + '[nodes.io]\nwrite_bps = "50MB"\n'
    policy.load(limited, "t", policy.Site())  # throttles touch no scheduler
    with pytest.raises(InputError, match="not yes or no"):
        policy.Site.parse(["io_weight=maybe"])


def test_each_job_gets_its_own_subnet_from_the_pool() -> None:
    """A spec asking for the whole pool (10.88.0.0/16) cannot block other jobs:
    each job's subnet is cut from the pool by job id, the same on every host."""
    greedy = spec_of().replace("10.88.5.0/24", "10.88.0.0/16")
    spec, doc = policy.load(greedy, "t", policy.Site())
    site = policy.Site()
    a, _ = policy.for_job(spec, doc, site, 41, 2)
    b, bdoc = policy.for_job(spec, doc, site, 42, 2)
    assert a.network.subnet == "10.88.41.0/24" and b.network.subnet == "10.88.42.0/24"
    assert bdoc["network"]["subnet"] == "10.88.42.0/24"
    assert not a.network.network.overlaps(b.network.network)
    assert policy.for_job(spec, doc, site, 42, 2)[0] == b  # every host computes the same
    assert policy.for_job(spec, doc, site, 42 + 256, 2)[0].network.subnet == "10.88.42.0/24"
    # Where the site lets users choose, the spec's own subnet (inside the pool) stays.
    mine = policy.Site(user_subnets=True)
    own, _ = policy.for_job(*policy.load(spec_of(), "t", mine), mine, 42, 2)
    assert own.network.subnet == "10.88.5.0/24"


@given(job=st.integers(1, 10**9), computes=st.integers(0, 300), hosts=st.integers(1, 4))
def test_job_subnets_stay_in_the_pool_and_fit_the_cluster(
    job: int, computes: int, hosts: int
) -> None:
    site = policy.Site(subnets=("10.64.0.0/12", "172.20.0.0/16"))
    big = spec_of(computes).replace("10.88.5.0/24", "10.88.0.0/16")
    spec, _ = policy.load(big, "t", site)
    net = policy.job_subnet(spec, site, job, hosts)
    assert any(net.subnet_of(ipaddress.IPv4Network(p)) for p in site.subnets)
    assert net.num_addresses >= computes + 1 + 2 + hosts + 1


def test_pool_too_small_for_a_cluster_is_refused() -> None:
    site = policy.Site(subnets=("10.88.0.0/25",))
    with pytest.raises(InputError, match="larger than any network of this site's pool"):
        policy.load(spec_of(), "t", site)


def test_memory_beyond_the_allocation_is_refused(tmp_path: Path) -> None:
    spec, _ = policy.load(spec_of(2), "t", policy.Site())
    # 2 hosts: head0 + compute0 (384 MiB), compute1 (256 MiB)
    assert policy.share_memory(spec, 2) == [384, 256]
    policy.check_memory(spec, 2, 384)
    policy.check_memory(spec, 2, 0)  # Slurm allocates no memory here: nothing to hold to
    with pytest.raises(InputError, match="need 384 MiB") as e:
        policy.check_memory(spec, 2, 100)
    assert "--mem=384M" in e.value.line() and "100 MiB" in e.value.line()
    p = tmp_path / "c.toml"
    p.write_text(spec_of(2))
    with pytest.raises(InputError, match="need 640 MiB"):
        policy.check(p, policy.Site(), hosts=1, mem_mib=600)
    assert policy.decode_spec(policy.check(p, policy.Site(), hosts=1, mem_mib=640)) == spec_of(2)
    with pytest.raises(DoesNotFit):
        policy.check(p, policy.Site(), hosts=4, mem_mib=640)


def test_site_says_how_slurm_counts_cores() -> None:
    assert policy.Site().threads_as_cores is False
    assert policy.Site.parse(["threads_as_cores=yes"]).threads_as_cores is True
    assert policy.Site.parse(["threads_as_cores=no"]).threads_as_cores is False


def test_check_prints_the_memory_each_host_count_needs(tmp_path: Path) -> None:
    """`hpvc node check`: the encoded spec, then the biggest host share's MiB
    for 1, 2, 3 hosts (head 128 + 2 x 256: 640; 384; 256), which the plugin
    compares with the job's memory without starting hpvc again."""
    from typer.testing import CliRunner

    from hpvc.cli import app

    p = tmp_path / "c.toml"
    p.write_text(spec_of(2))
    r = CliRunner().invoke(app, ["node", "check", str(p)])
    assert r.exit_code == 0, r.output
    encoded, mem = r.output.splitlines()
    assert policy.decode_spec(encoded) == spec_of(2)
    assert mem == "mem 640 384 256"


def test_the_jobs_user_is_kept_by_uid_with_this_hosts_name_for_it() -> None:
    """What `hpvc node up --uid --gid` keeps in the share's record (Spark's
    daemons run as it, the coordinator charges the share to its name)."""
    assert policy.job_user(-1, -1) is None  # an older plugin: not known
    assert policy.job_user(0, 0) == {"uid": 0, "gid": 0, "name": "root"}
    free = next(u for u in range(60000, 65000) if u not in {p.pw_uid for p in pwd.getpwall()})
    assert policy.job_user(free, -1) == {"uid": free, "gid": free, "name": f"uid{free}"}
