"""Two hosts apart on a private fabric, joined by one cluster network across them.

``two_hosts()`` builds, on this one machine, what a cluster across two hosts
looks like, out of network namespaces (names carry a tag, the PID by default,
so two runs side by side do not collide)::

    fabric netns:  bridge (MTU 9000) ── veth ──┬── host A netns: eth0 10.252.7.1
                                               ├── host B netns: eth0 10.252.7.2
                                               └── (outsider netns: eth0 10.252.7.99)
    host X netns:  cluster bridge ── VXLAN port (hpvc.host.vxlan.join, VNI, filter)
                                  └── veth ── node X netns: eth0 10.97.3.2 / .3

The fabric is ``hpvc.testbed.fabric``'s (the one the Slurm test cluster's
hosts stand on too), built inside the fabric namespace. Each host's part is
made by hpvc's own code (``hpvc.host.net`` and ``hpvc.host.vxlan`` with an
``hpvc.plan.overlay.Overlay``). Both run in a Python child entered into the
namespace with ``nsenter --net`` (netlink sockets, nftables and
``/proc/sys/net`` follow the process's namespace). Every change is journaled
before it is made (architecture rule 5): one journal per host
and one for the fabric, each undone inside its own namespace, and one for the
namespaces themselves, undone last from here. Nothing is routed out of the
namespaces: all traffic stays on the private fabric.

Bridge netfilter (``br_netfilter``): where the kernel has it (built in, or the
module loaded), every *new* network namespace starts with
``net.bridge.bridge-nf-call-{iptables,ip6tables,arptables}`` = 1, so every frame
crossing a bridge in it goes through the IP firewall hooks. A compute host
without Docker or Kubernetes has the module unloaded, and a fabric switch runs
no firewall at all, so by default the fabric's and the hosts' namespaces set
these to 0 (``bridge_netfilter=False``); ``True`` sets 1, as on a host where
Docker or Kubernetes loaded the module. The setting lives and dies with the
namespace (no journal record: it has nothing to restore).

Receive CPUs (``rx_cpus``): a veth delivers a frame on the CPU that sent it, so
without help the sending host's CPU also does the receiving host's kernel work
(for the cluster network: UDP, VXLAN decapsulation, the cluster bridge, the
node's veth and its TCP). Two machines do not share that work: a NIC
interrupts a CPU of its own host. ``rx_cpus=(a, b)`` models that with RPS on
each host's fabric interface, so what arrives at host A is processed on CPU
``a`` and what arrives at host B on CPU ``b`` (the fabric bridge, standing for
the switch, still runs on the sender's CPU). Like the knobs above it belongs
to the namespace's own device and goes with it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpvc.errors import HpvcError
from hpvc.host import net, vxlan
from hpvc.host.journal import Journal
from hpvc.host.probe import BRIDGE_NF_KNOBS
from hpvc.plan.overlay import VXLAN_OVERHEAD, Overlay, Vtep, vni_for
from hpvc.progress import Progress, quiet
from hpvc.testbed import fabric
from hpvc.testbed.fabric import FABRIC_MTU, PREFIXLEN

FABRIC_NET = "10.252.7"  # /24, inside the namespaces only
CLUSTER_NET = "10.97.3"  # the virtual cluster's /24
NODE_MTU = FABRIC_MTU - VXLAN_OVERHEAD
OUTSIDER_ADDRESS = f"{FABRIC_NET}.99"
FABRIC_IFNAME = fabric.IFNAME  # each host's interface on the fabric
CHILD_TIMEOUT_S = 120
_TAG = re.compile(r"[a-z0-9]{1,8}")
_CHILD = "import sys; from hpvc.testbed.pair import child_main; child_main(sys.argv[1:])"


@dataclass(frozen=True)
class Host:
    """One of the two hosts: its namespace and fabric address, and the node it runs."""

    key: str  # "a" or "b"
    netns: str
    address: str  # on the fabric
    bridge_address: str  # its cluster bridge's address on the cluster subnet
    node_netns: str
    node_address: str  # on the cluster subnet
    node_mac: str


@dataclass(frozen=True)
class Testbed:
    """What a benchmark or a test needs to run commands on either host or node."""

    __test__ = False  # not a pytest test class, despite its name

    tag: str
    workdir: str  # the journals
    fabric_netns: str
    fabric_bridge: str
    hosts: tuple[Host, Host]
    outsider_netns: str  # "" without one
    cluster: str
    bridge: str  # the cluster bridge's name on each host
    vxlan_link: str
    vni: int
    fabric_mtu: int = FABRIC_MTU
    node_mtu: int = NODE_MTU
    bridge_netfilter: bool = False  # br_netfilter's IP hooks on the fabric's and hosts' bridges
    rx_cpus: tuple[int, int] | None = None  # RPS: the CPU of host A's and host B's receive work

    @property
    def all_netns(self) -> list[str]:
        """Every namespace the test bed makes, in the order it makes them."""
        names = [self.fabric_netns, *(h.netns for h in self.hosts)]
        names += [self.outsider_netns] if self.outsider_netns else []
        return names + [h.node_netns for h in self.hosts]

    def argv(self, netns: str, *cmd: str) -> list[str]:
        """``cmd`` run inside ``netns`` (nsenter execs it: the PID is the command's)."""
        return ["nsenter", f"--net={net.netns_path(netns)}", *cmd]

    def run(
        self, netns: str, *cmd: str, check: bool = True, timeout: float | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(netns, *cmd), capture_output=True, text=True, check=check, timeout=timeout
        )

    def journal(self, netns: str) -> Path:
        return Path(self.workdir) / f"{netns}.jsonl"

    def bridge_netfilter_state(self) -> dict[str, dict[str, int]]:
        """br_netfilter's knobs as the kernel has them in the fabric's and hosts' namespaces
        (empty per namespace where the kernel has no br_netfilter)."""
        out: dict[str, dict[str, int]] = {}
        for ns in (self.fabric_netns, *(h.netns for h in self.hosts)):
            paths = [f"{net.BRIDGE_NF}/{k}" for k in BRIDGE_NF_KNOBS]
            r = self.run(ns, "sh", "-c", 'for p; do [ -e "$p" ] && cat "$p" || echo -; done',
                         "sh", *paths)  # fmt: skip
            values = r.stdout.split()
            out[ns] = {k: int(v) for k, v in zip(BRIDGE_NF_KNOBS, values, strict=True) if v != "-"}
        return out

    def undo_hosts(self) -> list[str]:
        """Undo what hpvc made inside each host (bridge, VXLAN, filter, veths); errors."""
        errors: list[str] = []
        for h in self.hosts:
            errors += _undo_in(self, h.netns)
        return errors


def layout(
    tag: str,
    workdir: str,
    outsider: bool = False,
    bridge_netfilter: bool = False,
    rx_cpus: tuple[int, int] | None = None,
) -> Testbed:
    """Names and addresses of a test bed tagged ``tag`` (pure)."""
    if not _TAG.fullmatch(tag):
        raise HpvcError(f"test bed tag {tag!r}", "want 1-8 of [a-z0-9]")
    hosts = tuple(
        Host(
            key=k,
            netns=f"hvt{tag}-{k}",
            address=f"{FABRIC_NET}.{i}",
            bridge_address=f"{CLUSTER_NET}.{1 if k == 'a' else 254}",
            node_netns=f"hvt{tag}-n{k}",
            node_address=f"{CLUSTER_NET}.{i + 1}",
            node_mac=f"02:aa:00:00:00:{i + 1:02x}",
        )
        for i, k in ((1, "a"), (2, "b"))
    )
    cluster = f"testbed-{tag}"
    return Testbed(
        tag=tag,
        workdir=workdir,
        fabric_netns=f"hvt{tag}-fab",
        fabric_bridge=f"hvf{tag}",
        hosts=(hosts[0], hosts[1]),
        outsider_netns=f"hvt{tag}-x" if outsider else "",
        cluster=cluster,
        bridge=f"hvc{tag}",
        vxlan_link=vxlan.link_name(cluster),
        vni=vni_for(cluster),
        bridge_netfilter=bridge_netfilter,
        rx_cpus=rx_cpus,
    )


def overlay(bed: Testbed, me: Host) -> Overlay:
    """Host ``me``'s view of the cluster network: the other host and its node."""
    other = next(h for h in bed.hosts if h.key != me.key)
    node = (f"node-{other.key}", other.node_address, other.node_mac)
    return Overlay(
        vni=bed.vni,
        local=me.address,
        remotes=(Vtep(other.netns, other.address, (node,)),),
        mtu=bed.node_mtu,
    )


@contextmanager
def two_hosts(
    tag: str | None = None,
    outsider: bool = False,
    progress: Progress = quiet,
    bridge_netfilter: bool = False,
    rx_cpus: tuple[int, int] | None = None,
) -> Iterator[Testbed]:
    """Build the test bed, yield it, undo it all (also on failure).

    ``outsider``: a third fabric host outside the cluster (to check the VNI filter).
    ``bridge_netfilter``: br_netfilter's IP hooks on (as on a Docker host) or off.
    ``rx_cpus``: the CPUs host A's and host B's receive work runs on (None: the sender's).
    An undo that fails keeps the journals and names them.
    """
    tag = tag or str(os.getpid() % 100000)
    if not _TAG.fullmatch(tag):
        raise HpvcError(f"test bed tag {tag!r}", "want 1-8 of [a-z0-9]")
    workdir = tempfile.mkdtemp(prefix=f"hpvc-testbed-{tag}-")
    bed = layout(tag, workdir, outsider, bridge_netfilter, rx_cpus)
    top = Journal(Path(workdir) / "namespaces.jsonl")
    failed = True
    try:
        progress(f"test bed: namespaces {', '.join(bed.all_netns)}")
        fabric.make_namespaces(top, bed.all_netns)
        progress(f"test bed: fabric bridge, MTU {bed.fabric_mtu}")
        _in_netns(bed, bed.fabric_netns, "fabric", _fabric_args(bed))
        for h in bed.hosts:
            progress(f"test bed: host {h.key} joins VNI {bed.vni}, node {h.node_address}")
            _in_netns(bed, h.netns, "host", _host_args(bed, h))
        if rx_cpus is not None:
            progress(f"test bed: host A receives on CPU {rx_cpus[0]}, host B on {rx_cpus[1]}")
            for h, cpu in zip(bed.hosts, rx_cpus, strict=True):
                rx_masks(bed, h.netns, FABRIC_IFNAME, 1 << cpu)
        yield bed
        failed = False
    finally:
        errors = bed.undo_hosts() + _undo_in(bed, bed.fabric_netns) + top.undo_all()
        if not errors:
            shutil.rmtree(workdir, ignore_errors=True)
        elif not failed:
            raise HpvcError("test bed: undo", errors[0], f"journals kept in {workdir}")
        else:
            progress(f"test bed: undo failed ({errors[0]}); journals kept in {workdir}")


# Inside a network namespace, /sys still shows the namespace the process started
# in; a private mount namespace with a fresh sysfs shows this one's devices.
_RPS = (
    'mount -t sysfs sysfs /sys && for q in /sys/class/net/"$1"/queues/rx-*/rps_cpus;'
    ' do if [ -n "$2" ]; then echo "$2" > "$q"; fi && cat "$q"; done'
)


def _cpumask(mask: int) -> str:
    """``mask`` as the kernel writes CPU masks: hex in 32-bit words joined by commas."""
    text = f"{mask:x}"
    text = "0" * (-len(text) % 8) + text
    return ",".join(text[i : i + 8] for i in range(0, len(text), 8))


def rx_masks(bed: Testbed, netns: str, ifname: str, mask: int | None = None) -> list[int]:
    """The RPS CPU masks of ``ifname``'s receive queues in ``netns`` (0: processed where
    it arrives), after setting them to ``mask`` unless it is None."""
    what = f"test bed: receive CPUs of {ifname} in {netns}"
    argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", _RPS, "sh", ifname]
    r = bed.run(netns, *argv, "" if mask is None else _cpumask(mask), check=False)
    try:
        masks = [int(x.replace(",", ""), 16) for x in r.stdout.split()]
    except ValueError:
        masks = []
    if r.returncode != 0 or not masks:
        raise HpvcError(what, (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1])
    if mask is not None and any(m != mask for m in masks):
        raise HpvcError(what, f"asked for {mask:x}, the kernel has {masks}")
    return masks


def _fabric_args(bed: Testbed) -> dict[str, Any]:
    ports = [(h.key, h.netns, h.address) for h in bed.hosts]
    if bed.outsider_netns:
        ports.append(("x", bed.outsider_netns, OUTSIDER_ADDRESS))
    return {
        "journal": str(bed.journal(bed.fabric_netns)),
        "bridge_netfilter": bed.bridge_netfilter,
        "bridge": bed.fabric_bridge,
        "mtu": bed.fabric_mtu,
        "ports": [
            {"netns": ns, "ifname": f"{bed.fabric_bridge}{k}", "address": a} for k, ns, a in ports
        ],
    }


def _host_args(bed: Testbed, h: Host) -> dict[str, Any]:
    return {
        "journal": str(bed.journal(h.netns)),
        "bridge_netfilter": bed.bridge_netfilter,
        "cluster": bed.cluster,
        "bridge": bed.bridge,
        "bridge_address": h.bridge_address,
        "overlay": overlay(bed, h).to_json(),
        "node": {
            "netns": h.node_netns,
            "ifname": f"hvn{bed.tag}{h.key}",
            "address": h.node_address,
            "mac": h.node_mac,
        },
        "neighbors": [[x.node_address, x.node_mac] for x in bed.hosts],
    }


def _in_netns(bed: Testbed, netns: str, op: str, args: dict[str, Any]) -> Any:
    """Run ``op`` of ``child_main`` in a Python child inside ``netns``; its JSON answer."""
    argv = bed.argv(netns, sys.executable, "-c", _CHILD, op, json.dumps(args))
    try:
        r = subprocess.run(
            argv, capture_output=True, text=True, check=False, timeout=CHILD_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise HpvcError(f"test bed: {op} in {netns}", str(e)) from e
    if r.returncode != 0:
        lines = (r.stderr or r.stdout).strip().splitlines()
        raise HpvcError(
            f"test bed: {op} in {netns}", lines[-1] if lines else f"exit {r.returncode}"
        )
    return json.loads(r.stdout)


def _undo_in(bed: Testbed, netns: str) -> list[str]:
    """Undo ``netns``'s journal inside it (nothing to do when either is gone)."""
    if not bed.journal(netns).exists() or not os.path.exists(net.netns_path(netns)):
        return []
    try:
        errors = _in_netns(bed, netns, "undo", {"journal": str(bed.journal(netns))})
    except HpvcError as e:
        return [e.line()]
    return [str(x) for x in errors]


# --- inside a host's namespace (the child) -------------------------------------------


def _op_fabric(args: dict[str, Any]) -> Any:
    net.set_bridge_netfilter(bool(args["bridge_netfilter"]))
    ports = tuple(fabric.Port(p["netns"], p["ifname"], p["address"]) for p in args["ports"])
    fabric.build(
        Journal(args["journal"]), fabric.Fabric(str(args["bridge"]), ports, mtu=int(args["mtu"]))
    )
    return None


def _op_host(args: dict[str, Any]) -> Any:
    net.set_bridge_netfilter(bool(args["bridge_netfilter"]))
    j = Journal(args["journal"])
    o = Overlay.from_json(args["overlay"])
    bridge, node = str(args["bridge"]), args["node"]
    net.ensure_bridge(j, bridge, args["bridge_address"], PREFIXLEN, o.mtu)
    vxlan.hold_port(j, o.port)  # as `hpvc node prepare` does when a host starts
    link = vxlan.join(j, str(args["cluster"]), bridge, o)
    net.add_node_link(
        j, bridge=bridge, netns=node["netns"], host_ifname=node["ifname"], mtu=o.mtu,
        address=node["address"], prefixlen=PREFIXLEN, mac=node["mac"],
        gateway=args["bridge_address"],
    )  # fmt: skip
    net.set_static_neighbors(node["netns"], [(str(ip), str(mac)) for ip, mac in args["neighbors"]])
    return link


def _op_undo(args: dict[str, Any]) -> Any:
    return Journal(args["journal"]).undo_all()


_OPS = {"fabric": _op_fabric, "host": _op_host, "undo": _op_undo}


def child_main(argv: list[str]) -> None:
    """Entry of the child run inside a namespace: ``OP JSON`` -> JSON on stdout."""
    op, args = argv[0], json.loads(argv[1])
    try:
        out = _OPS[op](args)
    except HpvcError as e:
        sys.stderr.write(e.line() + "\n")
        sys.exit(1)
    sys.stdout.write(json.dumps(out) + "\n")
