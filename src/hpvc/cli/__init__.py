"""The ``hpvc`` command line. One module per command; parse, call, print."""

from __future__ import annotations

import sys

import typer

from hpvc.cli import bench, cluster, doctor, image, node, plan, render, topology
from hpvc.cli.common import err_console, state
from hpvc.errors import HpvcError

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


for module in (doctor, topology, plan, render, image, cluster, bench, node):
    module.register(app)


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the CLI, turning HpvcError into one line and an exit code.

    Typer (standalone mode) reports usage errors itself with exit code 2 and
    lets every other exception through; ours become one line, no traceback.
    """
    try:
        app(args=sys.argv[1:] if argv is None else argv, prog_name="hpvc")
    except HpvcError as e:
        if state.debug:
            raise
        err_console.print(f"hpvc: {e.line()}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(e.exit_code)
