"""The `disk` key of a node group (its writable layer's size), its plan, and
the pure parts of hpvc.host.layer."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from hpvc.errors import SpecError
from hpvc.host import layer
from hpvc.plan.model import plan_from_json
from hpvc.spec import parse_spec
from hpvc.spec.model import DISK_DEFAULT_MIB
from tests.unit.test_plan import plan_on, spec
from tests.unit.topogen import make_topology


def group(**keys: Any) -> dict[str, Any]:
    return {"name": "t", "nodes": [{"role": "compute", **keys}]}


def test_default_is_four_gib() -> None:
    assert DISK_DEFAULT_MIB == 4096
    assert parse_spec(group()).nodes[0].disk == 4096


@pytest.mark.parametrize(
    ("value", "mib"),
    [
        ("2G", 2048),
        ("2GiB", 2048),
        ("512MiB", 512),
        ("1.5GiB", 1536),
        ("64MiB", 64),
        ("16TiB", 16 << 20),
    ],
)
def test_valid_sizes(value: str, mib: int) -> None:
    assert parse_spec(group(disk=value)).nodes[0].disk == mib


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (2048, "write the unit"),
        ("2048", "write the unit"),
        (True, "must be a string"),
        (["2G"], "must be a string"),
        ("2 lots", "is not a size"),
        ("", "is not a size"),
        ("100MB", "not a whole number of MiB"),
        ("1000KiB", "not a whole number of MiB"),
        ("32MiB", "out of range: give 64MiB to 16TiB"),
        ("0MiB", "out of range"),
        ("17TiB", "out of range"),
    ],
)
def test_invalid_sizes_name_the_key(value: object, why: str) -> None:
    with pytest.raises(SpecError) as e:
        parse_spec(
            {"name": "t", "nodes": [{"role": "head"}, {"role": "compute", "disk": value}]}, "s.toml"
        )
    assert e.value.exit_code == 2 and e.value.key == "nodes[1].disk"
    assert why in e.value.why and e.value.fix
    assert "\n" not in str(e.value)


def test_vms_refuse_the_key_and_plan_no_layer() -> None:
    with pytest.raises(SpecError) as e:
        parse_spec({"name": "t", "kind": "vm", "nodes": [{"role": "compute", "disk": "2GiB"}]})
    assert e.value.key == "nodes[0].disk" and 'kind = "container" only' in e.value.why
    p = plan_on(spec([{"role": "compute", "memory": "1GiB"}], kind="vm"), make_topology())
    assert [n.disk_mib for n in p.nodes] == [None]


def test_cli_says_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from hpvc.cli import main

    path = tmp_path / "s.toml"
    path.write_text('name = "t"\n[[nodes]]\nrole = "compute"\ndisk = "lots"\n')
    with pytest.raises(SystemExit) as e:
        main(["plan", str(path)])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and "\n" not in err
    assert err.startswith(f"hpvc: {path}: nodes[0].disk: 'lots' is not a size")


def test_plan_carries_each_groups_disk_and_old_plans_load() -> None:
    s = spec(
        [
            {"role": "head", "memory": "1GiB"},
            {"role": "compute", "count": 2, "memory": "1GiB", "disk": "512MiB"},
        ]
    )
    p = plan_on(s, make_topology())
    assert [n.disk_mib for n in p.nodes] == [4096, 512, 512]
    j = p.to_json()
    assert [n["disk_mib"] for n in j["nodes"]] == [4096, 512, 512]
    assert plan_from_json(j) == p
    for n in j["nodes"]:  # a plan saved before `disk` existed: no limit
        del n["disk_mib"]
    assert [n.disk_mib for n in plan_from_json(j).nodes] == [None] * 3


def test_sparse_copy_keeps_holes_and_data(tmp_path: Path) -> None:
    src, dest = tmp_path / "src", tmp_path / "dest"
    with open(src, "wb") as f:
        f.truncate(64 << 20)
        f.seek(1 << 20)
        f.write(b"a" * 4096)
        f.seek(40 << 20)
        f.write(b"b" * 8192)
    layer.sparse_copy(src, dest)
    assert dest.read_bytes() == src.read_bytes()
    assert dest.stat().st_blocks * 512 < 1 << 20  # holes stayed holes
    assert dest.stat().st_mode & 0o777 == 0o600
    with pytest.raises(FileExistsError):
        layer.sparse_copy(src, dest)


def test_loop_config_is_the_kernels_struct() -> None:
    # struct loop_config: u32 fd, u32 block_size, loop_info64 (232 bytes), 64 reserved
    cfg = layer._loop_config(7, 4 | 16)
    assert len(cfg) == 304
    assert int.from_bytes(cfg[:4], "little") == 7
    assert int.from_bytes(cfg[8 + 52 : 8 + 56], "little") == 20  # lo_flags


def test_overcommit_warns_only_past_free_space(tmp_path: Path) -> None:
    st = os.statvfs(tmp_path)
    free = st.f_bavail * st.f_frsize >> 20
    assert layer.overcommit(tmp_path, [1, 1]) is None
    warning = layer.overcommit(tmp_path, [free, 4096])
    assert warning is not None and "lower the nodes' disk" in warning
