"""Issue 25, item 6: a small spec that asks for millions of nodes is refused by
arithmetic, before anything is expanded or planned; what a spec may ask (nodes,
groups, disk per node) is capped by site policy, which a site can raise."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hpvc.errors import InputError, SpecError
from hpvc.plan import planner
from hpvc.slurm import policy
from hpvc.spec import parse_spec, read_spec
from hpvc.spec.limits import DEFAULT, Limits, read_site

# The spec: 20 groups of 100,000 nodes, a network that has room for them.
HUGE = 'name = "big"\n[network]\nsubnet = "10.0.0.0/8"\n' + (
    '[[nodes]]\nrole = "compute"\ncount = 100000\nmemory = "64MiB"\n' * 20
)


@pytest.fixture
def no_expand(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fails the test if anything expands a spec into its nodes."""

    def refuse(*_: object) -> None:
        raise AssertionError("the spec was expanded before the refusal")

    monkeypatch.setattr(planner, "expand", refuse)
    monkeypatch.setattr(policy, "expand", refuse)


def test_huge_spec_refused_by_arithmetic(tmp_path: Path, no_expand: None) -> None:
    path = tmp_path / "big.toml"
    path.write_text(HUGE)
    assert len(HUGE) < 2048
    with pytest.raises(SpecError) as e:
        read_spec(path, DEFAULT)
    assert e.value.exit_code == 2 and e.value.key == "nodes"
    assert "2000000 nodes in all" in e.value.why and "at most 1024 (max_nodes)" in e.value.why
    assert "/etc/hpvc/limits.toml" in e.value.fix and "\n" not in str(e.value)


def test_slurm_submit_refuses_before_expanding(tmp_path: Path, no_expand: None) -> None:
    """``hpvc node check`` (srun/sbatch) and ``node up``: the same refusal,
    naming the plugin's setting, not the file."""
    path = tmp_path / "big.toml"
    path.write_text(HUGE)
    site = policy.Site.parse(["subnets=10.0.0.0/8"])
    with pytest.raises(InputError) as e:
        policy.check_spec(path, site, hosts=2, mem_mib=600)
    assert e.value.exit_code == 2 and "2000000 nodes in all" in str(e.value)
    assert "plugstack.conf: max_nodes=" in e.value.fix
    with pytest.raises(InputError):
        policy.load(HUGE, "job 1 spec", site)


def test_too_many_groups_refused_before_the_schema(monkeypatch: pytest.MonkeyPatch) -> None:
    from hpvc.spec import model

    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("the schema ran before the group count was checked")

    monkeypatch.setattr(model.Spec, "model_validate", refuse)
    doc = {"name": "g", "nodes": [{"role": "compute"}] * 65}
    with pytest.raises(SpecError) as e:
        parse_spec(doc, "g.toml", DEFAULT)
    assert e.value.key == "nodes" and "65 node groups" in e.value.why
    assert "at most 64 (max_groups)" in e.value.why


def test_disk_per_node_capped(tmp_path: Path) -> None:
    doc = {"name": "d", "nodes": [{"role": "head"}, {"role": "compute", "disk": "16TiB"}]}
    with pytest.raises(SpecError) as e:
        parse_spec(doc, "d.toml", DEFAULT)
    assert e.value.key == "nodes[1].disk"
    assert e.value.why == "16384GiB per node, this site allows at most 1024GiB (max_disk)"
    # Without caps (a stored record read back) the schema's range alone applies.
    assert parse_spec(doc, "d.toml").nodes[1].disk == 16 << 20


def test_at_the_caps_is_allowed() -> None:
    doc = {
        "name": "ok",
        "network": {"subnet": "10.0.0.0/16"},
        "nodes": [{"role": "compute", "count": 16, "disk": "1TiB"}] * 64,
    }
    spec = parse_spec(doc, "ok.toml", DEFAULT)
    assert sum(g.count for g in spec.nodes) == DEFAULT.max_nodes
    doc["nodes"] = [*doc["nodes"], {"role": "head"}]  # type: ignore[list-item]
    with pytest.raises(SpecError):
        parse_spec(doc, "ok.toml", DEFAULT)


def test_site_file_raises_the_caps(tmp_path: Path) -> None:
    site = tmp_path / "limits.toml"
    assert read_site(site) == DEFAULT  # no file: the defaults
    site.write_text('max_nodes = 5000\nmax_groups = 100\nmax_disk = "4TiB"\n')
    limits = read_site(site)
    assert limits == Limits(max_nodes=5000, max_groups=100, max_disk_mib=4 << 20)
    doc = {
        "name": "r",
        "network": {"subnet": "10.0.0.0/16"},
        "nodes": [{"role": "compute", "count": 50, "disk": "2TiB"}] * 100,
    }
    assert sum(g.count for g in parse_spec(doc, "r.toml", limits).nodes) == 5000


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("max_nodes = 0\n", "not a positive count"),
        ('max_nodes = "many"\n', "not a positive count"),
        ('max_disk = "lots"\n', "not a size"),
        ("max_cpus = 3\n", "unknown key 'max_cpus'"),
        ("max_nodes = \n", "not valid TOML"),
    ],
)
def test_bad_site_file_is_one_line(tmp_path: Path, text: str, why: str) -> None:
    site = tmp_path / "limits.toml"
    site.write_text(text)
    with pytest.raises(InputError) as e:
        read_site(site)
    assert e.value.exit_code == 2 and why in str(e.value) and "\n" not in str(e.value)


def test_plugstack_settings() -> None:
    site = policy.Site.parse(["max_nodes=10", "max_groups=2", "max_disk=8GiB"])
    assert site.limits == Limits(max_nodes=10, max_groups=2, max_disk_mib=8192)
    for bad in ("max_nodes=-1", "max_nodes=1,2", "max_disk=huge"):
        with pytest.raises(InputError):
            policy.Site.parse([bad])
    spec = 'name = "a"\n[[nodes]]\nrole = "compute"\ncount = 11\nmemory = "64MiB"\n'
    with pytest.raises(InputError) as e:
        policy.load(spec, "s.toml", site)
    assert "11 nodes in all, this site allows at most 10 (max_nodes)" in str(e.value)


def test_cli_plan_refuses_in_one_line_with_little_memory(tmp_path: Path) -> None:
    """``hpvc plan`` of the issue's spec in a process of its own: exit 2, one
    line naming the cap, and its peak memory an upper bound that expanding
    two million nodes (913 MB in the issue) would break."""
    path = tmp_path / "big.toml"
    path.write_text(HUGE)
    code = (
        "import json, sys\n"
        "from hpvc.cli import main\n"
        "try:\n"
        "    main(['plan', sys.argv[1]])\n"
        "except SystemExit as e:\n"
        "    code = e.code\n"
        # VmHWM: this process's peak since its exec (ru_maxrss keeps the parent's).
        "rss = [int(x.split()[1]) for x in open('/proc/self/status') if x.startswith('VmHWM')][0]\n"
        "print(json.dumps({'code': code, 'rss_kib': rss}))\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120
    )
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["code"] == 2, r
    err = r.stderr.strip()
    assert "\n" not in err and "2000000 nodes in all" in err, err
    assert out["rss_kib"] < 200 * 1024, out
