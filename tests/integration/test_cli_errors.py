"""Every common mistake at the CLI is one line, ``hpvc: <what>: <why> (<fix>)``,
exit 2, and following the fix it names makes the command succeed (issue 32).

Each row makes a mistake as a user would, runs ``hpvc`` as a process, checks
the line, then applies the fix the line gives (read from the line where it
names a value: the closest image, the spec's roles, the setting to change)
and runs the command again. Plans use topology snapshots so that a row does
not depend on this host; the rows that need a cluster bring up one small
container cluster in a private state directory and take it down at the end.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from hpvc.paths import image_dir
from tests.helpers import ROOT, requires
from tests.integration.test_cluster import image_ready

HPVC = Path(ROOT) / ".venv" / "bin" / "hpvc"
BIG = "64amd64-4s2n4ca2co"  # fits every example
SMALL = "2i386-2t-hugepagesizecount"  # 2 CPUs: examples/cluster.toml's 4 dedicated vCPUs do not fit
# Two 2-vCPU nodes pinned 1:1 on a 2-CPU host; memory that fits.
TOO_MANY_CPUS = """name = "pinned"
kind = "container"
[tuning]
pinning = "dedicated"
hugepages = "none"
partition = "commodity"
[[nodes]]
role = "compute"
count = 2
vcpus = 2
memory = "128MiB"
"""
SHAPE = re.compile(r"^hpvc: (?P<what>.+?): (?P<why>.+) \((?P<fix>.+)\)$")


@dataclass
class Line:
    text: str  # the whole line
    what: str
    why: str
    fix: str  # the last parenthesised part


def run(
    env: dict[str, str], *argv: str, cwd: Path, as_user: list[str] | None = None
) -> tuple[int, str, str]:
    p = subprocess.run(
        [*(as_user or []), str(HPVC), *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return p.returncode, p.stdout, p.stderr


def mistake(env: dict[str, str], *argv: str, cwd: Path, as_user: list[str] | None = None) -> Line:
    """Run a command that must fail with exit 2 and one line of the shape; its parts."""
    rc, out, err = run(env, *argv, cwd=cwd, as_user=as_user)
    lines = err.splitlines()
    assert rc == 2, f"hpvc {' '.join(argv)}: exit {rc}\n{out}{err}"
    assert len(lines) == 1, f"hpvc {' '.join(argv)}: not one line:\n{err}"
    m = SHAPE.match(lines[0])
    assert m, f"hpvc {' '.join(argv)}: not 'hpvc: what: why (fix)': {lines[0]!r}"
    fix = _last_parens(lines[0])
    return Line(lines[0], m.group("what"), m.group("why"), fix)


def _last_parens(line: str) -> str:
    """The text of the parenthesised part that ends the line (nested ones kept)."""
    depth = 0
    for i in range(len(line) - 1, -1, -1):
        depth += {")": 1, "(": -1}.get(line[i], 0)
        if depth == 0:
            return line[i + 1 : -1]
    raise AssertionError(f"unbalanced: {line!r}")


def ok(env: dict[str, str], *argv: str, cwd: Path, as_user: list[str] | None = None) -> str:
    rc, out, err = run(env, *argv, cwd=cwd, as_user=as_user)
    assert rc == 0, f"after the fix, hpvc {' '.join(argv)}: exit {rc}\n{out}{err}"
    return out


def fix_command(line: Line) -> list[str]:
    """The hpvc command a fix names ('see hpvc ls', 'see hpvc render --help')."""
    m = re.search(r"\bhpvc ([a-z-][\w -]*?)(?:;|$)", line.fix)
    assert m, f"no hpvc command in the fix: {line.fix!r}"
    return m.group(1).split()


@pytest.fixture(scope="module")
def snapshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("topologies")
    for name in (BIG, SMALL):
        tar = Path(ROOT) / "tests" / "data" / "topologies" / f"{name}.tar.bz2"
        subprocess.run(["tar", "xjf", str(tar), "-C", str(out)], check=True)
    return out


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "HPVC_STATE_DIR": str(tmp_path / "state"),
        "HPVC_IMAGE_DIR": str(image_dir()),
        "COLUMNS": "200",
    }


def spec(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_plan_mistakes_print_one_line_whose_fix_works(
    tmp_path: Path, env: dict[str, str], snapshots: Path
) -> None:
    big = ["--topology-root", str(snapshots / BIG)]
    demo = (Path(ROOT) / "examples" / "demo.toml").read_text()

    # A misspelt key: named with its path; fixing its spelling plans.
    s = spec(tmp_path, "typo.toml", demo.replace('image = "hpc"', 'imgae = "hpc"'))
    e = mistake(env, "plan", s.name, *big, cwd=tmp_path)
    assert e.text.startswith("hpvc: typo.toml: imgae: unknown key (") and "spelling" in e.fix
    s.write_text(s.read_text().replace("imgae", "image"))
    ok(env, "plan", s.name, *big, cwd=tmp_path)

    # A value out of its set: the line lists the values one may write, and one of them plans.
    s = spec(tmp_path, "bad.toml", demo.replace('hugepages = "2M"', 'hugepages = "4M"'))
    e = mistake(env, "plan", s.name, *big, cwd=tmp_path)
    assert e.text.startswith("hpvc: bad.toml: tuning.hugepages: got '4M', "), e
    allowed = re.findall(r"'([^']+)'", e.text.split("should be", 1)[1])
    assert "2M" in allowed, e
    s.write_text(demo.replace('hugepages = "2M"', f'hugepages = "{allowed[allowed.index("2M")]}"'))
    ok(env, "plan", s.name, *big, cwd=tmp_path)

    # A missing file: the path is checked; the right path plans.
    e = mistake(env, "plan", "demo.tom", *big, cwd=tmp_path)
    assert e.text.startswith("hpvc: demo.tom: ") and "not found" in e.why and "path" in e.fix
    spec(tmp_path, "demo.toml", demo)
    ok(env, "plan", "demo.toml", *big, cwd=tmp_path)

    # A folder instead of a spec file.
    e = mistake(env, "plan", str(tmp_path), *big, cwd=tmp_path)
    assert "spec" in e.fix and ".toml" in e.fix

    # A spec that does not fit: what is short, and a setting that makes it fit.
    cluster = spec(tmp_path, "cluster.toml", TOO_MANY_CPUS)
    small = ["--topology-root", str(snapshots / SMALL)]
    e = mistake(env, "plan", cluster.name, *small, cwd=tmp_path)
    assert e.text.startswith("hpvc: cluster does not fit: "), e
    m = re.search(r'(\w+) = "(\w+)" under \[(\w+)\]', e.fix)
    assert m, f"no setting in the fix: {e.fix!r}"
    key, value, table = m.groups()
    text = re.sub(
        rf'(?ms)(^\[{table}\].*?^{key} = )"\w+"', rf'\1"{value}"', cluster.read_text(), count=1
    )
    assert text != cluster.read_text()
    cluster.write_text(text)
    ok(env, "plan", cluster.name, *small, cwd=tmp_path)


def test_command_line_mistakes_print_one_line_whose_help_helps(
    tmp_path: Path, env: dict[str, str], snapshots: Path
) -> None:
    big = ["--topology-root", str(snapshots / BIG)]
    spec(tmp_path, "small.toml", (Path(ROOT) / "examples" / "small.toml").read_text())

    # A missing option: the fix is the command's --help, which shows it; given, it renders.
    e = mistake(env, "render", "small.toml", *big, cwd=tmp_path)
    assert "--out" in e.why
    assert fix_command(e) == ["render", "--help"]
    assert "--out" in ok(env, *fix_command(e), cwd=tmp_path)
    ok(env, "render", "small.toml", *big, "--out", "out", cwd=tmp_path)
    assert (tmp_path / "out" / "hostfile").is_file()

    # An unknown option and an unknown command: the help they name lists the right one.
    e = mistake(env, "plan", "small.toml", "--topology", str(snapshots / BIG), cwd=tmp_path)
    assert "--topology-root" in ok(env, *fix_command(e), cwd=tmp_path)
    e = mistake(env, "topolgy", cwd=tmp_path)
    assert " topology " in ok(env, *fix_command(e), cwd=tmp_path)


def test_an_unreadable_spec_is_one_line_and_chmod_fixes_it(
    tmp_path: Path, env: dict[str, str], snapshots: Path
) -> None:
    requires("root")
    # root without the capabilities that read any file, as an ordinary user reads
    user = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--inh-caps=-all"]
    s = spec(tmp_path, "mine.toml", (Path(ROOT) / "examples" / "demo.toml").read_text())
    s.chmod(0)
    big = ["--topology-root", str(snapshots / BIG)]
    e = mistake(env, "plan", s.name, *big, cwd=tmp_path, as_user=user)
    assert e.text.startswith("hpvc: mine.toml: ") and "Permission denied" in e.why, e
    assert "permission" in e.fix, e
    s.chmod(0o644)
    ok(env, "plan", s.name, *big, cwd=tmp_path, as_user=user)


@pytest.fixture
def cluster_name(env: dict[str, str]) -> Iterator[str]:
    requires("root", "crun", "ip")
    image_ready()
    name = f"errs{os.getpid() % 10000}"
    try:
        yield name
    finally:
        subprocess.run([str(HPVC), "down", name], env=env, capture_output=True, timeout=120)


def test_cluster_mistakes_print_one_line_whose_fix_works(
    tmp_path: Path, env: dict[str, str], cluster_name: str
) -> None:
    demo = (Path(ROOT) / "examples" / "demo.toml").read_text()
    text = demo.replace('name = "demo"', f'name = "{cluster_name}"').replace(
        "10.88.0.0/24", f"10.88.{200 + os.getpid() % 50}.0/24"
    )

    # An image that is not there: the closest name is offered, and with it the cluster comes up.
    s = spec(tmp_path, "c.toml", text.replace('image = "hpc"', 'image = "hpcc"'))
    e = mistake(env, "up", s.name, cwd=tmp_path)
    m = re.search(r"did you mean '([\w.-]+)'", e.fix)
    assert m and m.group(1) == "hpc", e
    s.write_text(text)
    ok(env, "up", s.name, cwd=tmp_path)

    # A cluster name that is not there: `hpvc ls` (the fix) lists the one that is.
    e = mistake(env, "status", cluster_name + "x", cwd=tmp_path)
    assert fix_command(e) == ["ls"]
    ok(env, "ls", cwd=tmp_path)
    names = [c["name"] for c in json.loads(ok(env, "ls", "--json", cwd=tmp_path))]
    assert names == [cluster_name]
    ok(env, "status", names[0], cwd=tmp_path)

    # Scaling a role the spec does not have: the fix names the roles; one of them scales.
    e = mistake(env, "scale", cluster_name, "storage=1", cwd=tmp_path)
    roles = re.search(r"roles: ([\w, ]+)$", e.fix)
    assert roles and "compute" in roles.group(1).split(", "), e
    ok(env, "scale", cluster_name, f"{roles.group(1).split(', ')[-1]}=1", cwd=tmp_path)
    # A count that is not one: the fix shows the form, which scales.
    e = mistake(env, "scale", cluster_name, "compute=-1", cwd=tmp_path)
    form = re.search(r"\b(compute)=\d+", e.fix)
    assert form, e
    ok(env, "scale", cluster_name, f"{form.group(1)}=2", cwd=tmp_path)
    ok(env, "down", cluster_name, cwd=tmp_path)
