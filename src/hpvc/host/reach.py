"""Whether a node answers on its cluster network from this host: a few pings over the bridge.

``hpvc migrate`` asks after a switch-over (issue 27): a moved guest has been
seen to lose its network under TCG (docs/vms.md "Live migration", known
problem) while QEMU still said ``running``, and the command should say so
instead of reporting a clean move. ``ping`` (iputils) exits 0 when at least
one reply came. Read-only: it sends ICMP echo to an address inside a bridge
hpvc made, and changes nothing. Architecture: docs/architecture.md (``host/``).
"""

from __future__ import annotations

import shutil
import subprocess


def answers(ip: str, bridge: str, tries: int = 5, wait_s: int = 2) -> bool | None:
    """True when ``ip`` answered one of ``tries`` pings sent over ``bridge``;
    None when this host has no ``ping`` (cannot tell)."""
    ping = shutil.which("ping")
    if ping is None:
        return None
    argv = [ping, "-n", "-q", "-c", str(tries), "-i", "0.2", "-W", str(wait_s), "-I", bridge, ip]
    try:
        r = subprocess.run(
            argv, capture_output=True, timeout=tries * 0.2 + wait_s + 10, check=False
        )
    except subprocess.TimeoutExpired:
        return False
    return r.returncode == 0
