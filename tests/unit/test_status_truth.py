"""Status reads what runs (issue 17, points 6 and 8): who holds a cluster's
lock, an interrupted up, the accelerator of a running QEMU, where `run` puts
ranks without compute nodes, I/O limits with no disk under them, and one
"needs root" line for a user who may not run a command."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hpvc.backends.qemu import process as vm_qemu
from hpvc.cli import command_words, main
from hpvc.cluster import listing, ops
from hpvc.host import blkio
from hpvc.locks import holder, owned_lock
from hpvc.plan import plan_cluster
from hpvc.spec import parse_spec
from hpvc.store import ClusterRecord, Store
from tests.unit.topogen import make_topology


def test_a_lock_holder_is_named_while_it_holds_and_gone_after(tmp_path: Path) -> None:
    path = tmp_path / "c.lock"
    assert holder(path) is None  # no file: nobody
    with owned_lock(path, "PID 1 (hpvc up)", lambda _: None):
        assert holder(path) == "PID 1 (hpvc up)"
    assert holder(path) is None
    path.write_text("PID 99999 (hpvc up)")  # left by a holder killed outright
    assert holder(path) is None


def record(status: str) -> ClusterRecord:
    return ClusterRecord("c", {}, "c.toml", {}, status, 0.0, 0.0)


@pytest.mark.parametrize(
    ("status", "held", "interrupted", "note"),
    [
        ("creating", False, True, "interrupted \N{EM DASH} run hpvc down c"),
        ("scaling", False, True, "interrupted \N{EM DASH} run hpvc down c"),
        ("creating", True, False, "coming up (PID 7 (hpvc up))"),
        ("running", False, False, None),
        ("running", True, False, None),
    ],
)
def test_an_up_nobody_runs_any_more_is_interrupted(
    tmp_path: Path, status: str, held: bool, interrupted: bool, note: str | None
) -> None:
    store = Store(tmp_path)
    rec = record(status)
    if not held:
        got = listing.under_way(store, rec)
    else:
        with store.cluster_lock("c", "hpvc up", lambda _: None):
            (store.root / "locks" / "c.lock").write_text("PID 7 (hpvc up)")
            got = listing.under_way(store, rec)
    assert got["interrupted"] is interrupted and got["note"] == note


@pytest.mark.parametrize(
    ("argv", "accel"),
    [
        (["qemu", "-accel", "kvm", "-cpu", "host"], "kvm"),
        (["qemu", "-accel", "tcg,thread=multi"], "tcg"),
        (["qemu", "-machine", "pc-q35-8.2,accel=kvm,usb=off"], "kvm"),
        (["qemu", "-enable-kvm"], "kvm"),
        (["qemu", "-m", "1G"], None),
    ],
)
def test_the_accelerator_is_read_from_qemus_command_line(argv: list[str], accel: str) -> None:
    assert vm_qemu.accel_of(argv) == accel


def plan_of(nodes: list[dict[str, Any]]) -> Any:
    spec = parse_spec(
        {
            "name": "t",
            "kind": "container",
            "tuning": {"pinning": "shared", "hugepages": "none", "partition": "commodity"},
            "nodes": nodes,
        }
    )
    return plan_cluster(spec, [("h0", make_topology())], None)


def test_run_says_when_a_cluster_has_no_compute_nodes() -> None:
    head = {"role": "head", "vcpus": 1, "memory": "256MiB"}
    compute = {"role": "compute", "vcpus": 1, "memory": "256MiB"}
    assert ops.no_compute_notice(plan_of([head, compute])) is None
    assert ops.no_compute_notice(plan_of([head])) == (
        "cluster t has no compute nodes: the ranks run on head0"
    )


def test_no_block_device_names_the_file_system(tmp_path: Path) -> None:
    fake = tmp_path / "root"
    (fake / "proc/self").mkdir(parents=True)
    state = tmp_path / "state"
    state.mkdir()
    (fake / "proc/self/mounts").write_text(f"/dev/vda / ext4 rw 0 0\ntmpfs {state} tmpfs rw 0 0\n")
    # The fake root has no /sys/dev/block: no block device under anything.
    assert blkio.no_block_device(state, fake) == f"{state} is on tmpfs, no block device"
    assert blkio.filesystem_type(tmp_path, fake) == "ext4"


@pytest.mark.parametrize(
    ("args", "words"),
    [(["down", "x"], "down"), (["image", "rm", "hpc"], "image rm"), (["--debug", "ls"], "ls")],
)
def test_command_words(args: list[str], words: str) -> None:
    assert command_words(args) == words


@pytest.mark.parametrize(
    "args", [["down", "c"], ["scale", "c", "compute=2"], ["run", "c", "--", "hostname"]]
)
def test_non_root_down_scale_run_need_root(
    args: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("os.geteuid", lambda: 65534)
    with pytest.raises(SystemExit) as e:
        main(args)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err == f"hpvc: hpvc {args[0]}: needs root (cgroups, namespaces, mounts) (run as root)"


def test_a_permission_error_of_a_non_root_user_says_needs_root(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def denied(*_: object, **__: object) -> object:
        raise PermissionError(13, "Permission denied", "/var/lib/hpvc/images/store.lock")

    monkeypatch.setattr("hpvc.cli.image.remove_image", denied)
    monkeypatch.setattr("os.geteuid", lambda: 65534)
    with pytest.raises(SystemExit) as e:
        main(["image", "rm", "hpc"])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip() == (
        "hpvc: image rm: needs root: permission denied /var/lib/hpvc/images/store.lock"
        " (run as root)"
    )


def test_scale_down_does_not_wait_for_zero_guests() -> None:
    from hpvc.backends.qemu.backend import QemuBackend

    said: list[str] = []
    QemuBackend().start(None, None, [], said.append)  # type: ignore[arg-type]
    assert said == []
