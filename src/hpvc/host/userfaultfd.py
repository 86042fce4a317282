"""Whether a migration target's QEMU may use userfaultfd, which postcopy needs.

A postcopy target maps the guest's memory empty and has the kernel tell it,
through a userfaultfd, which page the guest touches next. hpvc's QEMUs drop
root for the cluster's own uid (``-runas``, ``hpvc.host.qemu_user``), and
since Linux 5.11 an unprivileged process gets a userfaultfd that also takes
faults in the kernel only when ``vm.unprivileged_userfaultfd`` is 1 (the
kernel's admin-guide sysctl/vm.rst); QEMU 7.2 asks for that kind and does not
open ``/dev/userfaultfd`` (QEMU 8.1 does). With the sysctl at 0 (Debian's
default) the target refuses ``postcopy-ram`` ("Postcopy is not supported",
reproduced: docs/vms.md "Live migration"). hpvc does not turn the sysctl on by
itself: it widens what every user of the host may do, a site's choice.

Read-only: ``postcopy_refusal`` reads the sysctl and changes nothing.
Architecture: docs/architecture.md (``host/``).
"""

from __future__ import annotations

from hpvc.sysroot import HOST, RootLike, as_root

SYSCTL = "/proc/sys/vm/unprivileged_userfaultfd"


def why_not(value: str | None, uid: int) -> str | None:
    """Why a QEMU running as ``uid`` cannot take a postcopy guest, given the
    sysctl's text (None: unreadable); None when it can. Pure."""
    if uid == 0 or (value is not None and value.strip() == "1"):
        return None
    now = "unreadable" if value is None else value.strip()
    return (
        f"postcopy needs userfaultfd in the target QEMU, which runs as uid {uid}, and this"
        f" host gives it to unprivileged processes only with vm.unprivileged_userfaultfd=1"
        f" (it is {now})"
    )


def postcopy_refusal(uid: int, root: RootLike = HOST) -> str | None:
    """``why_not`` for this host's sysctl."""
    try:
        value: str | None = as_root(root).at(SYSCTL).read_text()
    except OSError:
        value = None
    return why_not(value, uid)
