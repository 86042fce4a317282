"""The two-host test bed's pure parts: its layout, br_netfilter's knobs, CPU masks."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpvc.cluster import testbed
from hpvc.host import net
from hpvc.host.probe import BRIDGE_NF_KNOBS


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
