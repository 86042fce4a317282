"""Spec loading: valid files load, every kind of mistake names file, key path and fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpvc.errors import SpecError
from hpvc.spec import load_spec, parse_spec
from hpvc.spec.model import Spec
from hpvc.units import format_cpulist, parse_cpulist, parse_size

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

GOOD = """
name = "demo"
kind = "container"
image = "hpc"
[network]
subnet = "10.88.0.0/24"
mtu = 9000
[tuning]
pinning = "dedicated"
hugepages = "2M"
numa = "mirror"
partition = "hpc"
[[nodes]]
role = "head"
count = 1
vcpus = 1
memory = "1GiB"
[[nodes]]
role = "compute"
count = 2
vcpus = 2
memory = "2GiB"
io = { read_bps = "50MB", write_bps = "50MB", weight = 500 }
"""


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "spec.toml"
    p.write_text(text)
    return p


def test_issue_example_loads(tmp_path: Path) -> None:
    s = load_spec(write(tmp_path, GOOD))
    assert s.name == "demo" and s.tuning.hugepage_kib == 2048
    assert [(g.role, g.count, g.vcpus, g.memory) for g in s.nodes] == [
        ("head", 1, 1, 1024),
        ("compute", 2, 2, 2048),
    ]
    io = s.nodes[1].io
    assert io is not None and io.read_bps == 50_000_000 and io.weight == 500


@pytest.mark.parametrize(
    "path", sorted(p for p in EXAMPLES.glob("*.toml") if p.name != "hosts.toml")
)
def test_examples_load(path: Path) -> None:
    assert load_spec(path).nodes


@pytest.mark.parametrize(
    ("change", "key", "why"),
    [
        (('pinning = "dedicated"', 'pinning = "pinned"'), "tuning.pinning", "'dedicated' or"),
        (('memory = "1GiB"', 'memory = "1 lot"'), "nodes[0].memory", "is not a size"),
        (('memory = "1GiB"', "memory = 1024"), "nodes[0].memory", "write the unit"),
        (('memory = "1GiB"', 'memory = "1001MiB"'), "nodes[0].memory", "multiple of the 2M"),
        (('subnet = "10.88.0.0/24"', 'subnet = "10.88.0.1/24"'), "network.subnet", "IPv4"),
        (("mtu = 9000", "mtu = 70000"), "network.mtu", "less than or equal to 65520"),
        (('name = "demo"', 'name = "Demo Cluster"'), "name", "not a cluster name"),
        (("count = 2", "count = -1"), "nodes[1].count", "greater than or equal to 0"),
        (("weight = 500", "weight = 5000"), "nodes[1].io.weight", "less than or equal to 1000"),
        (('role = "head"', 'role = "login"'), "nodes[0].role", "'head', 'compute' or"),
        (("vcpus = 1", "vcpus = 1\ncolour = 3"), "nodes[0].colour", "unknown key"),
        (
            ('memory = "1GiB"', 'memory = "1GiB"\nhugepage_memory = "1GiB"'),
            "nodes[0].hugepage_memory",
            "leaves 0MiB of the node's 1024MiB as normal memory",
        ),
        (
            ('memory = "1GiB"', 'memory = "1GiB"\nhugepage_memory = "3MiB"'),
            "nodes[0].hugepage_memory",
            "multiple of the 2M",
        ),
        (
            ('memory = "1GiB"', 'memory = "1GiB"\nhugepage_memory = 512'),
            "nodes[0].hugepage_memory",
            "write the unit",
        ),
        (
            (
                'hugepages = "2M"',
                'hugepages = "none"',
                'memory = "1GiB"',
                'memory = "1GiB"\nhugepage_memory = "512MiB"',
            ),
            "nodes[0].hugepage_memory",
            'tuning.hugepages = "none"',
        ),
        (
            (
                'kind = "container"',
                'kind = "vm"',
                'memory = "1GiB"',
                'memory = "1GiB"\nhugepage_memory = "512MiB"',
            ),
            "nodes[0].hugepage_memory",
            'applies to kind = "container" only',
        ),
    ],
)
def test_mistakes_name_file_key_and_fix(
    tmp_path: Path, change: tuple[str, ...], key: str, why: str
) -> None:
    text = GOOD
    for old, new in zip(change[::2], change[1::2], strict=True):
        text = text.replace(old, new, 1)
    assert text != GOOD
    path = write(tmp_path, text)
    with pytest.raises(SpecError) as e:
        load_spec(path)
    assert e.value.exit_code == 2
    assert e.value.path == str(path)
    assert e.value.key == key
    assert why in e.value.why
    assert e.value.fix


def test_hugepage_memory_of_containers_and_vms(tmp_path: Path) -> None:
    """A container node's hugepages are what its group asks (default none); a
    VM's memory is all hugepages; without hugepages, neither has any."""

    def spec_of(old: str, new: str) -> Spec:
        return load_spec(write(tmp_path, GOOD.replace(old, new, 1)))

    base = spec_of('memory = "2GiB"', 'memory = "2GiB"\nhugepage_memory = "1GiB"')
    head, compute = base.nodes
    assert (base.hugepage_mib(head), base.hugepage_mib(compute)) == (0, 1024)
    vm = spec_of('kind = "container"', 'kind = "vm"')
    assert [vm.hugepage_mib(g) for g in vm.nodes] == [1024, 2048]
    flat = spec_of('hugepages = "2M"', 'hugepages = "none"')
    assert [flat.hugepage_mib(g) for g in flat.nodes] == [0, 0]
    zero = spec_of('memory = "1GiB"', 'memory = "1GiB"\nhugepage_memory = "0MiB"')
    assert zero.hugepage_mib(zero.nodes[0]) == 0


def test_subnet_too_small_for_the_nodes(tmp_path: Path) -> None:
    text = GOOD.replace('subnet = "10.88.0.0/24"', 'subnet = "10.88.0.0/30"').replace(
        "count = 2", "count = 20"
    )
    with pytest.raises(SpecError, match="has room for 1 nodes, the spec asks for 21"):
        load_spec(write(tmp_path, text))


def test_not_toml_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="not valid TOML"):
        load_spec(write(tmp_path, "name = "))
    with pytest.raises(SpecError, match="file not found"):
        load_spec(tmp_path / "nope.toml")


def test_missing_nodes_key() -> None:
    with pytest.raises(SpecError) as e:
        parse_spec({"name": "x"})
    assert e.value.key == "nodes" and "missing" in e.value.why


def test_sizes_and_cpulists() -> None:
    assert parse_size("2GiB") == 2 << 30
    assert parse_size("512MiB") == 512 << 20
    assert parse_size("50MB/s") == 50_000_000
    assert parse_size("1G") == 1 << 30
    for bad in ("", "GiB", "1.5B", "-1MB", "12 parsecs"):
        with pytest.raises(ValueError):
            parse_size(bad)
    assert parse_cpulist("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_cpulist("0-6:2") == [0, 2, 4, 6]
    assert parse_cpulist("") == []
    assert format_cpulist([11, 0, 1, 2, 3, 8, 10]) == "0-3,8,10-11"


def test_cli_spec_error_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from hpvc.cli import main

    path = write(tmp_path, GOOD.replace('hugepages = "2M"', 'hugepages = "4M"'))
    with pytest.raises(SystemExit) as e:
        main(["plan", str(path)])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"hpvc: {path}: tuning.hugepages:") and "\n" not in err
