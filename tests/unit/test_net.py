"""Interface names for the cluster network: short, deterministic, and apart from the taps."""

from __future__ import annotations

import re

import pytest

from hpvc.host.net import netns_path, short_ifname


def test_short_ifname_is_15_chars_and_deterministic() -> None:
    name = short_ifname("hc", "cluster-with-a-very-long-name", "compute-0017")
    assert len(name) == 15
    assert re.fullmatch(r"hc[0-9a-f]{13}", name)
    assert name == short_ifname("hc", "cluster-with-a-very-long-name", "compute-0017")


def test_short_ifname_depends_on_every_part_and_their_boundaries() -> None:
    base = short_ifname("hc", "c1", "n1")
    assert short_ifname("hc", "c1", "n2") != base
    assert short_ifname("hc", "c2", "n1") != base
    assert short_ifname("hc", "c1n1") != base
    assert short_ifname("hc", "c", "1n1") != base


def test_short_ifname_has_no_collision_over_a_large_cluster() -> None:
    names = {short_ifname("hc", "c", f"node{i}") for i in range(20_000)}
    assert len(names) == 20_000


def test_short_ifname_cannot_look_like_a_renderer_tap() -> None:
    # Taps are "hv" + 12 hex (14 chars); ours start with "hc" and are 15 long.
    assert not re.fullmatch(r"hv[0-9a-f]{12}", short_ifname("hc", "x"))


@pytest.mark.parametrize("prefix", ["", "HC", "1c", "toolong8", "h-c"])
def test_short_ifname_rejects_bad_prefixes(prefix: str) -> None:
    with pytest.raises(ValueError):
        short_ifname(prefix, "x")


def test_short_ifname_needs_parts() -> None:
    with pytest.raises(ValueError):
        short_ifname("hc")


def test_netns_path() -> None:
    assert netns_path("hpvc-c-n1") == "/run/netns/hpvc-c-n1"
    assert netns_path("/run/netns/x") == "/run/netns/x"
