"""README step 7's Slurm commands fit the memory the test cluster gives a job
(DefMemPerNode=1024, scripts/slurm/up.sh) or ask for more (issue 32)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hpvc.errors import InputError
from hpvc.slurm.policy import check_memory
from hpvc.spec.load import load_spec

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MIB = 1024


def _srun_lines(text: str, spec: str) -> list[str]:
    """The srun lines that allocate a job with ``spec`` (a step in a job, --jobid, does not)."""
    return [
        ln.strip()
        for ln in text.splitlines()
        if re.search(rf"srun .*--hpvc={spec}\b", ln) and "--jobid" not in ln
    ]


def _mem_mib(line: str) -> int:
    m = re.search(r"--mem=(\d+)([MG])\b", line)
    if not m:
        return DEFAULT_MIB
    return int(m.group(1)) * (1024 if m.group(2) == "G" else 1)


@pytest.mark.parametrize("doc", ["README.md", "docs/slurm.md"])
def test_every_vm_srun_line_has_the_memory_its_hosts_need(doc: str) -> None:
    spec = load_spec(ROOT / "examples" / "slurm-vm.toml")
    lines = _srun_lines((ROOT / doc).read_text(), "slurm-vm.toml")
    assert any("-N1 -n1" in ln for ln in lines), lines
    for line in lines:
        hosts = int(re.search(r"-N(\d+)", line).group(1))  # type: ignore[union-attr]
        check_memory(spec, hosts, _mem_mib(line))


def test_one_host_without_mem_is_refused_with_the_fix() -> None:
    spec = load_spec(ROOT / "examples" / "slurm-vm.toml")
    with pytest.raises(InputError) as e:
        check_memory(spec, 1, DEFAULT_MIB)
    assert "need 1536 MiB" in e.value.why
    check_memory(spec, 1, _mem_mib("--mem=2G"))
