"""Fixtures shared by the Slurm integration tests: the tenants who submit
(ordinary users made for the session, tests/tenants.py) and a private Slurm
test cluster with hpvc's plugin per test module (slurm_env.Env)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpvc.bench.slurm import cluster as bench_slurm
from tests.helpers import requires
from tests.integration.slurm_env import Env, spec_text
from tests.integration.test_cluster import image_ready
from tests.integration.test_slurm_cluster import requires_slurm
from tests.tenants import tenants as make_tenants


@pytest.fixture(scope="session")
def tenants() -> Iterator[tuple[bench_slurm.Submitter, bench_slurm.Submitter]]:
    """Two ordinary users; jobs are submitted by them, never by root."""
    with make_tenants() as users:
        yield users


def slurm_env(
    tenants: tuple[bench_slurm.Submitter, bench_slurm.Submitter], site: str = "", hosts: int = 3
) -> Iterator[Env]:
    """A private Slurm test cluster of ``hosts`` hosts with hpvc's plugin,
    ``site`` added to its plugstack arguments; whatever a test left is swept
    and fails the module."""
    requires("root", "crun", "ip", "mpi")
    requires_slurm()
    image_ready()
    if not Path("/usr/include/slurm/spank.h").exists():
        if os.environ.get("HPVC_REQUIRE_ALL") == "1":
            pytest.fail("slurm/spank.h missing (apt-get install libslurm-dev)")
        pytest.skip("slurm/spank.h missing (apt-get install libslurm-dev)")
    tmp = Path(tempfile.mkdtemp(prefix="hpvc-spank-test-"))
    os.chmod(tmp, 0o755)
    shared = tmp / "work"  # the "shared file system": every tenant's directory is in it
    shared.mkdir()
    left: list[tuple[str, str]] = []
    extra = f"binds={shared} {site}".strip()
    try:
        # The same private cluster `hpvc bench slurm` uses, sharing `shared` with the nodes.
        with bench_slurm.private_slurm(tmp, "10.88.0.0/16", extra_args=extra, hosts=hosts) as c:
            try:
                yield Env(tmp, c, shared, tenants)
            finally:
                # Whatever a failed test left, taken down inside its host.
                left = c.sweep(c.env["HPVC_BIN"])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    assert left == [], f"shares left after the module: {left}"


@pytest.fixture(scope="module")
def slurm(tenants: tuple[bench_slurm.Submitter, bench_slurm.Submitter]) -> Iterator[Env]:
    yield from slurm_env(tenants)


@pytest.fixture
def spec(slurm: Env) -> Path:
    p = slurm.work / "cluster.toml"
    p.write_text(spec_text(f"10.88.{100 + os.getpid() % 100}.0/24"))
    return p
