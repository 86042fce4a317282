"""``hpvc image import`` from every kind of source, and every bad input refused.

The images are made here, from nothing downloaded: a busybox-only root
filesystem (busybox-static, no bash, no apt), turned into Podman images,
docker and OCI archives with Podman and skopeo, and OCI layouts written by
hand with tarfile and json for the bad inputs. Each test uses its own image
store in its temporary folder; the Podman images it makes are removed.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hpvc.errors import InputError
from hpvc.image import Store, list_images, remove_image, resolve_image
from hpvc.image.importer import import_image
from tests.helpers import ROOT, requires


def busybox_rootfs(path: Path) -> Path:
    """A root filesystem of busybox alone: /bin/busybox and its applet links."""
    (path / "bin").mkdir(parents=True)
    (path / "etc").mkdir()
    (path / "tmp").mkdir()
    (path / "tmp").chmod(0o1777)
    shutil.copy2(shutil.which("busybox") or "/bin/busybox", path / "bin" / "busybox")
    for applet in ("sh", "sleep", "env", "cat", "ls", "pwd", "echo", "hostname"):
        (path / "bin" / applet).symlink_to("busybox")
    (path / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    return path


@pytest.fixture
def rootfs(tmp_path: Path) -> Path:
    requires("root", "skopeo", "umoci", "busybox")
    return busybox_rootfs(tmp_path / "rootfs")


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "images")


# ---- OCI layouts by hand ---------------------------------------------------


def layer(files: dict[str, bytes | str], *, compress: bool = True) -> bytes:
    """A layer: ``name -> content`` (bytes: a file; str: a symlink to it)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, content in files.items():
            info = tarfile.TarInfo(name)
            info.mtime = 0
            if isinstance(content, str):
                info.type, info.linkname = tarfile.SYMTYPE, content
                tar.addfile(info)
            else:
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
    data = buf.getvalue()
    return gzip.compress(data, mtime=0) if compress else data


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def write_layout(
    path: Path,
    layers: list[bytes],
    *,
    arch: str = "amd64",
    env: list[str] | None = None,
    claimed_size: int | None = None,
    workdir: str = "/tmp",
) -> str:
    """An OCI layout at ``path`` (tag ``t``) of gzip ``layers``; the manifest's digest.
    ``claimed_size``: what the manifest says the first layer's size is."""
    blobs = path / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)

    def put(data: bytes) -> str:
        digest = _sha(data)
        (blobs / digest.split(":")[1]).write_bytes(data)
        return digest

    diff_ids = [_sha(gzip.decompress(data)) for data in layers]
    config = {
        "architecture": arch,
        "os": "linux",
        "config": {"Env": env or ["PATH=/bin", "GREETING=hello"], "WorkingDir": workdir},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }
    cdata = json.dumps(config).encode()
    manifest: dict[str, Any] = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": put(cdata),
            "size": len(cdata),
        },
        "layers": [
            {
                "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                "digest": put(data),
                "size": len(data) if claimed_size is None or i else claimed_size,
            }
            for i, data in enumerate(layers)
        ],
    }
    mdata = json.dumps(manifest).encode()
    mdigest = put(mdata)
    desc = {
        "mediaType": manifest["mediaType"],
        "digest": mdigest,
        "size": len(mdata),
        "annotations": {"org.opencontainers.image.ref.name": "t"},
    }
    (path / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    (path / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [desc]}))
    return mdigest


def busybox_layer(rootfs: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(rootfs, arcname=".")
    return gzip.compress(buf.getvalue(), mtime=0, compresslevel=1)


def leftovers(store: Store) -> list[str]:
    """What an import left in the store besides finished images and their blobs."""
    found = (
        [p.name for p in store.digests_dir.glob("*.tmp-*")] if store.digests_dir.exists() else []
    )
    blobs = store.blobs_dir / "sha256"
    used = store.blob_users()
    if blobs.is_dir():
        found += [f"blob {p.name}" for p in blobs.iterdir() if p.name not in used]
    return found


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hpvc", *args],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )


# ---- Podman images -----------------------------------------------------------


@pytest.fixture
def podman_image(rootfs: Path, tmp_path: Path) -> Iterator[str]:
    """A Podman image of the busybox rootfs, with an Env and a WorkingDir; removed after."""
    requires("podman")
    tag = f"localhost/hpvc-import-test-{os.getpid()}:1"
    tarball = tmp_path / "rootfs.tar"
    subprocess.run(["tar", "-C", str(rootfs), "-cf", str(tarball), "."], check=True)
    changes = ["--change", "ENV GREETING=hello", "--change", "WORKDIR /tmp"]
    subprocess.run(
        ["podman", "import", "-q", *changes, str(tarball), tag], check=True, capture_output=True
    )
    try:
        yield tag
    finally:
        subprocess.run(["podman", "rmi", "-f", tag], check=False, capture_output=True)


def test_docker_archive_imports_and_a_second_import_is_instant(
    podman_image: str, tmp_path: Path, store: Store
) -> None:
    archive = tmp_path / "img.tar"
    subprocess.run(["podman", "save", "-q", "-o", str(archive), podman_image], check=True)
    image = import_image("bb", f"docker-archive:{archive}", store=store)
    assert (image.rootfs / "bin/busybox").is_file()
    assert os.readlink(image.rootfs / "bin/sh") == "busybox"
    assert "GREETING=hello" in image.env and image.workdir == "/tmp"
    assert image.architecture == "amd64" and len(image.layers) == 1
    assert not (image.rootfs / "etc/hpvc-image").exists()  # the image's files stay its own
    # The archive's plain tar layer is kept plain (not gzipped only to be
    # gunzipped again) and its manifest says so, which is what umoci read.
    index = json.loads((image.path / "oci" / "index.json").read_text())
    manifest = json.loads(store.blob(index["manifests"][0]["digest"]).read_bytes())
    (lay,) = manifest["layers"]
    assert lay["mediaType"] == "application/vnd.oci.image.layer.v1.tar"
    assert store.blob(lay["digest"]).read_bytes()[:2] != b"\x1f\x8b"
    assert image.manifest == index["manifests"][0]["digest"]

    # Same digest: nothing copied or unpacked (the rootfs is the very same folder).
    stamp = (image.rootfs / "bin").stat().st_ino
    steps: list[str] = []
    again = import_image("bb2", f"docker-archive:{archive}", store=store, progress=steps.append)
    assert again.reused and again.digest == image.digest
    assert not any(s.startswith("copying") for s in steps)
    assert (again.rootfs / "bin").stat().st_ino == stamp
    assert [i.name for i in list_images(store)] == ["bb", "bb2"]
    assert leftovers(store) == []


def test_podman_oci_archive_and_oci_layout_sources(
    podman_image: str, tmp_path: Path, store: Store
) -> None:
    digests = set()
    ociarchive = tmp_path / "img.oci.tar"
    subprocess.run(
        ["podman", "save", "-q", "--format", "oci-archive", "-o", str(ociarchive), podman_image],
        check=True,
    )
    layout = tmp_path / "layout"
    subprocess.run(
        ["skopeo", "copy", "-q", f"oci-archive:{ociarchive}", f"oci:{layout}:v1"], check=True
    )
    for name, source in (
        ("p", f"podman:{podman_image}"),
        ("cs", f"containers-storage:{podman_image}"),
        ("oa", f"oci-archive:{ociarchive}"),
        ("ol", f"oci:{layout}:v1"),
    ):
        image = import_image(name, source, store=store)
        assert (image.rootfs / "bin/busybox").is_file(), source
        assert "GREETING=hello" in image.env, source
        digests.add(image.digest)
    assert len(digests) == 1  # one image, whichever way it came: stored once
    assert len(list(store.digests_dir.iterdir())) == 1
    assert leftovers(store) == []


def test_rootfs_folder_and_tarballs(rootfs: Path, tmp_path: Path, store: Store) -> None:
    plain, packed = tmp_path / "r.tar", tmp_path / "r.tar.gz"
    subprocess.run(["tar", "-C", str(rootfs), "-cf", str(plain), "."], check=True)
    subprocess.run(["tar", "-C", str(rootfs), "-czf", str(packed), "."], check=True)
    from_dir = import_image("d", f"dir:{rootfs}", store=store)
    assert os.readlink(from_dir.rootfs / "bin/sleep") == "busybox"
    assert (from_dir.rootfs / "tmp").stat().st_mode & 0o7777 == 0o1777
    again = import_image("d2", f"dir:{rootfs}", store=store)
    assert again.digest == from_dir.digest  # the same folder: the same image
    a = import_image("t", f"tar:{plain}", store=store)
    b = import_image("tgz", str(packed), store=store)
    assert a.digest == b.digest  # the same tar stream, compressed or not
    assert (b.rootfs / "bin/busybox").is_file() and b.env == ()
    assert leftovers(store) == []


def test_a_common_base_is_stored_once_and_rm_keeps_what_others_use(
    rootfs: Path, tmp_path: Path, store: Store
) -> None:
    base = busybox_layer(rootfs)
    write_layout(tmp_path / "one", [base])
    write_layout(tmp_path / "two", [base, layer({"etc/motd": b"two\n"})])
    one = import_image("one", f"oci:{tmp_path / 'one'}:t", store=store)
    two = import_image("two", f"oci:{tmp_path / 'two'}:t", store=store)
    assert one.layers[0] == two.layers[0] and (two.rootfs / "etc/motd").read_text() == "two\n"
    assert store.blob_users()[one.layers[0][0].split(":")[1]] == ["one", "two"]
    size = len(base)
    assert store.blob(one.layers[0][0]).stat().st_size == size  # one copy on disk

    out = cli("image", "inspect", "two", env={"HPVC_IMAGE_DIR": str(store.root)})
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["source"].startswith("oci:") and doc["layers"][0]["shared_with"] == ["one"]
    assert doc["layers"][1]["shared_with"] == []
    out = cli("image", "ls", "--json", env={"HPVC_IMAGE_DIR": str(store.root)})
    assert out.returncode == 0, out.stderr
    shared = {d["name"]: (len(d["layers"]), d["layers_shared"]) for d in json.loads(out.stdout)}
    assert shared == {"one": (1, 1), "two": (2, 1)}

    remove_image("one", store)
    assert store.blob(one.layers[0][0]).exists()  # two still uses the base
    remove_image("two", store)
    assert list((store.blobs_dir / "sha256").iterdir()) == []


# ---- bad input -----------------------------------------------------------------


def refused(store: Store, name: str, source: str, why: str) -> str:
    """``hpvc image import`` exits 2 with one line saying ``why``; nothing is left."""
    out = cli("image", "import", name, source, env={"HPVC_IMAGE_DIR": str(store.root)})
    assert out.returncode == 2, (out.stdout, out.stderr)
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("hpvc:")]  # not progress
    assert len(lines) == 1 and why in lines[0].lower(), out.stderr
    assert leftovers(store) == []
    assert store.read_name(name) is None
    return lines[0]


def test_corrupt_truncated_mismatched_and_foreign_images_are_refused(
    rootfs: Path, podman_image: str, tmp_path: Path, store: Store
) -> None:
    archive = tmp_path / "img.tar"
    subprocess.run(["podman", "save", "-q", "-o", str(archive), podman_image], check=True)
    cut = tmp_path / "cut.tar"
    cut.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
    refused(store, "cut", f"docker-archive:{cut}", "image import")
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"\x1f\x8b" + os.urandom(4096))
    refused(store, "junk", str(junk), "unreadable")

    # A layer whose bytes do not match the digest the manifest names.
    bad = tmp_path / "mismatch"
    write_layout(bad, [busybox_layer(rootfs)])
    manifest = json.loads(
        (
            bad
            / "blobs/sha256"
            / json.loads((bad / "index.json").read_text())["manifests"][0]["digest"].split(":")[1]
        ).read_text()
    )
    blob = bad / "blobs/sha256" / manifest["layers"][0]["digest"].split(":")[1]
    blob.write_bytes(layer({"bin/other": b"not what was signed\n"}) + b"\0" * 64)
    refused(store, "mismatch", f"oci:{bad}:t", "digest")

    write_layout(tmp_path / "arm", [layer({"a": b"1"})], arch="arm64")
    refused(store, "arm", f"oci:{tmp_path / 'arm'}:t", "linux/arm64, this host runs linux/amd64")

    # A manifest list whose only image is for another architecture.
    listed = tmp_path / "list"
    child = write_layout(listed, [layer({"a": b"1"})], arch="arm64")
    index = json.loads((listed / "index.json").read_text())
    entry = {**index["manifests"][0], "platform": {"os": "linux", "architecture": "arm64"}}
    entry.pop("annotations")
    ldata = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [entry],
        }
    ).encode()
    (listed / "blobs/sha256" / hashlib.sha256(ldata).hexdigest()).write_bytes(ldata)
    index["manifests"] = [
        {
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "digest": _sha(ldata),
            "size": len(ldata),
            "annotations": {"org.opencontainers.image.ref.name": "t"},
        }
    ]
    (listed / "index.json").write_text(json.dumps(index))
    assert child
    refused(store, "listed", f"oci:{listed}:t", "linux/amd64")


def test_paths_escaping_the_root_stay_inside_it(tmp_path: Path, store: Store) -> None:
    requires("root", "skopeo", "umoci")
    outside = tmp_path / "host-side"
    outside.mkdir()
    evil = layer(
        {
            "../escaped": b"out\n",  # a parent path
            "etc/link": str(outside),  # an absolute symlink to a host folder...
            "etc/link/planted": b"through the link\n",  # ...then a file through it
            "abs": "/etc/passwd",
        }
    )
    write_layout(tmp_path / "evil", [evil])
    try:
        image = import_image("evil", f"oci:{tmp_path / 'evil'}:t", store=store)
    except InputError:  # refusing is as good as containing
        assert leftovers(store) == []
    else:
        assert os.readlink(image.rootfs / "abs") == "/etc/passwd"  # a link, not followed
        assert (image.rootfs / "escaped").read_text() == "out\n"  # kept inside the root
    assert list(outside.iterdir()) == []
    assert not (store.digests_dir / "escaped").exists() and not (tmp_path / "escaped").exists()


@pytest.fixture
def small_store(tmp_path: Path) -> Iterator[Store]:
    """An image store on a 48 MiB tmpfs."""
    requires("root", "skopeo", "umoci")
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(mnt)], check=True)
    try:
        yield Store(mnt)
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_an_image_larger_than_the_free_space_is_refused(tmp_path: Path, small_store: Store) -> None:
    # Declared larger than the store: refused before a byte is copied.
    write_layout(tmp_path / "big", [layer({"a": b"1"})], claimed_size=1 << 30)
    refused(small_store, "big", f"oci:{tmp_path / 'big'}:t", "free")
    # A bomb: 96 MiB of zeros in a few hundred KiB; the unpack runs out of room.
    write_layout(tmp_path / "bomb", [layer({"zeros": bytes(96 << 20)})])
    refused(small_store, "bomb", f"oci:{tmp_path / 'bomb'}:t", "space")


def test_a_killed_import_leaves_what_the_next_import_sweeps(
    rootfs: Path, tmp_path: Path, store: Store
) -> None:
    write_layout(tmp_path / "l", [busybox_layer(rootfs)])
    source = f"oci:{tmp_path / 'l'}:t"
    env = {"HPVC_IMAGE_DIR": str(store.root), "HPVC_FAIL_AT": "crash:import:copied"}
    out = cli("image", "import", "k", source, env=env)
    assert out.returncode == 70  # died as kill -9 would, mid-import
    assert [p.name for p in store.digests_dir.glob("import.tmp-*")] != []
    assert store.read_name("k") is None
    image = import_image("k", source, store=store)
    assert (image.rootfs / "bin/busybox").is_file() and leftovers(store) == []
    assert resolve_image("k", store).digest == image.digest


def test_gc_removes_what_a_killed_import_left(rootfs: Path, tmp_path: Path, store: Store) -> None:
    from hpvc.cluster import gc

    write_layout(tmp_path / "l", [busybox_layer(rootfs)])
    env = {"HPVC_IMAGE_DIR": str(store.root), "HPVC_FAIL_AT": "crash:import:copied"}
    assert cli("image", "import", "k", f"oci:{tmp_path / 'l'}:t", env=env).returncode == 70
    (left,) = store.digests_dir.glob("import.tmp-*")
    found, errors = gc._interrupted_imports(store, dry_run=False)
    assert [o.name for o in found] == [str(left)] and errors == []
    assert leftovers(store) == [] and list(store.blobs_dir.glob("sha256/*")) == []


# ---- a container cluster from an imported image ------------------------------


def test_container_cluster_from_a_busybox_image(
    rootfs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """No bash, no apt, no systemd in the image: the nodes run its busybox, with its Env
    and WorkingDir in `hpvc exec`; an image without a shell is refused before `up`
    changes anything."""
    requires("root", "crun", "ip")
    from hpvc.cluster import lifecycle, ops
    from hpvc.store import Store as ClusterStore
    from tests.integration.test_cluster import clean_up, leftovers

    images = Store(tmp_path / "images")
    monkeypatch.setenv("HPVC_IMAGE_DIR", str(images.root))
    write_layout(tmp_path / "l", [busybox_layer(rootfs)], env=["PATH=/bin", "GREETING=hi"])
    import_image("bbnode", f"oci:{tmp_path / 'l'}:t", store=images)
    write_layout(tmp_path / "noshell", [layer({"etc/motd": b"no shell here\n"})])
    import_image("noshell", f"oci:{tmp_path / 'noshell'}:t", store=images)

    state = ClusterStore(tmp_path / "state")
    name = f"imp{os.getpid() % 10000}"

    def spec(image: str) -> str:
        p = tmp_path / f"{image}.toml"
        p.write_text(
            f'name = "{name}"\nkind = "container"\nimage = "{image}"\n'
            f'[network]\nsubnet = "10.215.{os.getpid() % 250}.0/24"\n'
            '[tuning]\npinning = "shared"\nhugepages = "none"\npartition = "commodity"\n'
            '[[nodes]]\nrole = "compute"\ncount = 2\nvcpus = 1\nmemory = "128MiB"\n'
        )
        return str(p)

    try:
        with pytest.raises(InputError, match=r"has no /bin/sh or sleep"):
            lifecycle.up(spec("noshell"), state)
        assert state.names() == [] and leftovers(name) == []

        rec = lifecycle.up(spec("bbnode"), state)
        assert rec.status == "running"
        argv = ["sh", "-c", 'echo "$GREETING $(pwd) $(hostname)"; grep -c compute /etc/hosts']
        capfd.readouterr()
        assert ops.exec_node(name, "compute1", argv, state) == 0
        assert capfd.readouterr().out.split() == ["hi", "/tmp", "compute1", "2"]

        digest = resolve_image("bbnode", images).digest  # what the record and status say
        assert rec.image_digests() == {digest: ["compute0", "compute1"]}
        assert ops.status(name, state)["image_digests"] == rec.image_digests()
        out = cli("image", "rm", "bbnode", env={"HPVC_STATE_DIR": str(state.root)})
        assert out.returncode == 2 and f"in use by cluster {name}" in out.stderr
        assert resolve_image("bbnode", images).rootfs.is_dir()

        lifecycle.down(name, state)
        assert leftovers(name) == [] and state.names() == []
    finally:
        clean_up(state)
    remove_image("bbnode", images)
