"""What the kernel says about a node's interface, read by iproute2 in one process.

``hpvc status`` reads every node's link back (address, MAC, MTU, state, its
permanent ARP entries) in the node's network namespace. With pyroute2 that
read cost the import of its IPRoute, ~0.04-0.09 s of a status on the 2-CPU
machines (docs/benchmarks.md, issue 33 item 4), more than the rest of the
command; ``ip -json -batch`` answers both questions in one short process
(``nsenter --net=PATH``, joined by path as hpvc.host.net says, never ``ip
netns exec``). The changes (bridges, veths, addresses) stay in hpvc.host.net
with pyroute2; this module only reads.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess
from typing import Any, TypedDict

from hpvc.errors import HpvcError, MissingDependency

NETNS_DIR = "/run/netns"
NODE_IFNAME = "eth0"


class Neighbor(TypedDict):
    """One permanent ARP entry."""

    ip: str
    mac: str


class LinkInfo(TypedDict):
    """What the kernel says about a node's interface (read back, not planned)."""

    ifname: str
    address: str | None
    prefixlen: int | None
    mac: str
    mtu: int
    operstate: str
    neighbors: list[Neighbor]


def netns_path(netns: str) -> str:
    """The bind-mount path of a named namespace; a path (with '/') is returned as is."""
    return netns if "/" in netns else f"{NETNS_DIR}/{netns}"


def _tools(what: str) -> tuple[str, str]:
    found = shutil.which("nsenter"), shutil.which("ip")
    if found[0] is None or found[1] is None:
        missing = "nsenter (util-linux)" if found[0] is None else "ip (iproute2)"
        raise MissingDependency(what, f"{missing} not found", "apt-get install iproute2 util-linux")
    return found[0], found[1]


def parse(dev: str, link: list[dict[str, Any]], neigh: list[dict[str, Any]]) -> LinkInfo:
    """``LinkInfo`` from ``ip -json addr show dev DEV`` and ``ip -json neigh show dev
    DEV nud permanent`` (pure: the unit tests give it iproute2's own output)."""
    one = link[0]
    first = next((a for a in one.get("addr_info", []) if a.get("family") == "inet"), None)
    neighbors = [
        Neighbor(ip=str(n["dst"]), mac=str(n.get("lladdr")))
        for n in neigh
        if "PERMANENT" in n.get("state", []) and ":" not in str(n["dst"])  # IPv4, as ARP
    ]
    return LinkInfo(
        ifname=dev,
        address=None if first is None else str(first["local"]),
        prefixlen=None if first is None else int(first["prefixlen"]),
        mac=str(one.get("address")),
        mtu=int(one["mtu"]),
        operstate=str(one.get("operstate")),
        neighbors=sorted(neighbors, key=lambda n: ipaddress.ip_address(n["ip"])),
    )


def read_link(netns: str, dev: str = NODE_IFNAME) -> LinkInfo:
    """What the kernel reports for ``dev`` in ``netns``: IPv4 address, MAC, MTU, state, ARP."""
    what = f"{dev} in {netns}"
    path = netns_path(netns)
    if not os.path.exists(path):
        raise HpvcError(what, f"network namespace {path} does not exist")
    nsenter, ip = _tools(what)
    batch = f"addr show dev {dev}\nneigh show dev {dev} nud permanent\n"
    r = subprocess.run(
        [nsenter, f"--net={path}", ip, "-json", "-batch", "-"],
        input=batch,
        capture_output=True,
        text=True,
        check=False,
    )
    if r.returncode != 0:
        if "does not exist" in r.stderr:
            raise HpvcError(what, f"no interface {dev} in {netns}")
        why = (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[0]
        raise HpvcError(what, why)
    answers = [json.loads(line) for line in r.stdout.splitlines() if line.strip()]
    if len(answers) != 2 or not answers[0]:
        raise HpvcError(what, f"unexpected answer from ip: {r.stdout.strip()[:200]!r}")
    return parse(dev, answers[0], answers[1])
