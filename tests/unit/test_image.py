"""Image builder and store with a fake debootstrap: digest, layout, reuse, removal,
atomic failure cleanup, progress. No root, no network."""

from __future__ import annotations

import functools
import json
import os
import stat
import threading
import time
from pathlib import Path

import pytest

from hpvc.cli import image as cli_image
from hpvc.cli import main
from hpvc.errors import HpvcError, InputError, MissingDependency
from hpvc.host.probe import mounts_under
from hpvc.image import (
    DEFAULT_PACKAGES,
    Image,
    ImageSpec,
    Store,
    build_image,
    find_debootstrap,
    list_images,
    parse_progress,
    remove_image,
    resolve_image,
)
from hpvc.image.store import default_store, remove_tree

# The default recipe's digest. It changes only when the recipe or FORMAT_VERSION
# does; if this test fails, every cached image on every machine is rebuilt.
DEFAULT_DIGEST = "d22c173a361149cb07c0aa2f5d52dfb5e0374758a8a7a2a3db598d6260e6fa5e"

FAKE = """#!/bin/sh
# A fake debootstrap: records its arguments, then behaves as MODE says.
if [ "$1" = "--version" ]; then echo "debootstrap 9.9-fake"; exit 0; fi
echo "$@" >> {calls}
eval "target=\\${{$(($# - 1))}}"
mkdir -p "$target/usr/bin" "$target/etc" "$target/debootstrap" \\
    "$target/var/lib/apt/lists/partial" "$target/var/cache/apt/archives/partial"
echo "I: Retrieving InRelease"
echo "I: Retrieving libc6 2.36-9"
echo "I: Validating libc6 2.36-9"
echo "some dpkg chatter"
touch "$target/usr/bin/mpirun" "$target/var/lib/apt/lists/deb.debian.org_Packages" \\
    "$target/var/cache/apt/archives/libc6.deb" "$target/var/cache/apt/pkgcache.bin"
echo "dpkg: error processing package hpcc" > "$target/debootstrap/debootstrap.log"
ln -s {host_hosts} "$target/etc/hosts"
echo "nameserver 10.9.9.9" > "$target/etc/resolv.conf"
case "{mode}" in
  fail) echo "E: Couldn't download http://m/dists/bookworm/Release"; exit 1 ;;
  nodebs) echo "E: Couldn't find these debs: nosuchpkg libopenmpi3"; exit 1 ;;
  hang) echo "I: Unpacking the base system..."; sleep 30; exit 0 ;;
  slow) sleep 0.5 ;;
esac
echo "I: Unpacking libc6..."
echo "I: Configuring libc6..."
echo "W: something odd"
rm -rf "$target/debootstrap"
echo "I: Base system installed successfully."
"""


class Fake:
    """A fake debootstrap script in tmp_path and the arguments it was called with."""

    def __init__(self, tmp_path: Path, mode: str = "ok") -> None:
        self.calls = tmp_path / f"calls-{mode}"
        self.host_hosts = tmp_path / "host-hosts"
        self.host_hosts.write_text("HOST FILE\n")
        self.path = tmp_path / f"debootstrap-{mode}"
        self.path.write_text(FAKE.format(calls=self.calls, host_hosts=self.host_hosts, mode=mode))
        self.path.chmod(self.path.stat().st_mode | stat.S_IXUSR)

    def runs(self) -> list[str]:
        return self.calls.read_text().splitlines() if self.calls.exists() else []


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "store")


def build(fake: Fake, store: Store, name: str = "hpc", **kw: object) -> Image:
    return build_image(
        name,
        store=store,
        debootstrap_path=fake.path,
        require_root=False,
        cache_dir=store.root.parent / "cache",
        check_suite=None,
        **kw,  # type: ignore[arg-type]
    )


def leftovers(store: Store) -> list[str]:
    return sorted(p.name for p in store.digests_dir.iterdir() if ".tmp-" in p.name)


# --- digest ---------------------------------------------------------------------------


def test_digest_is_stable_and_pinned() -> None:
    assert ImageSpec.make().digest == ImageSpec.make(list(DEFAULT_PACKAGES)).digest
    assert ImageSpec.make().digest == DEFAULT_DIGEST


def test_digest_ignores_package_order_duplicates_and_mirror_slash() -> None:
    a = ImageSpec.make(["fio", "hpcc", "procps"], mirror="http://m/debian")
    b = ImageSpec.make(["procps", "fio", "hpcc", "fio", " "], mirror="http://m/debian/")
    assert a.digest == b.digest
    assert a.packages == ("fio", "hpcc", "procps")


@pytest.mark.parametrize(
    "other",
    [
        {"packages": ["fio", "hpcc", "procps", "strace"]},
        {"packages": ["fio", "hpcc"]},
        {"suite": "trixie"},
        {"mirror": "http://ftp.de.debian.org/debian"},
    ],
)
def test_digest_changes_with_the_recipe(other: dict[str, object]) -> None:
    base = {"packages": ["fio", "hpcc", "procps"], "suite": "bookworm", "mirror": ""}
    assert ImageSpec.make(**base).digest != ImageSpec.make(**{**base, **other}).digest  # type: ignore[arg-type]


def test_digest_changes_with_the_format_version() -> None:
    spec = ImageSpec.make()
    assert ImageSpec(spec.suite, spec.packages, spec.mirror, format_version=2).digest != spec.digest


@pytest.mark.parametrize(
    "kw",
    [{"packages": ["ok", "rm -rf /"]}, {"suite": "../x"}, {"mirror": "deb.debian.org"}],
)
def test_bad_recipes_are_input_errors(kw: dict[str, object]) -> None:
    with pytest.raises(InputError):
        ImageSpec.make(**kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["", "Hpc", "../x", "a/b", ".hidden", "x" * 64])
def test_bad_names_are_refused(name: str, tmp_path: Path, store: Store) -> None:
    with pytest.raises(InputError, match="not a valid name"):
        build(Fake(tmp_path), store, name)


# --- progress -------------------------------------------------------------------------


def test_parse_progress() -> None:
    assert parse_progress("I: Retrieving libc6 2.36-9\n") == "Retrieving libc6 2.36-9"
    assert parse_progress("I: Configuring fio...") == "Configuring fio..."
    assert parse_progress("W: no cache") == "warning: no cache"
    assert parse_progress("dpkg: warning: something") is None
    assert parse_progress("") is None


def test_progress_streams_debootstrap_steps(tmp_path: Path, store: Store) -> None:
    steps: list[str] = []
    build(Fake(tmp_path), store, progress=steps.append)
    assert "Retrieving libc6 2.36-9" in steps
    assert "Validating libc6 2.36-9" in steps
    assert "Unpacking libc6..." in steps
    assert "Configuring libc6..." in steps
    assert "warning: something odd" in steps
    assert "some dpkg chatter" not in steps


# --- build, layout, reuse -------------------------------------------------------------


def test_build_layout_and_metadata(tmp_path: Path, store: Store) -> None:
    fake = Fake(tmp_path)
    image = build(fake, store)
    d = store.digests_dir / DEFAULT_DIGEST
    assert image.digest == DEFAULT_DIGEST and image.path == d and image.rootfs == d / "rootfs"
    assert (store.names_dir / "hpc").read_text().strip() == DEFAULT_DIGEST
    meta = json.loads((d / "image.json").read_text())
    assert meta["names"] == ["hpc"]
    assert meta["packages"] == sorted(DEFAULT_PACKAGES)
    assert meta["debootstrap_version"] == "9.9-fake"
    assert meta["size_bytes"] > 0 and meta["build_seconds"] >= 0 and meta["created"]
    assert (d / "build.log").read_text().count("I: ") >= 5
    assert leftovers(store) == [] and not image.reused
    (args,) = fake.runs()
    assert args.split() == [
        "--variant=minbase",
        "--include=" + ",".join(sorted(DEFAULT_PACKAGES)),
        f"--cache-dir={tmp_path / 'cache'}",
        "bookworm",
        str(d.with_name(f"{DEFAULT_DIGEST}.tmp-{os.getpid()}") / "rootfs"),
        "http://deb.debian.org/debian",
    ]


def test_rootfs_is_finished(tmp_path: Path, store: Store) -> None:
    fake = Fake(tmp_path)
    root = build(fake, store).rootfs
    assert (root / "etc/hpvc-image").read_text() == DEFAULT_DIGEST + "\n"
    for f in ("etc/hosts", "etc/resolv.conf"):
        assert (root / f).is_file() and not (root / f).is_symlink()
    assert "localhost" in (root / "etc/hosts").read_text()
    assert "10.9.9.9" not in (root / "etc/resolv.conf").read_text()
    assert fake.host_hosts.read_text() == "HOST FILE\n"  # the symlink was not followed
    assert os.listdir(root / "var/lib/apt/lists") == ["partial"]
    assert os.listdir(root / "var/cache/apt/archives") == ["partial"]
    assert os.listdir(root / "var/cache/apt") == ["archives"]


def test_same_recipe_is_reused_and_forced_rebuilt(tmp_path: Path, store: Store) -> None:
    fake = Fake(tmp_path)
    first = build(fake, store)
    again = build(fake, store)
    alias = build(fake, store, "alias")
    assert again.reused and alias.reused and len(fake.runs()) == 1
    assert again.digest == alias.digest == first.digest
    assert set(resolve_image("hpc", store).names) == {"hpc", "alias"}
    forced = build(fake, store, force=True)
    assert len(fake.runs()) == 2 and not forced.reused
    assert set(forced.names) == {"hpc", "alias"} and leftovers(store) == []
    assert [p.name for p in store.digests_dir.iterdir() if ".old-" in p.name] == []


def test_reused_build_needs_no_debootstrap(tmp_path: Path, store: Store) -> None:
    build(Fake(tmp_path), store)
    image = build_image("hpc", store=store, debootstrap_path=tmp_path / "nope")
    assert image.reused


def test_repointing_a_name_drops_the_orphaned_digest(tmp_path: Path, store: Store) -> None:
    fake = Fake(tmp_path)
    old = build(fake, store, "dev", packages=["fio"])
    new = build(fake, store, "dev", packages=["fio", "strace"])
    assert old.digest != new.digest
    assert not old.path.exists() and new.path.exists()
    assert resolve_image("dev", store).digest == new.digest


def test_repointing_keeps_a_digest_in_use(tmp_path: Path, store: Store) -> None:
    fake = Fake(tmp_path)
    old = build(fake, store, "dev", packages=["fio"])
    build(fake, store, "dev", packages=["strace"], in_use=lambda d: d == old.digest)
    assert old.path.exists()


def test_concurrent_builds_of_one_recipe_build_once(tmp_path: Path, store: Store) -> None:
    fake = Fake(tmp_path, "slow")
    results: list[Image] = []
    threads = [
        threading.Thread(target=lambda n=n: results.append(build(fake, store, n)))
        for n in ("a", "b")
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(results) == 2 and len(fake.runs()) == 1
    assert sorted(r.reused for r in results) == [False, True]
    assert set(resolve_image("a", store).names) == {"a", "b"}


def test_unusable_download_cache_is_skipped(tmp_path: Path, store: Store) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    fake = Fake(tmp_path)
    steps: list[str] = []
    build_image(
        "hpc",
        store=store,
        debootstrap_path=fake.path,
        require_root=False,
        cache_dir=blocker / "cache",
        progress=steps.append,
        check_suite=None,
    )
    assert "--cache-dir" not in fake.runs()[0]
    assert any(s.startswith("warning: no download cache") for s in steps)


# --- failures -------------------------------------------------------------------------


def test_failed_build_leaves_nothing_and_saves_the_log(tmp_path: Path, store: Store) -> None:
    with pytest.raises(HpvcError) as e:
        build(Fake(tmp_path, "fail"), store)
    assert e.value.exit_code == 1
    assert "debootstrap failed (exit 1): Couldn't download http://m/dists/" in e.value.line()
    (log,) = store.logs_dir.iterdir()
    assert str(log) in e.value.line()
    text = log.read_text()
    assert "E: Couldn't download" in text and "dpkg: error processing package hpcc" in text
    assert leftovers(store) == [] and list(store.names_dir.iterdir()) == []
    assert list_images(store) == []


def test_interrupted_build_is_stopped_and_removed(tmp_path: Path, store: Store) -> None:
    def ctrl_c(step: str) -> None:
        if step.startswith("Unpacking"):
            raise KeyboardInterrupt

    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        build(Fake(tmp_path, "hang"), store, progress=ctrl_c)
    assert time.monotonic() - started < 15  # the hanging fake was stopped, not waited for
    assert leftovers(store) == [] and list(store.names_dir.iterdir()) == []


def test_stale_tmp_dirs_of_a_recipe_are_swept(tmp_path: Path, store: Store) -> None:
    store.ensure()
    stale = store.digests_dir / f"{DEFAULT_DIGEST}.tmp-999999"
    (stale / "rootfs").mkdir(parents=True)
    build(Fake(tmp_path), store)
    assert not stale.exists()


def test_missing_debootstrap_and_non_root(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(MissingDependency, match=r"apt-get install debootstrap") as e:
        find_debootstrap("/nonexistent/debootstrap")
    assert e.value.exit_code == 2
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(InputError, match="run as root"):
        find_debootstrap("/bin/sh")
    assert find_debootstrap("/bin/sh", require_root=False) == "/bin/sh"


# --- list, resolve, remove ------------------------------------------------------------


def test_list_and_resolve(tmp_path: Path, store: Store) -> None:
    assert list_images(store) == []
    fake = Fake(tmp_path)
    build(fake, store, "b-tools", packages=["strace"])
    build(fake, store, "a-hpc")
    names = [(i.name, i.short_digest) for i in list_images(store)]
    assert names == [("a-hpc", DEFAULT_DIGEST[:12]), ("b-tools", names[1][1])]
    assert resolve_image("b-tools", store).packages == ("strace",)
    with pytest.raises(InputError) as e:
        resolve_image("nope", store)
    assert e.value.why == "not found (images here: a-hpc, b-tools)"
    assert "hpvc image build nope" not in str(e.value)  # that would make a new image
    # A typo names the closest image (issue 32, item 6); a recipe is still built by name.
    with pytest.raises(InputError) as e:
        resolve_image("b-tool", store)
    assert e.value.fix.startswith("did you mean 'b-tools'? see hpvc image ls")
    with pytest.raises(InputError) as e:
        resolve_image("hpcc", store)
    assert "did you mean 'hpc'?" in str(e.value)
    assert "recipes to build: hpc, hpc-openblas, spark" in str(e.value)
    with pytest.raises(InputError, match=r"not found \(build it: hpvc image build spark\)"):
        resolve_image("spark", store)


def test_remove_keeps_a_shared_digest_until_its_last_name(tmp_path: Path, store: Store) -> None:
    fake = Fake(tmp_path)
    image = build(fake, store, "a")
    build(fake, store, "b")
    first = remove_image("a", store)
    assert not first.deleted and first.kept_for == ("b",) and image.rootfs.is_dir()
    assert resolve_image("b", store).names == ("b",)
    with pytest.raises(InputError, match="not found"):
        resolve_image("a", store)
    last = remove_image("b", store)
    assert last.deleted and not image.path.exists() and list_images(store) == []
    with pytest.raises(InputError, match="not found"):
        remove_image("b", store)


def test_remove_refuses_an_image_in_use(tmp_path: Path, store: Store) -> None:
    image = build(Fake(tmp_path), store)
    with pytest.raises(InputError, match="in use"):
        remove_image("hpc", store, in_use=lambda d: d == image.digest)
    assert resolve_image("hpc", store).rootfs.is_dir()
    with pytest.raises(InputError, match="in use"):
        build(Fake(tmp_path), store, force=True, in_use=lambda d: True)


def test_remove_tree_never_descends_into_a_mount(tmp_path: Path) -> None:
    victim = tmp_path / "tmp-1"
    (victim / "rootfs/proc").mkdir(parents=True)
    host = tmp_path / "host"
    (host / "proc").mkdir(parents=True)
    point = str(victim / "rootfs/proc").replace(" ", "\\040")
    (host / "proc/mounts").write_text(f"proc {point} proc rw 0 0\nx /elsewhere x rw 0 0\n")
    assert mounts_under(victim, host) == [str(victim / "rootfs/proc")]
    with pytest.raises(HpvcError, match="still mounted"):
        remove_tree(victim, root=host)
    assert victim.exists()
    remove_tree(victim, root=tmp_path / "none")
    assert not victim.exists()


def test_default_store_follows_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HPVC_IMAGE_DIR", raising=False)
    monkeypatch.delenv("HPVC_STATE_DIR", raising=False)
    assert default_store() == Path("/var/lib/hpvc/images")
    monkeypatch.setenv("HPVC_STATE_DIR", "/s")
    assert default_store() == Path("/s/images")
    monkeypatch.setenv("HPVC_IMAGE_DIR", "/i")
    assert default_store() == Path("/i")


# --- CLI ------------------------------------------------------------------------------


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        main(args)
        code = 0
    except SystemExit as e:
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_build_ls_rm(
    tmp_path: Path,
    store: Store,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    fake = Fake(tmp_path)
    patched = functools.partial(
        build_image, debootstrap_path=fake.path, require_root=False, check_suite=None
    )
    monkeypatch.setattr(cli_image, "build_image", patched)
    s = str(store.root)
    code, out, err = run_cli(
        ["image", "build", "tools", "--packages", "strace", "--store", s, "--json"], capsys
    )
    assert code == 0, err
    doc = json.loads(out)
    assert doc["name"] == "tools" and "strace" in doc["packages"] and "fio" in doc["packages"]
    assert "Retrieving" in err  # progress goes to stderr
    code, out, _ = run_cli(
        ["image", "build", "tools", "--packages", "strace", "--store", s], capsys
    )
    assert code == 0 and "reused" in out
    code, out, _ = run_cli(["image", "ls", "--store", s, "--json"], capsys)
    assert [i["name"] for i in json.loads(out)] == ["tools"]
    code, out, _ = run_cli(["image", "inspect", "tools", "--store", s, "--rootfs"], capsys)
    assert code == 0 and out == f"{doc['rootfs']}\n" and Path(out.strip()).is_dir()
    code, out, _ = run_cli(["image", "rm", "tools", "--store", s], capsys)
    assert code == 0 and "rootfs deleted" in out
    code, _, err = run_cli(["image", "rm", "tools", "--store", s], capsys)
    assert code == 2 and err.startswith("hpvc: image 'tools': not found")


def test_cli_packages_notation() -> None:
    assert cli_image._packages(None, False) is None
    assert cli_image._packages("a, b", False) == [*DEFAULT_PACKAGES, "a", "b"]
    assert cli_image._packages("a,b", True) == ["a", "b"]


def test_cli_help_has_examples(capsys: pytest.CaptureFixture[str]) -> None:
    for cmd in (["image"], ["image", "build"], ["image", "ls"], ["image", "rm"]):
        code, out, _ = run_cli([*cmd, "--help"], capsys)
        assert code == 0 and "Examples" in out and "hpvc image" in out
