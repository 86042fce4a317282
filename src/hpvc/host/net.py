"""Cluster networks on one host: a bridge per cluster, a namespace and a veth per node.

Layout, for a cluster whose nodes are containers::

    host:  bridge (gateway address, MTU) ── hc<hash> (veth host end, no address)
                                                 │
    netns /run/netns/<name>:                    eth0 (node MAC, address, MTU), lo

Nothing leaves the bridge: no NAT, no default route in the namespaces, only the
subnet route that comes with each address. IPv6 is switched off on every
interface made here (no link-local address, no DAD or router solicitations),
where the kernel lets us.

architecture rule 5: every change is written to the ``Journal`` before it is made;
the undo kinds are ``"bridge"``, ``"netns"`` and ``"veth"``, each idempotent.
Errors become ``HpvcError`` naming the interface and the kernel's reason.
Namespaces are joined by path (``nsenter --net=PATH``, crun), never with
``ip netns exec``, which remounts /sys (HOST-NOTES).
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import re
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from hpvc.errors import HpvcError
from hpvc.host import netns as nsenter
from hpvc.host.journal import Args, Journal, undoer
from hpvc.host.linkinfo import NETNS_DIR as NETNS_DIR
from hpvc.host.linkinfo import NODE_IFNAME as NODE_IFNAME
from hpvc.host.linkinfo import LinkInfo as LinkInfo
from hpvc.host.linkinfo import Neighbor as Neighbor
from hpvc.host.linkinfo import netns_path as netns_path
from hpvc.host.linkinfo import read_link as read_link
from hpvc.host.probe import BRIDGE_NF_KNOBS

IFNAME_MAX = 15  # IFNAMSIZ - 1
NUD_PERMANENT = 0x80
_ENODEV = 19
_NETNS_NAME = re.compile(r"[A-Za-z0-9_.-]{1,255}")
_PREFIX = re.compile(r"[a-z][a-z0-9]{0,6}")


def short_ifname(prefix: str, *parts: str) -> str:
    """A deterministic interface name of exactly 15 characters: prefix + hex hash of parts.

    ``short_ifname("hc", cluster, node)`` gives ``hc`` + 13 hex digits. The
    prefix is 1 to 7 lowercase letters or digits (so at least 8 hex digits
    remain); the renderer's tap names (``hv`` + 12 hex) cannot collide with ``hc``.
    """
    if not _PREFIX.fullmatch(prefix):
        raise ValueError(f"interface name prefix {prefix!r}: want 1-7 of [a-z0-9], a letter first")
    if not parts:
        raise ValueError("short_ifname needs at least one part to hash")
    digest = hashlib.sha256("\0".join(parts).encode()).hexdigest()
    return prefix + digest[: IFNAME_MAX - len(prefix)]


def _pyroute2() -> tuple[Any, type[Exception]]:
    """pyroute2's IPRoute and NetlinkError, imported when a change needs them:
    its import is ~0.04-0.09 s, which a reader (status: hpvc.host.linkinfo)
    does not pay (issue 33 item 4)."""
    from pyroute2 import IPRoute, NetlinkError  # type: ignore[import-untyped]

    return IPRoute, NetlinkError


def _fail(what: str, err: Exception, fix: str = "") -> HpvcError:
    code = getattr(err, "code", None) if isinstance(err, _pyroute2()[1]) else None
    if code is None and isinstance(err, OSError):
        code = err.errno
    why = os.strerror(code) if isinstance(code, int) and code > 0 else str(err)
    return HpvcError(what, why.lower(), fix)


@contextmanager
def _rtnl(what: str, netns: str | None = None) -> Iterator[Any]:
    """A netlink socket (inside ``netns`` when given); failures become ``HpvcError(what)``."""
    if netns is not None and not os.path.exists(netns_path(netns)):
        raise HpvcError(what, f"network namespace {netns_path(netns)} does not exist")
    IPRoute, NetlinkError = _pyroute2()
    try:
        ipr = IPRoute() if netns is None else nsenter.call_in(netns_path(netns), IPRoute)
    except (NetlinkError, OSError) as e:
        raise _fail(what, e) from e
    try:
        yield ipr
    except (NetlinkError, OSError) as e:
        raise _fail(what, e) from e
    finally:
        ipr.close()


def _index(ipr: Any, ifname: str) -> int | None:
    found = ipr.link_lookup(ifname=ifname)
    return int(found[0]) if found else None


def _require_index(ipr: Any, ifname: str, what: str, where: str = "on the host") -> int:
    index = _index(ipr, ifname)
    if index is None:
        raise HpvcError(what, f"no interface {ifname} {where}")
    return index


def _kind(ipr: Any, index: int) -> str | None:
    kind = ipr.link("get", index=index)[0].get_nested("IFLA_LINKINFO", "IFLA_INFO_KIND")
    return None if kind is None else str(kind)


def _in_netns(netns: str, fn: Callable[[], None]) -> None:
    """Run ``fn`` with this thread in ``netns`` (setns is per thread; hpvc.host.netns)."""
    nsenter.call_in(netns_path(netns), fn)


def _disable_ipv6(ifname: str, netns: str | None = None) -> None:
    """Switch IPv6 off on one interface if the kernel lets us (no DAD, no RS noise)."""
    path = Path(f"/proc/sys/net/ipv6/conf/{ifname}/disable_ipv6")

    def write() -> None:
        # No IPv6 in this kernel, or a read-only /proc/sys: fine, IPv6 just stays on.
        with suppress(OSError):
            path.write_text("1\n")

    if netns is None:
        write()
    else:
        _in_netns(netns, write)


def _ensure_addr(ipr: Any, index: int, address: str, prefixlen: int) -> None:
    for msg in ipr.addr("dump", index=index, family=socket.AF_INET):
        if msg.get("IFA_LOCAL") == address and msg["prefixlen"] == prefixlen:
            return
    ipr.addr("add", index=index, address=address, prefixlen=prefixlen)


def ensure_bridge(
    journal: Journal, name: str, address: str | None, prefixlen: int, mtu: int
) -> None:
    """Create the cluster's bridge (or adopt it when it exists), with MTU and gateway address, up.

    ``address`` None or "": no address here.

    A bridge left by an earlier ``up`` of the same cluster is adopted without a
    second journal record; an interface of that name that is not a bridge is an error.
    """
    what = f"bridge {name}"
    with _rtnl(what) as ipr:
        index = _index(ipr, name)
        if index is None:
            journal.record("bridge", name=name)
            ipr.link("add", ifname=name, kind="bridge")
            index = _require_index(ipr, name, what)
        elif _kind(ipr, index) != "bridge":
            raise HpvcError(what, f"{name} exists and is not a bridge", "remove it or rename")
        _disable_ipv6(name)
        ipr.link("set", index=index, mtu=mtu)
        _pin_mac(ipr, index)
        if address:
            _ensure_addr(ipr, index, address, prefixlen)
        ipr.link("set", index=index, state="up")


def _pin_mac(ipr: Any, index: int) -> None:
    """Keep the bridge's MAC address as it is now, whatever ports come and go.

    A Linux bridge whose address was never set takes the lowest MAC of its
    ports and changes it when that port leaves (or a lower one joins): a
    VM node's live migration swaps its tap for a new one, so the host's own
    address on the cluster bridge (the guests' gateway, the MPI launcher's
    and ssh's peer) could change MAC under the guests, whose ARP entry for it
    then points nowhere until it expires: connections from a guest to the
    host stall (issue 27; shown in a namespace by test_bridge_mac.py). An
    address set by hand is kept by the kernel (br_stp_recalculate_bridge_id);
    setting the one it has now changes nothing a guest already knows.
    docs/network.md."""
    links = ipr.get_links(index)
    mac = links[0].get_attr("IFLA_ADDRESS") if links else None
    if mac:
        ipr.link("set", index=index, address=mac)


def create_netns(journal: Journal, name: str) -> str:
    """Create the named network namespace; return its path (``/run/netns/<name>``)."""
    what = f"network namespace {name}"
    if not _NETNS_NAME.fullmatch(name) or name in (".", ".."):
        raise HpvcError(what, "not a valid name (letters, digits, '._-', at most 255)")
    path = netns_path(name)
    if os.path.lexists(path):
        raise HpvcError(what, f"{path} already exists", "run 'hpvc down' for its cluster first")
    journal.record("netns", name=name)
    try:
        nsenter.create(path)
    except OSError as e:
        raise _fail(what, e) from e
    return path


def _check_subnet(address: str, prefixlen: int, gateway: str) -> None:
    net = ipaddress.ip_interface(f"{address}/{prefixlen}").network
    if ipaddress.ip_address(gateway) not in net:
        raise HpvcError(f"node address {address}/{prefixlen}", f"gateway {gateway} is outside")


def add_node_link(
    journal: Journal,
    *,
    bridge: str,
    netns: str,
    host_ifname: str,
    mtu: int,
    address: str,
    prefixlen: int,
    mac: str,
    gateway: str,
) -> None:
    """Wire one node: a veth from ``bridge`` into ``netns``, where it is ``eth0``.

    The host end ``host_ifname`` (<= 15 chars, see ``short_ifname``) joins the
    bridge; ``eth0`` gets ``mac``, ``mtu`` and ``address/prefixlen``; ``lo`` is
    brought up. ``gateway`` (the bridge's address) is only checked to lie in the
    node's subnet: no route goes through it, the cluster network is local.
    """
    _check_subnet(address, prefixlen, gateway)
    what = f"veth {host_ifname}"
    with _rtnl(what) as ipr:
        master = _require_index(ipr, bridge, what)
        if _index(ipr, host_ifname) is not None:
            raise HpvcError(what, "already exists", "run 'hpvc down' for its cluster first")
        journal.record("veth", ifname=host_ifname, netns=netns)
        fd = os.open(netns_path(netns), os.O_RDONLY | os.O_CLOEXEC)
        try:
            peer = {"ifname": NODE_IFNAME, "net_ns_fd": fd, "mtu": mtu, "address": mac}
            ipr.link("add", ifname=host_ifname, kind="veth", mtu=mtu, peer=peer)
        finally:
            os.close(fd)
        index = _require_index(ipr, host_ifname, what)
        _disable_ipv6(host_ifname)
        ipr.link("set", index=index, master=master, state="up")
    _setup_node_end(netns, address, prefixlen)


def _setup_node_end(netns: str, address: str, prefixlen: int) -> None:
    _disable_ipv6(NODE_IFNAME, netns)
    what = f"{NODE_IFNAME} in {netns}"
    where = f"in {netns}"
    with _rtnl(what, netns) as ipr:
        index = _require_index(ipr, NODE_IFNAME, what, where)
        _ensure_addr(ipr, index, address, prefixlen)
        ipr.link("set", index=index, state="up")
        ipr.link("set", index=_require_index(ipr, "lo", what, where), state="up")


def set_static_neighbors(
    netns: str, entries: list[tuple[str, str]], dev: str = NODE_IFNAME
) -> None:
    """Permanent ARP entries ``(ip, mac)`` on ``dev`` inside ``netns``; the node's own is skipped.

    No undo: the entries go with the namespace.
    """
    what = f"neighbours on {dev} in {netns}"
    with _rtnl(what, netns) as ipr:
        index = _require_index(ipr, dev, what, f"in {netns}")
        own = {m.get("IFA_LOCAL") for m in ipr.addr("dump", index=index, family=socket.AF_INET)}
        for ip, mac in entries:
            if ip in own:
                continue
            ipr.neigh("replace", dst=ip, lladdr=mac, ifindex=index, state=NUD_PERMANENT)


def set_link_up(ifname: str, up: bool) -> None:
    """Bring the host's ``ifname`` (a node's veth end) up or down: down, its
    node sends and receives nothing (no carrier), and nothing answers for it."""
    what = f"veth {ifname}"
    with _rtnl(what) as ipr:
        ipr.link("set", index=_require_index(ipr, ifname, what), state="up" if up else "down")


def _delete_link(ifname: str, kind: str) -> None:
    """Delete ``ifname`` if it exists and is of ``kind``; anything else of that name is not ours."""
    with _rtnl(f"{kind} {ifname}") as ipr:
        index = _index(ipr, ifname)
        if index is None or _kind(ipr, index) != kind:
            return
        try:
            ipr.link("del", index=index)
        except _pyroute2()[1] as e:
            # gone meanwhile (its veth peer's namespace went)
            if getattr(e, "code", None) != _ENODEV:
                raise


@undoer("bridge")
def _undo_bridge(args: Args) -> None:
    _delete_link(str(args["name"]), "bridge")


@undoer("veth")
def _undo_veth(args: Args) -> None:
    _delete_link(str(args["ifname"]), "veth")


@undoer("netns")
def _undo_netns(args: Args) -> None:
    path = netns_path(str(args["name"]))
    if not os.path.lexists(path):
        return
    try:
        nsenter.remove(path)  # lazy unmount, then unlink; fine if never mounted
    except OSError as e:
        raise _fail(f"network namespace {args['name']}", e) from e


# --- VM taps -------------------------------------------------------------------------

_TUN_TYPE_TAP = 2


def _is_tap(ipr: Any, index: int) -> bool:
    info = ipr.link("get", index=index)[0].get("IFLA_LINKINFO")
    if info is None or info.get("IFLA_INFO_KIND") != "tun":
        return False
    data = info.get("IFLA_INFO_DATA")
    kind = None if data is None else data.get("IFLA_TUN_TYPE")
    return kind is None or kind == _TUN_TYPE_TAP


def create_tap(journal: Journal, name: str, bridge: str, mtu: int) -> None:
    """A persistent single-queue tap ``name`` with ``mtu``, enslaved to ``bridge``, up."""
    what = f"tap {name}"
    with _rtnl(what) as ipr:
        master = _index(ipr, bridge)
        if master is None:
            raise HpvcError(what, f"no bridge {bridge} on the host", "create the cluster network")
        if _index(ipr, name) is not None:
            raise HpvcError(what, "already exists", "run 'hpvc down' for its cluster first")
        journal.record("tap", ifname=name)
        flags = {"no_pi": 1, "multi_queue": 0, "vnet_hdr": 0}
        ipr.link("add", ifname=name, kind="tuntap", mode="tap", ifr=flags)
        index = _require_index(ipr, name, what)
        _disable_ipv6(name)
        ipr.link("set", index=index, mtu=mtu, master=master, state="up")


@undoer("tap")
def _undo_tap(args: Args) -> None:
    name = str(args["ifname"])
    with _rtnl(f"tap {name}") as ipr:
        index = _index(ipr, name)
        if index is None or not _is_tap(ipr, index):
            return  # gone, or an interface of that name that is not our tap
        try:
            ipr.link("del", index=index)
        except _pyroute2()[1] as e:
            if getattr(e, "code", None) != _ENODEV:
                raise


BRIDGE_NF = "/proc/sys/net/bridge"  # bridge-nf-call-*: per network namespace


def set_bridge_netfilter(on: bool, base: str = BRIDGE_NF) -> dict[str, int]:
    """br_netfilter's knobs of this network namespace set to ``on``; what they are now.

    Empty when the kernel has no br_netfilter (module not loaded): bridged
    frames then never see the IP hooks, which is what ``on=False`` models.
    """
    out: dict[str, int] = {}
    for knob in BRIDGE_NF_KNOBS:
        path = Path(base) / knob
        if not path.exists():
            continue
        try:
            path.write_text("1\n" if on else "0\n")
            out[knob] = int(path.read_text())
        except (OSError, ValueError) as e:
            raise HpvcError(f"{path}", str(e)) from e
    return out
