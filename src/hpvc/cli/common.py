"""What the command modules share: consoles, JSON output, the global flags."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from pathlib import Path

    from rich.console import Console


class _LazyConsole:
    """A rich Console made on first use: importing rich costs ~40 ms, which a
    command printing JSON or nothing should not pay (issue 16). What it writes
    to is looked at then too (a resident hpvc's command gets its client's
    descriptors after the import: hpvc.resident)."""

    def __init__(self, *, stderr: bool = False) -> None:
        self._stderr = stderr
        self._console: Console | None = None

    def __getattr__(self, name: str) -> Any:
        if self._console is None:
            from rich.console import Console

            stream = sys.stderr if self._stderr else sys.stdout
            # Piped output (logs, CI) gets 120 columns rather than rich's 80,
            # so tables of CPU lists and addresses stay on one line per row.
            width = None if stream.isatty() else 120
            self._console = Console(stderr=self._stderr, highlight=False, width=width)
        return getattr(self._console, name)


console = cast("Console", _LazyConsole())
err_console = cast("Console", _LazyConsole(stderr=True))


@dataclass
class _State:
    debug: bool = False


state = _State()


def print_json(data: Any) -> None:
    """Machine-readable output: plain JSON on stdout, nothing else."""
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False) + "\n")


def show_results(out: Path, doc: dict[str, Any], report: str, as_json: bool) -> None:
    """A benchmark's end: results.json and report.md in ``out``, then the JSON
    (--json) or the report and where both went."""
    from hpvc.bench.common import write_results

    write_results(out, doc, report)
    if as_json:
        print_json(doc)
        return
    console.print(report, markup=False, highlight=False)
    console.print(f"results: {out / 'results.json'}, report: {out / 'report.md'}")
