"""The test beds' pure parts: the two hosts' layout, the fabric's, br_netfilter's knobs,
CPU masks."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpvc.errors import HpvcError
from hpvc.host import net
from hpvc.host.probe import BRIDGE_NF_KNOBS
from hpvc.testbed import fabric
from hpvc.testbed import pair as testbed


def test_by_default_the_test_bed_models_hosts_without_br_netfilter() -> None:
    bed = testbed.layout("t1", "/nowhere")
    assert bed.bridge_netfilter is False and bed.rx_cpus is None
    bed = testbed.layout("t1", "/nowhere", bridge_netfilter=True, rx_cpus=(0, 1))
    assert bed.bridge_netfilter is True and bed.rx_cpus == (0, 1)


def test_bridge_netfilter_knobs_are_set_where_the_kernel_has_them(tmp_path: Path) -> None:
    assert net.set_bridge_netfilter(False, str(tmp_path)) == {}  # no br_netfilter: nothing
    for knob in BRIDGE_NF_KNOBS:
        (tmp_path / knob).write_text("1\n")
    assert net.set_bridge_netfilter(False, str(tmp_path)) == dict.fromkeys(BRIDGE_NF_KNOBS, 0)
    assert net.set_bridge_netfilter(True, str(tmp_path)) == dict.fromkeys(BRIDGE_NF_KNOBS, 1)


@pytest.mark.parametrize(
    ("mask", "text"),
    [(1, "00000001"), (2, "00000002"), (1 << 40, "00000100,00000000")],
)
def test_cpu_masks_are_written_as_the_kernel_writes_them(mask: int, text: str) -> None:
    assert testbed._cpumask(mask) == text


def test_the_fabric_gives_each_host_a_mac_from_its_address() -> None:
    assert fabric.mac_for("10.250.0.1") == "02:fb:0a:fa:00:01"
    assert fabric.mac_for("10.252.7.99") == "02:fb:0a:fc:07:63"
    port = fabric.Port("hvt1-a", "hvf1a", "10.252.7.1")
    assert port.mac == fabric.mac_for(port.address)


def test_the_two_hosts_stand_on_the_fabric_builder() -> None:
    bed = testbed.layout("t1", "/nowhere", outsider=True)
    args = testbed._fabric_args(bed)
    ports = tuple(fabric.Port(p["netns"], p["ifname"], p["address"]) for p in args["ports"])
    fabric.check(fabric.Fabric(args["bridge"], ports, mtu=args["mtu"]))  # a fabric that works
    assert [p.netns for p in ports] == [h.netns for h in bed.hosts] + [bed.outsider_netns]
    assert args["mtu"] == fabric.FABRIC_MTU and testbed.FABRIC_IFNAME == net.NODE_IFNAME


@pytest.mark.parametrize(
    ("ports", "address", "why"),
    [
        ((("a", "vethaaaaaaaaaaaa", "10.0.0.1"),), "", "1-15 characters"),
        ((("a", "va", "10.0.0.1"), ("b", "va", "10.0.0.2")), "", "share an interface"),
        ((("a", "va", "10.0.0.1"), ("a", "vb", "10.0.0.2")), "", "share an interface"),
        ((("a", "va", "10.0.0.1"), ("b", "vb", "10.0.0.1")), "", "share an address"),
        ((("a", "va", "10.0.0.1"),), "10.0.0.1", "share an address"),
        ((("a", "va", "10.0.0.1"), ("b", "vb", "10.0.1.2")), "", "10.0.1.2 outside"),
    ],
)
def test_a_fabric_that_cannot_work_is_refused(
    ports: tuple[tuple[str, str, str], ...], address: str, why: str
) -> None:
    fab = fabric.Fabric("fab", tuple(fabric.Port(*p) for p in ports), address)
    with pytest.raises(HpvcError, match=why):
        fabric.check(fab)
