"""The batch script the README and docs/slurm.md submit exists (issue 32)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "examples" / "job.sh"


def test_examples_job_sh_is_an_executable_batch_script_of_srun_steps() -> None:
    assert os.access(JOB, os.X_OK)
    text = JOB.read_text()
    assert text.startswith("#!/bin/bash\n")
    assert "srun " in text
    subprocess.run(["bash", "-n", str(JOB)], check=True)


def test_the_readme_and_slurm_doc_point_at_it() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "cp examples/slurm.toml examples/job.sh /tmp/" in readme
    assert "sbatch -N2 --hpvc=slurm.toml job.sh" in readme
    assert "examples/job.sh" in (ROOT / "docs" / "slurm.md").read_text()
