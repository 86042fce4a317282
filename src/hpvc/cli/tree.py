"""The whole ``hpvc`` command tree (see hpvc.cli for the entry point).

Every command's module is imported only when that command runs (issue 16:
``hpvc ls`` must not pay for importing the benchmarks, the planner and
pydantic). The root group knows each command by name and a one-sentence
summary, which is all ``hpvc --help`` shows; the command's own module (its
options, its full help) is loaded by ``resolve_command`` when the user names
it. tests/unit/test_cli_tree.py checks every summary against the command's own
help, so the two cannot drift apart.

Click's documented way to do this is a custom group overriding
``get_command``/``list_commands``; the one wrinkle is that typer's help lists
commands through ``get_command`` too, so a command not yet loaded is shown
through a stand-in that carries its summary and nothing else.
"""

from __future__ import annotations

import difflib
import importlib

import typer
from typer.core import TyperCommand, TyperGroup

try:  # typer vendors click from 0.2x on; before, it used click itself
    from typer._click.core import Command, Context
    from typer._click.exceptions import UsageError
except ImportError:  # pragma: no cover - older typer
    from click import Command, Context, UsageError  # type: ignore[no-redef, import-not-found, unused-ignore]

from hpvc.cli.common import state

# name -> (module in hpvc.cli that registers it, the first sentence of its help)
COMMANDS: dict[str, tuple[str, str]] = {
    "doctor": (
        "doctor",
        "Report what this host offers and lacks for hpvc: accelerator (KVM or TCG), NUMA,"
        " hugepages, cgroups, bfq, network devices and the tools later commands need,"
        " each with a fix hint.",
    ),
    "topology": ("topology", "Show the host's topology as hpvc sees it."),
    "plan": (
        "plan",
        "Plan a cluster: pin vCPUs, map guest NUMA cells, count hugepages, give addresses.",
    ),
    "render": (
        "render",
        "Render a cluster: libvirt domain XML, QEMU command, OCI config.json, hostfile.",
    ),
    "gc": ("cluster", "Remove what hpvc left on this host that no cluster here owns any more."),
    "up": ("cluster", "Bring a cluster up on this host: plan, then start every node."),
    "ls": ("cluster", "List the clusters on this host."),
    "status": ("cluster", "Nodes, states, IPs, CPUs and limits, read back from the kernel."),
    "exec": ("cluster", "Run a command inside one node."),
    "console": (
        "cluster",
        "Open an interactive login shell in one node (hpvc exec -it with root's shell).",
    ),
    "run": (
        "cluster",
        "Launch an MPI job over the cluster's compute nodes, one rank per vCPU.",
    ),
    "jobs": (
        "jobs",
        "List the MPI jobs hpvc run --detach started in a cluster; show or wait for one.",
    ),
    "scale": ("cluster", "Add or remove nodes while the cluster runs."),
    "restart": ("restart", "Bring back nodes whose container or VM died."),
    "migrate": (
        "migrate",
        "Move a running VM node to a new place, live (its guest keeps running).",
    ),
    "down": ("cluster", "Stop the cluster and remove everything it made on this host."),
    "checkpoint": (
        "checkpoint",
        "Save a whole running cluster as files, one consistent cut: list, show, remove them.",
    ),
    "restore": (
        "checkpoint",
        "Bring a checkpointed cluster back and let it run on from where it was.",
    ),
    "image": ("image", "Build, import, list and remove node images."),
    "bench": (
        "bench",
        "Benchmarks that back hpvc's claims; each writes results.json and report.md.",
    ),
    "node": (
        "node",
        "Node-level commands for Slurm jobs (called by the hpvc SPANK plugin).",
    ),
    "spark": (
        "spark",
        "Run Spark applications on a Spark virtual cluster (spec \\[spark], docs/spark.md).",
    ),
    "serve": ("serve", "Keep hpvc loaded on this host: commands start from a warm fork."),
    "io": (
        "io",
        "Share storage bandwidth among clusters by priority and demand; show who gets and uses"
        " how much.",
    ),
}


def load(name: str) -> Command:
    """The real command ``name``: import its module and build it with typer."""
    module = importlib.import_module(f"hpvc.cli.{COMMANDS[name][0]}")
    sub = typer.Typer()
    module.register(sub)
    group = typer.main.get_group(sub)
    return group.commands[name]


class LazyGroup(TyperGroup):
    """The root group: commands are loaded when named, summarised otherwise."""

    def list_commands(self, ctx: Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: Context, cmd_name: str) -> Command | None:
        cmd = self.commands.get(cmd_name)
        if cmd is None and cmd_name in COMMANDS:
            # Help listings only; resolve_command loads the real one first.
            cmd = TyperCommand(cmd_name, help=COMMANDS[cmd_name][1])
        return cmd

    def resolve_command(
        self, ctx: Context, args: list[str]
    ) -> tuple[str | None, Command | None, list[str]]:
        if args and args[0] in COMMANDS and args[0] not in self.commands:
            self.add_command(load(args[0]), args[0])
        try:
            return super().resolve_command(ctx, args)
        except UsageError as e:
            # typer suggests only among loaded commands: suggest among all.
            close = difflib.get_close_matches(args[0], COMMANDS) if args else []
            if close and "Did you mean" not in e.message:
                e.message = f"{e.message.rstrip('.')}. Did you mean {close[0]!r}?"
            raise


app = typer.Typer(
    name="hpvc",
    cls=LazyGroup,
    help=(
        "High Performance Virtual Clusters: describe a cluster in one spec file and run it"
        " as tuned VMs or containers.\n\n"
        "Examples:\n\n"
        "  hpvc doctor\n\n"
        "  hpvc topology --json\n\n"
        "  hpvc plan examples/small.toml\n\n"
        "  hpvc up examples/small.toml && hpvc ls\n\n"
        "  hpvc render examples/cluster.toml --out build/demo"
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks for errors."),
) -> None:
    state.debug = debug
