"""What ``hpvc node ls`` says of a share's NFS mounts (hpvc.cluster.share_view):
a container node's mount as the host sees it; a VM guest's is in the guest."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hpvc.cluster import share_view
from hpvc.store import ClusterRecord, Store


def test_a_guest_mount_is_not_reported_as_missing_on_the_host(tmp_path: Path) -> None:
    store = Store(tmp_path / "state")
    plan = {
        "nodes": [{"name": "head0"}, {"name": "compute0"}],
        "shared": {"server": "nfs", "node": "head0", "address": "10.88.1.2", "export": "/shared"},
    }
    rec = ClusterRecord("j7-0", {}, "slurm job 7", plan, "running", 1.0, 2.0)
    (store.node_dir("j7-0", "compute0") / "shared").mkdir(parents=True)  # a container's, unmounted
    row = share_view.services(store, rec)
    assert row["mounts"] == {"head0": share_view.IN_GUEST, "compute0": "not mounted"}
    assert "compute0: not mounted" in share_view.text(row)
    guests = {**row, "mounts": {"head0": share_view.IN_GUEST}}
    assert "mounted in the guests" in share_view.text(guests)
    assert "every mount answers" in share_view.text({**row, "mounts": {"compute0": "ok"}})


def test_the_mount_point_itself_is_never_stated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stat of a mount whose server died waits as long as the client does
    (CI, 2026-11-27: node ls hung past 60 s): presence comes from the node
    folder's listing, and only health (a child, bounded) touches the mount."""
    node = tmp_path / "compute0"
    (node / "shared").mkdir(parents=True)
    real_stat = os.stat

    def stat(path: object, *args: object, **kwargs: object) -> os.stat_result:
        assert os.path.basename(os.fspath(path)) != "shared", f"stat of {path}"  # type: ignore[arg-type]
        return real_stat(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "stat", stat)
    assert share_view._mount(lambda p: "server not answering", node) == "server not answering"
    assert share_view._mount(lambda p: None, node) == "ok"


def test_a_node_folder_that_errors_is_the_hosts_and_asked(tmp_path: Path) -> None:
    """A node folder that cannot be listed (here a name too long for the file
    system): the mount is taken as the host's and health says what it sees
    (node ls of a job whose NFS host died must not crash)."""
    node = tmp_path / ("n" * 300)
    asked: list[Path] = []

    def health(p: Path) -> str:
        asked.append(p)
        return "server not answering (input/output error)"

    assert share_view._mount(health, node) == "server not answering (input/output error)"
    assert asked == [node / "shared"]
