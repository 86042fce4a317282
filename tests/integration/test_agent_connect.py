"""The agent client reaches a guest that leaves its first ARP unanswered, as a
just-booted TCG guest did right after its hpvc-ready line in CI ("No route to
host"; native/agent/client.c). Without a VM: two network namespaces this test
makes, joined by a veth pair; the agent's side answers no ARP (``arp off``) for
its first 3.5 s (past the kernel's 3 s of ARP probes), then does. hpvc-rsh,
``hpvc exec`` and the Slurm task relay all connect this way."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.agent_driver import build
from tests.helpers import requires

HERE, GUEST = "10.231.78.1", "10.231.78.2"


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    requires("root")
    return build(tmp_path_factory.mktemp("agent-build"))


def test_a_guest_silent_to_arp_for_a_while_is_still_reached(driver: Path, tmp_path: Path) -> None:
    fd = os.open(tmp_path / "key", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, os.urandom(32))
    os.close(fd)
    t = tmp_path
    # The outer namespace is the host's side; the guest's is a second one,
    # held by a sleep that dies with the outer one (--kill-child).
    script = f"""
set -eu
ip link set lo up
unshare --net sleep 120 & peer=$!
me=$(readlink /proc/self/ns/net)
for i in $(seq 100); do [ "$(readlink /proc/$peer/ns/net)" != "$me" ] && break; sleep 0.02; done
ip link add va type veth peer name vb
ip link set vb netns $peer
ip addr add {HERE}/24 dev va && ip link set va up
g() {{ nsenter -t $peer -n "$@"; }}
g ip link set lo up
g ip addr add {GUEST}/24 dev vb
g ip link set vb arp off
g ip link set vb up
g {driver} serve {GUEST}/24 {t}/key > {t}/serve.out &
for i in $(seq 100); do grep -q ready {t}/serve.out 2>/dev/null && break; sleep 0.05; done
(sleep 3.5; g ip link set vb arp on) &
a=$(date +%s%N)
set +e
{driver} run {GUEST} {t}/key echo hello > {t}/run.out 2> {t}/run.err
echo $? > {t}/run.rc
echo $(( ($(date +%s%N) - a) / 1000000 )) > {t}/run.ms
ip neigh show {GUEST} > {t}/neigh
kill $(cut -d' ' -f2 {t}/serve.out) $peer
"""
    subprocess.run(["unshare", "--net", "--fork", "--kill-child", "sh", "-c", script],
                   check=True, timeout=60)  # fmt: skip
    rc, ms = int((t / "run.rc").read_text()), int((t / "run.ms").read_text())
    err = (t / "run.err").read_text()
    assert (rc, (t / "run.out").read_text()) == (0, "hello\n"), (rc, err)
    # The first try waited out the kernel's ARP probes (3 s) and failed: the
    # command ran on a later one, after the guest began to answer.
    assert ms >= 4000, ms
    assert "lladdr" in (t / "neigh").read_text()
