"""The one root every host reader reads under: ``/`` on a real host, a tree in tests.

architecture rule 2 (no host path in logic): code that reads /proc, /sys or /dev takes a
``SysRoot`` (or, for convenience in tests and on the command line, a ``Path`` or
``str`` naming one) and joins absolute paths under it with ``at``. ``HOST`` is the
real host. Pure: importing this module touches nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SysRoot:
    """A filesystem root: ``/``, or an extracted snapshot (``topologies/...``) or fake tree."""

    path: Path = Path("/")

    def at(self, abs_path: str) -> Path:
        """``abs_path`` (``/proc/mounts``) under this root."""
        return self.path / abs_path.lstrip("/")

    @property
    def is_host(self) -> bool:
        """True for the real root ``/``."""
        return self.path == Path("/")

    def __str__(self) -> str:
        return str(self.path)


HOST = SysRoot()

RootLike = SysRoot | Path | str


def as_root(root: RootLike | None = None) -> SysRoot:
    """``root`` as a SysRoot: a SysRoot as is, a path wrapped, None the host."""
    if root is None:
        return HOST
    if isinstance(root, SysRoot):
        return root
    return SysRoot(Path(root))
