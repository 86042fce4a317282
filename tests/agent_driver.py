"""Build tests/native/agent_driver.c against native/agent's archive (no VM needed)."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
AGENT = ROOT / "native" / "agent"


def build(out: Path) -> Path:
    """The driver binary, built in ``out`` (the archive's objects too)."""
    subprocess.run(
        ["make", "-s", "-C", str(AGENT), f"OUT={out}", f"BIN={out}", f"{out}/libhpvc-agent.a"],
        check=True,
    )
    drv = out / "agent_driver"
    subprocess.run(
        ["gcc", "-O2", "-std=gnu11", "-Wall", "-Wextra", "-Werror", f"-I{AGENT}", "-o", str(drv),
         str(ROOT / "tests" / "native" / "agent_driver.c"), str(out / "libhpvc-agent.a")],
        check=True,
    )  # fmt: skip
    return drv
