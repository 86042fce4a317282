"""``hpvc bench network``: the cluster network across hosts against the fabric."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from hpvc.bench import common
from hpvc.bench.network import report as network_report
from hpvc.bench.network import runner as network
from hpvc.cli.common import console, err_console, print_json

NETWORK_HELP = """The cluster network across hosts against the fabric (root, iperf3, sockperf).

Builds two hosts apart on a private fabric out of network namespaces (a
bridge with MTU 9000), joins a cluster network across them with hpvc's VXLAN
code, one node per host, and measures in one run, the two pairs alternated
every repetition: TCP bandwidth (iperf3, one stream) and TCP latency
(sockperf ping-pong, 64 B) from node to node over the cluster network and
from host to host directly over the fabric. Reports min/median/max per side
and the ratios node/fabric paired per repetition. Goals: bandwidth >= 0.90
of the fabric's, latency <= 1.2x. Everything made is undone at the end.
Each repetition takes about 4 x --seconds. As on two machines, each host's
kernel receive work runs on that host's CPU (RPS on its fabric interface);
--rx-on-sender leaves it on the sending CPU (a veth's default). Bridge
netfilter (br_netfilter) is off on the test bed's bridges, as on a compute
host without Docker or Kubernetes; --bridge-netfilter measures with it on.

Examples:

  hpvc bench network

  hpvc bench network --bridge-netfilter --out /tmp/network-brnf

  hpvc bench network --repeat 10 --seconds 10 --out /tmp/network --json
"""


def network_cmd(
    repeat: int = typer.Option(5, min=1, help="Repetitions (each measures both pairs)."),
    seconds: int = typer.Option(5, min=1, help="Length of every iperf3 and sockperf run."),
    out: Path = typer.Option(Path("bench/results/network"), help="Where results go."),
    as_json: bool = typer.Option(False, "--json", help="Print results.json to stdout."),
    bridge_netfilter: bool = typer.Option(
        False,
        "--bridge-netfilter",
        help="Bridged frames through the IP firewall hooks (as on a Docker host).",
    ),
    rx_on_sender: bool = typer.Option(
        False,
        "--rx-on-sender",
        help="Leave each packet's receive work on the sending CPU (no RPS).",
    ),
) -> None:
    doc = network.run(
        repeat,
        seconds,
        progress=_progress,
        bridge_netfilter=bridge_netfilter,
        steer_rx=not rx_on_sender,
    )
    common.write_results(out, doc, network_report.report_md(doc))
    if as_json:
        print_json(doc)
        return
    t = Table(title=f"cluster network vs fabric, {repeat} repetitions of {seconds} s")
    for col in ("metric", "unit", "fabric min/median/max", "node min/median/max"):
        t.add_column(col)
    t.add_column("node/fabric min/median/max")
    for key, r in doc["rows"].items():
        ratio = r["ratio"]
        t.add_row(
            key,
            r["unit"],
            *(
                f"{r[s]['min']:.3g} / {r[s]['median']:.3g} / {r[s]['max']:.3g}"
                for s in network_report.SIDES
            ),
            f"{ratio['min']:.3f} / {ratio['median']:.3f} / {ratio['max']:.3f}" if ratio else "n/a",
        )
    console.print(t)
    for g in doc["goals"]:
        verdict = "met" if g["met"] else "NOT met"
        console.print(f"goal ({g['what']}, median): {verdict}")
    console.print(f"results: {out / 'results.json'}, report: {out / 'report.md'}")


def _progress(msg: str) -> None:
    err_console.print(f"[dim]{msg}[/dim]")


def register(app: typer.Typer) -> None:
    app.command("network", help=NETWORK_HELP)(network_cmd)
