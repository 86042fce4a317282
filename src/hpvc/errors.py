"""One exception family for everything a user can act on.

The CLI prints ``hpvc: <what failed>: <why> (<what to do>)`` and exits with
``exit_code``: 2 for bad input (spec, arguments, a cluster that does not fit, a
missing dependency), 1 for a failure at run time.
"""

from __future__ import annotations


class HpvcError(Exception):
    """Base of every error hpvc reports to users."""

    exit_code = 1

    def __init__(self, what: str, why: str, fix: str = "") -> None:
        self.what = what
        self.why = why
        self.fix = fix
        super().__init__(self.line())

    def line(self) -> str:
        text = f"{self.what}: {self.why}"
        if self.fix:
            text += f" ({self.fix})"
        return text


class InputError(HpvcError):
    """Bad input from the user: exit code 2, nothing changed on the host."""

    exit_code = 2


class SpecError(InputError):
    """A spec file that cannot be loaded or is invalid; names file and key path."""

    def __init__(self, path: str, key: str, why: str, fix: str = "") -> None:
        self.path = path
        self.key = key
        where = f"{path}: {key}" if key else path
        super().__init__(where, why, fix)


class DoesNotFit(InputError):
    """The cluster cannot be placed on the given hosts; says what is short."""

    def __init__(self, why: str, fix: str = "") -> None:
        super().__init__("cluster does not fit", why, fix or "shrink the spec or add hosts")


class TopologyError(InputError):
    """A topology root that cannot be read at all."""


class MissingDependency(InputError):
    """A host tool or feature hpvc needs is absent."""


def require_root(what: str) -> None:
    """Refuse, in one line (exit 2), a command on clusters run by someone else
    than root: hpvc's state and what its nodes are made of are root's."""
    import os

    if os.geteuid() != 0:
        raise MissingDependency(what, "needs root (cgroups, namespaces, mounts)", "run as root")
