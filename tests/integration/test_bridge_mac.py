"""A cluster bridge keeps its MAC address while taps come and go (issue 27).

A Linux bridge whose address was never set takes its lowest port's MAC and
changes it when that port leaves; a live migration swaps a node's tap, so
without ``hpvc.host.net._pin_mac`` the host's address on the bridge (the
guests' gateway) could change MAC under the guests' ARP entries. Here: a
bridge made by ``net.ensure_bridge``, a tap with a MAC lower than any other
joins and leaves, and the bridge's MAC is the same throughout. Everything
runs in a network namespace of its own (``unshare --net``), gone when the
child exits: nothing is made on the host's network.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT, requires

pytestmark = pytest.mark.integration

CHILD = """
import json, subprocess, sys
from pathlib import Path
from hpvc.host import net
from hpvc.host.journal import Journal

def mac(name):
    out = subprocess.run(["ip", "-j", "link", "show", name], capture_output=True, text=True,
                         check=True).stdout
    return json.loads(out)[0]["address"]

j = Journal(Path(sys.argv[1]))
seen = {}
net.ensure_bridge(j, "hpvc-mactest", "10.9.9.1", 24, 1500)
seen["made"] = mac("hpvc-mactest")
net.create_tap(j, "hvmac1", "hpvc-mactest", 1500)
net.create_tap(j, "hvmac2", "hpvc-mactest", 1500)
seen["two taps"] = mac("hpvc-mactest")
subprocess.run(["ip", "link", "set", "hvmac2", "address", "02:00:00:00:00:01"], check=True)
seen["a lower tap"] = mac("hpvc-mactest")
subprocess.run(["ip", "link", "del", "hvmac1"], check=True)
subprocess.run(["ip", "link", "del", "hvmac2"], check=True)
seen["taps gone"] = mac("hpvc-mactest")
net.ensure_bridge(j, "hpvc-mactest", "10.9.9.1", 24, 1500)  # adopted again
seen["adopted"] = mac("hpvc-mactest")
print(json.dumps(seen))
"""


def test_the_bridge_keeps_its_mac_while_taps_come_and_go(tmp_path: Path) -> None:
    requires("root", "ip")
    r = subprocess.run(
        ["unshare", "--net", sys.executable, "-c", CHILD, str(tmp_path / "journal")],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    seen = json.loads(r.stdout)
    assert len(set(seen.values())) == 1, seen  # one MAC from start to end
    assert seen["made"] != "02:00:00:00:00:01"
