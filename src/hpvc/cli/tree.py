"""The whole ``hpvc`` command tree (see hpvc.cli for the entry point)."""

from __future__ import annotations

import typer

from hpvc.cli import bench, cluster, doctor, image, node, plan, render, restart, topology
from hpvc.cli.common import state

app = typer.Typer(
    name="hpvc",
    help=(
        "High Performance Virtual Clusters: describe a cluster in one spec file and run it"
        " as tuned VMs or containers.\n\n"
        "Examples:\n\n"
        "  hpvc doctor\n\n"
        "  hpvc topology --json\n\n"
        "  hpvc plan examples/small.toml\n\n"
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


for module in (doctor, topology, plan, render, image, cluster, restart, bench, node):
    module.register(app)
