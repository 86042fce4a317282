"""The one accelerator probe (``hpvc.host.accel``): KVM only with vmx/svm, and the
``HPVC_ACCEL`` override that ``hpvc up`` and ``hpvc render`` both honour."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpvc.cli import main
from hpvc.errors import InputError
from hpvc.host.accel import accelerator
from hpvc.sysroot import SysRoot


def _host(root: Path, *, kvm: bool, flag: str | None) -> Path:
    (root / "proc").mkdir(parents=True)
    (root / "proc" / "cpuinfo").write_text(f"processor : 0\nflags : fpu sse2 {flag or ''}\n")
    if kvm:
        (root / "dev").mkdir()
        (root / "dev" / "kvm").write_text("")
    return root


def test_accelerator_probes_kvm_only_with_vmx(tmp_path: Path) -> None:
    hw = accelerator(_host(tmp_path / "hw", kvm=True, flag="vmx"), env={})
    assert (hw.name, hw.forced, hw.warning) == ("kvm", False, None)
    pvm = accelerator(_host(tmp_path / "pvm", kvm=True, flag=None), env={})
    assert (pvm.name, pvm.forced) == ("tcg", False)
    assert pvm.warning is not None and "TCG" in pvm.warning and "vmx/svm" in pvm.warning


def test_accelerator_override(tmp_path: Path) -> None:
    hw = _host(tmp_path / "hw", kvm=True, flag="svm")
    pvm = _host(tmp_path / "pvm", kvm=True, flag=None)
    tcg = accelerator(hw, env={"HPVC_ACCEL": "tcg"})
    assert (tcg.name, tcg.forced) == ("tcg", True)
    assert tcg.warning is not None and "forced by HPVC_ACCEL" in tcg.warning
    kvm = accelerator(pvm, env={"HPVC_ACCEL": " KVM "})
    assert (kvm.name, kvm.forced) == ("kvm", True)
    assert kvm.warning is not None and "stall" in kvm.warning
    assert accelerator(hw, env={"HPVC_ACCEL": "kvm"}).warning is None
    with pytest.raises(InputError, match="HPVC_ACCEL=xen: not an accelerator"):
        accelerator(hw, env={"HPVC_ACCEL": "xen"})


def test_accelerator_takes_a_sysroot(tmp_path: Path) -> None:
    root = SysRoot(_host(tmp_path, kvm=True, flag="vmx"))
    assert accelerator(root, env={}).name == "kvm"
    assert accelerator(str(root.path), env={}).name == "kvm"


def test_render_honours_hpvc_accel(
    snapshots: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``hpvc render --accel auto`` asks the same probe as ``hpvc up``."""
    monkeypatch.setenv("HPVC_ACCEL", "tcg")
    spec = tmp_path / "vm.toml"
    spec.write_text('name = "acc"\nkind = "vm"\n[[nodes]]\nrole = "compute"\nvcpus = 1\n')
    out = tmp_path / "out"
    root = snapshots["64amd64-4s2n4ca2co"]
    with pytest.raises(SystemExit) as e:
        main(["render", str(spec), "--out", str(out), "--topology-root", str(root)])
    assert e.value.code == 0
    assert "accelerator tcg" in capsys.readouterr().out
    assert "-accel tcg" in (out / "compute0.qemu.sh").read_text()
