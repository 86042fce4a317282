"""What a command imports before it answers (issue 33 item 4), checked without
timing: the listings run without typer, a help page drawn once is replayed
without typer or rich, and either way the output is what typer prints."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpvc.cli import helpcache, quick
from hpvc.store import ClusterRecord, Store
from tests.unit.test_image_in_use import plan_json, spec

# As the command line runs (argv from sys.argv, so the help cache is used);
# prints, on stderr's last line, which of the modules asked about it loaded.
RUN = (
    "import json, sys\n"
    "watch = json.loads(sys.argv[2])\n"
    "sys.argv = ['hpvc', *json.loads(sys.argv[1])]\n"
    "from hpvc.cli import main\n"
    "try:\n"
    "    main()\n"
    "except SystemExit as e:\n"
    "    assert not e.code, e.code\n"
    "print(json.dumps(sorted(m for m in watch if m in sys.modules)),"
    " file=sys.stderr)\n"
)
HEAVY = [
    "typer",
    "pydantic",
    "pyroute2",
    "rich.markdown",
    "hpvc.image.builder",
    "hpvc.plan.planner",
]
BY_TYPER = (  # the same command through typer, for comparison
    "import sys\n"
    "from hpvc.cli import _invoke\n"
    "from hpvc.cli.tree import app\n"
    "_invoke(app, sys.argv[1:], 'hpvc')\n"
)


def _env(tmp: Path, **more: str) -> dict[str, str]:
    return {
        "HPVC_STATE_DIR": str(tmp / "state"),
        "HPVC_RESIDENT": "0",
        "XDG_CACHE_HOME": str(tmp / "cache"),
        "PATH": "/usr/bin:/bin",
        **more,
    }


def _run(argv: list[str], env: dict[str, str], watch: list[str] = HEAVY) -> tuple[str, list[str]]:
    r = subprocess.run(
        [sys.executable, "-c", RUN, json.dumps(argv), json.dumps(watch)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout, json.loads(r.stderr.strip().splitlines()[-1])


def _by_typer(argv: list[str], env: dict[str, str]) -> str:
    r = subprocess.run([sys.executable, "-c", BY_TYPER, *argv], capture_output=True, text=True,
                       env=env)  # fmt: skip
    assert r.returncode == 0, r.stderr
    return r.stdout


def _one_cluster(tmp: Path) -> None:
    now = time.time() - 5
    rec = ClusterRecord("c", spec(), "c.toml", plan_json(spec()), "running", now, now)
    Store(tmp / "state").save(rec)


@pytest.mark.parametrize("argv", [["ls"], ["ls", "--json"], ["image", "ls"],
                                  ["image", "ls", "--json"], ["node", "ls"],
                                  ["node", "ls", "--json"]])  # fmt: skip
def test_listings_import_no_typer_and_print_what_typer_would(
    argv: list[str], tmp_path: Path
) -> None:
    _one_cluster(tmp_path)
    env = _env(tmp_path)
    out, loaded = _run(argv, env)
    assert loaded == []
    age = re.compile(r"│ \d+s ")  # the age column, in whole seconds, may tick between the two
    assert age.sub("│ Ns ", out) == age.sub("│ Ns ", _by_typer(argv, env))
    if argv[0] == "ls":
        assert "c" in (json.loads(out)[0]["name"] if "--json" in argv else out)


@pytest.mark.parametrize("argv", [["status", "c"], ["status", "c", "--json"],
                                  ["status", "--json", "c"]])  # fmt: skip
def test_status_imports_no_typer_schema_netlink_or_planner_and_prints_what_typer_would(
    argv: list[str], tmp_path: Path
) -> None:
    """A record of a cluster whose nodes do not run here: status reads the kernel
    (no container, no namespace, no cgroup: each said so per node) as typer's."""
    now = time.time() - 5
    rec = ClusterRecord("c", spec(), "c.toml", plan_json(spec()), "running", now, now,
                        backend="crun")  # fmt: skip
    Store(tmp_path / "state").save(rec)
    env = _env(tmp_path, PATH=os.environ["PATH"])  # crun, nsenter and ip, where they are
    out, loaded = _run(argv, env, [*HEAVY, "hpvc.spec.model", "hpvc.render.libvirt"])
    assert loaded == []
    assert out == _by_typer(argv, env)
    if "--json" in argv:
        doc = json.loads(out)
        assert [n["name"] for n in doc["nodes"]] == ["head0", "compute0", "compute1"]
        assert "does not exist" in doc["nodes"][0]["network"]["error"]
    else:
        assert "cluster c: running" in out and "head0" in out


@pytest.mark.parametrize("argv", [["plan", "SPEC"], ["plan", "--json", "SPEC"]])
def test_plan_imports_no_typer_and_prints_what_typer_would(argv: list[str], tmp_path: Path) -> None:
    """The spec is still read by its schema (pydantic): only typer is left out."""
    demo = Path(__file__).resolve().parents[2] / "examples" / "demo.toml"
    argv = [str(demo) if a == "SPEC" else a for a in argv]
    env = _env(tmp_path)
    out, loaded = _run(argv, env, ["typer", "hpvc.cli.tree", "pydantic"])
    assert loaded == ["pydantic"]
    assert out == _by_typer(argv, env)
    if "--json" in argv:
        assert [n["name"] for n in json.loads(out)["nodes"]] == ["head0", "compute0", "compute1"]
    else:
        assert "cluster demo: container" in out


def test_a_spec_mistake_through_the_quick_plan_is_the_one_line_typer_s_way_gives(
    tmp_path: Path,
) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\nkind = "container"\nimage = "hpc"\nnodes = []\n')
    env = _env(tmp_path)
    typer_here = "import sys\nfrom hpvc.cli import quick, run_here\nquick.run = lambda a: False\n"
    by_typer = subprocess.run(
        [sys.executable, "-c", f"{typer_here}run_here(sys.argv[1:])", "plan", str(bad)],
        capture_output=True,
        text=True,
        env=env,
    )
    quick_way = subprocess.run([sys.executable, "-m", "hpvc", "plan", str(bad)],
                               capture_output=True, text=True, env=env)  # fmt: skip
    assert (quick_way.returncode, quick_way.stdout) == (2, "")
    assert quick_way.stderr.startswith(f"hpvc: {bad}: nodes: ")
    assert len(quick_way.stderr.splitlines()) == 1
    assert (by_typer.returncode, by_typer.stderr) == (2, quick_way.stderr)


def test_image_ls_with_a_store_runs_quick_and_reads_that_store(tmp_path: Path) -> None:
    store = tmp_path / "images"
    store.mkdir()
    env = _env(tmp_path)
    out, loaded = _run(["image", "ls", "--json", "--store", str(store)], env)
    assert (json.loads(out), loaded) == ([], [])
    out, _ = _run(["image", "ls", f"--store={store}"], env)
    assert out == "no images (build one: hpvc image build hpc)\n"


@pytest.mark.parametrize(
    "argv",
    [["ls", "--jsn"], ["ls", "x"], ["image", "ls", "--store"],
     ["image", "ls", "--json", "--json"], ["image", "ls", "--store", "--json"],
     ["image", "rm", "x"], ["--debug", "ls"], ["status"], ["status", "--json"],
     ["status", "c", "d"], ["status", "c", "--json", "--json"], ["status", "--help"],
     ["status", "-x"], ["status", "c", "-h"], ["plan"], ["plan", "a.toml", "--hosts", "h.toml"],
     ["plan", "a.toml", "--topology-root", "r"], ["plan", "a.toml", "b.toml"], ["plan", "-h"],
     ["node", "ls", "-h"], ["node", "up"]],
)  # fmt: skip
def test_anything_but_the_exact_quick_forms_is_left_to_typer(argv: list[str]) -> None:
    assert quick.run(argv) is False


def test_a_help_page_is_replayed_without_typer_or_rich_and_unchanged(tmp_path: Path) -> None:
    env = _env(tmp_path)
    watch = ["typer", "rich", "hpvc.cli.tree", "hpvc.cli.cluster"]
    first, loaded = _run(["up", "--help"], env, watch)
    assert "typer" in loaded and "Usage: hpvc up" in first  # drawn by typer, kept
    assert len(os.listdir(tmp_path / "cache" / "hpvc" / "help")) == 1
    second, loaded = _run(["up", "--help"], env, watch)
    assert (second, loaded) == (first, [])
    off, loaded = _run(["up", "--help"], {**env, "HPVC_HELP_CACHE": "0"}, watch)
    assert off == first and "typer" in loaded
    narrow, _ = _run(["up", "--help"], {**env, "COLUMNS": "60"}, watch)
    assert narrow != first  # another width is another page, drawn by typer
    assert len(os.listdir(tmp_path / "cache" / "hpvc" / "help")) == 2


@pytest.mark.parametrize(
    ("argv", "is_help"),
    [(["-h"], True), (["--help"], True), (["status", "--help"], True),
     (["image", "ls", "-h"], True), (["plan", "x.toml", "--out", "-h"], False),
     (["exec", "c", "n", "--", "ls", "--help"], False), (["ls"], False), ([], False)],
)  # fmt: skip
def test_what_counts_as_a_help_request(argv: list[str], is_help: bool) -> None:
    assert helpcache.is_help(argv) is is_help


@pytest.mark.parametrize(
    ("printed", "code", "kept"),
    [(" Usage: hpvc x [OPTIONS]\n", 0, True), ("ran instead\n", 0, False),
     (" Usage: hpvc x [OPTIONS]\n", 2, False)],
)  # fmt: skip
def test_only_a_usage_page_that_exited_0_is_kept(
    printed: str, code: int, kept: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("HPVC_HELP_CACHE", raising=False)

    def command(args: list[str]) -> None:
        sys.stdout.write(printed)
        raise SystemExit(code)

    with pytest.raises(SystemExit):
        helpcache.recorded(["x", "--help"], command)
    assert (tmp_path / "hpvc" / "help").is_dir() is kept
    if kept:
        assert [p.read_text() for p in (tmp_path / "hpvc" / "help").iterdir()] == [printed]


def test_the_key_follows_the_width_and_the_words(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    base = helpcache.key(["up", "--help"])
    assert helpcache.key(["up", "--help"]) == base
    assert helpcache.key(["down", "--help"]) != base
    monkeypatch.setenv("COLUMNS", "71")
    assert helpcache.key(["up", "--help"]) != base


def test_netlink_users_load_pyroute2_without_its_families_and_all_of_it_on_demand() -> None:
    code = (
        "import sys\n"
        "import hpvc.host\n"
        "assert 'pyroute2' not in sys.modules  # nothing until someone imports it\n"
        "from hpvc.host import net, orphans, routes, vxlan\n"
        "import pyroute2\n"
        "from pyroute2 import IPRoute, NetlinkError, netns\n"
        "heavy = ['pyroute2.ndb.main', 'pyroute2.ipdb', 'pyroute2.conntrack']\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
        "assert IPRoute.__module__.startswith('pyroute2.iproute')\n"
        "assert issubclass(NetlinkError, Exception) and netns.__name__ == 'pyroute2.netns'\n"
        "from pyroute2 import NDB  # any other name: pyroute2's own __init__, then the name\n"
        "print(NDB.__module__, 'pyroute2.ndb.main' in sys.modules, pyroute2.IPRoute is IPRoute)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["[]", "pyroute2.ndb.main True True"]


def test_no_page_is_kept_in_a_folder_of_another_user(tmp_path: Path) -> None:
    if os.geteuid() == 0:  # as sudo with the user's HOME: not root's to fill
        theirs = tmp_path / "theirs"
        theirs.mkdir()
        os.chown(theirs, 12345, 12345)
    else:  # a user's cache under a folder of root's (the nearest one that exists)
        theirs = Path("/var/lib/hpvc-test-no-such-folder")
    env = _env(tmp_path, XDG_CACHE_HOME=str(theirs / "cache"))
    out, _ = _run(["up", "--help"], env, [])
    assert "Usage: hpvc up" in out
    assert not (theirs / "cache").exists()


def test_the_cache_keeps_only_the_newest_pages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("HPVC_HELP_CACHE", raising=False)
    monkeypatch.setattr(helpcache, "KEEP", 3)
    pages = tmp_path / "hpvc" / "help"
    pages.mkdir(parents=True)
    for i in range(5):
        (pages / f"old{i}").write_text("x")
        os.utime(pages / f"old{i}", ns=(i * 10**9, i * 10**9))

    def command(args: list[str]) -> None:
        sys.stdout.write(" Usage: hpvc x [OPTIONS]\n")

    helpcache.recorded(["x", "--help"], command)
    assert sorted(p.name for p in pages.iterdir()) == sorted(
        ["old3", "old4", helpcache.key(["x", "--help"])]
    )
