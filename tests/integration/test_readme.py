"""README.md runs as written (issue 32): its command blocks, in order, in one
shell, from a fresh copy of the checkout, with the output it shows checked.

How a block is marked (run, skip with a reason, spec) is in tests/readme.py.
The only rewrites are the ones a user's own terminal makes: ``hpvc`` is
``.venv/bin/hpvc`` (on PATH, as README's Set-up says), and ``sudo `` is
dropped when already root. Whatever clusters the run brought up are taken
down at the end, whatever happened.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import requires
from tests.integration.test_cluster import image_ready
from tests.readme import README, ROOT, Block, Command, blocks

HPVC = ROOT / ".venv" / "bin" / "hpvc"
SNAPSHOT = "build/topologies/64amd64-4s2n4ca2co"  # README step 2 extracts it
RC = "@@readme-test rc "
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
ERROR_LINE = re.compile(r"^hpvc: .+: .+ \(.+\)$")


@dataclass
class Ran:
    cmd: Command
    rc: int
    out: str


def fresh_checkout(dest: Path) -> Path:
    """The checkout's files (tracked, and new ones git does not ignore), nothing built."""
    names = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout.split(b"\0")
    for raw in names:
        rel = raw.decode()
        src = ROOT / rel
        if not rel or not src.is_file():
            continue
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / rel, follow_symlinks=False)
    return dest


def as_run(text: str) -> str:
    """The command as this terminal runs it: no ``sudo`` when already root."""
    if os.geteuid() == 0:
        text = re.sub(r"(^|&&\s*|;\s*)sudo\s+", r"\1", text)
    return text


def script(todo: list[Block]) -> tuple[str, list[Command]]:
    """One bash script for every run block (cd and export carry on, as in a terminal)."""
    parts = ["exec </dev/null"]
    cmds: list[Command] = []
    for b in todo:
        if b.action == "spec":
            spec = f"readme-spec-{b.line}.toml"
            text = f"hpvc plan {spec} --topology-root {SNAPSHOT}"
            parts.append(f"cat > {spec} <<'README_SPEC'\n{b.text}\nREADME_SPEC")
            cmd = Command(b.line, text)
        else:
            for c in b.commands():
                cmds.append(c)
                parts.append(f"{{ {as_run(c.text)}\n}} 2>&1; printf '\\n{RC}%d\\n' $?")
            continue
        cmds.append(cmd)
        parts.append(f"{{ {cmd.text}\n}} 2>&1; printf '\\n{RC}%d\\n' $?")
    return "\n".join(parts) + "\n", cmds


def split(out: str, cmds: list[Command]) -> list[Ran]:
    ran: list[Ran] = []
    chunk: list[str] = []
    for ln in out.splitlines():
        if ln.startswith(RC):
            ran.append(Ran(cmds[len(ran)], int(ln[len(RC) :]), "\n".join(chunk).strip("\n")))
            chunk = []
        else:
            chunk.append(ANSI.sub("", ln))
    return ran


def check(r: Ran) -> str | None:
    """What is wrong with one command's run, if anything."""
    where = f"README.md:{r.cmd.line}: {r.cmd.text!r}"
    if r.rc != 0:
        if r.rc != r.cmd.may_exit:
            return f"{where} exited {r.rc}:\n{r.out}"
        lines = r.out.splitlines()
        if len(lines) != 1 or not ERROR_LINE.match(lines[0]):
            return f"{where} exited {r.rc} without one 'hpvc: what: why (fix)' line:\n{r.out}"
    flat = " ".join(r.out.split())
    missing = [p for p in r.cmd.expect if " ".join(p.split()) not in flat]
    if missing:
        return f"{where} did not print {missing} (the README shows them):\n{r.out}"
    return None


def clusters(env: dict[str, str]) -> set[str]:
    p = subprocess.run([str(HPVC), "ls", "--json"], env=env, capture_output=True, text=True)
    return {c["name"] for c in json.loads(p.stdout or "[]")} if p.returncode == 0 else set()


def images(env: dict[str, str]) -> set[str]:
    p = subprocess.run(
        [str(HPVC), "image", "ls", "--json"], env=env, capture_output=True, text=True
    )
    return {i["name"] for i in json.loads(p.stdout or "[]")} if p.returncode == 0 else set()


def podman_images() -> set[str]:
    if shutil.which("podman") is None:
        return set()
    p = subprocess.run(["podman", "images", "-q", "--no-trunc"], capture_output=True, text=True)
    return set(p.stdout.split())


@pytest.fixture
def checkout(tmp_path: Path) -> Iterator[Path]:
    requires("root", "crun", "ip", "mpi", "topologies")
    image_ready()  # what `hpvc image build hpc` reuses (minutes the first time, on any test)
    yield fresh_checkout(tmp_path / "hpvc")


def test_the_readme_runs_as_written(checkout: Path) -> None:
    all_blocks = blocks(README.read_text())
    todo = [b for b in all_blocks if b.action in ("run", "spec")]
    for b in all_blocks:
        assert b.action != "skip" or b.reason.strip(), f"README.md:{b.line}: a skip needs a why"
    assert todo, "README.md has no block to run"
    env = {
        **os.environ,
        "PATH": f"{HPVC.parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "COLUMNS": "200",
        "NO_COLOR": "1",
    }
    text, cmds = script(todo)
    before, images_before, podman_before = clusters(env), images(env), podman_images()
    try:
        p = subprocess.run(
            ["bash", "-c", text],
            cwd=checkout,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
    finally:
        for name in sorted(clusters(env) - before):
            subprocess.run([str(HPVC), "down", name], env=env, capture_output=True)
        # what a README step made and a failing run left: images, Podman's too
        for name in sorted(images(env) - images_before):
            subprocess.run([str(HPVC), "image", "rm", name], env=env, capture_output=True)
        for ident in sorted(podman_images() - podman_before):
            subprocess.run(["podman", "rmi", "-f", ident], capture_output=True)
    ran = split(p.stdout, cmds)
    problems = [e for e in (check(r) for r in ran) if e]
    assert not problems, "\n\n".join(problems)
    assert len(ran) == len(cmds), (
        f"the README's shell stopped after {len(ran)} of {len(cmds)} commands "
        f"(next: README.md:{cmds[len(ran)].line} {shlex.quote(cmds[len(ran)].text)}):\n"
        f"{p.stdout[-2000:]}{p.stderr[-2000:]}"
    )
    assert clusters(env) == before, "the README's own steps left a cluster up"
    assert images(env) == images_before, "the README's own steps left an image"
