"""What a spec may ask of a host, by site policy: node count, groups, disk per node;
and how much of a node's console the host keeps (``max_console``).

A spec is checked against these caps by arithmetic on its groups (counts
summed, sizes compared) before any node is expanded, so a small file that asks
for millions of nodes costs the root side nothing (issue 25, item 6). The
defaults suit one site's ordinary use; a site raises or lowers them:

* ``hpvc up``/``plan``/``scale``/``render``: ``/etc/hpvc/limits.toml``
  (``max_nodes = 4096``, ``max_groups = 256``, ``max_disk = "4TiB"``,
  ``max_console = "64MiB"``), a file
  root writes; no environment variable moves it, since a command run for
  another user through ``hpvc serve`` carries that user's environment;
* Slurm jobs: the plugin's ``max_nodes=``, ``max_groups=``, ``max_disk=``,
  ``max_console=`` arguments in plugstack.conf (``hpvc.slurm.policy.Site``).

``max_console`` is no question a spec asks: a node's console log on the host
(what its init and anyone in it writes to the console) is kept to that size
by hpvc's reader (``hpvc.host.console_ring``), the older part in one rotated
file, so a node that writes without end cannot fill the state disk.

Light: no pydantic, no planner.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, replace
from pathlib import Path

from hpvc.errors import InputError
from hpvc.units import format_mib, parse_size

SITE_FILE = Path("/etc/hpvc/limits.toml")
KEYS = ("max_nodes", "max_groups", "max_disk", "max_console")
SIZE_KEYS = {"max_disk": 64, "max_console": 1}  # a size; the least MiB a site may set
FIX_FILE = f"ask less, or the site raises it in {SITE_FILE}"


@dataclass(frozen=True)
class Limits:
    """Caps on one spec: nodes in all (the sum of the groups' counts), groups,
    and the writable layer of one container node (MiB); and what the host
    keeps of one node's console log (MiB, twice that with its rotated file)."""

    max_nodes: int = 1024
    max_groups: int = 64
    max_disk_mib: int = 1 << 20  # 1 TiB
    max_console_mib: int = 16

    def with_item(self, key: str, value: object, where: str) -> Limits:
        """A copy with ``key`` (one of KEYS) set from ``value`` (a count, or a size
        such as "2TiB" for max_disk or "64MiB" for max_console); InputError
        naming ``where`` otherwise."""
        if key in SIZE_KEYS:
            try:
                mib = parse_size(value) // (1 << 20) if isinstance(value, str) else -1
            except ValueError:
                mib = -1
            if mib < SIZE_KEYS[key]:
                least = format_mib(SIZE_KEYS[key])
                example = 'e.g. "1TiB"' if key == "max_disk" else 'e.g. "64MiB"'
                raise InputError(
                    where, f"{key} = {value!r} is not a size of {least} or more", example
                )
            return replace(self, **{f"{key}_mib": mib})
        if key not in KEYS:
            raise InputError(where, f"unknown key {key!r}", "known: " + ", ".join(KEYS))
        if isinstance(value, str) and value.isdigit():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InputError(where, f"{key} = {value!r} is not a positive count", f"{key} = 1024")
        return replace(self, **{key: value})


DEFAULT = Limits()


def read_site(path: Path = SITE_FILE) -> Limits:
    """The site's caps: the defaults, changed by ``path`` where it exists."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return DEFAULT
    except OSError as e:
        raise InputError(f"site limits {path}", f"cannot read: {e.strerror}", "") from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise InputError(f"site limits {path}", f"not valid TOML: {e}", "fix the syntax") from None
    out = DEFAULT
    for key, value in doc.items():
        out = out.with_item(key, value, f"site limits {path}")
    return out


def check_counts(doc: object, limits: Limits) -> tuple[str, str] | None:
    """(key, why) where the raw spec ``doc`` asks for more groups or nodes than
    ``limits`` allow; None otherwise (also for a malformed document: the
    schema says what is wrong with it). Pure arithmetic, nothing expanded."""
    groups = doc.get("nodes") if isinstance(doc, dict) else None
    if not isinstance(groups, list):
        return None
    if len(groups) > limits.max_groups:
        return "nodes", (
            f"{len(groups)} node groups, this site allows at most {limits.max_groups} (max_groups)"
        )
    counts = [g.get("count", 1) if isinstance(g, dict) else 0 for g in groups]
    if not all(isinstance(c, int) and not isinstance(c, bool) for c in counts):
        return None
    total = sum(c for c in counts if c > 0)
    if total > limits.max_nodes:
        return "nodes", (
            f"{total} nodes in all, this site allows at most {limits.max_nodes} (max_nodes)"
        )
    return None


def disk_over(mib: int, limits: Limits) -> str | None:
    """Why a node's writable layer of ``mib`` is over the site's cap, or None."""
    if mib <= limits.max_disk_mib:
        return None
    return (
        f"{format_mib(mib)} per node, this site allows at most"
        f" {format_mib(limits.max_disk_mib)} (max_disk)"
    )
