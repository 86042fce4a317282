"""``hpvc spark``: run Spark applications on a Spark virtual cluster (docs/spark.md)."""

from __future__ import annotations

import subprocess

import typer

from hpvc.cli.common import console, err_console, print_json
from hpvc.cluster import ops, spark
from hpvc.cluster import spark_jobs as jobs

spark_app = typer.Typer(
    help="Run Spark applications on a Spark virtual cluster (spec \\[spark], docs/spark.md).",
    no_args_is_help=True,
)

SUBMIT_HELP = """Run a Spark application from the cluster's head node.

spark-submit runs in the head (client mode) against the cluster's master;
APP is a jar or Python file as the nodes see it (put it in the shared
directory, e.g. /shared/app.jar), or `terasort` for the TeraSort jar of the
Spark image. Its output comes to this terminal; the exit status is the
application's. Event logs go to the shared directory (spark/events).

Examples:

  hpvc spark submit demo /shared/app.jar --class org.example.Main -- in out

  hpvc spark submit demo terasort -- gen 671089 /shared/tera/in

  hpvc spark submit demo /opt/spark/examples/src/main/python/pi.py --conf spark.cores.max=2
"""

TERASORT_HELP = """Generate, sort and validate SIZE of TeraSort records on the cluster.

Records are 100 bytes with 10-byte keys (the sort benchmark's); validation
checks the order and that the sorted data's checksum equals the generated
data's. The data lives in DIR (default the shared directory's
spark/terasort), which every worker must see. The three steps run as one
Spark application (the driver and executors start once); each step's time
is its own, and the total is the whole command's, Spark's start included.

Examples:

  hpvc spark terasort demo --size 64MiB

  hpvc spark terasort demo --size 1GiB --dir /shared/tera --json
"""


def _progress(msg: str) -> None:
    err_console.print(f"[dim]{msg}[/dim]")


@spark_app.command("submit", help=SUBMIT_HELP)
def submit_cmd(
    name: str = typer.Argument(..., help="Cluster name."),
    app: str = typer.Argument(..., help="The application, as the nodes see it, or `terasort`."),
    args: list[str] = typer.Argument(None, help="The application's arguments (after --)."),
    cls: str = typer.Option(None, "--class", help="Main class of a jar."),
    conf: list[str] = typer.Option(None, "--conf", help="A Spark setting KEY=VALUE (repeatable)."),
) -> None:
    settings = jobs.parse_conf(conf or [])
    plan = jobs.spark_plan(name)
    app_path, app_cls = jobs.resolve_app(app, cls)
    assert plan.spark is not None
    jobs.check_app(name, plan, app_path)
    err_console.print(
        f"[dim]spark: master {plan.spark.url}, UI {plan.spark.ui}, logs and event logs in"
        f" {spark.spark_dir(plan)} (host: {jobs.host_spark_dir(name)})[/dim]"
    )
    argv = spark.submit_argv(plan, app_path, list(args or []), cls=app_cls, conf=settings)
    rc = subprocess.run(ops.exec_argv(name, plan.spark.master, argv), check=False).returncode
    raise typer.Exit(rc)


@spark_app.command("terasort", help=TERASORT_HELP)
def terasort_cmd(
    name: str = typer.Argument(..., help="Cluster name."),
    size: str = typer.Option("64MiB", "--size", help="Data to sort, e.g. 64MiB, 1GiB."),
    directory: str = typer.Option(
        None, "--dir", help="Where the data goes, as the nodes see it (default: shared)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    result = jobs.terasort(name, jobs.rows_of(size), directory, progress=_progress)
    if as_json:
        print_json(result)
    else:
        console.print(
            f"terasort {result['records']} records ({result['bytes'] / (1 << 20):.0f} MiB) on"
            f" {name}: gen {result['gen_s']:.2f} s, sort {result['sort_s']:.2f} s,"
            f" validate {result['validate_s']:.2f} s ({result['wall_s']:.1f} s in all);"
            " sorted and checksum"
            f" {result['checksum']} {'matches' if result['valid'] else 'DOES NOT match'}"
        )
    if not result["valid"]:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add ``spark`` to the app."""
    app.add_typer(spark_app, name="spark")
