"""How long the quick ``hpvc`` commands take, start to exit, as a user sees them.

Each command is its own process (``hpvc --help``, ``hpvc ls``, ``hpvc node
ls``, ``hpvc status NAME`` of a running 1-node cluster, ``hpvc status --help``
for the start of a command that loads its own module), timed by the wall
clock, the order rotating between repetitions. ``python -c pass`` with the
same interpreter is measured alongside: the floor no Python CLI goes under.
The goal (issue 16): each quick command within 0.1 s (median).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from hpvc.bench.stats import summary
from hpvc.errors import HpvcError
from hpvc.progress import Progress, quiet

GOAL_S = 0.1


def commands(hpvc: list[str], cluster: str) -> dict[str, list[str]]:
    return {
        "python -c pass": [sys.executable, "-c", "pass"],
        "hpvc --help": [*hpvc, "--help"],
        "hpvc status --help": [*hpvc, "status", "--help"],
        "hpvc ls": [*hpvc, "ls"],
        "hpvc node ls": [*hpvc, "node", "ls"],
        f"hpvc status {cluster}": [*hpvc, "status", cluster],
    }


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
    for rep in range(repeat):
        for name in names[rep % len(names) :] + names[: rep % len(names)]:
            runs[name].append(timed(cmds[name], env))
        progress(f"CLI start {rep + 1}/{repeat}: hpvc ls {runs['hpvc ls'][-1]:.3f} s")
    rows = []
    for name in names:
        s = summary(runs[name])
        quick = name.startswith("hpvc")
        rows.append(
            {
                "command": name,
                **s,
                "runs": runs[name],
                "goal_s": GOAL_S if quick else None,
                "meets_goal": (s["median"] <= GOAL_S) if quick else None,
            }
        )
    return {"repeat": repeat, "goal_s": GOAL_S, "commands": rows}


def report_lines(doc: dict[str, Any]) -> list[str]:
    cli = doc.get("cli")
    if not cli:
        return []
    lines = [
        "",
        f"CLI start: each command its own process, {cli['repeat']} repetitions alternated,"
        f" wall clock start to exit; goal: within {cli['goal_s']:g} s (median).",
        "",
        "| command | min s | median s | max s | goal met |",
        "|---|---|---|---|---|",
    ]
    for r in cli["commands"]:
        met = "" if r["meets_goal"] is None else ("yes" if r["meets_goal"] else "no")
        lines.append(
            f"| `{r['command']}` | {r['min']:.3f} | {r['median']:.3f} | {r['max']:.3f} | {met} |"
        )
    return lines
