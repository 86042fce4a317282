"""Issue 25, item 6: a node that writes to its console without end does not
fill the state disk. The cluster comes up with a 1 MiB console cap; its node
writes 64 MiB to its console (its init's stdout, as anyone root in it can);
the host keeps the newest bytes, at most the cap in console.log and the cap in
console.log.1; the node still runs, and `down` ends the console readers.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from hpvc.cluster import lifecycle, ops
from hpvc.host import console_ring, procfs
from hpvc.spec import read_spec
from hpvc.store import Store
from tests.helpers import requires
from tests.integration.test_cluster import image_ready, leftovers

CAP_MIB = 1
FLOOD_MIB = 64
NET = f"10.227.{os.getpid() % 250}"


def readers_of(node_dir: Path) -> list[int]:
    """PIDs of console readers (hpvc.host.console_reader) writing into ``node_dir``."""
    log = str(node_dir / "console.log")
    return [
        pid
        for pid in procfs.pids()
        if (argv := procfs.cmdline(pid)) and str(console_ring.READER) in argv and log in argv
    ]


def settled(log: Path) -> None:
    last, since = -1, time.monotonic()
    while time.monotonic() - since < 0.5:
        size = log.stat().st_size
        if size != last:
            last, since = size, time.monotonic()
        time.sleep(0.05)


def test_console_flood_is_capped(tmp_path: Path) -> None:
    requires("root", "crun", "ip")
    image_ready()
    store = Store(tmp_path / "state")
    name = f"cc{os.getpid() % 10000}"
    path = tmp_path / f"{name}.toml"
    path.write_text(
        f'name = "{name}"\nkind = "container"\n[network]\nsubnet = "{NET}.0/24"\n'
        '[tuning]\npinning = "shared"\nhugepages = "none"\npartition = "commodity"\n'
        'locality = "none"\n[[nodes]]\nrole = "compute"\ncount = 1\nmemory = "256MiB"\n'
    )
    spec, doc = read_spec(path)
    try:
        rec = lifecycle.up_spec(spec, doc, str(path), store, console_mib=CAP_MIB)
        assert rec.console_bytes() == CAP_MIB << 20
        node_dir = store.node_dir(name, "compute0")
        log = node_dir / "console.log"
        assert len(readers_of(node_dir)) == 1

        flood = (
            f"head -c {FLOOD_MIB}M /dev/zero | tr '\\0' y > /proc/1/fd/1;"
            " echo the-last-line > /proc/1/fd/2"
        )
        assert ops.exec_node(name, "compute0", ["sh", "-c", flood], store) == 0
        settled(log)
        cap = CAP_MIB << 20
        rotated = log.with_name("console.log.1")
        assert log.stat().st_size <= cap and rotated.stat().st_size <= cap
        assert log.read_bytes().endswith(b"y" * 100 + b"the-last-line\n")
        # The node lives on and its console still reaches the log.
        assert (
            ops.exec_node(name, "compute0", ["sh", "-c", "echo again > /proc/1/fd/1"], store) == 0
        )
        settled(log)
        assert log.read_bytes().endswith(b"the-last-line\nagain\n")
        assert len(readers_of(node_dir)) == 1
    finally:
        errors = lifecycle.teardown(store, name)
    assert errors == []
    assert leftovers(name) == [] and store.names() == []
    assert readers_of(store.node_dir(name, "compute0")) == []
