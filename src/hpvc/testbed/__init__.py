"""Test beds: hosts apart, simulated on one machine, for tests and benchmarks only.

Not the cluster API and no part of what a site runs: nothing in ``cluster/``,
``backends/``, ``slurm/`` or ``cli/`` imports it; ``bench/`` (``hpvc bench
network``), the tests and ``scripts/slurm/`` do.

- ``fabric``: the one private fabric (a bridge, a network namespace per host, a
  veth each, MTU 9000) that both test beds stand on;
- ``pair``: two hosts on it, each with a cluster bridge joined by VXLAN and one
  node (``two_hosts()``: tests/integration/test_vxlan.py, ``hpvc bench network``);
- ``python -m hpvc.testbed`` (``__main__``): the fabric for the local Slurm test
  cluster's hosts (scripts/slurm/up.sh, down.sh), whose daemons the scripts start.

It changes the host, but only through ``hpvc.host`` (journaled, architecture
rule 5), and imports nothing above ``host/`` and ``plan/`` (docs/architecture.md).
"""
