"""A whole cluster's artifacts at once (``hpvc render``) and a VM node's QEMU script."""

from __future__ import annotations

import shlex

from hpvc.plan.model import Plan
from hpvc.render.context import RenderContext
from hpvc.render.files import (
    ethers,
    guest_network,
    hostfile,
    hosts,
    locality_json,
    plan_json,
)
from hpvc.render.libvirt import render_domain_xml
from hpvc.render.network import network_scripts
from hpvc.render.oci import dumps as oci_dumps
from hpvc.render.oci import render_oci_config
from hpvc.render.qemu import QemuLaunch, render_qemu
from hpvc.units import format_cpulist


def qemu_script(launch: QemuLaunch) -> str:
    """A shell script that execs the QEMU command (pinning is applied after start)."""
    pins = " ".join(f"{v}:{format_cpulist(c)}" for v, c in launch.pinning.vcpus)
    return (
        "#!/bin/sh\n"
        f"# vCPU pinning after start (vcpu:cpus): {pins}\n"
        f"# emulator threads: {format_cpulist(launch.pinning.emulator) or 'not pinned'}\n"
        f"exec {shlex.join(launch.argv)}\n"
    )


def render_cluster(plan: Plan, ctx: RenderContext) -> dict[str, str]:
    """Every artifact of a cluster: relative path -> text, in a stable order.

    VM nodes: ``NODE.xml``, ``NODE.qemu.sh``, ``NODE.network``; container nodes:
    ``NODE/config.json``; then ``hostfile``, ``hosts``, ``ethers``,
    ``locality.json`` and ``plan.json``; for a plan across hosts,
    ``network-HOST.sh`` per host (its VXLAN port, forwarding and filter).
    """
    out: dict[str, str] = {}
    for node in plan.nodes:
        if node.kind == "vm":
            out[f"{node.name}.xml"] = render_domain_xml(plan, node, ctx)
            out[f"{node.name}.qemu.sh"] = qemu_script(render_qemu(plan, node, ctx))
            out[f"{node.name}.network"] = guest_network(plan, node)
        else:
            out[f"{node.name}/config.json"] = oci_dumps(render_oci_config(plan, node, ctx))
    out["hostfile"] = hostfile(plan)
    out["hosts"] = hosts(plan)
    out["ethers"] = ethers(plan)
    out["locality.json"] = locality_json(plan)
    out["plan.json"] = plan_json(plan)
    out.update(network_scripts(plan))
    return out
