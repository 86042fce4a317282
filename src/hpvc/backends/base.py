"""The one interface every node backend implements (architecture rule 3).

A backend turns the planned nodes of one cluster into running ones and back:
crun containers, QEMU VMs started directly, QEMU VMs started by libvirt. The
cluster layer (``hpvc.cluster``) does what every cluster needs whatever its
nodes are (book the plan, grow hugepage pools, the bridge, the hosts file)
and calls a ``Backend`` for the rest; it never asks what kind of node it
holds. ``hpvc.backends.registry`` maps a spec to its backend.

What a backend keeps between commands is its own ``State`` dataclass, stored
as JSON in the cluster's record (``ClusterRecord.backend_state``) and typed
again on load: no untyped dictionaries. Every host change a backend makes is
journaled (``ClusterEnv.journal`` cluster-wide, ``node_journal`` per node),
so ``hpvc down`` undoes it with no backend code at all, even after a crash.

Migration, when it comes, needs exactly what this interface already keeps
apart: the node's place (``Plan``), its host changes (its journal), and the
backend's typed state; ``Capabilities`` says what a backend can do live.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, Self

from hpvc.errors import InputError
from hpvc.host.journal import Journal
from hpvc.plan import Plan, PlannedNode
from hpvc.progress import Progress
from hpvc.store import ClusterRecord, Store

if TYPE_CHECKING:  # host.orphans loads netlink: only gc needs it
    from hpvc.host.orphans import Keep, Orphan
    from hpvc.spec import Spec  # the schema (pydantic): not on status's path (issue 33)


class State:
    """Base of a backend's typed record (subclasses are dataclasses)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)  # type: ignore[call-overload, no-any-return]

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Self:
        known = {f.name for f in fields(cls)}  # type: ignore[arg-type]
        return cls(**{k: v for k, v in d.items() if k in known})


@dataclass(frozen=True)
class Capabilities:
    """What a backend can change on a running node without restarting it."""

    repin: bool  # move vCPU / emulator threads to other CPUs (scale shifts floating sets)
    shared_memory: bool  # MPI ranks in different co-resident nodes may use shared memory
    # Hugepages: False, a started node maps all of its pages at once (VMs
    # preallocate); True, its programs map them as they go, and the kernel's
    # hugetlb cgroup of the cluster (``/hpvc/<cluster>/<node>``) counts them.
    pages_on_demand: bool = False
    # Checkpoint and restore of whole nodes (``freeze``/``thaw``/``save``/
    # ``restore_nodes``, docs/checkpoint.md): False, ``hpvc checkpoint`` refuses
    # the cluster in one line before anything is frozen.
    checkpoint: bool = False
    # What a Slurm job runs in the nodes for itself (Spark's daemons) runs as the
    # job's user (``ClusterRecord.user``); False for VM guests, whose root is the
    # job's user (tasks run as root through the agent, docs/slurm.md), so such
    # daemons run as root there too and share the tasks' files.
    job_user_daemons: bool = True


# Seconds per phase of a backend's ``start`` (``{"boot": 12.3, ...}``), in the
# order they ran: the cluster's record keeps them (``hpvc up --json`` shows
# them, ``hpvc bench`` reads them). Empty: the start is one phase, which the
# cluster layer times itself as ``nodes``.
Phases = dict[str, float]


@dataclass(frozen=True)
class MpiLaunch:
    """How ``hpvc run`` starts a rank inside a node: the rank script (POSIX sh,
    written beside the ranks file; it reads line OMPI_COMM_WORLD_RANK+1 and hands
    the rank the launcher's ``OMPI_*``/``PMIX_*`` variables, or hpvc's ``PMI_*``
    for MPICH, ``hpvc.cluster.pmi``) and what that file holds for each node."""

    script: str
    targets: dict[str, str]  # node name -> its line in the ranks file
    env: dict[str, str] = field(default_factory=dict)  # for mpirun (its PMIx server)


@dataclass(frozen=True)
class InNodeLaunch:
    """How an MPI launcher started inside one node reaches the others
    (``hpvc run --detach``, hpvc.cluster.jobs): the node's hpvc-rsh, which
    starts the launcher's daemon in another node through that node's agent, and
    the variables the launcher needs there besides the node's own."""

    rsh: str  # hpvc-rsh's path inside the nodes
    env: tuple[str, ...] = ()  # K=V, put in front of the launcher


@dataclass(frozen=True)
class TaskEntry:
    """How a task started on the host (a Slurm step's, by hpvc's SPANK plugin)
    runs in one of a backend's nodes."""

    # False: the task enters the namespaces (and cgroups) of the node's main
    # process; True: it relays its command to the agent inside the node, at the
    # node's address (a VM has no namespaces on the host to enter).
    relay: bool = False
    env: tuple[str, ...] = ()  # what a relayed task gets besides Slurm's variables
    # A relayed task: the file, in the cluster's folder, of the key it proves to
    # the node's agent that it holds (read as root); "" for none.
    key: str = ""


@dataclass
class ClusterEnv:
    """Where one cluster lives on this host, handed to its backend on every call."""

    store: Store
    rec: ClusterRecord
    state: State

    @property
    def name(self) -> str:
        return self.rec.name

    @property
    def dir(self) -> Path:
        return self.store.cluster_dir(self.rec.name)

    def journal(self) -> Journal:
        return self.store.journal(self.rec.name)

    def node_journal(self, node: str) -> Journal:
        return self.store.node_journal(self.rec.name, node)

    def node_dir(self, node: str) -> Path:
        return self.store.node_dir(self.rec.name, node)

    def host_journal(self) -> Journal:
        return self.store.host_journal()

    def save(self) -> None:
        """Write the record, with the backend's state, atomically."""
        self.rec.backend_state = self.state.to_json()
        self.store.save(self.rec)


class Backend(Protocol):
    """One kind of node. Methods get the cluster's ``ClusterEnv`` and ``Plan``."""

    name: ClassVar[str]  # its registry key, stored in the cluster's record
    kind: ClassVar[str]  # the spec's kind it runs: "container" or "vm"
    capabilities: ClassVar[Capabilities]

    def new_state(self) -> State:
        """An empty state record for a cluster about to be created."""
        ...

    def load_state(self, data: dict[str, Any]) -> State:
        """The typed state record from its JSON."""
        ...

    def preflight(self, spec: Spec) -> None:
        """Refuse, before any host change, what cannot work here (MissingDependency)."""
        ...

    def build_image(self, spec: Spec, progress: Progress) -> None:
        """Make sure what the nodes boot from exists (built once, then cached);
        a missing image is bad input, refused before any host change."""
        ...

    def prepare(self, env: ClusterEnv, plan: Plan, progress: Progress) -> None:
        """Cluster-wide host changes of this backend, after pools, bridge and hosts file."""
        ...

    def start(self, env: ClusterEnv, plan: Plan, names: list[str], progress: Progress) -> Phases:
        """Start the named nodes (new ones: up, scale) and wait until they are usable;
        how long each of its phases took (empty: one phase)."""
        ...

    def stop(self, env: ClusterEnv, plan: Plan, names: list[str], progress: Progress) -> None:
        """Stop and remove the named nodes (scale down): undo their journals."""
        ...

    def refresh(self, env: ClusterEnv, old: Plan, plan: Plan, progress: Progress) -> None:
        """After a scale: nodes that stay learn the new names and addresses."""
        ...

    def repin(self, env: ClusterEnv, old: Plan, plan: Plan) -> None:
        """Running nodes whose CPUs changed in ``plan`` get them live (if capable)."""
        ...

    def node_state(self, env: ClusterEnv, plan: Plan, node: PlannedNode) -> str:
        """running, stopped, created or missing: read from the runtime, not the record."""
        ...

    def node_status(self, env: ClusterEnv, plan: Plan, node: PlannedNode) -> dict[str, Any]:
        """What ``hpvc status`` shows of one node, read back from the kernel/runtime."""
        ...

    def summary(self, env: ClusterEnv) -> dict[str, Any]:
        """Cluster-wide keys ``hpvc status`` adds for this backend."""
        ...

    def emulated(self, env: ClusterEnv) -> bool:
        """Do the cluster's nodes run under software emulation (VM guests under
        TCG, 10-50x slower)? What hpvc waits for inside them (Spark's daemons)
        then gets longer."""
        ...

    def node_pid(self, env: ClusterEnv, plan: Plan, node: PlannedNode) -> int:
        """The node's main host process (container init, QEMU); raises if not running."""
        ...

    def exec_argv(
        self, env: ClusterEnv, plan: Plan, node: PlannedNode, argv: list[str], tty: bool = False
    ) -> list[str]:
        """The host command that runs ``argv`` inside ``node``, stdio passed through;
        with ``tty``, on a terminal of its own in the node (``hpvc exec -t``)."""
        ...

    def exec_status(
        self, env: ClusterEnv, plan: Plan, node: PlannedNode, argv: list[str], rc: int
    ) -> int:
        """The exit code ``hpvc exec`` reports for the runtime's ``rc``: a shell's
        127 (not found) and 126 (not executable) where the runtime has its own."""
        ...

    def mpi_launch(self, env: ClusterEnv, plan: Plan) -> MpiLaunch:
        """How ``hpvc run`` reaches the nodes' ranks."""
        ...

    def in_node_launch(self, env: ClusterEnv, plan: Plan) -> InNodeLaunch | None:
        """How an MPI launcher run inside a node reaches the other nodes; None
        where nodes cannot start anything in each other (no agent in them)."""
        ...

    def task_entry(self, mpi: str) -> TaskEntry:
        """How a host task of a Slurm step launched with ``srun --mpi=<mpi>`` runs
        in these nodes; InputError (before any host change) for an MPI plugin
        whose server cannot reach tasks in these nodes."""
        ...

    # --- checkpoint and restore (issue 28, docs/checkpoint.md) ----------------
    # ``hpvc checkpoint`` calls freeze on every node first, then save on each,
    # then thaw (or stop with --stop): one consistent cut of the cluster.
    # ``hpvc restore`` re-plans, ``prepare``s, calls restore_nodes (nodes come
    # back frozen), then thaw on all at once. Only called where
    # ``capabilities.checkpoint`` is True.

    def refuse_checkpoint(self, env: ClusterEnv, plan: Plan) -> None:
        """What keeps these nodes from a cut, as an InputError (one line), before
        any node of the cut, on any host, is frozen; nothing else happens."""
        ...

    def freeze(self, env: ClusterEnv, plan: Plan, names: list[str]) -> None:
        """Stop the named nodes from running (VMs: vCPUs stopped; containers: cgroup
        frozen) without losing anything; a frozen node sends and takes no packet."""
        ...

    def thaw(self, env: ClusterEnv, plan: Plan, names: list[str]) -> None:
        """Let frozen (or restored) nodes run again."""
        ...

    def save(
        self, env: ClusterEnv, plan: Plan, name: str, dest_dir: Path, progress: Progress
    ) -> dict[str, Any]:
        """Write one frozen node's whole state (memory, devices, its writable disk or
        layer) as files under ``dest_dir`` (made empty by the caller); the node stays
        frozen. Returns the node's manifest fields, JSON-able: ``files`` (paths
        relative to ``dest_dir``, every file written), and whatever else restore
        needs (``image_digest`` is added by the cluster layer from the record; the
        checkpoint layer adds each file's size and sha256)."""
        ...

    def restore_nodes(
        self, env: ClusterEnv, plan: Plan, names: list[str], src_dir: Path, progress: Progress
    ) -> None:
        """Start the named nodes of ``plan`` (a fresh plan for this host, the saved
        names, addresses and MACs) from their saved state under ``src_dir / name``,
        journaled as ``start`` journals, and leave them frozen: the caller thaws all
        at once. Raises HpvcError when one cannot start (the caller undoes all)."""
        ...

    def orphans(self, keep: Keep, prefix: str) -> list[Orphan]:
        """What this backend's nodes left on this host for clusters with no record
        here (``hpvc gc``: the journals that would undo it are lost), named by
        hpvc for a cluster whose name starts with ``prefix`` and is none of
        ``keep``'s; in removal order. What every cluster leaves (network
        namespaces, links, cgroups, mounts) is ``hpvc.host.orphans``'."""
        ...

    def remove_orphan(self, orphan: Orphan) -> None:
        """Remove one of ``orphans``' finds, as its journal's undo would; raises
        HpvcError, OSError or CalledProcessError when it stays."""
        ...


def no_checkpoint(backend: str) -> InputError:
    """What a backend without ``capabilities.checkpoint`` raises from the
    checkpoint methods (the cluster layer refuses before calling them)."""
    return InputError(
        f"checkpoint of {backend} nodes",
        "not supported by this backend yet",
        "see docs/checkpoint.md for the backends that checkpoint",
    )


def undo_nodes(env: ClusterEnv, names: list[str], progress: Progress) -> list[str]:
    """Undo the named nodes' journals (every backend's ``stop``); return the errors."""
    errors: list[str] = []
    for name in names:
        progress(f"remove {name}")
        errors += env.node_journal(name).undo_all(progress)
    return errors
