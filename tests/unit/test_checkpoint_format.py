"""The checkpoint folder's manifest: written, read back, and every refusal."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

import pytest

from hpvc import __version__
from hpvc.cluster import checkpoint_format as cf
from hpvc.errors import InputError


def _checkpoint(root: Path) -> cf.Manifest:
    node_dir = root / cf.NODES / "c0"
    node_dir.mkdir(parents=True)
    (node_dir / "state.bin").write_bytes(b"\x01" * 3000)
    (node_dir / "disk.qcow2").write_bytes(b"disk")
    files = cf.describe(root, cf.files_under(root, f"{cf.NODES}/c0"))
    node = cf.NodeEntry("c0", "vm", "qemu", "sha256:abc", "10.1.0.2", "52:54:00:00:00:02", files)
    m = cf.Manifest(
        cluster="ck",
        created=1700000000.0,
        spec={"name": "ck", "kind": "vm"},
        spec_text='name = "ck"\n',
        plan={"cluster": "ck"},
        subnet="10.1.0.0/24",
        nodes=(node,),
        frozen_s=0.5,
    )
    cf.write_manifest(root, m)
    return m


def test_manifest_round_trips_with_sizes_and_hashes(tmp_path: Path) -> None:
    m = _checkpoint(tmp_path)
    back = cf.read_manifest(tmp_path)
    assert back == m
    assert [f.path for f in back.nodes[0].files] == ["nodes/c0/disk.qcow2", "nodes/c0/state.bin"]
    assert back.size() == 3004
    assert back.hpvc_version == __version__ and back.arch == cf.machine()
    cf.verify(tmp_path, back)  # nothing changed: no error


def test_a_folder_without_manifest_is_not_a_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"has no manifest\.json: not a checkpoint") as e:
        cf.read_manifest(tmp_path)
    assert e.value.exit_code == 2
    with pytest.raises(InputError, match="no such folder"):
        cf.read_manifest(tmp_path / "nope")


def test_truncated_manifest_is_one_line(tmp_path: Path) -> None:
    _checkpoint(tmp_path)
    text = (tmp_path / cf.MANIFEST).read_text()
    (tmp_path / cf.MANIFEST).write_text(text[: len(text) // 2])
    with pytest.raises(InputError, match=r"manifest\.json is truncated or corrupted") as e:
        cf.read_manifest(tmp_path)
    assert "\n" not in e.value.line()


def test_truncated_state_file_is_refused(tmp_path: Path) -> None:
    m = _checkpoint(tmp_path)
    with open(tmp_path / "nodes/c0/state.bin", "r+b") as f:
        f.truncate(100)
    with pytest.raises(InputError, match=r"state\.bin is truncated or changed: 100 bytes"):
        cf.verify(tmp_path, m)


def test_corrupted_state_file_is_refused_by_sha256(tmp_path: Path) -> None:
    m = _checkpoint(tmp_path)
    with open(tmp_path / "nodes/c0/state.bin", "r+b") as f:
        f.seek(1500)
        f.write(b"\x02")
    cf.verify(tmp_path, m, hashes=False)  # same size: only the hash tells
    with pytest.raises(InputError, match=r"state\.bin is corrupted: its sha256 differs"):
        cf.verify(tmp_path, m)


def test_hashes_side_by_side_match_one_at_a_time_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sha256_all on several CPUs gives each file its own hash, in the order asked
    (it starts the largest first), empty and multi-chunk files included."""
    sizes = [0, 1, cf._CHUNK - 1, 3 * cf._CHUNK + 17, 5]
    paths = []
    for i, size in enumerate(sizes):
        p = tmp_path / f"f{i}"
        p.write_bytes((bytes(range(i, 251)) * (size // 200 + 1))[:size])
        paths.append(p)
    want = [hashlib.sha256(p.read_bytes()).hexdigest() for p in paths]
    monkeypatch.setattr(cf.os, "sched_getaffinity", lambda _pid: {0, 1, 2, 3})
    assert cf.sha256_all(paths) == want
    monkeypatch.setattr(cf.os, "sched_getaffinity", lambda _pid: {0})
    assert cf.sha256_all(paths) == want
    assert cf.sha256_all([]) == []


def test_the_first_corrupted_file_in_the_manifest_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    m = _checkpoint(tmp_path)
    monkeypatch.setattr(cf.os, "sched_getaffinity", lambda _pid: {0, 1})
    first = m.nodes[0].files[0].path
    for f in m.nodes[0].files:  # both corrupted, sizes kept
        data = bytearray((tmp_path / f.path).read_bytes())
        data[0] ^= 0xFF
        (tmp_path / f.path).write_bytes(bytes(data))
    with pytest.raises(InputError, match=rf"{first} is corrupted"):
        cf.verify(tmp_path, m)


def test_missing_file_is_refused(tmp_path: Path) -> None:
    m = _checkpoint(tmp_path)
    (tmp_path / "nodes/c0/disk.qcow2").unlink()
    with pytest.raises(InputError, match=r"nodes/c0/disk\.qcow2 is missing"):
        cf.verify(tmp_path, m)


def _rewrite(root: Path, **changes: object) -> None:
    data = json.loads((root / cf.MANIFEST).read_text())
    data.update(changes)
    (root / cf.MANIFEST).write_text(json.dumps(data))


def test_other_version_architecture_and_schema_are_refused(tmp_path: Path) -> None:
    _checkpoint(tmp_path)
    _rewrite(tmp_path, hpvc_version="0.0.1")
    with pytest.raises(InputError, match=f"taken by hpvc 0.0.1, this is hpvc {__version__}"):
        cf.read_manifest(tmp_path)
    assert cf.read_manifest(tmp_path, check_version=False).hpvc_version == "0.0.1"  # ls/show
    _rewrite(tmp_path, hpvc_version=__version__, arch="riscv64")
    with pytest.raises(InputError, match=f"taken on riscv64, this host is {cf.machine()}"):
        cf.read_manifest(tmp_path)
    _rewrite(tmp_path, arch=cf.machine(), schema=99)
    with pytest.raises(InputError, match="schema 99, this hpvc reads schema 1"):
        cf.read_manifest(tmp_path)


def test_missing_key_and_escaping_path_are_refused(tmp_path: Path) -> None:
    m = _checkpoint(tmp_path)
    data = m.to_json()
    del data["nodes"][0]["mac"]
    with pytest.raises(InputError, match=r"nodes\[0\]\.mac is missing or not a str"):
        cf.from_json(tmp_path, data)
    data = m.to_json()
    data["nodes"][0]["files"][0]["path"] = "../../etc/passwd"
    with pytest.raises(InputError, match="leaves the checkpoint"):
        cf.from_json(tmp_path, data)
    with pytest.raises(InputError, match="lists no node"):
        cf.from_json(tmp_path, {**m.to_json(), "nodes": []})


def test_manifest_is_written_last_and_atomically(tmp_path: Path) -> None:
    m = _checkpoint(tmp_path)
    cf.write_manifest(tmp_path, replace(m, stopped=True))
    assert sorted(p.name for p in tmp_path.iterdir()) == [cf.MANIFEST, cf.NODES]
    assert cf.read_manifest(tmp_path).stopped is True
