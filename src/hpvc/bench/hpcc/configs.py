"""The hpcc suite's configurations and the spec of each one's cluster.

``native`` runs on the host; ``container`` is one compute node tuned as hpvc
tunes it; ``container-nopin`` / ``-nohuge`` / ``-nonuma`` switch one tuning
off; ``vm`` is the same node as a QEMU VM. Pure: names, tunings and spec text.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Config:
    """One configuration: where hpcc runs and, for a cluster, its tuning."""

    name: str
    kind: str  # "native", "container" or "vm"
    describe: str
    pinning: str = "dedicated"
    hugepages: str = "2M"
    numa: str = "mirror"
    code: str = ""  # cluster name suffix


TUNED = "pinning dedicated, hugepages 2M, numa mirror, partition commodity, locality shm"
CONFIGS: dict[str, Config] = {
    c.name: c
    for c in (
        Config("native", "native", "hpcc on the host, ranks bound to cores"),
        Config("container", "container", f"one container node, {TUNED}", code="c"),
        Config(
            "container-nopin", "container", "container, pinning shared", pinning="shared", code="p"
        ),
        Config(
            "container-nohuge", "container", "container, hugepages none", hugepages="none", code="h"
        ),
        Config("container-nonuma", "container", "container, numa none", numa="none", code="n"),
        Config("vm", "vm", f"one QEMU VM node, {TUNED}, MPI over TCP", code="v"),
    )
}

SPEC = """\
name = "{name}"
kind = "{kind}"
image = "{image}"
[network]
subnet = "{subnet}"
mtu = 9000
[tuning]
pinning = "{c.pinning}"
hugepages = "{c.hugepages}"
numa = "{c.numa}"
partition = "commodity"
locality = "shm"
[[nodes]]
role = "compute"
count = 1
vcpus = {vcpus}
memory = "{memory_mib}MiB"
"""


def spec_text(
    cfg: Config, name: str, subnet: str, vcpus: int, memory_mib: int, image: str = "hpc-openblas"
) -> str:
    """One compute node of ``vcpus`` vCPUs with the config's tuning, from ``image``
    (``hpc-openblas``: the hpc image with the OpenBLAS every side of the suite runs)."""
    kind = "vm" if cfg.kind == "vm" else "container"
    return SPEC.format(
        name=name, kind=kind, subnet=subnet, c=cfg, vcpus=vcpus, memory_mib=memory_mib, image=image
    )
