"""host/reach.py: whether an address answers ping over an interface (what
``hpvc migrate`` asks of a moved node). In a network namespace of its own
(``unshare --net``): its loopback, down, does not answer; up, it does.
Nothing is sent outside that namespace."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import ROOT, requires

pytestmark = pytest.mark.integration

CHILD = """
import subprocess
from hpvc.host import reach
down = reach.answers("127.0.0.1", "lo", tries=2, wait_s=1)
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
up = reach.answers("127.0.0.1", "lo", tries=2, wait_s=1)
print(down, up)
"""


def test_an_address_answers_only_when_it_can() -> None:
    requires("root", "ip", "ping")
    r = subprocess.run(
        ["unshare", "--net", sys.executable, "-c", CHILD],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "True"]
