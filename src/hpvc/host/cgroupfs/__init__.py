"""A host's cgroups behind one interface: the manager of its layout, chosen here once.

``manager(root)`` (or ``find_manager``) reads the layout (``probe.cgroup_layout``)
and returns a ``CgroupManager``: ``V1Manager`` wherever a v1 controller is
mounted (a hybrid host too: crun drives v1 there), else ``V2Manager``. This is
the only place that branches on the cgroup version; callers ask the manager
(``hpvc.host.cgroupfs.base`` lists what it answers).
"""

from __future__ import annotations

from collections.abc import Iterable

from hpvc.errors import HpvcError
from hpvc.host.cgroupfs.base import CgroupManager
from hpvc.host.cgroupfs.v1 import V1Manager
from hpvc.host.cgroupfs.v2 import V2Manager
from hpvc.host.probe import Mount, cgroup_layout
from hpvc.sysroot import HOST, RootLike


def find_manager(
    root: RootLike = HOST, mounts: Iterable[Mount] | None = None
) -> CgroupManager | None:
    """The manager of ``root``'s cgroups (``mounts``: its mount table, when already
    read); None when no cgroup filesystem is mounted."""
    layout = cgroup_layout(root, mounts)
    if layout.v1:
        return V1Manager(root, layout)
    if layout.v2_path is not None:
        return V2Manager(root, layout)
    return None


def manager(root: RootLike = HOST) -> CgroupManager:
    """The manager of ``root``'s cgroups; an ``HpvcError`` when none is mounted."""
    found = find_manager(root)
    if found is None:
        raise HpvcError(
            "cgroups", "no cgroup filesystem is mounted", "mount -t cgroup2 none /sys/fs/cgroup"
        )
    return found
