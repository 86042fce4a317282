"""The one accelerator probe: KVM or TCG for VMs, with the ``HPVC_ACCEL`` override.

``hpvc up``, ``hpvc render`` (``--accel auto``), ``hpvc doctor`` and the benchmarks
all ask ``accelerator()``, so they agree on one host with one environment.
Read-only: it looks at /dev/kvm, /proc/cpuinfo and /proc/modules under ``root``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from hpvc.errors import InputError
from hpvc.host.probe import probe_kvm
from hpvc.render.context import Accel
from hpvc.sysroot import HOST, RootLike

ACCEL_ENV = "HPVC_ACCEL"


@dataclass(frozen=True)
class AccelChoice:
    """The accelerator VMs use, whether the user forced it, and a line to show (or None)."""

    name: Accel
    forced: bool
    warning: str | None


def accelerator(root: RootLike = HOST, env: Mapping[str, str] | None = None) -> AccelChoice:
    """KVM only with a usable /dev/kvm and vmx/svm, else TCG; ``HPVC_ACCEL=kvm|tcg`` overrides."""
    value = (os.environ if env is None else env).get(ACCEL_ENV, "").strip().lower()
    if value not in ("", "kvm", "tcg"):
        raise InputError(
            f"{ACCEL_ENV}={value}", "not an accelerator", f"set {ACCEL_ENV}=kvm or tcg, or unset it"
        )
    probed = probe_kvm(root).accelerator
    name: Accel = "kvm" if value == "kvm" else "tcg" if value == "tcg" else probed
    return AccelChoice(name, bool(value), _warning(name, probed, bool(value)))


def _warning(name: Accel, probed: Accel, forced: bool) -> str | None:
    if name == "kvm":
        if probed == "kvm":
            return None
        return (
            f"KVM forced by {ACCEL_ENV} on a host without vmx/svm: "
            "guest kernels may stall in early boot"
        )
    why = f"forced by {ACCEL_ENV}" if forced else "no usable /dev/kvm with vmx/svm here"
    return f"VMs run under TCG ({why}): software emulation, far slower than KVM"
