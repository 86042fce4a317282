"""What keeps one user's cluster from another user (issue 13), without a host:

- every folder hpvc makes in its state directory is 0700 when it is made
  (clusters, nodes, locks, run, journals' folders), and a legacy one left
  open by an older hpvc is closed when next used;
- a tenant's (Slurm share's) container nodes get nosuid,nodev on the folders
  bound into them; root's own clusters render as before;
- ``hpvc up`` refuses the names Slurm's shares take (``j<job>-<index>``);
- names are matched whole: a trailing newline is not a valid name.

The integration side (a real cluster probed as nobody) is
tests/integration/test_tenant_paths.py.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest

from hpvc.cli import main
from hpvc.cluster import lifecycle
from hpvc.errors import HpvcError, InputError, SpecError
from hpvc.host import tree
from hpvc.host.journal import Journal
from hpvc.image import guest as guest_image
from hpvc.image import guest_kernel
from hpvc.image.model import ImageSpec, check_name, normalize_packages
from hpvc.paths import PRIVATE, private_dir
from hpvc.render import render_oci_config
from hpvc.spec import parse_spec
from hpvc.store import ClusterRecord, Store
from hpvc.units import parse_size
from tests.unit.test_render import ctx, hand_container_plan

NODES = [{"role": "compute"}]


def mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def record(name: str) -> ClusterRecord:
    return ClusterRecord(name, {}, f"{name}.toml", {}, "running", 0.0, 0.0)


# --- private folders ----------------------------------------------------------------


def test_private_dir_makes_every_missing_level_0700(tmp_path: Path) -> None:
    d = private_dir(tmp_path / "a" / "b" / "c")
    assert d.is_dir()
    for p in (tmp_path / "a", tmp_path / "a" / "b", d):
        assert mode(p) == PRIVATE, p


def test_private_dir_leaves_an_existing_folder_alone_unless_told(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir(mode=0o755)
    os.chmod(site, 0o755)
    private_dir(site)
    assert mode(site) == 0o755  # a state root a site chose keeps its mode
    private_dir(site, tighten=True)
    assert mode(site) == PRIVATE
    f = tmp_path / "file"
    f.write_text("")
    with pytest.raises(NotADirectoryError):
        private_dir(f)


def test_store_folders_and_records_are_root_only(tmp_path: Path) -> None:
    store = Store(tmp_path / "state")
    with store.lock():
        pass
    assert mode(store.root) == PRIVATE  # made by hpvc: nobody else lists it
    store.save(record("c1"))
    assert mode(store.root / "clusters") == PRIVATE
    assert mode(store.cluster_dir("c1")) == PRIVATE
    assert mode(store.cluster_dir("c1") / "cluster.json") == 0o600
    with store.cluster_lock("c1", "test", lambda _: None):
        assert mode(store.root / "locks") == PRIVATE
    run = store.run_dir("c1")
    assert mode(run) == PRIVATE and mode(run.parent) == PRIVATE
    tree.record(store.node_journal("c1", "compute0"), store.node_dir("c1", "compute0"))
    assert mode(store.cluster_dir("c1") / "nodes") == PRIVATE
    assert mode(store.node_dir("c1", "compute0")) == PRIVATE


def test_folders_an_older_hpvc_left_open_are_closed(tmp_path: Path) -> None:
    root = tmp_path / "state"
    for d in ("clusters/old", "locks", "run/old"):
        (root / d).mkdir(parents=True)
    for p in (root, root / "clusters", root / "locks", root / "run"):
        os.chmod(p, 0o755)
    store = Store(root)
    store.save(record("new"))
    with store.cluster_lock("new", "test", lambda _: None):
        pass
    store.run_dir("new")
    assert mode(root) == 0o755  # the root may be a site's choice: not changed
    for p in (root / "clusters", root / "locks", root / "run"):
        assert mode(p) == PRIVATE, p
    assert store.names() == ["new"]


def test_a_journal_makes_its_folder_root_only(tmp_path: Path) -> None:
    j = Journal(tmp_path / "x" / "nodes" / "n" / "journal.jsonl")
    tree.record(j, tmp_path / "x" / "nodes" / "n")
    assert mode(tmp_path / "x") == PRIVATE and mode(tmp_path / "x" / "nodes" / "n") == PRIVATE
    assert mode(j.path) == 0o600


# --- tenants' mounts ------------------------------------------------------------------


def _mounts(tenant: bool) -> dict[str, list[str]]:
    plan = hand_container_plan()
    c = ctx(binds=(("/site/home", "/home", False), ("/x/shared", "/shared", False)), tenant=tenant)
    cfg: dict[str, Any] = render_oci_config(plan, plan.node("compute0"), c)
    return {m["destination"]: m["options"] for m in cfg["mounts"]}


def test_a_tenants_binds_are_nosuid_nodev() -> None:
    mounts = _mounts(tenant=True)
    for dest in ("/home", "/shared", "/etc/hosts", "/dev/shm", "/dev/hugepages"):
        assert {"nosuid", "nodev"} <= set(mounts[dest]), dest


def test_roots_own_cluster_renders_as_before() -> None:
    mounts = _mounts(tenant=False)
    assert mounts["/home"] == ["rbind", "rw"] and mounts["/shared"] == ["rbind", "rw"]
    assert mounts["/etc/hosts"] == ["rbind", "ro"]


def test_tenant_is_kept_in_the_record(tmp_path: Path) -> None:
    store = Store(tmp_path)
    rec = record("j7-0")
    rec.tenant = True
    store.save(rec)
    assert store.get("j7-0").tenant is True
    legacy = {k: v for k, v in record("old").to_json().items() if k != "tenant"}
    assert ClusterRecord.from_json(legacy).tenant is False


# --- names Slurm keeps --------------------------------------------------------------


NODE_DOC = {"role": "compute", "memory": "256MiB"}


def _spec_file(tmp_path: Path, name: str) -> Path:
    p = tmp_path / "c.toml"
    p.write_text(
        f'name = "{name}"\nimage = "hpc"\n[[nodes]]\nrole = "compute"\nmemory = "256MiB"\n'
    )
    return p


@pytest.mark.parametrize("name", ["j1-0", "j42-3", "j007-12"])
def test_up_refuses_a_slurm_share_name(
    name: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    called: list[str] = []
    monkeypatch.setattr(lifecycle, "up_spec", lambda *a, **k: called.append("up"))
    monkeypatch.setenv("HPVC_STATE_DIR", str(tmp_path / "state"))
    with pytest.raises(SystemExit) as e:
        main(["up", str(_spec_file(tmp_path, name))])
    assert e.value.code == 2 and called == []
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert f"name: '{name}' has the shape of a Slurm job's share" in err
    assert "give the cluster another name" in err


@pytest.mark.parametrize("name", ["j1", "jx-0", "job1-0", "j1-0a", "demo"])
def test_up_takes_names_that_are_not_shares(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    called: list[str] = []

    def fake_up(*_: object, **__: object) -> ClusterRecord:
        called.append("up")
        raise InputError("fake up", "stopped here")

    monkeypatch.setattr(lifecycle, "up_spec", fake_up)
    with pytest.raises(SystemExit):
        main(["up", str(_spec_file(tmp_path, name))])
    assert called == ["up"]


def test_up_reads_the_spec_file_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``hpvc up SPEC`` reads and parses the file once, up to the planning (it
    used to read it three times: the name check, the spec, the document)."""
    path = _spec_file(tmp_path, "demo")
    reads: list[str] = []
    for method in ("read_bytes", "read_text"):
        real = getattr(Path, method)

        def counted(self: Path, *a: Any, _real: Any = real, _m: str = method, **k: Any) -> Any:
            if self.name == path.name:
                reads.append(_m)
            return _real(self, *a, **k)

        monkeypatch.setattr(Path, method, counted)
    planned: list[tuple[str, dict[str, Any]]] = []

    def stop_at_planning(_b: object, spec: Any, doc: dict[str, Any], *_: Any, **__: Any) -> Any:
        planned.append((spec.name, doc))
        raise InputError("fake up", "stopped here")

    monkeypatch.setattr(lifecycle, "preflight", lambda spec, *a: object())
    monkeypatch.setattr(lifecycle, "_up_locked", stop_at_planning)
    monkeypatch.setenv("HPVC_STATE_DIR", str(tmp_path / "state"))
    with pytest.raises(SystemExit):
        main(["up", str(path)])
    assert planned == [("demo", {"name": "demo", "image": "hpc", "nodes": [NODE_DOC]})]
    assert reads == ["read_bytes"]


def test_the_slurm_path_still_makes_share_clusters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """up_spec (what hpvc.slurm.node calls, with the name it sets) checks no name."""
    reached: list[str] = []
    monkeypatch.setattr(lifecycle, "preflight", lambda spec, *a: object())
    monkeypatch.setattr(lifecycle, "_up_locked", lambda *a, **k: reached.append(a[1].name))
    spec = parse_spec({"name": "j7-0", "nodes": NODES})
    lifecycle.up_spec(spec, {}, "slurm job 7", Store(tmp_path), tenant=True)
    assert reached == ["j7-0"]


# --- whole-string names -------------------------------------------------------------


@pytest.mark.parametrize("name", ["demo\n", "demo\r\n", "\ndemo", "de mo"])
def test_a_cluster_name_with_a_newline_is_refused(name: str) -> None:
    with pytest.raises(SpecError, match="is not a cluster name"):
        parse_spec({"name": name, "nodes": NODES})
    assert parse_spec({"name": "demo", "nodes": NODES}).name == "demo"


def test_an_image_name_with_a_newline_is_refused() -> None:
    with pytest.raises(SpecError, match="is not an image name"):
        parse_spec({"name": "demo", "image": "hpc\n", "nodes": NODES})
    with pytest.raises(InputError):
        check_name("hpc\n")
    assert check_name("hpc") == "hpc"


def test_image_recipe_fields_with_a_newline_are_refused() -> None:
    assert normalize_packages(["vim\n"]) == ("vim",)  # list items are stripped first
    with pytest.raises(InputError):
        ImageSpec.make(suite="bookworm\n")
    with pytest.raises(InputError):
        ImageSpec.make(mirror="http://deb.debian.org/debian\n")


def test_guest_names_and_kernels_with_a_newline_are_refused() -> None:
    with pytest.raises(InputError):
        guest_image._hostname("compute0\n")
    assert guest_image._hostname("compute0") == "compute0"
    with pytest.raises(HpvcError):
        guest_kernel.check_version("6.1.0-56-cloud-amd64\n")
    assert guest_kernel.check_version("6.1.0-56-cloud-amd64") == "6.1.0-56-cloud-amd64"


def test_sizes_still_allow_surrounding_blanks() -> None:
    assert parse_size(" 2GiB \n") == parse_size("2GiB") == 2 * 2**30
