"""hpvc checkpoint ls/show/rm and hpvc restore's refusals, on checkpoint folders
made here (no cluster, no host change: a bad checkpoint is refused before any)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpvc.cli import main
from hpvc.cluster import checkpoint_format as cf
from hpvc.cluster.restore import _check_images
from hpvc.errors import InputError
from hpvc.spec import parse_spec

SPEC = {
    "name": "ck",
    "kind": "vm",
    "image": "hpc",
    "network": {"subnet": "10.77.0.0/24"},
    "nodes": [{"role": "compute", "count": 2, "vcpus": 1, "memory": "256MiB"}],
}


def _checkpoint(root: Path, digest: str = "sha256:" + "ab" * 32) -> cf.Manifest:
    nodes = []
    for i, name in enumerate(("compute0", "compute1")):
        d = root / cf.NODES / name
        d.mkdir(parents=True)
        (d / "state.bin").write_bytes(bytes([i]) * 4096)
        (d / "disk.qcow2").write_bytes(b"q" * 100)
        files = cf.describe(root, cf.files_under(root, f"{cf.NODES}/{name}"))
        mac = f"52:54:00:00:00:0{i + 2}"
        nodes.append(cf.NodeEntry(name, "vm", "qemu", digest, f"10.77.0.{i + 2}", mac, files))
    m = cf.Manifest("ck", 1.7e9, SPEC, "", {"cluster": "ck"}, "10.77.0.0/24", tuple(nodes))
    cf.write_manifest(root, m)
    return m


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as e:
        main(argv)
    out, err = capsys.readouterr()
    code = e.value.code if isinstance(e.value.code, int) else 0
    return code, out, err


@pytest.fixture(autouse=True)
def _state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HPVC_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("HPVC_HELP_CACHE", "0")


def test_show_and_ls_print_nodes_sizes_and_digests(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ck = tmp_path / "cks" / "one"
    ck.mkdir(parents=True)
    _checkpoint(ck)
    code, out, _ = _run(["checkpoint", "show", str(ck), "--json"], capsys)
    assert code == 0
    row = json.loads(out)
    assert row["cluster"] == "ck" and row["size"] == 2 * (4096 + 100)
    assert [(n["name"], n["ip"]) for n in row["nodes"]] == [
        ("compute0", "10.77.0.2"),
        ("compute1", "10.77.0.3"),
    ]
    assert {n["image_digest"] for n in row["nodes"]} == {"sha256:" + "ab" * 32}
    code, out, _ = _run(["checkpoint", "ls", str(tmp_path / "cks"), "--json"], capsys)
    assert code == 0 and [r["dir"] for r in json.loads(out)] == [str(ck)]
    code, out, _ = _run(["checkpoint", "ls", str(tmp_path / "cks")], capsys)
    assert code == 0 and str(ck) in out and "2 nodes" in out


@pytest.mark.parametrize(
    ("damage", "says"),
    [
        ("truncate-manifest", "manifest.json is truncated or corrupted"),
        ("truncate-state", "nodes/compute1/state.bin is truncated or changed"),
        ("corrupt-state", "nodes/compute0/state.bin is corrupted: its sha256 differs"),
        ("version", "was taken by hpvc 0.0.1"),
        ("arch", "was taken on s390x"),
        ("no-manifest", "has no manifest.json"),
    ],
)
def test_restore_refuses_a_bad_checkpoint_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: str, says: str
) -> None:
    ck = tmp_path / "ck"
    ck.mkdir()
    _checkpoint(ck)
    manifest = ck / cf.MANIFEST
    if damage == "truncate-manifest":
        manifest.write_text(manifest.read_text()[:200])
    elif damage == "truncate-state":
        with open(ck / "nodes/compute1/state.bin", "r+b") as f:
            f.truncate(1000)
    elif damage == "corrupt-state":
        with open(ck / "nodes/compute0/state.bin", "r+b") as f:
            f.seek(10)
            f.write(b"\xff")
    elif damage in ("version", "arch"):
        data = json.loads(manifest.read_text())
        data["hpvc_version" if damage == "version" else "arch"] = (
            "0.0.1" if damage == "version" else "s390x"
        )
        manifest.write_text(json.dumps(data))
    else:
        manifest.unlink()
    code, _, err = _run(["restore", str(ck)], capsys)
    assert code == 2
    (line,) = [x for x in err.splitlines() if x.startswith("hpvc:")]  # progress lines aside
    assert says in line and err.rstrip().endswith(line), err
    assert not (tmp_path / "state" / "clusters").exists()  # nothing booked or made


def test_rm_removes_a_checkpoint_and_refuses_other_folders(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = tmp_path / "photos"
    other.mkdir()
    (other / "cat.jpg").write_bytes(b"x")
    code, _, err = _run(["checkpoint", "rm", str(other)], capsys)
    assert code == 2 and "is not a checkpoint" in err
    assert (other / "cat.jpg").exists()
    ck = tmp_path / "ck"
    ck.mkdir()
    _checkpoint(ck)
    code, _, _ = _run(["checkpoint", "rm", str(ck)], capsys)
    assert code == 0 and not ck.exists()


def test_restore_refuses_another_image_digest(tmp_path: Path) -> None:
    m = _checkpoint(tmp_path)
    spec = parse_spec(SPEC)
    with pytest.raises(InputError, match="is not in this host's image store"):
        _check_images(m, spec, lambda name: "")
    with pytest.raises(InputError, match=r"is sha256:cdcdcdcdcdcd here, node compute0 was saved"):
        _check_images(m, spec, lambda name: "sha256:" + "cd" * 32)
    _check_images(m, spec, lambda name: "sha256:" + "ab" * 32)  # the same image: no error
