"""`hpvc ls` says a cluster whose nodes died is not running, as `hpvc status`
does (issue 32, item 7), from the record and crun's state files only."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from hpvc.cluster.listing import list_status, stopped_nodes
from hpvc.host import procfs
from hpvc.store import ClusterRecord
from tests.unit.test_image_in_use import plan_json, spec

GONE = 2**22 + 7  # above pid_max's default: never a live process


def _status(root: Path, cid: str, pid: int, started: str | None) -> None:
    (root / cid).mkdir(parents=True)
    doc: dict[str, object] = {"pid": pid}
    if started is not None:
        doc["process-start-time"] = int(started)
    (root / cid / "status").write_text(json.dumps(doc))


def test_a_container_cluster_whose_node_died_is_degraded_then_stopped(tmp_path: Path) -> None:
    now = time.time()
    rec = ClusterRecord("c", spec(), "c.toml", plan_json(spec()), "running", now, now)
    me = os.getpid()
    _status(tmp_path, "hpvc-c-head0", me, procfs.start_time(me))
    _status(tmp_path, "hpvc-c-compute0", me, procfs.start_time(me))
    _status(tmp_path, "hpvc-c-compute1", GONE, None)  # its init died
    stopped = stopped_nodes(rec, tmp_path)
    assert stopped == ["compute1"]
    assert list_status(rec, stopped) == "degraded"
    assert procfs.container_init("hpvc-c-head0", tmp_path) == me
    # A reused PID (another start time) is not the node's init.
    _status(tmp_path, "hpvc-c-x", me, "1")
    assert procfs.container_init("hpvc-c-x", tmp_path) is None
    for cid in ("hpvc-c-head0", "hpvc-c-compute0"):
        (tmp_path / cid / "status").unlink()  # crun's state went with them
    stopped = stopped_nodes(rec, tmp_path)
    assert list_status(rec, stopped) == "stopped" and len(stopped) == 3


def test_a_vm_cluster_reads_the_recorded_qemu_pids(tmp_path: Path) -> None:
    now = time.time()
    rec = ClusterRecord("c", spec(), "c.toml", plan_json(spec()), "running", now, now)
    rec.plan = {**rec.plan, "kind": "vm"}
    rec.backend_state = {"pids": {"head0": os.getpid(), "compute0": os.getpid(), "compute1": GONE}}
    stopped = stopped_nodes(rec, tmp_path)
    assert stopped == ["compute1"] and list_status(rec, stopped) == "degraded"


def test_a_cluster_not_running_keeps_its_record_status(tmp_path: Path) -> None:
    now = time.time()
    rec = ClusterRecord("c", spec(), "c.toml", plan_json(spec()), "creating", now, now)
    assert stopped_nodes(rec, tmp_path) == [] and list_status(rec, []) == "creating"
