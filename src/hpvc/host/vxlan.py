"""A cluster's bridge joined to its other hosts' bridges: kernel VXLAN, static forwarding, a filter.

``join`` gives the cluster's bridge on this host a VXLAN port (``vx`` + 13 hex
digits, hashed from the cluster name like every hpvc interface): the cluster's
VNI, this host's fabric address as source, learning off. The forwarding
database is written, never learned: one permanent entry per remote node MAC
pointing at its host, and one all-zeros entry per other host so broadcast
(there is little: ARP is static) reaches every host once. The bridge gets
one static entry per remote node MAC on the VXLAN port too: with learning
off on that port the bridge would otherwise never know where a remote node
is, and flood every frame to one (unknown unicast) to all of its ports, each
local node's veth included.

Only the other hosts' kernels may inject frames into a cluster's VNI: an
nftables table per VNI (``inet hpvc-vni<VNI>``) lets UDP to the VXLAN port
carrying that VNI in only from another of the cluster's hosts, through the
interface that host is reached by, from the source ports hpvc's links send
from (``SOURCE_PORTS``, below 1024, where no ordinary user binds), and drops
what a local user's socket sends into it (docs/network.md says what holds).

The port itself is held for hpvc (``hold_port``): a VXLAN link of VNI 0
(``hpvc-vxport``), up and joined to nothing, owns the host's one kernel UDP
socket on the port, which every cluster's link then shares (the kernel shares
one socket among VXLAN links of the same port and receive flags), so no user
can bind the port and keep a cluster from starting. ``hpvc node prepare``
makes it when a host starts; ``hpvc up`` makes it if missing; ``hpvc
doctor`` says who holds the port. nftables, not tc: this
kernel has tc's ``clsact`` but none of the classifiers a match needs (u32,
flower, bpf), and Debian ships ``nft`` (package nftables). The table's text is
``hpvc.render.network.vni_filter``'s, the same that ``network-<host>.sh`` shows:
one spelling of the rule, applied here with ``nft -f -`` (``hpvc.host.nftables``).

Undo kinds (architecture rule 5): ``"vxlan"`` ``{name, vni}`` deletes the link if it
is still a VXLAN with that VNI (its forwarding entries go with it; the holder too);
``"vxlan-filter"`` ``{table}`` deletes the nftables table.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
from typing import Any

from pyroute2 import IPRoute, NetlinkError  # type: ignore[import-untyped]

from hpvc.errors import HpvcError, MissingDependency
from hpvc.host import nftables, probe
from hpvc.host.journal import Args, Journal, undoer
from hpvc.plan.network import filter_table, vxlan_link_name
from hpvc.plan.overlay import HOLDER_LINK, HOLDER_VNI, SOURCE_PORTS, VXLAN_PORT, Overlay
from hpvc.render.network import HOLDER_TABLE, holder_filter, vni_filter

_ENODEV = 19
_EADDRINUSE = 98
_NUD_NOARP = 0x40  # a bridge's "static" entry (NUD_PERMANENT would mean its own address)
_NUD_PERMANENT = 0x80
_ZERO_MAC = "00:00:00:00:00:00"


link_name = vxlan_link_name  # the VXLAN port of a cluster's bridge (named in the plan)


def _fail(what: str, e: Exception) -> HpvcError:
    code = getattr(e, "code", None)
    why = str(e) if not isinstance(code, int) or code <= 0 else f"kernel error {code}: {e}"
    return HpvcError(what, why)


def _vxlan_ids(ipr: Any) -> dict[str, int]:
    """Name -> VNI of every VXLAN link in this network namespace."""
    out: dict[str, int] = {}
    for link in ipr.get_links():
        if link.get_nested("IFLA_LINKINFO", "IFLA_INFO_KIND") == "vxlan":
            vni = link.get_nested("IFLA_LINKINFO", "IFLA_INFO_DATA", "IFLA_VXLAN_ID")
            out[str(link.get_attr("IFLA_IFNAME"))] = int(vni)
    return out


def vni_in_use(vni: int, ignore: str = "") -> str | None:
    """The VXLAN link (other than ``ignore``) that already carries ``vni`` here, if any."""
    with IPRoute() as ipr:
        found = [n for n, v in _vxlan_ids(ipr).items() if v == vni and n != ignore]
    return found[0] if found else None


def join(journal: Journal, cluster: str, bridge: str, overlay: Overlay) -> str:
    """Add the VXLAN port to ``bridge``, its forwarding entries and the VNI filter."""
    name = link_name(cluster)
    what = f"VXLAN {name} (VNI {overlay.vni})"
    other = vni_in_use(overlay.vni, ignore=name)
    if other is not None:
        raise HpvcError(
            what,
            f"VNI {overlay.vni} is already used by {other} on this host",
            "another cluster has the same VNI: hpvc down it, or rename this one",
        )
    _filter(journal, overlay)
    low, high = SOURCE_PORTS
    try:
        with IPRoute() as ipr:
            master = ipr.link_lookup(ifname=bridge)
            if not master:
                raise HpvcError(what, f"no bridge {bridge} on this host")
            if not ipr.link_lookup(ifname=name):
                journal.record("vxlan", name=name, vni=overlay.vni)
                ipr.link(
                    "add",
                    ifname=name,
                    kind="vxlan",
                    vxlan_id=overlay.vni,
                    vxlan_local=overlay.local,
                    vxlan_port=overlay.port,
                    vxlan_port_range={"low": low, "high": high},
                    vxlan_learning=0,
                    mtu=overlay.mtu,
                )
            index = ipr.link_lookup(ifname=name)[0]
            ipr.link("set", index=index, master=master[0], mtu=overlay.mtu)
            _up(ipr, index, what, overlay.port)
            # The bridge must not learn remote MACs on this port either: all static.
            ipr.brport("set", index=index, learning=0)
    except NetlinkError as e:
        raise _fail(what, e) from e
    _forwarding(name, overlay)
    return name


def _up(ipr: Any, index: int, what: str, port: int) -> None:
    """Set a VXLAN link up (the kernel binds its UDP socket then, or shares one)."""
    try:
        ipr.link("set", index=index, state="up")
    except NetlinkError as e:
        if e.code != _EADDRINUSE:
            raise
        raise port_taken(what, port) from None


def port_taken(what: str, port: int) -> HpvcError:
    """The error for a VXLAN port a process other than the kernel's VXLAN holds."""
    users = sorted({u for u in probe.udp_binders(port) if u != 0})
    who = f"a process of uid {', '.join(map(str, users))}" if users else "a root process"
    return HpvcError(
        what,
        f"UDP port {port} is bound by {who}, not by a VXLAN link",
        f"end that process (ss -ulpn 'sport = :{port}' names it), then run `hpvc node prepare`"
        " when the host starts, before users log in, so hpvc holds the port",
    )


def hold_port(journal: Journal, port: int = VXLAN_PORT) -> bool:
    """Hold UDP ``port`` for hpvc's VXLAN links: the holder link (VNI 0, up, joined to
    nothing, its VNI dropped by an nftables table) owns the kernel's socket on it. True
    when made now; False when it was there (set up again if it was down)."""
    what = f"VXLAN port holder {HOLDER_LINK} (UDP {port})"
    try:
        with IPRoute() as ipr:
            made = _vxlan_ids(ipr).get(HOLDER_LINK) != HOLDER_VNI
            if made:
                if ipr.link_lookup(ifname=HOLDER_LINK):
                    raise HpvcError(
                        what,
                        f"a link named {HOLDER_LINK} is here and is not hpvc's holder",
                        f"ip link del {HOLDER_LINK} (nothing of hpvc uses another link of that"
                        " name)",
                    )
                _apply(journal, HOLDER_TABLE, holder_filter(port))
                journal.record("vxlan", name=HOLDER_LINK, vni=HOLDER_VNI)
                ipr.link("add", ifname=HOLDER_LINK, kind="vxlan", vxlan_id=HOLDER_VNI,
                         vxlan_port=port, vxlan_learning=0)  # fmt: skip
            _up(ipr, ipr.link_lookup(ifname=HOLDER_LINK)[0], what, port)
    except NetlinkError as e:
        raise _fail(what, e) from e
    return made


def forwarding_batch(name: str, overlay: Overlay) -> str:
    """The VXLAN link ``name``'s static forwarding entries as ``bridge -batch`` lines:
    per other host, one all-zeros entry (broadcasts go to it once), and per node
    there its MAC on the link (to that host) and on the bridge's port (static)."""
    lines = []
    for v in overlay.remotes:
        lines.append(f"fdb append {_ZERO_MAC} dev {name} dst {v.address} self permanent")
        for _, _, mac in v.nodes:
            lines.append(f"fdb replace {mac} dev {name} dst {v.address} self permanent")
            lines.append(f"fdb replace {mac} dev {name} master static")
    return "".join(line + "\n" for line in lines)


def _forwarding(name: str, overlay: Overlay) -> None:
    """Write the full mesh's entries in one ``bridge -batch`` (iproute2), not one
    pyroute2 request each: a host's entries grow with the job's nodes (2 per remote
    node, 1 per remote host), and pyroute2 took 0.45-0.65 ms an entry here against
    33-93 us in one batch (docs/benchmarks.md, "Scale"). The entries go with the
    link (its undo), so nothing more is journaled."""
    text = forwarding_batch(name, overlay)
    if text:
        _batch(name, text)


def follow_batch(name: str, mac: str, dst: str | None, was: str | None) -> str:
    """``bridge -batch`` lines that point a node's ``mac`` at the host it now lives
    on (issue 27, live migration across hosts): at fabric address ``dst``, or
    here (``dst`` None: its old entries go, the bridge learns it on its tap).
    ``was``: the fabric address the link's entry had (None: none, the node was
    here), whose entry a ``del`` names."""
    if dst is None:
        lines = [f"fdb del {mac} dev {name} master"] if was is not None else []
        lines += [f"fdb del {mac} dev {name} dst {was} self"] if was is not None else []
    else:
        lines = [
            f"fdb replace {mac} dev {name} dst {dst} self permanent",
            f"fdb replace {mac} dev {name} master static",
        ]
    return "".join(line + "\n" for line in lines)


def follow(name: str, mac: str, dst: str | None, was: str | None) -> None:
    """Apply ``follow_batch`` in one ``bridge -batch`` (as ``_forwarding`` does). Not
    journaled: the entries go with the link, which the cluster's journal removes.

    Arriving here (``dst`` None), the bridge's entry may already have left the
    VXLAN port: the guest's first frames on its new tap (QEMU announces it after
    the switch-over) move a static entry that is not sticky. So the deletions run
    with ``-force`` (a missing entry is not a failure) and what counts is the
    result, read back: no entry for ``mac`` left on the link."""
    text = follow_batch(name, mac, dst, was)
    if not text:
        return
    if dst is not None:
        _batch(name, text)
        return
    _batch(name, text, force=True)
    left = [m for m, _ in forwarding_entries(name) if m.lower() == mac.lower()]
    left += [m for m in bridge_entries(name) if m.lower() == mac.lower()]
    if left:
        raise HpvcError(f"VXLAN {name}: forwarding entries", f"{mac} still points at {was}")


def _batch(name: str, text: str, force: bool = False) -> None:
    bridge = shutil.which("bridge")
    if bridge is None:
        raise MissingDependency(f"VXLAN {name}", "bridge not found", "apt-get install iproute2")
    r = subprocess.run(
        [bridge, *(["-force"] if force else []), "-batch", "-"],
        input=text,
        capture_output=True,
        text=True,
        check=False,
    )
    if r.returncode != 0 and not force:
        why = (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1]
        raise HpvcError(f"VXLAN {name}: forwarding entries", why)


def bridge_entries(name: str) -> list[str]:
    """MACs the bridge forwards to the VXLAN link ``name`` (its static entries on that port)."""
    with IPRoute() as ipr:
        found = ipr.link_lookup(ifname=name)
        if not found:
            return []
        macs = {
            str(e.get_attr("NDA_LLADDR"))
            for e in ipr.fdb("dump", ifindex=found[0])
            if e.get_attr("NDA_MASTER") and e["state"] & (_NUD_NOARP | _NUD_PERMANENT) == _NUD_NOARP
        }
    return sorted(macs)


def forwarding_entries(name: str) -> list[tuple[str, str]]:
    """(mac, dst) of the VXLAN link's own forwarding entries, as the kernel has them."""
    out: list[tuple[str, str]] = []
    with IPRoute() as ipr:
        found = ipr.link_lookup(ifname=name)
        if not found:
            return out
        for e in ipr.fdb("dump", ifindex=found[0]):
            dst = e.get_attr("NDA_DST")
            if dst:
                out.append((str(e.get_attr("NDA_LLADDR")), str(dst)))
    return sorted(out)


def read_back(cluster: str, vni: int) -> dict[str, Any]:
    """The cluster's VXLAN link as the kernel has it: VNI, learning, forwarding
    entries (its own, and the bridge's static ones to it), and what the VNI's
    filter dropped (for ``hpvc status``)."""
    name = link_name(cluster)
    with IPRoute() as ipr:
        found = ipr.link_lookup(ifname=name)
        if not found:
            return {"link": name, "error": "no such link"}
        link = ipr.link("get", index=found[0])[0]
        data = ("IFLA_LINKINFO", "IFLA_INFO_DATA")
        stats = link.get_attr("IFLA_STATS64") or {}
        out: dict[str, Any] = {
            "link": name,
            "vni": int(link.get_nested(*data, "IFLA_VXLAN_ID") or 0),
            "learning": bool(link.get_nested(*data, "IFLA_VXLAN_LEARNING")),
            "mtu": int(link.get_attr("IFLA_MTU")),
            "tx_bytes": int(stats.get("tx_bytes", 0)),
            "rx_bytes": int(stats.get("rx_bytes", 0)),
        }
    entries = forwarding_entries(name)
    out["forwarding"] = len(entries)
    out["bridge_entries"] = len(bridge_entries(name))
    out["peers"] = sorted({dst for mac, dst in entries if mac == _ZERO_MAC})
    out["dropped_from_outside"] = dropped(vni)
    if out["vni"] != vni:
        out["error"] = f"carries VNI {out['vni']}, not {vni}"
    return out


# --- the filter ----------------------------------------------------------------------


def _nft() -> str:
    return nftables.find("the cluster network across hosts")


def _filter(journal: Journal, overlay: Overlay) -> None:
    _apply(journal, filter_table(overlay.vni), vni_filter(overlay))


def _apply(journal: Journal, table: str, text: str) -> None:
    nft = _nft()
    journal.record("vxlan-filter", table=table)
    nftables.load(nft, table, text)


def dropped(vni: int) -> int | None:
    """Packets the VNI's filter dropped so far, all its rules together (None: no such
    filter here)."""
    nft = shutil.which("nft")
    if nft is None:
        return None
    r = subprocess.run(
        [nft, "-j", "list", "table", "inet", filter_table(vni)],
        capture_output=True,
        text=True,
        check=False,
    )
    if r.returncode != 0:
        return None
    return sum(
        int(e["counter"]["packets"])
        for item in json.loads(r.stdout).get("nftables", [])
        for e in item.get("rule", {}).get("expr", [])
        if "counter" in e
    )


# --- undo ----------------------------------------------------------------------------


@undoer("vxlan")
def _undo_vxlan(args: Args) -> None:
    name, vni = str(args["name"]), int(args["vni"])
    with IPRoute() as ipr:
        if _vxlan_ids(ipr).get(name) != vni:
            return  # gone, or not ours any more
        with contextlib.suppress(NetlinkError):
            ipr.link("del", index=ipr.link_lookup(ifname=name)[0])


@undoer("vxlan-filter")
def _undo_filter(args: Args) -> None:
    nftables.delete(str(args["table"]))
