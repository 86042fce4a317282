"""hpvc.host.nodeprocs on a made-up /proc: a container node's init, what a
Slurm step left behind in its tree, and a step's task outside it."""

from __future__ import annotations

from pathlib import Path

from hpvc.host import nodeprocs

NODE = "2:freezer:/hpvc/c/head0\n1:memory:/hpvc/c/head0\n"
SLURM = "2:freezer:/slurm/uid_1000/job_7/step_0\n1:memory:/hpvc/c/head0\n"


def _proc(
    tmp: Path,
    pid: int,
    children: list[int],
    ns: str,
    cgroup: str,
    argv: list[str],
    state: str = "S",
    uid: int = 0,
) -> None:
    d = tmp / str(pid)
    (d / "task" / str(pid)).mkdir(parents=True)
    (d / "ns").mkdir()
    (d / "stat").write_text(f"{pid} (x y) {state} 1 1 1\n")
    (d / "task" / str(pid) / "children").write_text(" ".join(map(str, children)) + " ")
    (d / "ns" / "pid").symlink_to(f"pid:[{ns}]")
    (d / "cgroup").write_text(cgroup)
    (d / "cmdline").write_text("\0".join(argv) + "\0")
    (d / "status").write_text(f"Name:\tx\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\nGid:\t0\t0\t0\t0\n")


def _node(tmp: Path) -> Path:
    """init 100 (its tree: 101, a setsid job a step left, and 102 its child,
    103 a zombie); 200 a running step's task in the node's namespace, child
    of slurmstepd 199 (the host's namespace); 300 another node's init."""
    _proc(tmp, 100, [101, 103], "40", NODE, ["/sbin/init"])
    _proc(tmp, 101, [102], "40", SLURM, ["python3", "p.py", "client"], uid=1000)
    _proc(tmp, 102, [], "40", SLURM, ["sleep", "5"])
    _proc(tmp, 103, [], "40", SLURM, ["gone"], state="Z")
    _proc(tmp, 199, [200], "1", "2:freezer:/\n", ["slurmstepd: [7.0]"])
    _proc(tmp, 200, [], "40", SLURM, ["sleep", "600"])
    _proc(tmp, 300, [], "41", NODE.replace("head0", "compute0"), ["/sbin/init"])
    return tmp


def test_the_tree_is_the_init_and_everything_below_it(tmp_path: Path) -> None:
    proc = _node(tmp_path)
    assert nodeprocs.tree(100, proc) == {100, 101, 102, 103}
    assert nodeprocs.tree(999, proc) == set()  # gone


def test_the_namespace_holds_the_steps_task_too(tmp_path: Path) -> None:
    proc = _node(tmp_path)
    assert nodeprocs.namespace(100, proc) == {100, 101, 102, 103, 200}
    assert nodeprocs.namespace(300, proc) == {300}


def test_strays_are_the_trees_live_processes_in_other_cgroups(tmp_path: Path) -> None:
    proc = _node(tmp_path)
    assert nodeprocs.strays(100, proc) == [101, 102]  # not 103 (a zombie), not 200
    (proc / "101" / "cgroup").write_text(NODE)
    (proc / "102" / "cgroup").write_text(NODE)
    assert nodeprocs.strays(100, proc) == []


def test_outside_names_what_the_freeze_would_not_stop(tmp_path: Path) -> None:
    proc = _node(tmp_path)
    frozen = {100, 101, 102}
    assert nodeprocs.outside(100, frozen, proc) == [200]
    assert nodeprocs.outside(100, frozen | {200}, proc) == []
    assert nodeprocs.describe([200], proc) == "pid 200 (sleep 600)"
    (proc / "102" / "cmdline").write_text("python3\0-c\0\nimport os\n  x = 1\0")
    assert nodeprocs.describe([102], proc) == "pid 102 (python3 -c import os x = 1)"
    assert nodeprocs.describe([101, 102, 200, 100], proc) == (
        "pid 101 (python3 p.py client), pid 102 (python3 -c import os x = 1),"
        " pid 200 (sleep 600) and 1 more"
    )


def test_others_are_the_trees_processes_of_another_user(tmp_path: Path) -> None:
    proc = _node(tmp_path)
    assert nodeprocs.others(100, 0, 0, proc) == [101]  # not 200: outside the tree
    assert nodeprocs.user_of(101, proc) == 1000 and nodeprocs.user_of(999, proc) == -1
    assert nodeprocs.others(100, 1000, 0, proc) == [100, 102]
    (proc / "102" / "status").write_text("Uid:\t0\t0\t0\t0\nGid:\t0\t5\t0\t0\n")
    assert nodeprocs.others(100, 0, 0, proc) == [101, 102]  # a gid counts as well


def test_a_capability_is_read_from_the_effective_set(tmp_path: Path) -> None:
    (tmp_path / "self").mkdir()
    status = tmp_path / "self" / "status"
    status.write_text("CapPrm:\t000001ffffffffff\nCapEff:\t000001fffeffffff\n")
    assert not nodeprocs.has_capability(nodeprocs.CAP_SYS_RESOURCE, tmp_path)
    assert nodeprocs.has_capability(23, tmp_path) and nodeprocs.has_capability(25, tmp_path)
    status.write_text("CapEff:\t000001ffffffffff\n")
    assert nodeprocs.has_capability(nodeprocs.CAP_SYS_RESOURCE, tmp_path)
