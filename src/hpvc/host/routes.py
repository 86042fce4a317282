"""The host's IPv4 routes, read for one question: does a subnet a cluster
wants clash with a network the host already reaches (pyroute2, read-only)."""

from __future__ import annotations

import ipaddress
import socket

from pyroute2 import IPRoute, NetlinkError  # type: ignore[import-untyped]

from hpvc.errors import HpvcError


def overlapping(network: str) -> list[str]:
    """The routes of the host's main table (this network namespace) whose
    destination overlaps ``network``, as ``DEST dev IFNAME``; the default
    route overlaps nothing."""
    want = ipaddress.ip_network(network)
    out: list[str] = []
    try:
        with IPRoute() as ipr:
            names = {int(x["index"]): str(x.get_attr("IFLA_IFNAME")) for x in ipr.get_links()}
            for r in ipr.get_routes(family=socket.AF_INET, table=254):
                dst, plen = r.get_attr("RTA_DST"), int(r["dst_len"])
                if dst is None or plen == 0:
                    continue
                net = ipaddress.ip_network(f"{dst}/{plen}", strict=False)
                if net.overlaps(want):
                    dev = names.get(int(r.get_attr("RTA_OIF") or 0), "?")
                    out.append(f"{net} dev {dev}")
    except (NetlinkError, OSError) as e:
        raise HpvcError("read the host's routes", str(e)) from e
    return out
