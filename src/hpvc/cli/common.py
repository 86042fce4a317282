"""What the command modules share: consoles, JSON output, the global flags."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import Any

from rich.console import Console

# Piped output (logs, CI) gets 120 columns rather than rich's 80, so tables of
# CPU lists and addresses stay on one line per row.
console = Console(highlight=False, width=None if sys.stdout.isatty() else 120)
err_console = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 120)


@dataclass
class _State:
    debug: bool = False


state = _State()


def print_json(data: Any) -> None:
    """Machine-readable output: plain JSON on stdout, nothing else."""
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False) + "\n")
