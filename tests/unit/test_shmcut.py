"""Nodes sharing their cluster's namespaces (locality "shm"): what their cut
refuses, on a made-up /proc (hpvc.host.sharedns, hpvc.backends.crun.shmcut), and how their
commands reach the node's init (hpvc.backends.crun.nodeinit, the rank script)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from hpvc.backends.crun import nodeinit, shmcut
from hpvc.backends.crun.backend import CrunState
from hpvc.backends.crun.ranks import RANK_SCRIPT
from hpvc.errors import InputError
from hpvc.host import sharedns
from tests.unit.test_nodeprocs import NODE, _proc


def _shared(tmp: Path) -> Path:
    """holder init 1 (namespace 50); node inits 2 (head0: a session 10 and its
    command 11, a job 12 it left) and 3 (compute0: job 13); 20 an attached
    client (crun exec's, parent outside); 21 a zombie orphan of the holder;
    99 another cluster's process (namespace 51)."""
    _proc(tmp, 1, [21], "50", "", ["sleep", "infinity"])
    _proc(tmp, 2, [10, 12], "50", NODE, ["/dev/hpvc-nodeinit", "serve"])
    _proc(tmp, 10, [11], "50", NODE, ["/dev/hpvc-nodeinit", "serve"])
    _proc(tmp, 11, [], "50", NODE, ["sleep", "20"])
    _proc(tmp, 12, [], "50", NODE, ["python3", "job.py"])
    _proc(tmp, 3, [13], "50", NODE, ["/dev/hpvc-nodeinit", "serve"])
    _proc(tmp, 13, [], "50", NODE, ["python3", "server.py"])
    _proc(tmp, 20, [], "50", NODE, ["/dev/hpvc-nodeinit", "run", "--", "sleep", "20"])
    _proc(tmp, 21, [], "50", "", ["gone"], state="Z")
    _proc(tmp, 99, [], "51", "", ["other"])
    return tmp


def test_strays_are_the_shared_namespace_outside_every_node(tmp_path: Path) -> None:
    proc = _shared(tmp_path)
    assert sharedns.strays(1, [2, 3], proc) == [20]  # the zombie and the holder aside
    assert sharedns.strays(1, [2], proc) == [3, 13, 20]  # a node left out is a stray


def _maps(tmp: Path, pid: int, lines: list[str]) -> None:
    (tmp / str(pid) / "maps").write_text("".join(ln + "\n" for ln in lines))


DELETED = "7f00-7f01 rw-s 00000000 00:2a 4242                       /dev/shm/mpi seg (deleted)"
LINKED = "7f02-7f03 rw-s 00000000 00:2a 4343                       /dev/shm/kept"
OTHER = "7f04-7f05 rw-s 00000000 00:05 99                         /memfd:x (deleted)"


def test_a_deleted_shm_file_mapped_by_two_nodes_is_named(tmp_path: Path) -> None:
    proc = _shared(tmp_path)
    _maps(proc, 12, [DELETED, LINKED, OTHER])
    _maps(proc, 13, [DELETED, LINKED])
    _maps(proc, 11, [DELETED])
    assert sharedns.deleted_shm_maps(12, proc) == {("00:2a", 4242): "/dev/shm/mpi seg"}
    trees = {"head0": {2, 10, 11, 12}, "compute0": {3, 13}}
    assert sharedns.shared_deleted(trees, proc) == ["/dev/shm/mpi seg (nodes compute0, head0)"]
    # One node alone: CRIU restores its one copy for all of its processes.
    assert sharedns.shared_deleted({"head0": {2, 10, 11, 12}}, proc) == []
    _maps(proc, 13, [LINKED])  # a linked file is opened again by name: shared again
    assert sharedns.shared_deleted(trees, proc) == []


def test_commands_go_through_the_client_in_the_node() -> None:
    assert nodeinit.client(["sh", "-c", "x y"]) == [
        nodeinit.IN_NODE,
        "run",
        "--",
        "sh",
        "-c",
        "x y",
    ]
    assert nodeinit.COMMAND == (nodeinit.IN_NODE, "serve")


@pytest.mark.parametrize("client", ["", " " + nodeinit.client_words()])
def test_the_rank_script_puts_the_client_between_node_and_command(
    tmp_path: Path, client: str
) -> None:
    script = tmp_path / "rank.sh"
    script.write_text(RANK_SCRIPT.format(crun="echo", path="PATH=/bin", client=client))
    (tmp_path / "ranks").write_text("hpvc-c-head0\nhpvc-c-compute0\n")
    env = {"PATH": "/usr/bin:/bin", "OMPI_COMM_WORLD_RANK": "1", "PMIX_RANK": "1"}
    done = subprocess.run(
        ["sh", str(script), "./a.out", "x y"], env=env, capture_output=True, text=True, check=True
    )
    words = done.stdout.split()
    node = words.index("hpvc-c-compute0")
    assert words[:1] == ["exec"] and "--env" in words[:node]
    assert words[node + 1 :] == [*client.split(), "./a.out", "x", "y"]


def test_nodes_started_before_their_init_was_hpvc_nodeinit_are_refused() -> None:
    env: Any = SimpleNamespace(name="c", state=SimpleNamespace(node_init=False, holder_pid=1))
    with pytest.raises(InputError) as e:
        shmcut.refuse(env, {"head0": 2})
    assert e.value.exit_code == 2 and "down and up again" in e.value.line()
    env.state.holder_pid = None  # nodes of their own: nothing shared to refuse or name
    assert shmcut.holder(env) is None and shmcut.dump_ns(env) is None
    assert shmcut.restore_ns(env) is None


def test_the_highest_pid_counts_threads_of_the_shared_namespace_only(tmp_path: Path) -> None:
    proc = _shared(tmp_path)
    for pid, tids in {12: {12: 12, 40: 40}, 13: {13: 13}, 99: {99: 500}}.items():
        for host_tid, inner in tids.items():
            task = proc / str(pid) / "task" / str(host_tid)
            task.mkdir(parents=True, exist_ok=True)
            (task / "status").write_text(f"Name:\tx\nNSpid:\t{host_tid + 1000}\t{inner}\n")
    assert sharedns.highest_pid(1, proc) == 40  # a thread of 12; 99's 500 is another namespace's


def test_a_root_cluster_s_nodes_get_the_agent_the_rsh_and_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    init = tmp_path / "hpvc-nodeinit"
    monkeypatch.setattr(nodeinit, "binary", lambda: init)
    key = tmp_path / "agent.key"
    with_agent = nodeinit.node_init(True, key)
    assert with_agent.command == ("/dev/hpvc-nodeinit", "serve", "--agent")
    assert with_agent.binds == (
        (str(init), "/dev/hpvc-nodeinit", True),
        (str(init), "/dev/hpvc-rsh", True),  # the same binary, hpvc-rsh by that name
        (str(key), "/dev/hpvc-agent-key", True),
    )
    assert "OMPI_MCA_plm_rsh_agent=/dev/hpvc-rsh" in with_agent.env
    assert "HYDRA_LAUNCHER_EXEC=/dev/hpvc-rsh" in with_agent.env
    plain = nodeinit.node_init(True, None)  # a tenant's, or across hosts: no agent
    assert plain.command == ("/dev/hpvc-nodeinit", "serve") and plain.env == ()
    assert plain.binds == ((str(init), "/dev/hpvc-nodeinit", True),)
    old = nodeinit.node_init(False, None)  # a cluster from before hpvc-nodeinit
    assert old.command[0] == "/bin/sh" and old.binds == ()


def test_only_root_s_own_clusters_on_one_host_get_an_agent() -> None:
    assert nodeinit.wanted(tenant=False, across_hosts=False)
    assert not nodeinit.wanted(tenant=True, across_hosts=False)  # not root in its nodes
    assert not nodeinit.wanted(tenant=False, across_hosts=True)


def test_the_agent_key_goes_with_the_checkpoint_and_comes_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hpvc.backends.crun import clusterfiles

    monkeypatch.setattr(clusterfiles, "shared_folder", lambda env, plan: None)
    old, new, dest = tmp_path / "old", tmp_path / "new", tmp_path / "ck"
    for d in (old, new, dest):
        d.mkdir()
    (old / "agent.key").write_bytes(b"k" * 32)
    (new / "agent.key").write_bytes(b"n" * 32)  # the restored cluster's prepare made its own
    saved = CrunState(node_init=True, agent=True)
    clusterfiles.save(SimpleNamespace(dir=old, state=saved), None, dest, lambda m: None)
    assert (dest / "agent.key").read_bytes() == b"k" * 32
    assert (dest / "agent.key").stat().st_mode & 0o777 == 0o600
    restored = CrunState(node_init=True, agent=True)
    clusterfiles.restore(SimpleNamespace(dir=new, state=restored), None, dest, lambda m: None)
    assert (new / "agent.key").read_bytes() == b"k" * 32  # what the restored agents hold
    assert (new / "agent.key").stat().st_mode & 0o777 == 0o600
    assert restored.node_init and restored.agent


@pytest.mark.parametrize(
    ("shared_ns", "saved", "node_init", "agent"),
    [
        (False, None, False, False),  # locality "none" from before: the sh init
        (True, None, True, False),  # sharing namespaces from before: hpvc-nodeinit, no agent
        (False, {"node_init": True, "agent": False}, True, False),  # a tenant's
        (False, {"node_init": True, "agent": True}, True, True),
    ],
)
def test_restored_nodes_are_reached_as_they_were_made(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    shared_ns: bool,
    saved: dict[str, bool] | None,
    node_init: bool,
    agent: bool,
) -> None:
    """The new cluster's prepare says what a node started now gets; the nodes
    restored into it are the saved ones (init.json, or a checkpoint from before)."""
    from hpvc.backends.crun import clusterfiles

    monkeypatch.setattr(clusterfiles, "shared_folder", lambda env, plan: None)
    if saved is not None:
        (tmp_path / "init.json").write_text(json.dumps(saved))
    state = CrunState(node_init=True, agent=True, holder_pid=1 if shared_ns else None)
    monkeypatch.setattr(shmcut, "shm_dir", lambda env: None)
    clusterfiles.restore(SimpleNamespace(dir=tmp_path, state=state), None, tmp_path, print)
    assert (state.node_init, state.agent) == (node_init, agent)


def test_nodes_holding_a_deleted_shm_file_are_found_by_map_or_descriptor(tmp_path: Path) -> None:
    proc = _shared(tmp_path)
    (proc / "12" / "fd").mkdir()
    (proc / "12" / "fd" / "6").symlink_to("/dev/shm/open_mpi.0000 (deleted)")
    (proc / "13" / "fd").mkdir()
    (proc / "13" / "fd" / "3").symlink_to("/tmp/x (deleted)")  # not in /dev/shm
    (proc / "13" / "fd" / "4").symlink_to("/dev/shm/kept")  # not deleted
    assert sharedns.holds_deleted_shm({2, 10, 11, 12}, proc)
    assert not sharedns.holds_deleted_shm({3, 13}, proc)
    _maps(proc, 13, [DELETED])
    assert sharedns.holds_deleted_shm({3, 13}, proc)


def test_nodes_with_deleted_shm_files_are_restored_one_at_a_time(tmp_path: Path) -> None:
    names = ["head0", "compute0", "compute1"]
    assert shmcut.restore_order(tmp_path, names) == ([], names)  # none saved: all side by side
    (tmp_path / shmcut.PIDS).write_text(json.dumps({"highest": 40}))  # before ghosts were kept
    assert shmcut.restore_order(tmp_path, names) == ([], names)
    (tmp_path / shmcut.PIDS).write_text(
        json.dumps({"highest": 40, "ghosts": ["compute1", "head0"]})
    )
    assert shmcut.restore_order(tmp_path, names) == (["head0", "compute1"], ["compute0"])
