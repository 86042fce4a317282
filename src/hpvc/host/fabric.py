"""This host on the fabric that joins a job's hosts: names to addresses, and the MTU.

A site's compute hosts resolve each other by name (DNS or /etc/hosts); the
address a name resolves to is the host's fabric address, the source and
destination of the VXLAN packets of a cluster across hosts (hpvc.host.vxlan).
"""

from __future__ import annotations

import socket

from pyroute2 import IPRoute  # type: ignore[import-untyped]

from hpvc.errors import HpvcError


def address_of(host: str) -> str:
    """The IPv4 address ``host`` resolves to here."""
    try:
        infos = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_DGRAM)
    except socket.gaierror as e:
        raise HpvcError(
            f"job host {host!r}",
            f"does not resolve ({e.strerror})",
            "every compute host must resolve the others' names (DNS or /etc/hosts)",
        ) from None
    return str(infos[0][4][0])


def mtu_of(address: str) -> int:
    """The MTU of this host's interface holding ``address`` (where VXLAN packets leave)."""
    with IPRoute() as ipr:
        for a in ipr.get_addr(family=socket.AF_INET):
            if a.get_attr("IFA_ADDRESS") == address or a.get_attr("IFA_LOCAL") == address:
                link = ipr.link("get", index=a["index"])[0]
                return int(link.get_attr("IFLA_MTU"))
    raise HpvcError(
        f"fabric address {address}",
        "is not an address of this host",
        "this host's name must resolve to one of its own addresses",
    )
