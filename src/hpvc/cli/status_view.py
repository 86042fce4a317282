"""What ``hpvc status NAME`` prints, without typer (issue 33 item 4).

The typer command (hpvc.cli.cluster) and the quick path in front of typer
(hpvc.cli.quick) both call ``run_status``, so the two ways print the same;
``up``, ``scale`` and ``restart`` print their result with ``show_status``.
This module imports neither typer nor, until a table is drawn, rich.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hpvc.cli.common import console, print_json
from hpvc.cli.listings import image_text
from hpvc.cli.services_view import show_services
from hpvc.units import format_cpulist

if TYPE_CHECKING:
    from rich.table import Table


def run_status(name: str, as_json: bool) -> None:
    """``hpvc status NAME [--json]``: read back now (hpvc.cluster.status), then shown."""
    from hpvc.cluster.status import status

    st = status(name)
    if as_json:
        print_json(st)
    else:
        show_status(st)


def _limits(lim: dict[str, Any]) -> str:
    if "error" in lim:
        return str(lim["error"])
    parts = []
    if isinstance(lim.get("memory_limit"), int):
        parts.append(f"mem {lim['memory_limit'] // 2**20}MiB")
    if lim.get("cpu_shares"):
        parts.append(f"shares {lim['cpu_shares']}")
    io = lim.get("io") or {}
    for key, label in (("read_bps", "rd"), ("write_bps", "wr")):
        for dev, v in (io.get(key) or {}).items():
            parts.append(f"{label} {int(v) / 1e6:g}MB/s@{dev}")
    if lim.get("io_weight"):
        parts.append(f"weight {lim['io_weight']}")
    if lim.get("pids_max"):
        parts.append(f"pids {lim['pids_max']}")
    return " ".join(parts)


def show_status(st: dict[str, Any]) -> None:
    from rich.table import Table

    t = Table(
        title=f"cluster {st['cluster']}: {st['status']}, bridge {st['bridge']} {st['subnet']}"
        f" mtu {st['mtu']}, locality {st['locality']}",
        caption="read back from the kernel: cgroups, netns"
        if st["kind"] != "vm"
        else f"read back from QEMU and /proc; accelerator {st.get('accelerator')}",
    )
    for col in ("node", "state", "ip", "mtu", "cpus", "mems", "limits"):
        t.add_column(col, overflow="fold")
    pools = "; ".join(
        f"node {p['host_node']} {p['size_kib']}kB: {p['in_use']} in use of {p['total']}"
        f" (cluster planned {p['planned']})"
        for p in st.get("hugepages") or []
    )
    if pools:
        t.caption = f"{t.caption}; hugepages: {pools}"
    if st["kind"] == "vm":
        _vm_rows(t, st)
        console.print(t)
        if st.get("accelerator_warning"):
            console.print(f"[yellow]{st['accelerator_warning']}[/yellow]")
        _notes(st)
        return
    for n in st["nodes"]:
        netw, lim = n["network"], n["limits"]
        t.add_row(
            n["name"],
            n["state"],
            str(netw.get("address", netw.get("error", "-"))),
            str(netw.get("mtu", "-")),
            str(lim.get("cpus", "-")),
            str(lim.get("mems", "-")),
            _limits(lim),
        )
    console.print(t)
    _across_hosts(st.get("across_hosts"))
    show_services(st)
    _notes(st)


def _notes(st: dict[str, Any]) -> None:
    """What the table alone would hide: the image (by digest), limits that cannot
    apply, an up that was killed."""
    if st.get("image"):
        text = image_text(st["image"], st.get("image_digests") or {})
        console.print(f"image: {text}", markup=False)
    if st.get("io_warning"):
        console.print(f"warning: {st['io_warning']}", style="yellow", markup=False)
    if st.get("note"):
        style = "bold red" if st.get("interrupted") else "yellow"
        console.print(f"cluster {st['cluster']}: {st['note']}", style=style, markup=False)


def _across_hosts(x: dict[str, Any] | None) -> None:
    if not x:
        return
    k = x["kernel"]
    if "error" in k:
        console.print(f"[red]network across hosts: VXLAN {x['vni']}: {k['error']}[/red]")
        return
    console.print(
        f"network across hosts: VXLAN {k['vni']} on {k['link']} from {x['local']}"
        f" to {', '.join(x['hosts'])}, learning {'on' if k['learning'] else 'off'},"
        f" {k['forwarding']} forwarding entries, {k['dropped_from_outside']} packet(s)"
        " dropped from outside"
    )


def _vm_rows(t: Table, st: dict[str, Any]) -> None:
    """VM nodes: where QEMU's threads really run, and its memory backends."""
    for n in st["nodes"]:
        v = n.get("vm", {})
        if "error" in v or not v:
            t.add_row(n["name"], n["state"], n["planned"]["ip"], str(st["mtu"]), "-", "-",
                      str(v.get("error", "")))  # fmt: skip
            continue
        vcpus = " ".join(f"{x['vcpu']}:{format_cpulist(x['cpus'])}" for x in v["vcpus"])
        emu = sorted({c for x in v["emulator"] for c in x["cpus"]})
        cells = [m for m in v["memdevs"] if not str(m.get("id", "")).startswith("ivshmem")]
        shared = [m for m in v["memdevs"] if m not in cells]
        mems = ",".join(format_cpulist(m.get("host_nodes") or []) or "-" for m in cells)
        backs = " ".join(
            f"{m.get('size', 0) // 2**20}MiB {m.get('policy')}"
            f"{' prealloc' if m.get('prealloc') else ''}"
            for m in cells
        )
        backs += "".join(f"; ivshmem {m.get('size', 0) // 2**20}MiB" for m in shared)
        limits = f"vCPU>CPU {vcpus}; emulator {format_cpulist(emu)}; {backs}"
        t.add_row(n["name"], n["state"], n["planned"]["ip"], str(st["mtu"]), vcpus, mems, limits)
