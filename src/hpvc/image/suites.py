"""Which Debian suites this host can build, checked before a build writes anything.

A suite builds when debootstrap has a script for it, the mirror serves its
``dists/SUITE/InRelease`` and that file carries a valid signature from a key in
the keyring the script names (what debootstrap itself verifies, as it does:
any ``VALIDSIG`` from ``gpgv`` will do). A suite failing one of these is one
line naming the suites that pass them all, before the store is touched.

What a suite lacks is learned from debootstrap itself: it resolves
``--include`` against the suite's package lists within seconds, before it
downloads any package, and stops with ``Couldn't find these debs: ...``;
``missing_packages`` turns that into one line with the command line that
leaves them out (the default packages are bookworm's names).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from hpvc.errors import HpvcError, InputError, MissingDependency
from hpvc.image.model import (
    DEFAULT_MIRROR,
    DEFAULT_PACKAGES,
    DEFAULT_SUITE,
    ImageSpec,
    is_suite_name,
)

DEBIAN_KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
# Names that move from release to release: accepted, never offered.
ALIASES = frozenset({"stable", "testing", "unstable", "oldstable", "oldoldstable"})
TIMEOUT_S = 15.0

# ``get(url, body)``: the bytes at ``url`` (b"" when ``body`` is False), None when
# the mirror has nothing there (404, no such file); OSError when it cannot be asked.
Get = Callable[[str, bool], bytes | None]
# ``verify(data, keyring)``: whether ``data`` (an InRelease) is validly signed.
Verify = Callable[[bytes, str], bool]


def scripts_dir() -> Path:
    """Where debootstrap looks for its suite scripts (``$DEBOOTSTRAP_DIR/scripts``)."""
    return Path(os.environ.get("DEBOOTSTRAP_DIR") or "/usr/share/debootstrap") / "scripts"


def http_get(url: str, body: bool = True) -> bytes | None:
    """GET (or HEAD) ``url``; None for 404/410 or a missing file:// path."""
    req = urllib.request.Request(url, method="GET" if body else "HEAD")
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as r:
            return bytes(r.read()) if body else b""
    except urllib.error.HTTPError as e:
        if e.code in (404, 410):
            return None
        raise OSError(f"HTTP {e.code} {e.reason}") from None
    except urllib.error.URLError as e:
        if isinstance(e.reason, FileNotFoundError):
            return None
        raise OSError(str(e.reason)) from None
    except FileNotFoundError:
        return None


def gpgv_verify(data: bytes, keyring: str) -> bool:
    """Whether gpgv finds a valid signature by a key in ``keyring`` (as debootstrap asks)."""
    gpgv = shutil.which("gpgv")
    if gpgv is None:
        raise MissingDependency("image build", "gpgv not found", "apt-get install gpgv")
    with tempfile.NamedTemporaryFile(suffix=".InRelease") as f:
        f.write(data)
        f.flush()
        out = subprocess.run(
            [gpgv, "--status-fd", "1", "--keyring", keyring, "--ignore-time-conflict", f.name],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        ).stdout
    return any(line.startswith("[GNUPG:] VALIDSIG ") for line in out.splitlines())


def script_keyring(script: Path) -> str | None:
    """The keyring a debootstrap script names (``keyring /usr/share/keyrings/...``)."""
    try:
        text = script.read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        words = line.split()
        if len(words) == 2 and words[0] == "keyring":
            return words[1]
    return None


def _debian(keyring: str | None) -> bool:
    return keyring is not None and Path(keyring).name == Path(DEBIAN_KEYRING).name


def debian_scripts(scripts: Path) -> list[str]:
    """Suites debootstrap has a Debian script for (keyed by the Debian archive keyring),
    aliases and variants (``sarge.buildd``) left out."""
    try:
        names = sorted(p.name for p in scripts.iterdir())
    except OSError:
        return []
    return [
        n
        for n in names
        if is_suite_name(n) and n not in ALIASES and _debian(script_keyring(scripts / n))
    ]


def buildable(mirror: str, scripts: Path, get: Get = http_get) -> list[str]:
    """The Debian suites with a script here that ``mirror`` serves (asked side by side)."""
    names = debian_scripts(scripts)

    def served(suite: str) -> bool:
        try:
            return get(f"{mirror}/dists/{suite}/InRelease", False) is not None
        except OSError:
            return False

    with ThreadPoolExecutor(max_workers=8) as pool:
        flags = list(pool.map(served, names))
    return [n for n, ok in zip(names, flags, strict=True) if ok]


def _offer(mirror: str, scripts: Path, get: Get) -> str:
    found = buildable(mirror, scripts, get)
    return f"this host builds from {mirror}: {', '.join(found) or 'none'}"


def check(
    spec: ImageSpec,
    *,
    scripts: Path | None = None,
    get: Get = http_get,
    verify: Verify = gpgv_verify,
) -> None:
    """Refuse, in one line, a suite this host cannot build from ``spec.mirror``.

    InputError (exit 2) for a suite debootstrap has no script for, one the mirror
    does not serve, or one signed by no key in the script's keyring; HpvcError
    (exit 1) when the mirror cannot be reached at all.
    """
    where = scripts if scripts is not None else scripts_dir()
    suite, mirror = spec.suite, spec.mirror
    what = f"suite {suite!r}"
    script = where / suite
    if not script.is_file():
        raise InputError(
            what, f"debootstrap has no script for it in {where}", _offer(mirror, where, get)
        )
    url = f"{mirror}/dists/{suite}/InRelease"
    try:
        data = get(url, True)
    except OSError as e:
        raise HpvcError(
            f"mirror {mirror}", f"cannot read {url}: {e}", "check the network or --mirror"
        ) from None
    if data is None:
        raise InputError(
            what, f"not served by {mirror} (no dists/{suite}/InRelease)", _offer(mirror, where, get)
        )
    keyring = script_keyring(script)
    if keyring is None:
        return  # a script without a keyring: debootstrap does not verify either
    if not Path(keyring).is_file():
        raise MissingDependency(
            what, f"keyring {keyring} missing", "apt-get install debian-archive-keyring"
        )
    if not verify(data, keyring):
        raise InputError(
            what,
            f"its InRelease on {mirror} is signed by no key in {keyring}",
            "a newer debian-archive-keyring may know it; " + _offer(mirror, where, get),
        )


def missing_debs(tail: list[str]) -> list[str]:
    """The packages of debootstrap's ``E: Couldn't find these debs: a b``, else []."""
    marker = "E: Couldn't find these debs:"
    for line in reversed(tail):
        if line.startswith(marker):
            return line[len(marker) :].split()
    return []


def _more(spec: ImageSpec) -> str:
    """The options besides the suite and packages that rebuild ``spec``."""
    out = "" if spec.mirror == DEFAULT_MIRROR else f" --mirror {spec.mirror}"
    return out + (f" --extras {','.join(spec.extras)}" if spec.extras else "")


def missing_packages(name: str, spec: ImageSpec, missing: list[str]) -> InputError:
    """The one line for packages ``spec.suite`` does not have, with the way out."""
    what = f"image build {name}"
    listed = ", ".join(missing)
    if set(missing) <= set(DEFAULT_PACKAGES):
        rest = ",".join(p for p in spec.packages if p not in missing)
        whose = (
            "" if spec.suite == DEFAULT_SUITE else f" (the default packages are {DEFAULT_SUITE}'s)"
        )
        return InputError(
            what,
            f"{spec.suite} has no package {listed}{whose}",
            f"leave it out: hpvc image build {name} --suite {spec.suite}{_more(spec)}"
            f" --no-defaults --packages {rest}",
        )
    return InputError(
        what,
        f"{spec.suite} has no package {listed}",
        f"leave it out of --packages, or name {spec.suite}'s own (packages.debian.org)",
    )
