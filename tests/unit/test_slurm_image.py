"""Imported images under Slurm, without Slurm: only root imports (the site's
store), a job finds the image the site put there, and its tasks take the
image's Env and WorkingDir through the plugin's join records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpvc.cluster import images
from hpvc.errors import HpvcError, InputError
from hpvc.image import Store
from hpvc.image.importer import import_image
from hpvc.slurm import node, policy

DIGEST = "ab" * 32


def stored(store: Store, name: str, config: dict[str, object]) -> None:
    """An imported image's metadata in ``store`` (no rootfs: nothing here mounts it)."""
    store.ensure()
    d = store.digest_dir(DIGEST)
    d.mkdir()
    doc = {
        "digest": DIGEST,
        "source": "oci:/x:t",
        "created": "2026-11-25T00:00:00+00:00",
        "size_bytes": 1,
        "config": config,
    }
    (d / "image.json").write_text(json.dumps(doc))
    (store.names_dir / name).write_text(DIGEST + "\n")


def test_only_root_imports_and_a_refusal_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    store = tmp_path / "images"
    with pytest.raises(InputError) as e:
        import_image("mine", f"dir:{tmp_path}", store=store)
    assert e.value.line().startswith("image import: needs root (")
    assert "administrators" in e.value.line() and e.value.exit_code == 2
    assert not store.exists()


def test_a_job_finds_the_image_the_site_imported_or_says_so(tmp_path: Path) -> None:
    store = Store(tmp_path / "images")
    with pytest.raises(HpvcError, match=r"does not have it \(the site builds or imports it"):
        images.require_stored("mine", store)
    stored(store, "mine", {})
    assert images.require_stored("mine", store) == DIGEST


def test_tasks_take_the_images_env_and_workdir(tmp_path: Path) -> None:
    store = Store(tmp_path / "images")
    stored(store, "mine", {"Env": ["PATH=/opt/x/bin:/bin", "A=b c"], "WorkingDir": "/w"})
    got = images.task_image("mine", DIGEST, store)
    assert got == images.TaskImage(env=("PATH=/opt/x/bin:/bin", "A=b c"), workdir="/w")
    assert images.task_image("mine", "cd" * 32, store) == images.TaskImage()  # gone: nothing


@pytest.mark.parametrize(
    "config",
    [
        {"Env": ["A=1\nnode 0 1 2 mnt evil"]},
        {"Env": ["1A=x"]},
        {"Env": [f"V{i}=x" for i in range(images.MAX_TASK_ENV + 1)]},
        {"WorkingDir": "rel"},
    ],
)
def test_what_a_task_cannot_take_is_one_line(tmp_path: Path, config: dict[str, object]) -> None:
    store = Store(tmp_path / "images")
    stored(store, "mine", config)
    with pytest.raises(HpvcError, match=r"^image 'mine' \(abababababab\): .*\(the site fixes"):
        images.task_image("mine", DIGEST, store)


def test_the_workdir_travels_in_the_join_records() -> None:
    j = node.Join(0, "compute0", 4242, "98765", ("mnt",), (), ("A=b c",), workdir="/w")
    assert j.lines() == ["node 0 4242 98765 mnt compute0", "env 0 A=b c", "cwd 0 /w"]
    assert "cwd" not in " ".join(node.Join(0, "c", 1, "2", ("mnt",), (), (), workdir="/").lines())


@pytest.mark.parametrize("image", ["../x", "/tmp/x", "a/b", "..", "X"])
def test_an_image_is_a_name_never_a_path(image: str) -> None:
    spec = f'name = "c"\nimage = "{image}"\n[[nodes]]\nrole = "compute"\n'
    with pytest.raises(InputError, match="is not an image name"):
        policy.load(spec, "s.toml", policy.Site(images=(image, "hpc")))
