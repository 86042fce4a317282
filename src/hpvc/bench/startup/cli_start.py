"""How long the quick ``hpvc`` commands take, start to exit, as a user sees them.

Each command is its own process (``hpvc --help``, ``hpvc status --help``
and ``hpvc up --help``, ``hpvc ls``, ``hpvc image ls``, ``hpvc node ls``,
``hpvc status NAME`` of a running 1-node cluster, ``hpvc plan`` of the
repository's examples/demo.toml), timed by the wall clock, the order
rotating between repetitions. ``python -c pass`` with the same interpreter
is measured alongside: the floor no Python CLI goes under.

Goals: each quick command within 0.1 s (median, issue 16), and within
Python's own start + 0.06 s (medians of the same run, issue 33 item 4).
The help pages are kept in a cache made for the run (hpvc.cli.helpcache):
the first repetition draws them with typer (its max), the others replay.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from hpvc.bench.stats import summary
from hpvc.errors import HpvcError
from hpvc.progress import Progress, quiet

GOAL_S = 0.1
GOAL_OVER_PYTHON_S = 0.06
PYTHON = "python -c pass"
DEMO = Path(__file__).resolve().parents[4] / "examples" / "demo.toml"


def commands(hpvc: list[str], cluster: str) -> dict[str, list[str]]:
    out = {
        PYTHON: [sys.executable, "-c", "pass"],
        "hpvc --help": [*hpvc, "--help"],
        "hpvc status --help": [*hpvc, "status", "--help"],
        "hpvc up --help": [*hpvc, "up", "--help"],
        "hpvc ls": [*hpvc, "ls"],
        "hpvc image ls": [*hpvc, "image", "ls"],
        "hpvc node ls": [*hpvc, "node", "ls"],
        f"hpvc status {cluster}": [*hpvc, "status", cluster],
    }
    if DEMO.is_file():  # a checkout: the example the issue times
        out["hpvc plan examples/demo.toml"] = [*hpvc, "plan", str(DEMO)]
    return out


def timed(argv: list[str], env: dict[str, str]) -> float:
    """Wall seconds of one command, start to exit; a failure is an HpvcError
    with the command's last line on stderr."""
    t0 = time.perf_counter()
    r = subprocess.run(argv, env=env, capture_output=True, text=True)
    took = time.perf_counter() - t0
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["no message"])[-1]
        raise HpvcError(f"bench startup: {Path(argv[0]).name} {' '.join(argv[1:3])}", last, "")
    return took


def measure(
    hpvc: list[str], env: dict[str, str], cluster: str, repeat: int, progress: Progress = quiet
) -> dict[str, Any]:
    """Every command ``repeat`` times, alternated, in ``env``; min/median/max per command."""
    cmds = commands(hpvc, cluster)
    names = list(cmds)
    runs: dict[str, list[float]] = {n: [] for n in names}
    with tempfile.TemporaryDirectory(prefix="hpvc-help-") as cache:  # help pages: empty at first
        env = {**env, "XDG_CACHE_HOME": cache}
        for rep in range(repeat):
            for name in names[rep % len(names) :] + names[: rep % len(names)]:
                runs[name].append(timed(cmds[name], env))
            progress(f"CLI start {rep + 1}/{repeat}: hpvc ls {runs['hpvc ls'][-1]:.3f} s")
    python = statistics.median(runs[PYTHON])
    rows = []
    for name in names:
        s = summary(runs[name])
        quick = name != PYTHON
        rows.append(
            {
                "command": name,
                **s,
                "runs": runs[name],
                "over_python_s": s["median"] - python,
                "goal_s": GOAL_S if quick else None,
                "meets_goal": (s["median"] <= GOAL_S) if quick else None,
                "meets_goal_over_python": (s["median"] - python <= GOAL_OVER_PYTHON_S)
                if quick
                else None,
            }
        )
    return {
        "repeat": repeat,
        "goal_s": GOAL_S,
        "goal_over_python_s": GOAL_OVER_PYTHON_S,
        "commands": rows,
    }


def report_lines(doc: dict[str, Any]) -> list[str]:
    cli = doc.get("cli")
    if not cli:
        return []
    over = cli.get("goal_over_python_s")
    lines = [
        "",
        f"CLI start: each command its own process, {cli['repeat']} repetitions alternated,"
        f" wall clock start to exit; goals: within {cli['goal_s']:g} s (median)"
        + (f" and within `{PYTHON}` + {over:g} s (medians)." if over is not None else "."),
        "",
        "| command | min s | median s | max s | over python s | goal met | goal met (python +) |",
        "|---|---|---|---|---|---|---|",
    ]

    def met(flag: bool | None) -> str:
        return "" if flag is None else ("yes" if flag else "no")

    for r in cli["commands"]:
        extra = f"{r['over_python_s']:.3f}" if "over_python_s" in r else ""
        lines.append(
            f"| `{r['command']}` | {r['min']:.3f} | {r['median']:.3f} | {r['max']:.3f} | {extra}"
            f" | {met(r['meets_goal'])} | {met(r.get('meets_goal_over_python'))} |"
        )
    return lines
