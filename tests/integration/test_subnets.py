"""One subnet per cluster on a host (issue 17, point 5): a subnet that overlaps
a running cluster's (the same, a /25 inside it, a /16 around it) or a route
the host already has is refused at plan time with exit 2 and nothing made; a
spec that names no subnet gets a free one."""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpvc.cluster import lifecycle
from hpvc.errors import InputError
from hpvc.store import Store
from tests.helpers import ROOT
from tests.integration.test_cluster import cli_env, image_ready, leftovers, store

__all__ = ["store"]  # the fixture, shared with test_cluster

OCTET = 100 + os.getpid() % 100


def spec(tmp_path: Path, name: str, subnet: str | None) -> str:
    p = tmp_path / f"{name}.toml"
    net = f'[network]\nsubnet = "{subnet}"\n' if subnet else ""
    p.write_text(
        f'name = "{name}"\nkind = "container"\n{net}'
        '[tuning]\npinning = "shared"\nhugepages = "none"\npartition = "commodity"\n'
        '[[nodes]]\nrole = "compute"\ncount = 1\nmemory = "128MiB"\n'
    )
    return str(p)


def test_overlapping_subnets_are_refused_with_nothing_made(store: Store, tmp_path: Path) -> None:
    image_ready()
    first = f"sa{os.getpid() % 10000}"
    lifecycle.up(spec(tmp_path, first, f"10.77.{OCTET}.0/24"), store)
    for i, subnet in enumerate([f"10.77.{OCTET}.0/24", f"10.77.{OCTET}.128/25", "10.77.0.0/16"]):
        name = f"sb{i}{os.getpid() % 1000}"
        with pytest.raises(InputError, match=f"overlaps cluster '{first}'") as e:
            lifecycle.up(spec(tmp_path, name, subnet), store)
        assert e.value.exit_code == 2
        assert store.names() == [first] and leftovers(name) == []
    # The command line says it in one line, exit 2.
    r = subprocess.run(
        [sys.executable, "-m", "hpvc", "up", spec(tmp_path, "sc", f"10.77.{OCTET}.0/25")],
        env=cli_env(store), cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().count("\n") == 0 and f"overlaps cluster '{first}'" in r.stderr


def test_a_subnet_the_host_routes_is_refused(store: Store, tmp_path: Path) -> None:
    """A network the host reaches already (here a bridge of the test's own)."""
    image_ready()
    dev = f"hpvcrt{os.getpid() % 10000}"
    subprocess.run(["ip", "link", "add", dev, "type", "bridge"], check=True)
    try:
        subprocess.run(["ip", "addr", "add", f"10.76.{OCTET}.1/24", "dev", dev], check=True)
        subprocess.run(["ip", "link", "set", dev, "up"], check=True)
        name = f"sr{os.getpid() % 10000}"
        with pytest.raises(InputError, match=f"the host route 10.76.{OCTET}.0/24 dev {dev}"):
            lifecycle.up(spec(tmp_path, name, f"10.76.{OCTET}.64/26"), store)
        assert store.names() == [] and leftovers(name) == []
    finally:
        subprocess.run(["ip", "link", "del", dev], check=False)


def test_a_spec_without_a_subnet_gets_a_free_one(store: Store, tmp_path: Path) -> None:
    image_ready()
    names = [f"sf{i}{os.getpid() % 1000}" for i in range(2)]
    recs = [lifecycle.up(spec(tmp_path, n, None), store) for n in names]
    nets = [ipaddress.ip_network(r.plan["network"]["subnet"]) for r in recs]
    assert not nets[0].overlaps(nets[1]), nets
    assert all(n.subnet_of(ipaddress.ip_network("10.88.0.0/16")) for n in nets), nets
    assert [r.spec["network"]["subnet"] for r in recs] == [str(n) for n in nets]
