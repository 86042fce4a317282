"""The SPANK plugin (native/spank) on the local Slurm test cluster, for real.

One private Slurm cluster (scripts/slurm/up.sh in a temporary directory, its
own fabric; three hosts apart in their own network, UTS and mount namespaces,
each with its own hpvc state directory through the plugin's
``state_dir=.../%h``) with the plugin in plugstack.conf. Jobs run with
``--hpvc=SPEC``: tasks must run inside the virtual nodes (their hostnames,
addresses and cgroups), nodes of different hosts reach each other (the plugin
passes the job's node list), MPI across two Slurm hosts, sbatch and salloc
allocations, and every way a job can end (done, failed, cancelled) must leave
no container, namespace, cgroup or bridge behind on any host. Refusals (a spec
the site does not allow, an unknown plugstack key or % sequence) must stop
srun before a job exists.
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from hpvc.bench.slurm.cluster import Submitter
from hpvc.plan.addresses import node_ip, node_mac
from hpvc.plan.network import filter_table, vxlan_link_name
from hpvc.plan.overlay import vni_for
from hpvc.slurm import policy
from tests.helpers import build_pingpong, requires
from tests.integration.slurm_env import HOSTS, Env, last_job, spec_text
from tests.integration.test_cluster import image_ready
from tests.integration.test_slurm_cluster import requires_slurm, wait_state


def test_srun_tasks_run_in_the_virtual_nodes(slurm: Env, spec: Path) -> None:
    r = slurm.run(
        "srun", "-N2", "-n2", f"--hpvc={spec}", "sh", "-c",
        'echo "$(hostname) $HPVC_NODE $(ip -o -4 addr show eth0 | cut -d" " -f7)'
        ' $(grep cpuset /proc/self/cgroup)"',
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    rows = sorted(line.split() for line in r.stdout.splitlines())
    assert [row[0] for row in rows] == ["compute0", "compute1"], r.stdout
    assert [row[1] for row in rows] == ["compute0", "compute1"]
    # compute0 is the 2nd node of the spec, compute1 the 3rd: .3 and .4 of the subnet
    assert rows[0][2].endswith(".3/24") and rows[1][2].endswith(".4/24"), r.stdout
    job = last_job(slurm)
    assert rows[0][3].endswith(f"/hpvc/j{job}-0/compute0"), rows[0]
    assert rows[1][3].endswith(f"/hpvc/j{job}-1/compute1"), rows[1]
    slurm.wait_clean(job)


def test_nodes_on_different_hosts_reach_each_other(slurm: Env, spec: Path) -> None:
    """The plugin passes the job's node list (--nodelist): each host's share
    joins the job's cluster network over the fabric, so compute0 (first host)
    and compute1 (second host) reach each other by name. (A task starts once
    its own host's share is up; the other host's may take a moment longer:
    ping for up to 30 s.)"""
    r = slurm.run(
        "srun", "-N2", "-n2", f"--hpvc={spec}", "sh", "-c",
        "other=compute$((1 - SLURM_PROCID));"
        " ping -c1 -w30 $other >/dev/null && echo $(hostname) $other",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.splitlines()) == ["compute0 compute1", "compute1 compute0"], r.stdout
    slurm.wait_clean(last_job(slurm))


def dropped(slurm: Env, host: str, vni: int) -> int:
    """Packets the job's VNI filter on ``host`` has dropped so far (all its rules)."""
    out = json.loads(slurm.on(host, f"nft -j list table inet {filter_table(vni)}"))
    counters = [
        e["counter"]["packets"]
        for item in out["nftables"]
        for e in item.get("rule", {}).get("expr", [])
        if "counter" in e
    ]
    assert len(counters) == 3, out  # input, output, forward
    return sum(int(c) for c in counters)


VXLAN_SEND = (
    "import socket, sys\n"
    "vni = int(sys.argv[2])\n"
    "hdr = bytes([8, 0, 0, 0]) + (vni << 8).to_bytes(4, 'big')\n"
    "frame = b'\\xff' * 6 + b'\\x02' + b'\\x00' * 5 + b'\\x08\\x06' + b'\\x00' * 28\n"
    "socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(hdr + frame, (sys.argv[1], 4789))\n"
)
ECHO_ONCE = (
    "import socket\n"
    "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "s.bind(('0.0.0.0', 7777)); s.listen(1); s.settimeout(60)\n"
    "c, _ = s.accept(); c.sendall(c.recv(100)); c.close()\n"
)


def test_the_job_network_is_one_vxlan_only_its_hosts_send_into(slurm: Env, spec: Path) -> None:
    """The shares' bridges are joined by VXLAN (the job's VNI, learning off, static
    forwarding entries for the other host's nodes); head0 on the first host reaches
    compute1 on the second by name, ping and TCP, over the cluster subnet and through
    the VXLAN link; a VXLAN packet into the VNI from the fabric address of a machine
    that is not one of the job's hosts is dropped; scancel leaves nothing."""
    job = slurm.sleeping_job(spec)
    where = {names[0]: h for h, names in slurm.shares(job).items() if names}
    first, second = where[f"j{job}-0"], where[f"j{job}-1"]
    fabric = {h: slurm.on(first, f"getent ahostsv4 {h}").split()[0] for h in (first, second)}
    vni = vni_for(f"slurm-job-{job}")
    # The job's subnet, cut for it from the site's pool (not the spec's).
    net = ipaddress.ip_network(
        slurm.cluster.store(first).get(f"j{job}-0").the_plan().network.subnet
    )
    assert net == policy.job_subnet(policy.load(spec.read_text(), "t", policy.Site())[0],
                                    policy.Site(), job, 2)  # fmt: skip
    vx = vxlan_link_name(f"j{job}-0")
    try:
        info = json.loads(slurm.on(first, f"ip -d -j link show {vx}"))[0]["linkinfo"]
        assert info["info_data"]["id"] == vni and info["info_data"]["learning"] is False
        fdb = json.loads(slurm.on(first, f"bridge -j fdb show dev {vx}"))
        entries = {(e["mac"], e.get("dst")) for e in fdb if e.get("dst")}
        # compute1 (third node of the spec) runs on the second host, with its share's MAC.
        assert (node_mac(f"j{job}-1", net, 2), fabric[second]) in entries, entries
        assert ("00:00:00:00:00:00", fabric[second]) in entries, entries
        before_tx = json.loads(slurm.on(first, f"ip -s -j link show {vx}"))[0]["stats64"]
        head0 = f"hpvc-j{job}-0-head0"
        ping = slurm.on(first, f"crun exec {head0} ping -c 2 -W 5 compute1")
        assert f"from compute1 ({node_ip(net, 2)})" in ping and " 2 received" in ping, ping
        server = subprocess.Popen(
            slurm.cluster.on(
                second,
                ["nsenter", f"--net=/run/netns/hpvc-j{job}-1-compute1", "python3", "-c", ECHO_ONCE],
            ),
            env=slurm.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            said = ""
            talk = "exec 3<>/dev/tcp/compute1/7777 && echo over-vxlan >&3 && head -1 <&3"
            client = slurm.cluster.on(first, ["crun", "exec", head0, "bash", "-c", talk])
            for _ in range(50):  # until the server listens
                said = subprocess.run(
                    client, env=slurm.env, capture_output=True, text=True, timeout=30, check=False
                ).stdout.strip()
                if said:
                    break
                time.sleep(0.2)
            assert said == "over-vxlan"
        finally:
            server.kill()
            server.wait()
        after_tx = json.loads(slurm.on(first, f"ip -s -j link show {vx}"))[0]["stats64"]
        assert after_tx["tx"]["packets"] >= before_tx["tx"]["packets"] + 4  # 2 pings, TCP
        # This machine's root namespace is on the fabric but is no host of the job.
        before = dropped(slurm, first, vni)
        sent = subprocess.run(
            [sys.executable, "-c", VXLAN_SEND, fabric[first], str(vni)], check=False
        )
        assert sent.returncode == 0
        assert dropped(slurm, first, vni) == before + 1
        # hpvc status on the host reads the same back from the kernel.
        hpvc = slurm.env["HPVC_BIN"]
        st = json.loads(slurm.cluster.run_on(first, [hpvc, "status", f"j{job}-0", "--json"]))
        across = st["across_hosts"]
        assert across["vni"] == vni and across["hosts"] == [fabric[second]], across
        kernel = across["kernel"]
        assert kernel["learning"] is False and kernel["peers"] == [fabric[second]], kernel
        assert kernel["forwarding"] >= 2 and kernel["dropped_from_outside"] == before + 1, kernel
    finally:
        cancel = slurm.run("scancel", str(job))
        assert cancel.returncode == 0, cancel.stderr
    slurm.wait_clean(job)


def test_mpi_across_two_hosts_inside_nodes(slurm: Env, spec: Path) -> None:
    """An MPI ping-pong between compute0 (first host) and compute1 (second host)
    under PMIx: the ranks run in the nodes, in their network (the PMIx server
    reached through the plugin's forwarder), and their data goes over the
    cluster network (the nodes' addresses, joined by VXLAN), not the fabric
    directly: the VXLAN link carries at least what the ping-pong sent."""
    out = slurm.work / "bin"
    out.mkdir(exist_ok=True)
    build_pingpong(out)
    size, reps = 65536, 20
    r = slurm.run(
        "sbatch", "--parsable", "-N2", f"--hpvc={spec}", "-o", str(slurm.work / "pp.out"),
        "--wrap",
        f"srun -N2 -n2 --mpi=pmix {out / 'pingpong'} {size} {reps}"
        f" && echo done > {slurm.work / 'pp.done'}; sleep 300",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    job = int(r.stdout.strip().split(";")[0])
    try:
        deadline = time.monotonic() + 90
        while not (slurm.work / "pp.done").exists() and time.monotonic() < deadline:
            time.sleep(0.3)
        text = (slurm.work / "pp.out").read_text()
        assert (slurm.work / "pp.done").exists(), text
        rows = [json.loads(x) for x in text.splitlines() if x.startswith("{")]
        assert rows and rows[-1]["bytes"] == size, text
        assert {x["rank0"] for x in rows} == {"compute0"}  # rank 0 ran inside node compute0
        assert all(x["latency_us"] > 0 for x in rows)
        first = {names[0]: h for h, names in slurm.shares(job).items() if names}[f"j{job}-0"]
        vx = vxlan_link_name(f"j{job}-0")
        stats = json.loads(slurm.on(first, f"ip -s -j link show {vx}"))[0]["stats64"]
        sent = sum(x["bytes"] * x["iterations"] for x in rows)  # rank 0 sends each once
        assert stats["tx"]["bytes"] >= sent, (stats, sent)
        assert stats["rx"]["bytes"] >= sent, (stats, sent)
    finally:
        (slurm.work / "pp.done").unlink(missing_ok=True)
        cancel = slurm.run("scancel", str(job))
        assert cancel.returncode == 0, cancel.stderr
    slurm.wait_clean(job)


def test_sbatch_steps_run_in_nodes_and_script_on_host(slurm: Env, spec: Path) -> None:
    script = slurm.work / "job.sh"
    script.write_text(
        "#!/bin/sh\necho batch $HPVC_NODE.\nsrun hostname\nsrun -N1 -n1 grep compute1 /etc/hosts\n"
    )
    r = slurm.run("sbatch", "--parsable", "-N2", f"--hpvc={spec}", "-o", "out-%j.txt", str(script))
    assert r.returncode == 0, r.stderr
    job = int(r.stdout.strip().split(";")[0])
    wait_state(slurm.env, str(job), {"COMPLETED", "FAILED"}, timeout=60)
    text = (slurm.work / f"out-{job}.txt").read_text()
    lines = text.splitlines()
    assert lines[0] == "batch .", text  # the script itself runs on the host
    assert sorted(lines[1:3]) == ["compute0", "compute1"], text
    assert lines[3].split() == [lines[3].split()[0], "compute1"], text
    slurm.wait_clean(job)


def test_salloc_gives_a_virtual_cluster(slurm: Env, spec: Path) -> None:
    """The first step brings the nodes up; the second joins them from the
    plugin's cache of the running shares (no hpvc process), same nodes."""
    step1, go = slurm.work / "step1", slurm.work / "go"
    script = (
        f"srun -N2 -n2 hostname; touch {step1}; while [ ! -e {go} ]; do sleep 0.1; done; "
        "srun -N2 -n4 sh -c 'test -e /proc/self/status && echo $(hostname) in-pid-ns'"
    )
    argv = ["salloc", "-N2", "-n4", f"--hpvc={spec}", "sh", "-c", script]
    user = slurm.cluster.user_env(slurm.user)
    proc = subprocess.Popen(
        argv, env=user, cwd=slurm.work, user=slurm.user.uid, group=slurm.user.gid,
        extra_groups=[], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not step1.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert step1.exists(), "the first step did not finish"
        job = last_job(slurm)
        # The join records of the running shares, in their hosts' state (root's).
        cached = sorted(
            p.name
            for h in HOSTS
            for p in (slurm.cluster.store(h).root / "jobs").glob(f"j{job}-*.join")
        )
        assert cached == [f"j{job}-0.none.join", f"j{job}-1.none.join"], cached
        go.touch()
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    lines = out.split("\n")
    assert sorted(lines[:2]) == ["compute0", "compute1"], out
    second = sorted(x for x in lines if x.startswith("compute") and " " in x)
    # 4 tasks on 2 hosts, each in its host's compute node, inside its PID namespace
    assert second == ["compute0 in-pid-ns"] * 2 + ["compute1 in-pid-ns"] * 2, out
    slurm.wait_clean(job)


def test_scancel_mid_job_leaves_nothing(slurm: Env, spec: Path) -> None:
    job = slurm.sleeping_job(spec)
    shares = {h: names for h, names in slurm.shares(job).items() if names}
    # One share per host, each recorded in its own host's state directory only.
    assert sorted(map(len, shares.values())) == [1, 1], f"job {job} shares: {shares}"
    assert sorted(n for names in shares.values() for n in names) == [f"j{job}-0", f"j{job}-1"]
    for host, (name,) in shares.items():
        # The share's bridge and containers exist inside its host, not elsewhere.
        mine = slurm.on(host, f"ip -o link show hpvc-j{job}; crun list -q")
        assert f"hpvc-{name}-" in mine, mine
        for other in HOSTS:
            if other != host:
                assert f"hpvc-{name}-" not in slurm.on(other, "crun list -q"), other
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True)
    assert f" hpvc-j{job}:" not in links.stdout, "the job's bridge is in the root namespace"
    cancel = slurm.run("scancel", str(job))
    assert cancel.returncode == 0, cancel.stderr
    slurm.wait_clean(job)


def test_failing_task_leaves_nothing(slurm: Env, spec: Path) -> None:
    r = slurm.run("srun", "-N2", f"--hpvc={spec}", "sh", "-c", "exit 3")
    assert r.returncode != 0
    assert "exit code 3" in r.stderr, r.stderr
    slurm.wait_clean(last_job(slurm))


def test_spec_the_site_refuses_starts_no_job(slurm: Env) -> None:
    bad = slurm.work / "vm.toml"
    bad.write_text(spec_text("10.88.77.0/24").replace('kind = "container"', 'kind = "vm"'))
    before = last_job(slurm)
    r = slurm.run("srun", "-N1", f"--hpvc={bad}", "hostname")
    assert r.returncode != 0
    assert "hpvc:" in r.stderr and "only in container nodes" in r.stderr, r.stderr
    assert "no job was started" in r.stderr
    assert last_job(slurm) == before  # no job id was taken
    missing = slurm.run("srun", "-N1", f"--hpvc={slurm.work}/nope.toml", "hostname")
    assert missing.returncode != 0 and "no such file" in missing.stderr, missing.stderr


def test_unknown_plugstack_key_refuses(slurm: Env, spec: Path) -> None:
    conf = Path(slurm.env["SLURM_CONF"])
    plug = slurm.tmp / "bad-plugstack.conf"
    line = next(
        x for x in (conf.parent / "plugstack.conf").read_text().splitlines() if "required" in x
    )
    plug.write_text(line + " colour=blue\n")
    bad_conf = slurm.tmp / "bad-slurm.conf"
    text = conf.read_text().replace(str(conf.parent / "plugstack.conf"), str(plug))
    bad_conf.write_text(text)
    env = {"SLURM_CONF": str(bad_conf)}
    before = last_job(slurm)
    r = slurm.run("srun", "-N1", f"--hpvc={spec}", "hostname", timeout=30, env=env)
    assert r.returncode != 0
    assert "hpvc: plugstack.conf: unknown argument 'colour'" in r.stderr, r.stderr
    assert last_job(slurm) == before


def test_unknown_state_dir_sequence_refuses(slurm: Env, spec: Path) -> None:
    """state_dir=.../%h is this host's name; any other % sequence is refused."""
    conf = Path(slurm.env["SLURM_CONF"])
    plug = slurm.tmp / "bad-state-plugstack.conf"
    line = next(
        x for x in (conf.parent / "plugstack.conf").read_text().splitlines() if "required" in x
    )
    assert "state_dir=" in line and "/%h" in line, line
    plug.write_text(line.replace("/%h", "/%q") + "\n")
    bad_conf = slurm.tmp / "bad-state-slurm.conf"
    bad_conf.write_text(conf.read_text().replace(str(conf.parent / "plugstack.conf"), str(plug)))
    before = last_job(slurm)
    r = slurm.run(
        "srun", "-N1", f"--hpvc={spec}", "hostname", timeout=30,
        env={"SLURM_CONF": str(bad_conf)},
    )  # fmt: skip
    assert r.returncode != 0
    assert "hpvc: plugstack.conf: state_dir=" in r.stderr, r.stderr
    assert "unknown sequence '%q'" in r.stderr, r.stderr
    assert last_job(slurm) == before


def test_remote_failure_reaches_the_user(slurm: Env, spec: Path) -> None:
    """A spec that passes the submit-time check but cannot come up on the host
    (more Slurm hosts than virtual nodes) fails the step with hpvc's reason."""
    one = slurm.work / "one.toml"
    one.write_text(spec_text(f"10.88.{100 + os.getpid() % 100}.0/24", computes=0))
    r = slurm.run("srun", "-N2", f"--hpvc={one}", "hostname")
    assert "the job has 2 hosts but the spec 1 virtual node(s)" in r.stderr, r.stderr
    assert r.stdout.strip() == ""
    slurm.wait_clean(last_job(slurm))


def test_bench_slurm_measures_both_paths(tenants: tuple[Submitter, Submitter]) -> None:
    """`hpvc bench slurm` on its own private Slurm cluster, one repetition,
    every job submitted by a tenant."""
    requires("root", "crun", "ip")
    requires_slurm()
    image_ready()
    from hpvc.bench.slurm import runner as bench

    doc = bench.run(1, user=tenants[0].name)
    assert doc["submitted_by"] == tenants[0].name
    rows = {t["what"]: t for t in doc["table"]}
    assert set(rows) == set(bench.WHAT)
    for t in rows.values():
        assert t["plain"]["min"] > 0 and t["hpvc"]["min"] > 0
    # bringing nodes up costs more than joining running ones
    assert (
        rows["alloc_first_step_N3"]["hpvc"]["median"]
        > rows["alloc_later_step_N3"]["hpvc"]["median"]
    )
