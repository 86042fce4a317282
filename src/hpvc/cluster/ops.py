"""Working with a running cluster: status (read back from the kernel), exec, run."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

from hpvc.backends import container as ct
from hpvc.backends import vm_libvirt, vm_qemu
from hpvc.cluster import vm
from hpvc.cluster.lifecycle import Env
from hpvc.cluster.state import Store
from hpvc.errors import HpvcError, InputError, MissingDependency
from hpvc.host import cgroups, hugepages, net
from hpvc.plan import Plan, PlannedNode
from hpvc.render.files import mpi_nodes
from hpvc.render.libvirt import domain_name

MPIRUN = "mpirun.openmpi"


def _node_status(plan: Plan, node: PlannedNode) -> dict[str, Any]:
    cid = ct.container_id(plan.cluster, node.name)
    out: dict[str, Any] = {
        "name": node.name,
        "role": node.role,
        "host": node.host,
        "state": ct.container_state(cid),
        "planned": {"cpus": list(node.cpuset), "memory_mib": node.memory_mib, "ip": node.ip},
    }
    try:
        out["network"] = dict(net.read_link(f"hpvc-{plan.cluster}-{node.name}"))
    except HpvcError as e:
        out["network"] = {"error": e.why}
    try:
        out["limits"] = cgroups.read_node_limits(plan.cluster, node.name)
    except (HpvcError, OSError) as e:
        out["limits"] = {"error": str(e)}
    return out


def _libvirt_read_back(uri: str, plan: Plan, node: PlannedNode) -> dict[str, Any]:
    """libvirt's view, in the shape `hpvc status` shows for both VM backends."""
    conn = vm_libvirt.connect(uri)
    try:
        rb = vm_libvirt.read_back(conn, domain_name(plan, node))
    finally:
        conn.close()
    return {
        "vcpus": [
            {"vcpu": v["vcpu"], "cpus": v["cpus"], "pinned": v["pinned"]} for v in rb["vcpus"]
        ],
        "emulator": [{"cpus": rb["emulator"]["cpus"]}],
        "memdevs": [],
        "libvirt": dict(rb),
    }


def _vm_status(
    store: Store, plan: Plan, node: PlannedNode, pid: int | None, libvirt: str | None = None
) -> dict[str, Any]:
    """A VM node: QEMU alive?, thread affinities and memory backends read back over QMP."""
    out: dict[str, Any] = {
        "name": node.name,
        "role": node.role,
        "host": node.host,
        "state": "running" if pid and vm_qemu.running(pid) else "stopped",
        "planned": {"cpus": list(node.cpuset), "memory_mib": node.memory_mib, "ip": node.ip},
        "network": {"address": node.ip, "mtu": plan.network.mtu},
    }
    if pid and out["state"] == "running":
        qmp = store.root / "run" / plan.cluster / node.name / "qmp.sock"
        try:
            if libvirt:
                out["vm"] = _libvirt_read_back(libvirt, plan, node)
            else:
                out["vm"] = dict(vm_qemu.read_back(pid, qmp))
        except HpvcError as e:
            out["vm"] = {"error": e.why}
    return out


def _pools(plan: Plan) -> list[dict[str, Any]]:
    """The host pools the plan draws on, as the kernel counts them now."""
    out = []
    for h in plan.hosts:
        for g in h.hugepages:
            try:
                total, free = hugepages.pool_state(g.host_node, g.size_kib)
            except (OSError, HpvcError):
                total = free = -1
            out.append(
                {
                    "host": h.name,
                    "host_node": g.host_node,
                    "size_kib": g.size_kib,
                    "planned": g.count,
                    "total": total,
                    "free": free,
                    "in_use": total - free if total >= 0 else None,
                }
            )
    return out


def status(name: str, store: Store | None = None) -> dict[str, Any]:
    """Nodes, states, addresses and limits as the kernel reports them now."""
    store = store or Store()
    rec = store.get(name)
    plan = rec.the_plan()
    if plan.kind == "vm":
        pids = rec.extra.get("pids", {})
        uri = rec.extra.get("libvirt_uri") if rec.extra.get("backend") == "libvirt" else None
        nodes = [_vm_status(store, plan, n, pids.get(n.name), uri) for n in plan.nodes]
    else:
        nodes = [_node_status(plan, n) for n in plan.nodes]
    return {
        "cluster": name,
        "status": rec.status,
        "kind": plan.kind,
        "image": plan.image,
        "bridge": plan.network.bridge,
        "subnet": plan.network.subnet,
        "mtu": plan.network.mtu,
        "locality": rec.spec.get("tuning", {}).get("locality", "shm"),
        "up_seconds": rec.extra.get("up_seconds"),
        "phases": rec.extra.get("phases"),
        "shared_dir": {"host": str(store.cluster_dir(name) / "shared"), "node": "/shared"},
        "hugepages": _pools(plan),
        "accelerator": rec.extra.get("accel"),
        "backend": rec.extra.get("backend"),
        "accelerator_warning": rec.extra.get("accel_warning"),
        "nodes": nodes,
    }


def list_clusters(store: Store | None = None) -> list[dict[str, Any]]:
    store = store or Store()
    out = []
    for name in store.names():
        rec = store.load(name)
        if rec is None:
            continue
        plan = rec.the_plan()
        out.append(
            {
                "name": name,
                "status": rec.status,
                "kind": plan.kind,
                "nodes": len(plan.nodes),
                "vcpus": sum(len(n.vcpus) for n in plan.nodes),
                "subnet": plan.network.subnet,
                "created": rec.created,
            }
        )
    return out


def exec_node(name: str, node: str, argv: list[str], store: Store | None = None) -> int:
    """Run a command inside one node, stdio attached; return its exit code."""
    store = store or Store()
    plan = store.get(name).the_plan()
    try:
        plan.node(node)
    except KeyError:
        known = ", ".join(n.name for n in plan.nodes)
        raise InputError(f"node {node!r}", f"not in cluster {name!r}", f"one of: {known}") from None
    if not argv:
        raise InputError("hpvc exec", "no command given", "hpvc exec NAME NODE -- CMD")
    if plan.kind == "vm":
        return vm.exec_node(store, plan, node, argv)
    return subprocess.run(ct.exec_argv(ct.container_id(name, node), argv), check=False).returncode


RANK_SCRIPT = """#!/bin/bash
# hpvc: start MPI rank $OMPI_COMM_WORLD_RANK inside its node (see ranks beside this file).
set -e
here=$(dirname "$0")
node=$(sed -n "$((OMPI_COMM_WORLD_RANK + 1))p" "$here/ranks")
args=()
while IFS= read -r -d '' kv; do
  case "$kv" in OMPI_*|PMIX_*|OPAL_*|ORTE_*|HPVC_*) args+=(--env "$kv");; esac
done < <(env -0)
exec {crun} exec "${{args[@]}}" --env PATH=/usr/local/bin:/usr/bin:/bin "$node" "$@"
"""


VM_RANK_SCRIPT = """#!/bin/bash
# hpvc: start MPI rank $OMPI_COMM_WORLD_RANK inside its VM over ssh (see ranks beside this file).
set -e
here=$(dirname "$0")
ip=$(sed -n "$((OMPI_COMM_WORLD_RANK + 1))p" "$here/ranks")
args=()
while IFS= read -r -d '' kv; do
  case "$kv" in OMPI_*|PMIX_*|OPAL_*|ORTE_*|HPVC_*) args+=("$(printf '%q' "$kv")");; esac
done < <(env -0)
cmd=()
for a in "$@"; do cmd+=("$(printf '%q' "$a")"); done
exec ssh -i "$here/id_ed25519" {opts} "root@$ip" env "${{args[@]}}" "${{cmd[@]}}"
"""


def rank_layout(plan: Plan, n: int) -> list[str]:
    """Node of each rank (container id, or a VM's IP): nodes in order, one rank per vCPU."""
    slots = [
        (x.ip if plan.kind == "vm" else ct.container_id(plan.cluster, x.name), len(x.vcpus))
        for x in mpi_nodes(plan)
    ]
    total = sum(s for _, s in slots)
    if n > total:
        raise InputError(f"-n {n}", f"the cluster's MPI nodes have {total} vCPUs", f"-n {total}")
    out: list[str] = []
    for cid, s in slots:
        out += [cid] * s
    return out[:n]


def mpirun_argv(env: Env, plan: Plan, n: int, argv: list[str], locality: str) -> list[str]:
    """Host mpirun, each rank exec'd into its node (the PMIx server on the bridge).

    With locality "shm" the nodes share IPC, PID namespace and /dev/shm, so
    Open MPI's shared-memory transport (and CMA) works between them; with
    "none" only the network path is allowed.
    """
    mpirun = shutil.which(MPIRUN)
    if mpirun is None:
        raise MissingDependency("hpvc run", f"{MPIRUN} not found", "apt-get install openmpi-bin")
    out = [mpirun, "--allow-run-as-root", "-n", str(n), "--host", f"localhost:{n}"]
    out += ["--bind-to", "none", "--mca", "orte_tmpdir_base", str(env.dir / "mpi")]
    out += ["--mca", "btl_tcp_if_include", "eth0"]
    if locality != "shm":
        out += ["--mca", "btl", "tcp,self"]
    return [*out, str(env.dir / "rankexec"), *argv]


def run(
    name: str,
    argv: list[str],
    n: int | None = None,
    store: Store | None = None,
    capture: bool = False,
) -> int | subprocess.CompletedProcess[str]:
    """Launch ``argv`` as an MPI job over the cluster's nodes; return its exit code
    (or, with ``capture``, the finished process with its stdout and stderr)."""
    store = store or Store()
    rec = store.get(name)
    if rec.status != "running":
        raise InputError(f"cluster {name!r}", f"is {rec.status}", "wait for it, or hpvc up")
    if not argv:
        raise InputError("hpvc run", "no command given", "hpvc run NAME -n 2 -- CMD")
    plan = rec.the_plan()
    env = Env(store, rec)
    total = sum(len(x.vcpus) for x in mpi_nodes(plan))
    layout = rank_layout(plan, n or total)
    (env.dir / "ranks").write_text("".join(c + "\n" for c in layout))
    script = env.dir / "rankexec"
    if plan.kind == "vm":
        script.write_text(VM_RANK_SCRIPT.format(opts=shlex.join(vm.SSH_OPTS)))
    else:
        script.write_text(RANK_SCRIPT.format(crun=shlex.quote(ct.runtime())))
    script.chmod(0o755)
    locality = str(rec.spec.get("tuning", {}).get("locality", "shm"))
    if plan.kind == "vm":
        locality = "none"  # ranks in different guests share no memory: the network path
    cmd = mpirun_argv(env, plan, len(layout), argv, locality)
    child_env = {
        **os.environ,
        # Ranks sit in other network namespaces: the PMIx server must listen on
        # the cluster bridge, not on the host's loopback.
        "PMIX_MCA_ptl_tcp_remote_connections": "1",
        "PMIX_MCA_ptl_tcp_if_include": plan.network.bridge,
    }
    if capture:
        return subprocess.run(cmd, env=child_env, capture_output=True, text=True, check=False)
    return subprocess.run(cmd, env=child_env, check=False).returncode


def rank_file(store: Store, name: str) -> Path:
    return store.cluster_dir(name) / "ranks"
