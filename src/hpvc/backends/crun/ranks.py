"""How ``hpvc run``'s host mpirun starts each rank inside its container node.

Open MPI's mpirun runs on the host (``hpvc.cluster.ops.mpirun_argv``) and
starts every rank through the script below, which ``crun exec``s the rank's
program into the node the ranks file names for it, with the job's MPI
variables, under the node's init where it has one (``hpvc.backends.crun.nodeinit``).
"""

from __future__ import annotations

import shlex

from hpvc.backends.base import MpiLaunch
from hpvc.backends.crun import container as ct
from hpvc.backends.crun import nodeinit
from hpvc.image import resolve_image
from hpvc.image.mpi import DEFAULT_PATH
from hpvc.plan import Plan

# POSIX sh, no bash: the job's variables go in as --env, then the node, its init's
# client (locality "shm"), the command (rotated behind); PATH: the image's own.
RANK_SCRIPT = """#!/bin/sh
# hpvc: start MPI rank $OMPI_COMM_WORLD_RANK inside its node (see ranks beside this file).
set -e
here=$(dirname "$0")
node=$(sed -n "$((OMPI_COMM_WORLD_RANK + 1))p" "$here/ranks")
n=$#
IFS='
'
for kv in $(env | grep -E '^(OMPI|PMIX|PMI|OPAL|ORTE|HPVC)_[A-Za-z0-9_]*='); do
  set -- "$@" --env "$kv"
done
unset IFS
set -- "$@" --env {path} "$node"{client}
while [ "$n" -gt 0 ]; do
  set -- "$@" "$1"
  shift
  n=$((n - 1))
done
exec {crun} exec "$@"
"""


def mpi_launch(plan: Plan, crun: str, node_init: bool) -> MpiLaunch:
    """The rank script (the image's PATH; the init's client with ``node_init``)
    and each node's container."""
    image_env = resolve_image(plan.image).env
    path = next((kv for kv in image_env if kv.startswith("PATH=")), f"PATH={DEFAULT_PATH}")
    return MpiLaunch(
        script=RANK_SCRIPT.format(
            crun=shlex.quote(crun),
            path=shlex.quote(path),
            client=" " + nodeinit.client_words() if node_init else "",
        ),
        targets={n.name: ct.container_id(plan.cluster, n.name) for n in plan.nodes},
    )
