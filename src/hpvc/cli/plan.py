"""``hpvc plan``: where every vCPU, memory cell, hugepage and address goes."""

from __future__ import annotations

import typer

from hpvc.cli.plan_view import plan_and_show
from hpvc.spec import load_spec

HELP = """Plan a cluster: pin vCPUs, map guest NUMA cells, count hugepages, give addresses.

Plans against this machine by default, a topology snapshot with
--topology-root, or many hosts with --hosts (an inventory TOML). A cluster
placed on several hosts that have fabric addresses in the inventory gets a
network across them: the plan shows its VXLAN VNI, VTEPs and node MTU.
Changes nothing on any host. Exits 2 with what is short when the cluster does
not fit, or when the spec's network.mtu cannot fit in the fabric's.

Examples:

  hpvc plan examples/small.toml

  hpvc plan examples/cluster.toml --topology-root build/topologies/64amd64-4s2n4ca2co --json

  hpvc plan examples/cluster.toml --hosts examples/hosts.toml
"""


def plan_cmd(
    spec: str = typer.Argument(..., help="Cluster spec (TOML), e.g. examples/small.toml."),
    topology_root: str | None = typer.Option(
        None, "--topology-root", help="Plan against a sysfs snapshot root instead of this host."
    ),
    hosts: str | None = typer.Option(
        None,
        "--hosts",
        help="Inventory TOML of hosts (\\[\\[hosts]] name, topology, count, fabric, fabric_mtu).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON."),
) -> None:
    s = load_spec(spec)
    if hosts and topology_root:
        raise typer.BadParameter("give --hosts or --topology-root, not both")
    plan_and_show(s, topology_root, hosts, as_json)


def register(app: typer.Typer) -> None:
    app.command("plan", help=HELP)(plan_cmd)
