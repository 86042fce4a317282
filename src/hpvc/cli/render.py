"""``hpvc render``: plan a cluster and write every artifact it needs into a directory."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import typer

from hpvc import paths
from hpvc.cli.common import console, print_json
from hpvc.errors import InputError
from hpvc.plan import Plan, plan_cluster
from hpvc.plan.network import describe
from hpvc.render import RenderContext, render_cluster
from hpvc.spec import load_spec
from hpvc.topology.inventory import Inventory, local_hosts, read_inventory

HELP = """Render a cluster: libvirt domain XML, QEMU command, OCI config.json, hostfile.

Plans the spec (like `hpvc plan`) and writes, into --out: NODE.xml,
NODE.qemu.sh and NODE.network for VM nodes, NODE/config.json for container
nodes, and hostfile, hosts, ethers, locality.json, plan.json. A cluster planned
across hosts with fabric addresses (--hosts) also gets network-HOST.sh per
host: its VXLAN port, forwarding entries and nftables filter as commands.
Paths inside the artifacts point under the state directory. Changes nothing
on any host.

Examples:

  hpvc render examples/cluster.toml --out build/demo

  hpvc render examples/vm-cluster.toml --out build/vm --accel tcg --kernel /boot/vmlinuz

  hpvc render examples/cluster.toml -o build/amd --topology-root build/topologies/64amd64-4s2n4ca2co

  hpvc render examples/cluster.toml --out build/wide --hosts examples/hosts.toml
"""


def _block_device(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    major, sep, minor = text.partition(":")
    if not sep or not major.isdigit() or not minor.isdigit():
        raise InputError(
            "--block-device", f"{text!r} is not MAJOR:MINOR", "e.g. 8:0 (see lsblk -o MAJ:MIN)"
        )
    return int(major), int(minor)


def _accel(choice: str) -> Literal["kvm", "tcg"]:
    if choice in ("kvm", "tcg"):
        return "kvm" if choice == "kvm" else "tcg"
    if choice != "auto":
        raise InputError("--accel", f"got {choice!r}", "use kvm, tcg or auto")
    from hpvc.host.accel import accelerator

    return accelerator().name


def write_artifacts(out: Path, artifacts: dict[str, str]) -> list[Path]:
    """Write every artifact under ``out``; ``.sh`` files are made executable."""
    written: list[Path] = []
    for rel, text in artifacts.items():
        path = out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        if rel.endswith(".sh"):
            path.chmod(0o755)
        written.append(path)
    return written


def _notes(plan: Plan, ctx: RenderContext) -> list[str]:
    notes = list(plan.notes)
    if ctx.block_device is None and any(n.io for n in plan.nodes if n.kind == "container"):
        notes.append("I/O limits not in config.json: give --block-device MAJOR:MINOR")
    return notes


def render_cmd(
    spec: str = typer.Argument(..., help="Cluster spec (TOML), e.g. examples/cluster.toml."),
    out: Path = typer.Option(..., "--out", "-o", help="Directory to write the artifacts into."),
    topology_root: str | None = typer.Option(
        None, "--topology-root", help="Plan against a sysfs snapshot root instead of this host."
    ),
    hosts: str | None = typer.Option(
        None,
        "--hosts",
        help="Inventory TOML of hosts (name, topology root, count, fabric address and MTU).",
    ),
    accel: str = typer.Option(
        "auto", "--accel", help="VM accelerator: kvm, tcg, or auto (probe this host)."
    ),
    state_dir: str | None = typer.Option(
        None,
        "--state-dir",
        help=f"Base of paths in the artifacts [HPVC_STATE_DIR or {paths.DEFAULT_STATE_DIR}].",
    ),
    kernel: str | None = typer.Option(None, "--kernel", help="Guest kernel for direct boot."),
    initrd: str | None = typer.Option(None, "--initrd", help="Guest initrd (with --kernel)."),
    block_device: str | None = typer.Option(
        None, "--block-device", help="MAJOR:MINOR the containers' I/O limits apply to, e.g. 8:0."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the written files as a JSON list."),
) -> None:
    s = load_spec(spec)
    if hosts and topology_root:
        raise InputError("render", "--hosts and --topology-root both given", "give one of them")
    if initrd and not kernel:
        raise InputError("--initrd", "given without --kernel", "add --kernel or drop --initrd")
    ctx = RenderContext(
        base_dir=state_dir or str(paths.state_dir()),
        accel=_accel(accel),
        kernel=kernel,
        initrd=initrd,
        block_device=_block_device(block_device),
    )
    inv = read_inventory(hosts) if hosts else Inventory(tuple(local_hosts(topology_root)))
    plan = plan_cluster(s, inv.hosts, fabric=inv.fabric)
    written = write_artifacts(out, render_cluster(plan, ctx))
    if as_json:
        print_json([str(p) for p in written])
        return
    kinds = f"{sum(n.kind == 'vm' for n in plan.nodes)} VM, "
    kinds += f"{sum(n.kind == 'container' for n in plan.nodes)} container"
    if any(n.kind == "vm" for n in plan.nodes):
        kinds += f" nodes, accelerator {ctx.accel}"
    else:
        kinds += " nodes"
    console.print(f"cluster {plan.cluster}: {kinds}")
    across = describe(plan.network)
    if across:
        console.print(across, markup=False, soft_wrap=True)
    listing = " ".join(str(p.relative_to(out)) for p in written)
    console.print(f"wrote {len(written)} files to {out}: {listing}", markup=False, soft_wrap=True)
    for note in _notes(plan, ctx):
        console.print(f"note: {note}", style="dim", markup=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    app.command("render", help=HELP)(render_cmd)
