"""Issue 25, item 6, for VM nodes (the qemu backend): a guest that writes to its
serial console without end does not fill the state disk. QEMU logs the serial
port to a FIFO in the node's run folder (made 0600, root's, before QEMU opens
it as root and drops to its cluster's uid); hpvc's console reader copies it
into console.log, kept to a 1 MiB cap here (the record's ``console_mib``), the
older part in console.log.1. The guest writes 3 MiB to its serial port; the
readiness follower, reading while the log rotates, still finds the line that
comes after the flood; a forced restart boots the node again (its ready line
through a new reader); ``down`` leaves no reader and no FIFO.
"""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from hpvc.backends.vm.console import wait_ready
from hpvc.cluster import lifecycle, ops
from hpvc.cluster.restart import restart
from hpvc.spec import read_spec
from hpvc.store import Store
from tests.integration.test_cluster import image_ready
from tests.integration.test_console_cap import readers_of, settled
from tests.integration.test_vm_cluster import store, vm_leftovers

__all__ = ["store"]  # the fixture
pytestmark = pytest.mark.integration

CAP_MIB = 1
FLOOD_MIB = 3
NET = f"10.233.{os.getpid() % 250}"


def test_vm_serial_flood_is_capped_and_the_node_stays_ready(store: Store, tmp_path: Path) -> None:
    image_ready()
    name = f"vc{os.getpid() % 10000}"
    path = tmp_path / f"{name}.toml"
    path.write_text(
        f'name = "{name}"\nkind = "vm"\n[network]\nsubnet = "{NET}.0/24"\n'
        '[tuning]\npinning = "shared"\nhugepages = "none"\npartition = "commodity"\n'
        'locality = "none"\n[[nodes]]\nrole = "compute"\ncount = 1\nvcpus = 1\n'
        'memory = "256MiB"\n'
    )
    spec, doc = read_spec(path)
    rec = lifecycle.up_spec(spec, doc, str(path), store, console_mib=CAP_MIB)
    assert rec.console_bytes() == CAP_MIB << 20
    node_dir = store.node_dir(name, "compute0")
    log, rotated = node_dir / "console.log", node_dir / "console.log.1"
    fifo = store.layout.node_run_dir(name, "compute0") / "console.fifo"
    st = fifo.lstat()
    assert stat.S_ISFIFO(st.st_mode) and st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o600
    assert len(readers_of(node_dir)) == 1
    assert b"hpvc-ready compute0" in log.read_bytes()  # the boot came through the reader

    # The guest floods its serial port; the follower reads while the log rotates.
    flood = (
        f"yes hpvc-console-flood-line | head -c {FLOOD_MIB}M > /dev/ttyS0;"
        " echo hpvc-flood-done > /dev/ttyS0"
    )
    result: list[int] = []
    writer = threading.Thread(
        target=lambda: result.append(ops.exec_node(name, "compute0", ["sh", "-c", flood], store))
    )
    writer.start()
    try:
        qemu = ops.node_pid(name, "compute0", store)
        wait_ready(log, "hpvc-flood-done", 300.0, qemu)
    finally:
        writer.join()
    assert result == [0]
    settled(log)
    cap = CAP_MIB << 20
    assert log.stat().st_size <= cap and rotated.stat().st_size <= cap
    # The newest bytes are kept (sshd may log its goodbye after them).
    assert b"hpvc-console-flood-line\r\nhpvc-flood-done\r\n" in log.read_bytes()
    assert b"hpvc-console-flood-line\r\n" * 1000 in rotated.read_bytes()  # the older part
    assert len(readers_of(node_dir)) == 1

    # The node boots again through a new reader and says it is ready.
    done = restart(name, ["compute0"], store, force=True)
    assert [(d.node, d.restarted, d.state) for d in done] == [("compute0", True, "running")]
    assert b"hpvc-ready compute0" in log.read_bytes()
    assert log.stat().st_size <= cap
    assert len(readers_of(node_dir)) == 1

    lifecycle.down(name, store)
    assert vm_leftovers(name, store) == []
    assert readers_of(node_dir) == [] and not fifo.exists()
