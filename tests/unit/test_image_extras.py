"""Image extras and presets: digests stay put without extras, the spark preset's
recipe, installers run into the rootfs and are recorded, with a fake debootstrap
and a fake extra. No root, no network."""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path
from typing import Any

import pytest

from hpvc.bench.hpcc import blas
from hpvc.cli import image as cli_image
from hpvc.errors import HpvcError, InputError
from hpvc.image import DEFAULT_PACKAGES, ImageSpec, Store, build_image, resolve_image
from hpvc.image import extras as image_extras
from hpvc.image.extras import EXTRAS, SPARK_EXTRA, Extra, preset_extras, with_extras
from hpvc.progress import Progress
from tests.unit.test_image import DEFAULT_DIGEST, Fake, build, leftovers, run_cli

# The spark preset's recipe digest with its TeraSort sources' digest pinned to
# PINNED_CONTENT (the fixture below): changes only with its recipe (see DEFAULT_DIGEST).
PINNED_CONTENT = "0" * 64
REAL_SPARK = EXTRAS[SPARK_EXTRA]  # as registered, before the fixture pins it
SPARK_DIGEST = "59e4c6dcc04d997dd3a7d93bd723d4c1ec69ffe8dd48c35204f9cbd9a2af367d"


@pytest.fixture(autouse=True)
def pinned_spark_content(monkeypatch: pytest.MonkeyPatch) -> None:
    """The spark extra's content digest fixed, so SPARK_DIGEST does not follow
    every edit of the Java sources (test_the_terasort_sources_are_in_the_digest
    checks the real one)."""
    pinned = dataclasses.replace(EXTRAS[SPARK_EXTRA], content=lambda: PINNED_CONTENT)
    monkeypatch.setitem(EXTRAS, SPARK_EXTRA, pinned)


def test_the_terasort_sources_are_in_the_digest(monkeypatch: pytest.MonkeyPatch) -> None:
    """A changed TeraSort is a new spark recipe (an image holding the old jar is
    not reused), and the content is the sources' own digest with the recipe
    of the daemons' class-data archives."""
    from hpvc.spark import cds
    from hpvc.spark.app import sources_digest

    before = spark_spec().digest
    other = dataclasses.replace(EXTRAS[SPARK_EXTRA], content=lambda: "1" * 64)
    monkeypatch.setitem(EXTRAS, SPARK_EXTRA, other)
    assert spark_spec().digest != before
    monkeypatch.setitem(EXTRAS, SPARK_EXTRA, REAL_SPARK)
    doc = json.loads(spark_spec().canonical_json())
    assert doc["extras_content"] == {SPARK_EXTRA: f"{sources_digest()}+cds-{cds.recipe()}"}
    assert "extras_content" not in json.loads(
        ImageSpec.make(extras=[image_extras.OPENBLAS_EXTRA]).canonical_json()
    )  # no content of hpvc's own: the digest as before


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "store")


def spark_spec() -> ImageSpec:
    return ImageSpec.make(with_extras(None, [SPARK_EXTRA]), extras=[SPARK_EXTRA])


def test_no_extras_keeps_every_digest() -> None:
    assert ImageSpec.make(extras=()).digest == DEFAULT_DIGEST
    assert "extras" not in ImageSpec.make().canonical_json()
    assert ImageSpec.make(["fio"], extras=[" "]).digest == ImageSpec.make(["fio"]).digest


def test_extras_are_in_the_digest_sorted_and_unique() -> None:
    a = ImageSpec.make(extras=["spark-3.5.3"])
    assert a.digest != DEFAULT_DIGEST and '"extras":["spark-3.5.3"]' in a.canonical_json()
    b = ImageSpec.make(extras=["x-1", "spark-3.5.3", "x-1"])
    assert b.extras == ("spark-3.5.3", "x-1")
    assert b.digest == ImageSpec.make(extras=["spark-3.5.3", "x-1"]).digest != a.digest
    with pytest.raises(InputError, match="not an extra's name"):
        ImageSpec.make(extras=["Spark 3"])


def test_the_spark_preset_is_the_defaults_plus_java_the_nfs_server_and_spark() -> None:
    assert preset_extras("spark") == (SPARK_EXTRA,)
    assert preset_extras("hpc") == () and preset_extras("spark2") == ()
    spec = spark_spec()
    assert set(DEFAULT_PACKAGES) < set(spec.packages)
    # Java for Spark; Ganesha and rpcbind for a VM cluster's shared directory.
    assert set(spec.packages) - set(DEFAULT_PACKAGES) == {
        "openjdk-17-jre-headless", "nfs-ganesha", "nfs-ganesha-vfs", "rpcbind",
    }  # fmt: skip
    assert spec.extras == (SPARK_EXTRA,)
    assert spec.digest == SPARK_DIGEST


def test_with_extras() -> None:
    assert with_extras(None, []) is None
    assert with_extras(["vim", "fio"], []) == ("fio", "vim")
    assert with_extras(["busybox"], [SPARK_EXTRA]) == (
        "busybox", "nfs-ganesha", "nfs-ganesha-vfs", "openjdk-17-jre-headless", "procps",
        "rpcbind",
    )  # fmt: skip
    with pytest.raises(InputError, match=r"known extras: .*spark-3\.5\.3"):
        with_extras(None, ["hadoop-9"])


@pytest.fixture
def fake_extra(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """spark-3.5.3 replaced by an extra that drops a file into the rootfs."""
    calls: list[Path] = []

    def install(rootfs: Path, progress: Progress) -> None:
        calls.append(rootfs)
        (rootfs / "opt/spark").mkdir(parents=True)
        (rootfs / "opt/spark/RELEASE").write_text("fake\n")
        progress("copying Spark")

    pinned = EXTRAS[SPARK_EXTRA]
    fake = Extra(SPARK_EXTRA, pinned.packages, install, "fake", pinned.content)  # the same recipe
    monkeypatch.setitem(EXTRAS, SPARK_EXTRA, fake)
    return calls


def test_build_runs_the_extras_and_records_them(
    tmp_path: Path, store: Store, fake_extra: list[Path]
) -> None:
    fake = Fake(tmp_path)
    steps: list[str] = []
    image = build(fake, store, "spark", extras=[SPARK_EXTRA], progress=steps.append)
    assert image.extras == (SPARK_EXTRA,) and image.digest == SPARK_DIGEST
    assert (image.rootfs / "opt/spark/RELEASE").read_text() == "fake\n"
    assert len(fake_extra) == 1 and fake_extra[0].parent.name.startswith(SPARK_DIGEST + ".tmp-")
    meta = json.loads((image.path / "image.json").read_text())
    assert meta["extras"] == [SPARK_EXTRA] and "openjdk-17-jre-headless" in meta["packages"]
    assert "--include=" in fake.runs()[0] and "openjdk-17-jre-headless" in fake.runs()[0]
    assert f"extra {SPARK_EXTRA}: installing" in steps
    assert resolve_image("spark", store).extras == (SPARK_EXTRA,)
    assert build(fake, store, "spark", extras=[SPARK_EXTRA]).reused and len(fake_extra) == 1


def test_images_without_extras_record_none(tmp_path: Path, store: Store) -> None:
    image = build(Fake(tmp_path), store, "hpc")
    assert image.extras == () and image.digest == DEFAULT_DIGEST
    meta = json.loads((image.path / "image.json").read_text())
    meta.pop("extras")  # an image.json written before extras existed
    (image.path / "image.json").write_text(json.dumps(meta))
    assert resolve_image("hpc", store).extras == ()


def test_a_failing_extra_leaves_nothing(
    tmp_path: Path, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    def install(rootfs: Path, progress: Progress) -> None:
        raise InputError("image extra spark", "no Java 17 in the rootfs")

    monkeypatch.setitem(EXTRAS, SPARK_EXTRA, Extra(SPARK_EXTRA, (), install, "broken"))
    with pytest.raises(InputError, match="no Java 17"):
        build(Fake(tmp_path), store, "spark", extras=[SPARK_EXTRA])
    assert leftovers(store) == [] and store.all_names() == {}


def test_cli_build_spark_picks_the_preset(
    tmp_path: Path,
    store: Store,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    fake_extra: list[Path],
) -> None:
    seen: list[dict[str, Any]] = []
    real = functools.partial(
        build_image, debootstrap_path=Fake(tmp_path).path, require_root=False, check_suite=None
    )

    def recording(name: str, packages: list[str] | None, **kw: Any) -> Any:
        seen.append({"name": name, "packages": packages, "extras": list(kw["extras"])})
        return real(name, packages, **kw)

    monkeypatch.setattr(cli_image, "build_image", recording)
    s = str(store.root)
    code, out, err = run_cli(["image", "build", "spark", "--store", s, "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["extras"] == [SPARK_EXTRA] and doc["digest"] == SPARK_DIGEST
    code, out, err = run_cli(["image", "build", "hpc", "--store", s, "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["digest"] == DEFAULT_DIGEST and json.loads(out)["extras"] == []
    assert [e["extras"] for e in seen] == [[SPARK_EXTRA], []]
    assert [e["packages"] for e in seen] == [None, None]
    code, out, _ = run_cli(["image", "ls", "--store", s], capsys)
    assert code == 0 and f"+{SPARK_EXTRA}" in out
    code, _, err = run_cli(["image", "build", "x", "--extras", "nope-1", "--store", s], capsys)
    assert code == 2 and "known extras" in err


def test_the_registry_names_real_installers() -> None:
    for name, extra in image_extras.EXTRAS.items():
        assert extra.name == name and callable(extra.install) and extra.about


def test_the_hpc_openblas_preset_is_hpc_plus_debians_openblas(tmp_path: Path) -> None:
    assert preset_extras("hpc-openblas") == (image_extras.OPENBLAS_EXTRA,)
    packages = with_extras(None, preset_extras("hpc-openblas")) or ()
    assert set(packages) - set(DEFAULT_PACKAGES) == {"libopenblas0-pthread"}
    install = EXTRAS[image_extras.OPENBLAS_EXTRA].install
    with pytest.raises(HpvcError, match="not in the image"):
        install(tmp_path, lambda m: None)  # a rootfs without the pinned library
    lib = tmp_path / image_extras.OPENBLAS_LIB.format(arch=blas.MULTIARCH)
    lib.parent.mkdir(parents=True)
    lib.write_bytes(b"")
    said: list[str] = []
    install(tmp_path, said.append)
    assert said and lib.name in said[0]


def test_ensure_image_builds_a_spark_image_with_an_older_terasort_again(
    tmp_path: Path, store: Store, fake_extra: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """bench.common.ensure_image (the benchmarks' and tests' way to get an image):
    a spark image whose TeraSort sources changed since its build is built again
    with its own recipe; a current one, and one without extras, are left alone."""
    from hpvc.bench import common

    monkeypatch.setenv("HPVC_IMAGE_DIR", str(store.root))
    fake = Fake(tmp_path)
    built = build(fake, store, "spark", extras=[SPARK_EXTRA])
    build(fake, store, "hpc")
    calls: list[tuple[str, dict[str, Any]]] = []
    monkeypatch.setattr(common, "build_image", lambda name, *a, **kw: calls.append((name, kw)))
    common.ensure_image("spark")
    common.ensure_image("hpc")
    assert calls == []  # both current
    newer = dataclasses.replace(EXTRAS[SPARK_EXTRA], content=lambda: "2" * 64)
    monkeypatch.setitem(EXTRAS, SPARK_EXTRA, newer)
    said: list[str] = []
    common.ensure_image("spark", said.append)
    common.ensure_image("hpc")
    assert [(n, kw["extras"], kw["suite"]) for n, kw in calls] == [
        ("spark", (SPARK_EXTRA,), built.suite)
    ]
    assert said == [f"image 'spark' holds an older {SPARK_EXTRA}: building it again"]
