"""What ``hpvc plan SPEC`` prints, without typer (issue 33 item 4).

The typer command (hpvc.cli.plan) and the quick path in front of typer
(hpvc.cli.quick, ``plan SPEC [--json]``) both call ``plan_and_show``, so the
two ways print the same. The spec is still read by its schema (pydantic,
hpvc.spec): its validation and messages are the user's contract.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpvc.cli.common import console, print_json
from hpvc.units import format_cpulist, format_mib

if TYPE_CHECKING:
    from hpvc.plan import Plan, PlannedNode
    from hpvc.spec import Spec
    from hpvc.topology.model import Topology


def plan_and_show(s: Spec, topology_root: str | None, hosts: str | None, as_json: bool) -> None:
    """Plan ``s`` on this host (hugepages other clusters hold kept apart), a
    snapshot (``topology_root``) or an inventory (``hosts``); a table or JSON."""
    from hpvc.plan import plan_cluster
    from hpvc.topology.inventory import Inventory, local_hosts, read_inventory

    inv = read_inventory(hosts) if hosts else Inventory(tuple(local_hosts(topology_root)))
    if not hosts and not topology_root:
        inv = Inventory(tuple(_held_apart(s.name, h, t) for h, t in inv.hosts), inv.fabric)
    p = plan_cluster(s, inv.hosts, fabric=inv.fabric)
    if as_json:
        print_json(p.to_json())
    else:
        show(p)


def _cells(n: PlannedNode) -> str:
    return " ".join(f"{c.guest_node}>{c.host_node}:{format_mib(c.memory_mib)}" for c in n.numa)


def _page(size_kib: int) -> str:
    return f"{size_kib // 1048576}G" if size_kib >= 1048576 else f"{size_kib // 1024}M"


def show(p: Plan) -> None:
    from rich.markup import escape
    from rich.table import Table

    from hpvc.plan.network import describe

    t = Table(
        title=f"cluster {p.cluster}: {p.kind}, image {p.image}, bridge {p.network.bridge}",
        caption="CPUs: host CPU of each vCPU, or ~set for floating (shared) nodes;"
        " NUMA: guest cell>host node:memory",
    )
    for col in ("node", "host", "CPUs", "emulator", "NUMA", "hugepages", "ip"):
        t.add_column(col, overflow="fold")
    for n in p.nodes:
        cpus = (
            "~" + format_cpulist(n.cpuset)
            if n.pinning == "shared"
            else ",".join(str(v.pcpu) for v in n.vcpus)
        )
        huge = f"{n.hugepages.count}x{_page(n.hugepages.size_kib)}" if n.hugepages else "-"
        emu = format_cpulist(n.emulator_cpus) or "-"
        t.add_row(n.name, n.host, cpus, emu, _cells(n), huge, n.ip)
    console.print(t)
    for h in p.hosts:
        grow = "; ".join(
            f"node {g.host_node} {_page(g.size_kib)} pages: need {g.count},"
            f" free {g.free}, grow {g.grow}"
            for g in h.hugepages
        )
        socks = ",".join(map(str, h.hpc_packages)) or "none"
        console.print(
            f"host {h.name}: {len(h.nodes)} nodes; sockets held whole: {socks};"
            f" {grow or 'no hugepages'}"
        )
    across = describe(p.network)
    if across:
        console.print(across, markup=False, soft_wrap=True)
    sh = p.shared
    if sh.server == "nfs":
        size = f"{sh.size_mib} MiB ext4 loop file system" if sh.size_mib else "a host folder"
        console.print(
            f"shared {sh.path}: NFS from {sh.node} ({sh.address}:{sh.export})"
            f" to {p.network.subnet}, on {size}{', kept after down' if sh.keep else ''}",
            markup=False,
        )
    if p.spark is not None:
        ws = ", ".join(f"{w.node} {w.cores} cores {w.memory_mib} MiB" for w in p.spark.workers)
        console.print(f"spark: master {p.spark.url} on {p.spark.master}, UI {p.spark.ui};"
                      f" workers: {ws or 'none'}", markup=False)  # fmt: skip
    for note in p.notes:
        console.print(f"[dim]note: {escape(note)}[/dim]")


def _held_apart(name: str, host: str, topo: Topology) -> tuple[str, Topology]:
    """This host as `hpvc up` would plan on it: hugepages other clusters hold
    (grown for them, maybe not mapped yet) are not free. Without access to
    hpvc's state (not root), the kernel's own free counts."""
    from hpvc.cluster import pages
    from hpvc.store import Store

    try:
        return host, pages.unheld(Store(), topo, host, name)
    except PermissionError:
        return host, topo
