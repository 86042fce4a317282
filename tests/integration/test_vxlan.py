"""The cluster network across hosts (hpvc.host.vxlan) between two hosts that are apart.

Two "hosts" are network namespaces on a private fabric bridge (itself in a
namespace of its own, MTU 9000), made by ``hpvc.testbed.pair``: each gets a
cluster bridge joined by VXLAN, and one node (a namespace with a veth on the
bridge, static ARP). The node on host A must reach the node on host B over
the cluster subnet; the forwarding entries are the static ones hpvc wrote, and
the bridge sends frames to a remote node to the VXLAN port only (not flooded
to its other ports); a
VXLAN packet into the VNI from an address outside the cluster's hosts is
dropped (the filter's counter moves, the node never sees it) while one from
the peer host's kernel (a source port below 1024) is not; the journals undo
everything. All traffic stays inside namespaces the test bed made.

Two attacks of an ordinary user (a test tenant, tests/tenants.py) on a host
of the cluster (issue 25, items 2 and 5):

* a plain UDP socket sends a VXLAN frame (broadcast ARP) with the cluster's
  VNI to its own host's fabric address, to the other host's, and, bound with
  IP_FREEBIND to the other host's address, to its own host's: no frame
  reaches the cluster's VXLAN link on either host, and the filter counts
  each one dropped;
* the user binds the VXLAN port: refused where hpvc holds it; on a host
  where the user bound it first, hpvc's holder refuses in one line naming the
  user's uid and the fix, and ``hpvc doctor``'s check says so; once the user's
  process is gone the holder takes the port and the user's bind is refused.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from hpvc.bench.slurm.cluster import Submitter
from hpvc.plan.overlay import VXLAN_OVERHEAD, VXLAN_PORT
from hpvc.testbed import pair as testbed
from hpvc.testbed.pair import Testbed
from tests.helpers import requires
from tests.tenants import tenants


def py_in(bed: Testbed, ns: str, code: str, *args: str) -> str:
    r = bed.run(ns, sys.executable, "-c", code, *args, check=False)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def vxlan_packet(vni: int) -> str:
    """Python that sends one VXLAN frame for ``vni`` (to a broadcast MAC) to argv[1],
    from the address argv[2] (bound with IP_FREEBIND: it need not be this host's) and
    port argv[3] when given."""
    return (
        "import socket, sys\n"
        f"hdr = bytes([8, 0, 0, 0]) + ({vni} << 8).to_bytes(4, 'big')\n"
        "frame = b'\\xff' * 6 + b'\\x02' + b'\\x00' * 5 + b'\\x08\\x06' + b'\\x00' * 28\n"
        "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        "if len(sys.argv) > 2:\n"
        "    s.setsockopt(socket.IPPROTO_IP, 15, 1)  # IP_FREEBIND\n"
        "    s.bind((sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 0))\n"
        "s.sendto(hdr + frame, (sys.argv[1], 4789))\n"
    )


def as_user(user: Submitter, *cmd: str) -> list[str]:
    """``cmd`` run with ``user``'s ids and no supplementary groups."""
    return ["setpriv", f"--reuid={user.uid}", f"--regid={user.gid}", "--clear-groups", *cmd]


def check_forwarding(bed: Testbed) -> None:
    """Static forwarding, no learning, on each host."""
    a, b = bed.hosts
    link = bed.run(a.netns, "ip", "-d", "-j", "link", "show", bed.vxlan_link).stdout
    data = json.loads(link)[0]["linkinfo"]["info_data"]
    assert data["id"] == bed.vni and data["learning"] is False
    fdb = bed.run(a.netns, "bridge", "-j", "fdb", "show", "dev", bed.vxlan_link).stdout
    entries = {(e["mac"], e.get("dst")) for e in json.loads(fdb) if e.get("dst")}
    assert (b.node_mac, b.address) in entries
    assert ("00:00:00:00:00:00", b.address) in entries


def tx_packets(bed: Testbed, ns: str, ifname: str) -> int:
    link = json.loads(bed.run(ns, "ip", "-s", "-j", "link", "show", "dev", ifname).stdout)[0]
    return int(link["stats64"]["tx"]["packets"])


def check_no_flooding(bed: Testbed) -> None:
    """Frames to a remote node go to the VXLAN port only, not to every port of the bridge."""
    a, b = bed.hosts
    static = f"from hpvc.host import vxlan; print(vxlan.bridge_entries({bed.vxlan_link!r}))"
    assert py_in(bed, a.netns, static) == str([b.node_mac])
    # Another port on host A's bridge (as a second local node's veth would be).
    port, peer = f"hvp{bed.tag}", f"hvq{bed.tag}"
    bed.run(a.netns, "ip", "link", "add", port, "type", "veth", "peer", "name", peer)
    try:
        for cmd in (["master", bed.bridge, "up"], ["up"]):
            bed.run(a.netns, "ip", "link", "set", port if "master" in cmd else peer, *cmd)
        before = tx_packets(bed, a.netns, port)
        ping = bed.run(a.node_netns, "ping", "-q", "-c", "50", "-i", "0.002", "-W", "2",
                       b.node_address, check=False)  # fmt: skip
        assert ping.returncode == 0, ping.stdout + ping.stderr
        assert tx_packets(bed, a.netns, port) - before < 10, "frames to a remote node flooded"
    finally:
        bed.run(a.netns, "ip", "link", "del", port, check=False)


def check_node_to_node(bed: Testbed) -> None:
    """Node to node across hosts, by the cluster subnet, full-size frames unfragmented."""
    a, b = bed.hosts
    ping = bed.run(a.node_netns, "ping", "-c", "2", "-W", "2", b.node_address, check=False)
    assert ping.returncode == 0, ping.stdout + ping.stderr
    assert bed.node_mtu == bed.fabric_mtu - VXLAN_OVERHEAD
    size = str(bed.node_mtu - 28)  # ICMP payload of a full node frame
    mtu = bed.run(a.node_netns, "ping", "-c", "1", "-W", "2", "-M", "do", "-s", size,
                  b.node_address, check=False)  # fmt: skip
    assert mtu.returncode == 0, "a full-size node frame must cross the fabric unfragmented"


def dropped(bed: Testbed, ns: str) -> int:
    return int(py_in(bed, ns, f"from hpvc.host import vxlan; print(vxlan.dropped({bed.vni}))"))


def check_filter(bed: Testbed) -> None:
    """Only the cluster's hosts may inject into its VNI."""
    a, b = bed.hosts
    before = dropped(bed, a.netns)
    for _ in range(2):
        bed.run(bed.outsider_netns, sys.executable, "-c", vxlan_packet(bed.vni), a.address)
    assert dropped(bed, a.netns) == before + 2
    seen = injected(bed)
    # The peer host's kernel sends from a port below 1024 (root may bind one).
    bed.run(b.netns, sys.executable, "-c", vxlan_packet(bed.vni), a.address, b.address, "600")
    assert dropped(bed, a.netns) == before + 2  # let through
    assert injected(bed) == {"a": seen["a"] + 1, "b": seen["b"]}


INJECTED_MAC = "02:00:00:00:00:00"  # the source MAC of ``vxlan_packet``'s frame
WATCH = "hvtwatch"  # a netdev table the test puts on each host's VXLAN link


def watch(bed: Testbed, on: bool) -> None:
    """Count (on) or stop counting (off) frames from ``INJECTED_MAC`` that come out of
    each host's VXLAN link, whatever else the nodes send meanwhile."""
    for h in bed.hosts:
        bed.run(h.netns, "nft", "delete", "table", "netdev", WATCH, check=False)
        if on:
            hook = f'{{ type filter hook ingress device "{bed.vxlan_link}" priority 0; }}'
            bed.run(h.netns, "nft", "add", "table", "netdev", WATCH)
            bed.run(h.netns, "nft", "add", "chain", "netdev", WATCH, "rx", hook)
            bed.run(h.netns, "nft", "add", "rule", "netdev", WATCH, "rx", "ether", "saddr",
                    INJECTED_MAC, "counter")  # fmt: skip


def injected(bed: Testbed) -> dict[str, int]:
    out = {}
    for h in bed.hosts:
        table = json.loads(bed.run(h.netns, "nft", "-j", "list", "table", "netdev", WATCH).stdout)
        counters = [e["counter"]["packets"] for i in table["nftables"]
                    for e in i.get("rule", {}).get("expr", []) if "counter" in e]  # fmt: skip
        assert len(counters) == 1, table
        out[h.key] = int(counters[0])
    return out


def check_users_cannot_inject(bed: Testbed, user: Submitter) -> None:
    """Issue 25 item 2: an ordinary user on host B sends into the cluster's VNI, to
    host B itself, to host A, and from host A's address (IP_FREEBIND) to host B."""
    a, b = bed.hosts
    drops = {h.key: dropped(bed, h.netns) for h in bed.hosts}
    seen = injected(bed)
    send = ["nsenter", f"--net=/run/netns/{b.netns}", *as_user(user, sys.executable, "-c")]
    refused = 0
    for target, source in ((b.address, ()), (a.address, ()), (b.address, (a.address,))):
        r = subprocess.run([*send, vxlan_packet(bed.vni), target, *source],
                           capture_output=True, text=True, check=False)  # fmt: skip
        # Dropped on its way out (the user's sendto gets EPERM from the output hook), or,
        # from another host's address to this one, not even routed (ENETUNREACH).
        assert r.returncode != 0, "the user's VXLAN packet left the socket"
        sent = "Operation not permitted" in r.stderr
        assert sent or (source and "Network is unreachable" in r.stderr), r.stderr
        refused += sent
    # A user cannot send from the kernel's source ports, which the filter relies on.
    low = subprocess.run([*send, vxlan_packet(bed.vni), a.address, b.address, "600"],
                         capture_output=True, text=True, check=False)  # fmt: skip
    assert low.returncode != 0 and "Permission denied" in low.stderr, low.stderr
    assert injected(bed) == seen
    assert refused >= 2 and dropped(bed, b.netns) == drops["b"] + refused
    assert dropped(bed, a.netns) == drops["a"]
    # Behind that, input: what a local process sends to a local address arrives on lo and
    # is dropped, even from a kernel source port (root may bind one).
    bed.run(b.netns, sys.executable, "-c", vxlan_packet(bed.vni), b.address, b.address, "600")
    assert dropped(bed, b.netns) == drops["b"] + refused + 1
    assert injected(bed) == seen
    check_node_to_node(bed)  # the cluster's own traffic still flows


BIND = (
    "import socket, sys, time\n"
    "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
    "try:\n"
    "    s.bind(('0.0.0.0', int(sys.argv[1])))\n"
    "except OSError as e:\n"
    "    print(e.strerror); sys.exit(3)\n"
    "print('bound', flush=True)\n"
    "time.sleep(float(sys.argv[2]))\n"
)

HOLD = (
    "import json, sys\n"
    "from hpvc.errors import HpvcError\n"
    "from hpvc.host import doctor, vxlan\n"
    "from hpvc.host.journal import Journal\n"
    "out = {'doctor': doctor.check_vxlan_port().as_dict()}\n"
    "try:\n"
    "    out['held'] = vxlan.hold_port(Journal(sys.argv[1]))\n"
    "except HpvcError as e:\n"
    "    out['error'] = e.line()\n"
    "print(json.dumps(out))\n"
)

UNDO = "import sys; from hpvc.host.journal import Journal; print(Journal(sys.argv[1]).undo_all())"


def check_port_is_held(bed: Testbed, user: Submitter, tmp: Path) -> None:
    """Issue 25 item 5: an ordinary user binds the VXLAN port to keep clusters out."""
    a = bed.hosts[0]
    port = str(VXLAN_PORT)

    def bind(ns: str, *extra: str) -> list[str]:
        return bed.argv(ns, *as_user(user, sys.executable, "-c", BIND, port, *extra))

    # Where hpvc holds it (the test bed's hosts, as after `hpvc node prepare`): refused.
    r = subprocess.run(bind(a.netns, "0"), capture_output=True, text=True, check=False)
    assert r.returncode == 3 and "Address already in use" in r.stdout, r.stdout + r.stderr
    held = json.loads(py_in(bed, a.netns, HOLD, str(tmp / "a.jsonl")))
    assert held["doctor"]["status"] == "ok" and held["held"] is False, held
    # Where the user came first (the outsider, an idle host): a clear refusal, and doctor
    # names the user; once their process is gone, hpvc holds the port.
    ns, journal = bed.outsider_netns, str(tmp / "x.jsonl")
    squatter = subprocess.Popen(bind(ns, "60"), stdout=subprocess.PIPE, text=True)
    try:
        assert squatter.stdout is not None and squatter.stdout.readline().strip() == "bound"
        refused = json.loads(py_in(bed, ns, HOLD, journal))
        assert refused["doctor"]["status"] == "missing", refused
        assert f"uid {user.uid}" in refused["doctor"]["detail"], refused
        assert "hpvc node prepare" in refused["doctor"]["fix"], refused
        assert f"uid {user.uid}" in refused["error"] and "hpvc node prepare" in refused["error"]
    finally:
        squatter.kill()
        squatter.wait()
    try:
        held = json.loads(py_in(bed, ns, HOLD, journal))
        assert held["doctor"]["status"] == "warn" and "error" not in held, held
        r = subprocess.run(bind(ns, "0"), capture_output=True, text=True, check=False)
        assert r.returncode == 3 and "Address already in use" in r.stdout, r.stdout + r.stderr
    finally:
        assert py_in(bed, ns, UNDO, journal) == "[]"
    assert "hpvc-vxport" not in bed.run(ns, "ip", "-o", "link").stdout


def check_model_of_two_machines(bed: Testbed, cpus: tuple[int, int]) -> None:
    """Each host receives on its own CPU; bridged frames skip the IP firewall hooks."""
    for h, cpu in zip(bed.hosts, cpus, strict=True):
        assert testbed.rx_masks(bed, h.netns, testbed.FABRIC_IFNAME) == [1 << cpu]
    knobs = bed.bridge_netfilter_state()
    assert set(knobs) == {bed.fabric_netns, *(h.netns for h in bed.hosts)}
    assert all(v == 0 for k in knobs.values() for v in k.values()), knobs


def test_nodes_on_two_hosts_share_one_network(tmp_path: Path) -> None:
    requires("root", "ip", "nft", "ping")
    mine = sorted(os.sched_getaffinity(0))
    cpus = (mine[0], mine[-1])
    with tenants() as (user, _), testbed.two_hosts(outsider=True, rx_cpus=cpus) as bed:
        check_model_of_two_machines(bed, cpus)
        check_forwarding(bed)
        check_node_to_node(bed)
        check_no_flooding(bed)
        watch(bed, True)
        try:
            check_filter(bed)
            check_users_cannot_inject(bed, user)
        finally:
            watch(bed, False)
        check_port_is_held(bed, user, tmp_path)
        # hpvc's journals undo what it made inside each host.
        assert bed.undo_hosts() == []
        for h in bed.hosts:
            links = bed.run(h.netns, "ip", "-o", "link").stdout
            assert "vx" not in links and bed.bridge not in links
            tables = bed.run(h.netns, "nft", "list", "tables").stdout
            assert f"hpvc-vni{bed.vni}" not in tables and "hpvc-vxport" not in tables
    for ns in bed.all_netns:
        assert not Path(f"/run/netns/{ns}").exists()
    assert not Path(bed.workdir).exists()
