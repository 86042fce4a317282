"""Other Debian releases (``hpvc image build --suite``) with no root and no
network: debootstrap's scripts, the mirror and the signature check are made up
here. Which suites build, what a suite lacks, the suite and os in ``ls``; and
``image import`` refused to anyone but root."""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from hpvc.cli import image as cli_image
from hpvc.errors import HpvcError, InputError, MissingDependency
from hpvc.image import ImageSpec, Store, build_image, suites
from hpvc.image.rootfs import os_name
from tests.unit.test_image import Fake, build, leftovers, run_cli

MIRROR = "http://m/debian"
SERVED = {"bookworm", "bullseye", "trixie", "sid", "stable", "jammy"}
BUILDS = "this host builds from http://m/debian: bookworm, bullseye, sid, trixie"


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "store")


@pytest.fixture
def scripts(tmp_path: Path) -> Path:
    """A debootstrap scripts folder: Debian suites (links to sid, as Debian ships
    them), an alias, a variant, a Devuan name, an Ubuntu suite, the common part."""
    keyring = tmp_path / "debian-archive-keyring.gpg"
    keyring.write_bytes(b"keys")
    d = tmp_path / "scripts"
    d.mkdir()
    (d / "sid").write_text(f"mirror_style release\nkeyring {keyring}\n")
    for name in ("bookworm", "bullseye", "trixie", "buster", "stable", "ascii"):
        (d / name).symlink_to("sid")
    (d / "sarge.buildd").write_text(f"keyring {keyring}\n")
    (d / "jammy").write_text("keyring /usr/share/keyrings/ubuntu-archive-keyring.gpg\n")
    (d / "debian-common").write_text("# included by the others\n")
    return d


def mirror(down: bool = False) -> tuple[suites.Get, list[str]]:
    """A mirror serving SERVED (an InRelease that says ``signed``), and what was asked."""
    asked: list[str] = []

    def get(url: str, body: bool) -> bytes | None:
        asked.append(url)
        if down:
            raise OSError("Connection refused")
        suite = url.removeprefix(f"{MIRROR}/dists/").split("/")[0]
        return None if suite not in SERVED else b"signed" if body else b""

    return get, asked


def signed(data: bytes, keyring: str) -> bool:
    return data == b"signed"


def spec(suite: str) -> ImageSpec:
    return ImageSpec.make(None, suite, MIRROR)


def checker(scripts: Path, **kw: object) -> Callable[[ImageSpec], None]:
    get, _ = mirror()
    return functools.partial(suites.check, scripts=scripts, get=get, verify=signed, **kw)  # type: ignore[arg-type]


# --- which suites build ---------------------------------------------------------------


def test_a_suite_with_script_mirror_and_signature_builds(scripts: Path) -> None:
    get, asked = mirror()
    suites.check(spec("bullseye"), scripts=scripts, get=get, verify=signed)
    assert asked == [f"{MIRROR}/dists/bullseye/InRelease"]  # one request, nothing listed


def test_a_suite_without_a_script_names_those_that_build(scripts: Path) -> None:
    get, _ = mirror()
    with pytest.raises(InputError) as e:
        suites.check(spec("forky"), scripts=scripts, get=get, verify=signed)
    assert e.value.exit_code == 2
    assert e.value.line() == (
        f"suite 'forky': debootstrap has no script for it in {scripts} ({BUILDS})"
    )


def test_a_suite_the_mirror_does_not_serve_names_those_that_build(scripts: Path) -> None:
    get, _ = mirror()
    with pytest.raises(InputError) as e:
        suites.check(spec("buster"), scripts=scripts, get=get, verify=signed)
    assert e.value.line() == (
        f"suite 'buster': not served by {MIRROR} (no dists/buster/InRelease) ({BUILDS})"
    )


def test_a_suite_signed_by_no_known_key_is_refused(scripts: Path) -> None:
    get, _ = mirror()
    with pytest.raises(InputError, match=r"signed by no key in .*debian-archive-keyring\.gpg"):
        suites.check(spec("trixie"), scripts=scripts, get=get, verify=lambda d, k: False)


def test_a_missing_keyring_and_an_unreachable_mirror(scripts: Path, tmp_path: Path) -> None:
    get, _ = mirror()
    (tmp_path / "debian-archive-keyring.gpg").unlink()
    with pytest.raises(MissingDependency, match="apt-get install debian-archive-keyring"):
        suites.check(spec("trixie"), scripts=scripts, get=get, verify=signed)
    down, _ = mirror(down=True)
    with pytest.raises(HpvcError, match=r"cannot read .*Connection refused") as e:
        suites.check(spec("trixie"), scripts=scripts, get=down, verify=signed)
    assert e.value.exit_code == 1  # the network, not the input


@pytest.mark.parametrize("suite", ["Bookworm", "trixie!", "../sid", "-x", "", "a" * 40])
def test_malformed_suites_are_input_errors(suite: str) -> None:
    with pytest.raises(InputError, match="not a Debian suite name"):
        ImageSpec.make(None, suite)


def test_cli_refuses_a_bad_suite_in_one_line_writing_nothing(
    tmp_path: Path,
    store: Store,
    scripts: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    patched = functools.partial(
        build_image,
        debootstrap_path=Fake(tmp_path).path,
        require_root=False,
        check_suite=checker(scripts),
        mirror=MIRROR,
    )
    monkeypatch.setattr(cli_image, "build_image", patched)
    for suite, why in (("buster", "not served by"), ("Old!", "not a Debian suite name")):
        code, out, err = run_cli(
            ["image", "build", "old", "--suite", suite, "--store", str(store.root)], capsys
        )
        assert code == 2 and out == "", err
        assert err.startswith(f"hpvc: suite '{suite}': {why}") and err.count("\n") == 1, err
    assert not store.root.exists()


# --- what a suite lacks ---------------------------------------------------------------


def test_missing_debs_are_read_from_debootstrap() -> None:
    tail = ["I: Checking component main on http://m...", "E: Couldn't find these debs: a b"]
    assert suites.missing_debs(tail) == ["a", "b"]
    assert suites.missing_debs(["E: Couldn't download http://m/x"]) == []


def test_default_packages_a_suite_lacks_say_how_to_leave_them_out() -> None:
    e = suites.missing_packages("new", ImageSpec.make(None, "trixie"), ["libopenmpi3"])
    assert e.exit_code == 2
    assert e.line().startswith(
        "image build new: trixie has no package libopenmpi3 (the default packages are"
        " bookworm's) (leave it out: hpvc image build new --suite trixie --no-defaults"
        " --packages fio,hpcc,iproute2,"
    )
    assert "openmpi-bin" in e.line() and ",libopenmpi3" not in e.line()
    mine = ImageSpec.make(["procps", "nosuch"], "bullseye", "http://m/debian/")
    line = suites.missing_packages("x", mine, ["nosuch"]).line()
    assert line == (
        "image build x: bullseye has no package nosuch"
        " (leave it out of --packages, or name bullseye's own (packages.debian.org))"
    )


def test_a_build_missing_packages_is_one_input_error_leaving_nothing(
    tmp_path: Path, store: Store
) -> None:
    with pytest.raises(InputError) as e:
        build(Fake(tmp_path, "nodebs"), store, suite="trixie")
    assert "trixie has no package nosuchpkg, libopenmpi3" in e.value.line()
    assert leftovers(store) == [] and list(store.names_dir.iterdir()) == []
    assert list(store.logs_dir.iterdir()) == []  # bad input: no debootstrap log to read


# --- the suite through the CLI, the os in ls --------------------------------------------


def test_cli_builds_the_suite_and_ls_shows_it(
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
    args = ["image", "build", "old", "--suite", "bullseye", "--no-defaults", "--packages", "procps"]
    code, out, err = run_cli([*args, "--store", s, "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["suite"] == "bullseye" and doc["packages"] == ["procps"]
    assert doc["os"] == "bullseye"  # the fake wrote no os-release: the suite stands in
    assert fake.runs()[0].split()[-3] == "bullseye"
    rootfs = Path(doc["rootfs"])
    (rootfs / "usr/lib").mkdir(parents=True)
    (rootfs / "usr/lib/os-release").write_text(
        'NAME="Debian"\nPRETTY_NAME="Debian GNU/Linux 11 (bullseye)"\n'
    )
    (rootfs / "etc/os-release").symlink_to("../usr/lib/os-release")
    code, out, _ = run_cli(["image", "ls", "--store", s, "--json"], capsys)
    assert [(i["suite"], i["os"]) for i in json.loads(out)] == [
        ("bullseye", "Debian GNU/Linux 11 (bullseye)")
    ]
    code, out, _ = run_cli(["image", "inspect", "old", "--store", s], capsys)
    assert json.loads(out)["os"] == "Debian GNU/Linux 11 (bullseye)"


def test_os_name_is_read_inside_the_rootfs(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    assert os_name(root) == ""
    (root / "etc/os-release").symlink_to("/usr/lib/os-release")  # the image's, not the host's
    assert os_name(root) == ""
    (root / "usr/lib").mkdir(parents=True)
    (root / "usr/lib/os-release").write_text("ID=alpine\nPRETTY_NAME='Alpine Linux v3.20'\n")
    assert os_name(root) == "Alpine Linux v3.20"


# --- import is root's -----------------------------------------------------------------


def test_import_by_an_ordinary_user_is_one_line_writing_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    archive = tmp_path / "mine.tar"
    archive.write_bytes(b"")
    store = tmp_path / "store"
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    code, out, err = run_cli(
        ["image", "import", "mine", f"docker-archive:{archive}", "--store", str(store)], capsys
    )
    assert code == 2 and out == ""
    assert err.startswith("hpvc: image import: needs root (") and err.count("\n") == 1, err
    assert not store.exists()
