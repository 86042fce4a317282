"""Imported images without skopeo or umoci: the SOURCE notation, manifest lists,
platforms, the metadata round trip, and which blobs the store keeps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpvc.errors import InputError
from hpvc.image import Store, oci
from hpvc.image.model import Image


def test_sources_parse_to_what_reads_them() -> None:
    assert oci.parse_source("docker-archive:/a/b.tar").ref == "docker-archive:/a/b.tar"
    assert oci.parse_source("docker-archive:/a/b.tar").file == "/a/b.tar"
    assert oci.parse_source("oci:/lay:v2").file == "/lay"
    assert oci.parse_source("podman:localhost/x:1").ref == "containers-storage:localhost/x:1"
    assert oci.parse_source("containers-storage:x").ref == "containers-storage:x"
    assert oci.parse_source("dir:/r").kind == "dir"
    assert oci.parse_source("tar:/r.tgz").kind == "tar"
    assert oci.parse_source("/r.tar.zst") == oci.Source("tar", "/r.tar.zst", path="/r.tar.zst")
    for bad in ("docker://nginx", "/r.zip", "oci:", "podman:"):
        with pytest.raises(InputError):
            oci.parse_source(bad)


def test_manifest_list_without_this_platform_is_refused_naming_what_it_has() -> None:
    index = {
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {"digest": "sha256:" + "a" * 64, "platform": {"os": "linux", "architecture": "arm64"}},
            {"digest": "sha256:" + "b" * 64, "platform": {"os": "linux", "architecture": "amd64"}},
        ],
    }
    assert oci.is_index(index)
    assert oci.pick_platform(index, "x", arch="amd64")["digest"].endswith("b" * 64)
    with pytest.raises(InputError, match=r"no linux/s390x image.*linux/amd64, linux/arm64"):
        oci.pick_platform(index, "x", arch="s390x")


def test_config_for_another_machine_is_refused() -> None:
    oci.check_config({"os": "linux", "architecture": "amd64"}, "x", arch="amd64")
    with pytest.raises(InputError, match="linux/arm64, this host runs linux/amd64"):
        oci.check_config({"os": "linux", "architecture": "arm64"}, "x", arch="amd64")
    assert oci.host_arch("x86_64") == "amd64" and oci.host_arch("aarch64") == "arm64"


def test_node_config_keeps_what_a_node_honours() -> None:
    config = {"config": {"Env": ["A=1"], "WorkingDir": "/w", "Cmd": ["sh"], "Volumes": {}}}
    assert oci.node_config(config) == {"Env": ["A=1"], "WorkingDir": "/w", "Cmd": ["sh"]}
    assert oci.merged_env(("PATH=/x", "A=1"), ("PATH=/usr/bin", "TERM=xterm")) == (
        "PATH=/x",
        "A=1",
        "TERM=xterm",
    )
    with pytest.raises(InputError):
        oci.hex_of("md5:abc", "x")


def _imported(path: Path, name: str, layers: list[str]) -> Image:
    return Image(
        name=name,
        digest=name[0] * 64,
        path=path,
        suite="",
        packages=(),
        mirror="",
        created="2024-01-01T00:00:00+00:00",
        size_bytes=10,
        build_seconds=0.5,
        debootstrap_version="",
        names=(name,),
        source=f"dir:/{name}",
        manifest="sha256:" + "9" * 64,
        layers=tuple((f"sha256:{d * 64}", 5) for d in layers),
        architecture="amd64",
        config={"Env": ["X=1"], "WorkingDir": "/w"},
    )


def test_imported_metadata_round_trips(tmp_path: Path) -> None:
    image = _imported(tmp_path, "abc", ["1"])
    back = Image.from_metadata("abc", tmp_path, json.loads(json.dumps(image.metadata())))
    assert back == image and back.imported and back.env == ("X=1",) and back.workdir == "/w"
    assert back.config == image.config


def test_blobs_no_image_uses_are_pruned_shared_ones_kept(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.ensure()
    blobs = store.blobs_dir / "sha256"
    blobs.mkdir(parents=True)
    for name, layers in (("abc", ["1", "2"]), ("def", ["1", "3"])):
        image = _imported(store.digest_dir(name[0] * 64), name, layers)
        image.path.mkdir()
        store.write_metadata(image.path, image.metadata())
    for d in ("1", "2", "3", "4"):
        (blobs / (d * 64)).write_text(d)
    (blobs / ".tmp-123").write_text("half")
    users = store.blob_users()
    assert users["1" * 64] == ["abc", "def"] and users["2" * 64] == ["abc"]
    assert store.prune_blobs() == len("4") + len("half")  # bytes freed
    assert sorted(p.name[0] for p in blobs.iterdir()) == ["1", "2", "3"]


def test_interrupted_imports_are_swept(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.ensure()
    (store.digests_dir / "import.tmp-99" / "rootfs").mkdir(parents=True)
    assert [p.name for p in store.sweep_imports()] == ["import.tmp-99"]
    assert list(store.digests_dir.iterdir()) == []


def test_what_a_container_node_needs_is_looked_up_inside_the_image(tmp_path: Path) -> None:
    from hpvc.image.rootfs import in_root, missing_for_node

    (tmp_path / "bin").mkdir()
    (tmp_path / "usr").mkdir()
    (tmp_path / "usr" / "bin").symlink_to("/bin")  # absolute: the image's /bin, not the host's
    (tmp_path / "bin" / "busybox").write_text("")
    assert missing_for_node(tmp_path) == ["/bin/sh", "sleep"]
    (tmp_path / "bin" / "sh").symlink_to("busybox")
    (tmp_path / "bin" / "sleep").symlink_to("/usr/bin/busybox")
    assert in_root(tmp_path, "/usr/bin/sleep") == tmp_path / "bin" / "busybox"
    assert in_root(tmp_path, "/../../etc/passwd") is None  # never above the root
    assert missing_for_node(tmp_path) == []
    assert missing_for_node(tmp_path, ("PATH=/opt/bin",)) == ["sleep"]


def test_plain_layers_are_relabelled_plain_and_nothing_else_changes() -> None:
    from hpvc.image.oci import GZIP_LAYER, PLAIN_LAYER, relabel_plain

    manifest = {
        "schemaVersion": 2,
        "config": {"digest": "sha256:c"},
        "layers": [
            {"mediaType": GZIP_LAYER, "digest": "sha256:a", "size": 1},
            {"mediaType": GZIP_LAYER, "digest": "sha256:b", "size": 2},
        ],
    }
    assert relabel_plain(manifest, set()) is None  # all really gzip: kept as it is
    fixed = relabel_plain(manifest, {"sha256:b"})
    assert fixed is not None
    assert [x["mediaType"] for x in fixed["layers"]] == [GZIP_LAYER, PLAIN_LAYER]
    assert fixed["config"] == manifest["config"] and fixed["layers"][1]["size"] == 2
    assert manifest["layers"][1]["mediaType"] == GZIP_LAYER  # the input is not changed
    plain = {**manifest, "layers": [dict(manifest["layers"][0], mediaType=PLAIN_LAYER)]}
    assert relabel_plain(plain, {"sha256:a"}) is None  # already labelled plain
