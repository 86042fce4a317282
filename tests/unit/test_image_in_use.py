"""Which image, by digest, each cluster's nodes run (issue 26): the record keeps
it from up, scale and restart (an old record without it still loads), status
and ls show it, ``image rm`` refuses a digest a record holds naming the
clusters, and ``gc`` removes interrupted imports but never a running one."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from hpvc.cli import main
from hpvc.cli.cluster import image_text
from hpvc.cluster import gc, images, listing
from hpvc.errors import InputError
from hpvc.host import procfs
from hpvc.image import Store as ImageStore
from hpvc.image import remove_image
from hpvc.plan import plan_cluster
from hpvc.spec import parse_spec
from hpvc.store import ClusterRecord, Store
from tests.unit.topogen import make_topology

OLD, NEW = "a" * 64, "b" * 64


def spec(image: str = "mine", computes: int = 2) -> dict[str, Any]:
    return {
        "name": "c",
        "kind": "container",
        "image": image,
        "tuning": {"pinning": "shared", "hugepages": "none", "partition": "commodity"},
        "nodes": [
            {"role": "head", "vcpus": 1, "memory": "256MiB"},
            {"role": "compute", "count": computes, "vcpus": 1, "memory": "256MiB"},
        ],
    }


def plan_json(doc: dict[str, Any]) -> dict[str, Any]:
    plan = plan_cluster(parse_spec(doc), [("h0", make_topology())], None)
    return plan.to_json()


def image_store(tmp_path: Path, **names: str) -> ImageStore:
    """A store whose names point to digests with (empty) complete directories."""
    s = ImageStore(tmp_path / "images")
    s.ensure()
    for name, digest in names.items():
        (s.names_dir / name).write_text(digest + "\n")
        s.digest_dir(digest).mkdir(exist_ok=True)
        (s.digest_dir(digest) / "image.json").write_text(json.dumps({"names": [name]}))
    return s


def saved(tmp_path: Path, doc: dict[str, Any], digests: dict[str, str]) -> Store:
    store = Store(tmp_path / "state")
    now = time.time()
    rec = ClusterRecord("c", doc, "c.toml", plan_json(doc), "running", now, now, backend="crun")
    rec.images = digests
    store.save(rec)
    return store


def test_a_record_written_before_digests_were_kept_loads_without_them(tmp_path: Path) -> None:
    store = saved(tmp_path, spec(), {"head0": OLD})
    path = store.layout.record("c")
    doc = json.loads(path.read_text())
    assert doc["images"] == {"head0": OLD}
    del doc["images"]
    path.write_text(json.dumps(doc))
    rec = store.get("c")
    assert rec.images == {} and rec.image_digests() == {} and rec.image_name() == "mine"
    assert image_text("mine", rec.image_digests()) == "mine (digest not recorded)"


def test_up_records_every_node_and_scale_only_the_new_ones(tmp_path: Path) -> None:
    imgs = image_store(tmp_path, mine=OLD)
    now = time.time()
    rec = ClusterRecord("c", spec(), "c.toml", plan_json(spec()), "creating", now, now)
    images.record(rec, ["head0", "compute0", "compute1"], imgs)  # as up's booking does
    assert rec.image_digests() == {OLD: ["compute0", "compute1", "head0"]}
    (imgs.names_dir / "mine").write_text(NEW + "\n")  # re-imported under the same name
    images.record(rec, ["compute2"], imgs)  # scale's booking: the old plan and the new node
    assert rec.image_digests() == {OLD: ["compute0", "compute1", "head0"], NEW: ["compute2"]}
    rec.plan = plan_json(spec(computes=1))  # scaled down to one compute after all
    images.record(rec, [], imgs)
    assert rec.image_digests() == {OLD: ["compute0", "head0"]}
    images.record(rec, ["compute0"], imgs)  # a restart starts it from what the name is now
    assert rec.image_digests() == {OLD: ["head0"], NEW: ["compute0"]}
    missing = ClusterRecord("d", spec("gone"), "d.toml", plan_json(spec()), "creating", now, now)
    images.record(missing, ["head0"], imgs)  # an image the store lacks: nothing recorded
    assert missing.images == {}


def test_status_and_ls_say_the_image_and_its_digest_per_cluster_or_per_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    one = {"head0": OLD, "compute0": OLD, "compute1": OLD}
    assert image_text("mine", {OLD: sorted(one)}) == f"mine {OLD[:12]}"
    assert (
        image_text("mine", {OLD: ["head0"], NEW: ["compute0", "compute1"]})
        == f"mine {OLD[:12]} on head0; {NEW[:12]} on compute0, compute1"
    )
    store = saved(tmp_path, spec(), {"head0": OLD, "compute0": NEW, "compute1": NEW})
    (row,) = listing.list_clusters(store)
    assert row["image"] == "mine"
    assert row["image_digests"] == {OLD: ["head0"], NEW: ["compute0", "compute1"]}
    monkeypatch.setenv("HPVC_STATE_DIR", str(store.root))
    cli(["ls"])
    out = capsys.readouterr().out
    assert f"mine {OLD[:12]} on head0;" in out and f"{NEW[:12]} on" in out
    cli(["ls", "--json"])
    assert json.loads(capsys.readouterr().out)[0]["image_digests"] == row["image_digests"]


def cli(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 0


def test_status_json_carries_the_digests(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hpvc.cluster import ops
    from hpvc.cluster import status as status_mod  # where ops.status lives (issue 33)

    store = saved(tmp_path, spec(), {"head0": OLD, "compute0": OLD, "compute1": OLD})
    monkeypatch.setattr(status_mod, "_node_status", lambda *a: {})
    monkeypatch.setattr(status_mod, "_shared_dir", lambda env: None)
    monkeypatch.setattr(status_mod, "_across_hosts", lambda *a: None)
    st = ops.status("c", store)
    assert st["image"] == "mine"
    assert st["image_digests"] == {OLD: ["compute0", "compute1", "head0"]}


def test_rm_refuses_a_digest_a_record_holds_naming_the_cluster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The cluster's spec names another image: only the digest in its record ties it.
    imgs = image_store(tmp_path, mine=OLD)
    store = saved(tmp_path, spec("other"), {"head0": OLD, "compute0": OLD, "compute1": OLD})
    with pytest.raises(InputError, match=r"image 'mine' \(aaaaaaaaaaaa\): in use by cluster c"):
        remove_image("mine", imgs, in_use=images.in_use(store, imgs))
    assert imgs.read_name("mine") == OLD
    monkeypatch.setenv("HPVC_STATE_DIR", str(store.root))
    with pytest.raises(SystemExit) as e:
        main(["image", "rm", "mine", "--store", str(imgs.root)])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "in use by cluster c" in err
    # A name pointed elsewhere (a re-import) keeps the digest the nodes run.
    image_store(tmp_path, newer=NEW)
    with imgs.lock():
        imgs.point("mine", NEW, images.in_use(store, imgs))
    assert imgs.digest_dir(OLD).is_dir()
    store.remove("c")
    remove_image("newer", imgs, in_use=images.in_use(store, imgs))  # mine keeps NEW
    assert remove_image("mine", imgs, in_use=images.in_use(store, imgs)).deleted


def test_an_old_record_still_holds_the_digest_its_name_points_to(tmp_path: Path) -> None:
    imgs = image_store(tmp_path, mine=OLD)
    store = saved(tmp_path, spec(), {})
    assert images.in_use(store, imgs)(OLD) == ["c"]
    assert images.in_use(store, imgs)(NEW) == []


def dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_gc_removes_an_interrupted_import_and_never_a_running_one(tmp_path: Path) -> None:
    imgs = image_store(tmp_path)
    (imgs.blobs_dir / "sha256").mkdir(parents=True)
    (imgs.blobs_dir / "sha256" / ("c" * 64)).write_text("half a layer")
    stale = imgs.digests_dir / f"import.tmp-{dead_pid()}"
    live = imgs.digests_dir / f"import.tmp-{os.getpid()}"  # this process "imports"
    not_ours = imgs.digests_dir / "import.tmp-1"  # alive, but no holder of the lock
    for d in (stale, live, not_ours):
        (d / "rootfs").mkdir(parents=True)
    with imgs.import_lock():  # an import runs: this process holds the lock
        assert procfs.flock_holders(imgs.root / "import.lock") == {os.getpid()}
        found, errors = gc._interrupted_imports(imgs, dry_run=True)
        assert [o.name for o in found] == sorted([str(stale), str(not_ours)]) and not errors
        assert stale.is_dir()
        found, errors = gc._interrupted_imports(imgs, dry_run=False)
        assert not stale.exists() and not not_ours.exists() and not errors
        assert live.is_dir() and (imgs.blobs_dir / "sha256" / ("c" * 64)).exists()
    # The lock is free: no import runs, so the folder left is stale too, and
    # blobs no image uses go with it.
    found, _ = gc._interrupted_imports(imgs, dry_run=False)
    assert [(o.kind, o.name) for o in found] == [("import", str(live))]
    assert not live.exists() and not (imgs.blobs_dir / "sha256" / ("c" * 64)).exists()


def test_gc_sweep_reports_interrupted_imports_unless_given_a_prefix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gc.registry, "every", lambda: [])
    monkeypatch.setattr(gc.orphans, "find", lambda kept, prefix: [])
    imgs = image_store(tmp_path)
    (imgs.root / "import.lock").touch()
    leftover = imgs.digests_dir / f"import.tmp-{dead_pid()}"
    leftover.mkdir()
    store = Store(tmp_path / "state")
    assert gc.sweep(store, "test", images=imgs) == ([], [])
    found, errors = gc.sweep(store, images=imgs)
    assert [o.kind for o in found] == ["import"] and not errors and not leftover.exists()


def test_flock_holders_reads_proc_locks(tmp_path: Path) -> None:
    path = tmp_path / "l"
    path.write_text("")
    st = path.stat()
    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "locks").write_text(
        f"1: POSIX  ADVISORY  WRITE 11 {dev} 0 EOF\n"
        f"2: FLOCK  ADVISORY  WRITE 22 {dev} 0 EOF\n"
        f"2: -> FLOCK  ADVISORY  WRITE 33 {dev} 0 EOF\n"
        "3: FLOCK  ADVISORY  WRITE 44 00:01:1 0 EOF\n"
    )
    assert procfs.flock_holders(path, proc) == {22}
    assert procfs.flock_holders(tmp_path / "none", proc) == set()
    fd = os.open(path, os.O_RDWR)
    try:
        assert procfs.flock_holders(path) == set()
        fcntl.flock(fd, fcntl.LOCK_EX)
        assert procfs.flock_holders(path) == {os.getpid()}
    finally:
        os.close(fd)
