"""Pure renderers: Plan (+ RenderContext) -> domain XML, QEMU argv, OCI config, files.

The names below are loaded on first use (``hpvc.lazy``): a reader of one
renderer (the container backend reads ``files``; ``hpvc status`` loads it)
does not import the others, the topology and the VM renderers (issue 33
item 4). ``render_cluster`` and ``qemu_script`` live in hpvc.render.cluster.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpvc.lazy import exports

if TYPE_CHECKING:
    from hpvc.render.cluster import qemu_script, render_cluster
    from hpvc.render.context import RenderContext, tap_name
    from hpvc.render.files import (
        arp_entries,
        ethers,
        guest_network,
        guest_network_script,
        hostfile,
        hosts,
        locality_json,
        mpi_nodes,
        plan_json,
    )
    from hpvc.render.libvirt import domain_name, render_domain_xml
    from hpvc.render.network import network_script, network_scripts
    from hpvc.render.oci import render_oci_config
    from hpvc.render.qemu import QemuLaunch, QemuPinning, qemu_argv, qemu_pinning, render_qemu

__all__ = [
    "QemuLaunch",
    "QemuPinning",
    "RenderContext",
    "arp_entries",
    "domain_name",
    "ethers",
    "guest_network",
    "guest_network_script",
    "hostfile",
    "hosts",
    "locality_json",
    "mpi_nodes",
    "network_script",
    "network_scripts",
    "plan_json",
    "qemu_argv",
    "qemu_pinning",
    "qemu_script",
    "render_cluster",
    "render_domain_xml",
    "render_oci_config",
    "render_qemu",
    "tap_name",
]

__getattr__ = exports(
    __name__,
    {
        "hpvc.render.cluster": ["qemu_script", "render_cluster"],
        "hpvc.render.context": ["RenderContext", "tap_name"],
        "hpvc.render.files": [
            "arp_entries",
            "ethers",
            "guest_network",
            "guest_network_script",
            "hostfile",
            "hosts",
            "locality_json",
            "mpi_nodes",
            "plan_json",
        ],
        "hpvc.render.libvirt": ["domain_name", "render_domain_xml"],
        "hpvc.render.network": ["network_script", "network_scripts"],
        "hpvc.render.oci": ["render_oci_config"],
        "hpvc.render.qemu": [
            "QemuLaunch",
            "QemuPinning",
            "qemu_argv",
            "qemu_pinning",
            "render_qemu",
        ],
    },
)
