"""`hpvc topology`: packages, NUMA nodes, cores, memory and hugepages of a host."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table
from rich.text import Text

from hpvc.cli.common import console, print_json
from hpvc.sysroot import SysRoot
from hpvc.topology import Topology, offline_cpus, read_topology
from hpvc.topology.model import NumaNode
from hpvc.units import format_cpulist, format_mib

HELP = (
    "Show the host's topology as hpvc sees it.\n\n"
    "Packages (sockets), NUMA nodes with their"
    " CPUs, memory, free memory and hugepage pools, cores and online CPUs, plus every"
    " assumption made where sysfs said nothing. Like hwloc, only the CPUs and NUMA"
    " nodes this process may use (its cpuset: taskset, cgroup), which is all hpvc plan"
    " and hpvc up place nodes on; --whole-system shows every one, marking the rest."
    " Read-only.\n\n"
    "Examples:\n\n"
    "  hpvc topology\n\n"
    "  hpvc topology --json\n\n"
    "  hpvc topology --whole-system\n\n"
    "  hpvc topology --root build/topologies/16amd64-8n2c   # an extracted snapshot (README)"
)


def _pools(node: NumaNode) -> str:
    """``2048kB: free/total`` per hugepage size, or ``-``."""
    return ", ".join(f"{p.size_kib}kB: {p.free}/{p.total}" for p in node.hugepages) or "-"


def _cpus(topo: Topology, node: NumaNode) -> str:
    """The node's CPUs; ``(allowed: ...)`` when this process may not use them all."""
    if not node.cpus:
        return "- (memory only)"
    text = format_cpulist(node.cpus)
    allowed = [c for c in node.cpus if c in set(topo.allowed_cpus)]
    if len(allowed) < len(node.cpus):
        text += f" (allowed: {format_cpulist(allowed) or 'none'})"
    return text


def render_table(topo: Topology) -> Table:
    """One row per NUMA node; cells are Text so nothing is read as markup."""
    table = Table(show_header=True, header_style="bold")
    for name in ("node", "package", "cpus", "memory", "free", "hugepages free/total"):
        table.add_column(name, overflow="fold")
    owners = topo.cpu_package()
    for node in topo.numa_nodes:
        packages = sorted({owners[c] for c in node.cpus if c in owners})
        barred = "" if node.id in topo.allowed_mems else " (not allowed)"
        table.add_row(
            Text(str(node.id)),
            Text(",".join(map(str, packages)) or "-"),
            Text(_cpus(topo, node)),
            Text(format_mib(node.memory_mib) + barred),
            Text(format_mib(node.free_mib)),
            Text(_pools(node)),
        )
    return table


def _count(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


def summary_line(topo: Topology, offline: tuple[int, ...]) -> str:
    """``2 packages, 8 NUMA nodes, 16 cores, 16 PUs online, 0 offline CPUs``."""
    parts = [
        _count(len(topo.packages), "package"),
        _count(len(topo.numa_nodes), "NUMA node"),
        _count(sum(len(p.cores) for p in topo.packages), "core"),
        _count(len(topo.online_cpus), "PU") + " online",
        _count(len(offline), "offline CPU"),
    ]
    gone = f" ({format_cpulist(offline)})" if offline else ""
    return ", ".join(parts) + gone


def topology(
    root: Path = typer.Option(
        Path("/"),
        "--root",
        metavar="DIR",
        help="Read DIR/sys and DIR/proc instead of this host's. Example: --root /tmp/snap",
    ),
    json_out: bool = typer.Option(
        False, "--json", help="Print the topology as JSON (hpvc's Topology). Example: --json"
    ),
    whole_system: bool = typer.Option(
        False,
        "--whole-system",
        help="Show every online CPU and NUMA node, also those this process may not use"
        " (marked; JSON: allowed_cpus, allowed_mems). Example: --whole-system",
    ),
) -> None:
    """Show packages, NUMA nodes, cores, memory and hugepages of a host."""
    host = SysRoot(root)
    topo = read_topology(host, whole_system=whole_system)
    if json_out:
        print_json(topo.to_json())
        return
    console.print(render_table(topo))
    console.print(summary_line(topo, offline_cpus(host)), markup=False)
    if topo.notes:
        console.print("notes:", markup=False)
        for note in topo.notes:
            console.print(f"  - {note}", markup=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    app.command("topology", help=HELP)(topology)
