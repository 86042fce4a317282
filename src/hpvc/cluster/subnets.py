"""One subnet per cluster on a host: ``hpvc up`` refuses a subnet that
overlaps another cluster's or a network the host already routes (two bridges
with one subnet mean duplicate routes, and traffic for one cluster reaching
another's nodes), and gives a spec that names none a free /24."""

from __future__ import annotations

import ipaddress
from typing import Any

from hpvc.errors import InputError
from hpvc.host import routes
from hpvc.spec import Spec
from hpvc.store import Store

POOL = "10.88.0.0/16"  # where a spec that names no subnet gets a free /24


def _clashes(store: Store, name: str, net: ipaddress.IPv4Network) -> list[str]:
    """What on this host ``net`` would overlap: other clusters' subnets, host routes."""
    out = []
    for other in store.names():
        rec = store.load(other) if other != name else None
        theirs = str(rec.plan.get("network", {}).get("subnet", "")) if rec is not None else ""
        if theirs and ipaddress.ip_network(theirs).overlaps(net):
            out.append(f"cluster {other!r} ({theirs})")
    return out + [f"the host route {r}" for r in routes.overlapping(str(net))]


def claim_subnet(store: Store, spec: Spec, doc: dict[str, Any]) -> tuple[Spec, dict[str, Any]]:
    """The spec with a subnet nothing on this host overlaps (under the state
    lock): the one it names, or a refusal naming the clash; without one, the
    first free /24 of 10.88.0.0/16 (the default's neighbours)."""
    net = spec.network.network
    clash = _clashes(store, spec.name, net)
    named = "subnet" in doc.get("network", {})
    if not clash:
        # Recorded as chosen, so that a later scale plans the same network.
        return spec, doc if named else {
            **doc,
            "network": {**doc.get("network", {}), "subnet": str(net)},
        }
    if named:
        raise InputError(
            f"network.subnet = {net}",
            f"overlaps {clash[0]}",
            "pick a subnet no running cluster (hpvc ls) and no host route (ip route) overlaps",
        )
    for free in ipaddress.IPv4Network(POOL).subnets(new_prefix=max(24, net.prefixlen)):
        if not _clashes(store, spec.name, free):
            network = spec.network.model_copy(update={"subnet": str(free)})
            doc = {**doc, "network": {**doc.get("network", {}), "subnet": str(free)}}
            return spec.model_copy(update={"network": network}), doc
    raise InputError(
        "network.subnet", f"every /24 of {POOL} is in use on this host", "give the spec one"
    )
