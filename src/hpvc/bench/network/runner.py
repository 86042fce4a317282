"""The cluster network across hosts against the fabric: bandwidth and latency, A/B.

Two hosts apart on a private fabric (``hpvc.testbed.pair``: network
namespaces on this machine, each host's cluster bridge joined by hpvc's VXLAN
code) carry one node each. Two pairs are measured in the same run:

- ``fabric``: host A to host B directly over the fabric (MTU 9000);
- ``node``: the node on host A to the node on host B over the cluster network
  (VXLAN, node MTU 8950).

Every repetition measures the bandwidth (``iperf3 -J``, one TCP stream, the
receiver's rate) on both pairs, then the latency (``sockperf ping-pong``, TCP,
64-byte messages, median of half round trips) on both, the pair that goes
first alternating between repetitions. Host A's processes (the clients) run
pinned to one CPU and host B's (the servers) to another, as on two machines:
left to the scheduler, a ping-pong lands on one CPU or on two by chance, and
that alone moves its latency 3-4x on a small VM. The servers (one iperf3 and one
sockperf on host B and on node B) run for the whole run and are stopped by
PID at the end, also on failure. Ratios node / fabric are paired per
repetition (``network.report``); the goals: bandwidth >= 0.90 of the fabric's,
latency <= 1.2x.

Bridge netfilter (``br_netfilter``) is off in the fabric's and the hosts'
namespaces by default, as on a compute host without Docker or Kubernetes (the
module is not loaded there) and on a fabric switch; ``bridge_netfilter=True``
measures a host where it is on (every bridged frame through the IP firewall
hooks). The report states which, with the knobs as the kernel had them.

Receive work: a veth delivers on the CPU that sent, so left alone host A's CPU
would also do host B's whole receive path (and host B's CPU host A's, for the
ACKs and replies). Two machines do not share that: each NIC interrupts its own
host. So each host's fabric interface steers what it receives (RPS) to that
host's CPU, the one its processes are pinned to (``steer_rx=False``: left on
the sender's CPU, as the test bed was before). The report states which.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from hpvc.bench import common
from hpvc.bench.network import report as network_report
from hpvc.errors import HpvcError, MissingDependency
from hpvc.progress import Progress, quiet
from hpvc.testbed import pair as testbed
from hpvc.testbed.pair import Testbed

# Tool -> the Debian package that has it.
TOOLS = {
    "iperf3": "iperf3",
    "sockperf": "sockperf",
    "nsenter": "util-linux",
    "taskset": "util-linux",
    "unshare": "util-linux",
    "ip": "iproute2",
    "ss": "iproute2",
    "nft": "nftables",
}
IPERF_PORT = 5201
SOCKPERF_PORT = 11111
MESSAGE_BYTES = 64
READY_S = 10.0  # a server must listen within this
SLACK_S = 60  # a client may take this long past its --seconds


@dataclass(frozen=True)
class Pair:
    """A client namespace, a server namespace and the server's address."""

    side: str
    client: str
    server: str
    address: str
    describe: str
    client_cpu: int | None = None  # where host A's processes run (None: anywhere)
    server_cpu: int | None = None  # where host B's run

    def pinned(self, cpu: int | None, argv: list[str]) -> list[str]:
        return argv if cpu is None else ["taskset", "-c", str(cpu), *argv]


def preflight(repeat: int, seconds: int) -> None:
    if repeat < 1 or seconds < 1:
        raise HpvcError("bench network", "--repeat and --seconds must be at least 1")
    if os.geteuid() != 0:
        raise MissingDependency("bench network", "needs root (network namespaces)", "run as root")
    for tool, pkg in TOOLS.items():
        if shutil.which(tool) is None:
            raise MissingDependency("bench network", f"{tool} not found", f"apt-get install {pkg}")


def cpus() -> tuple[int | None, int | None]:
    """Host A's CPU and host B's: two of ours, as two machines each have their own."""
    mine = sorted(os.sched_getaffinity(0))
    return (mine[0], mine[1]) if len(mine) >= 2 else (None, None)


def pairs(bed: Testbed) -> dict[str, Pair]:
    a, b = bed.hosts
    ca, cb = cpus()
    return {
        "fabric": Pair(
            "fabric",
            a.netns,
            b.netns,
            b.address,
            f"host A ({a.address}) to host B ({b.address}) over the fabric"
            f" (veth + bridge, MTU {bed.fabric_mtu})",
            ca,
            cb,
        ),
        "node": Pair(
            "node",
            a.node_netns,
            b.node_netns,
            b.node_address,
            f"node on host A ({a.node_address}) to node on host B ({b.node_address}) over"
            f" the cluster network (VXLAN VNI {bed.vni}, node MTU {bed.node_mtu})",
            ca,
            cb,
        ),
    }


# --- servers ---------------------------------------------------------------------------


def _server_argv(tool: str, address: str) -> list[str]:
    if tool == "iperf3":
        return ["iperf3", "-s", "-B", address, "-p", str(IPERF_PORT)]
    return ["sockperf", "server", "--tcp", "-i", address, "-p", str(SOCKPERF_PORT)]


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop one server we started, by its PID (nsenter exec'd it: the PID is the tool's)."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


def _wait_listening(
    bed: Testbed, ns: str, port: int, proc: subprocess.Popen[bytes], log: Path
) -> None:
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            lines = log.read_text(errors="replace").strip().splitlines()
            why = lines[-1] if lines else f"exit {proc.returncode}"
            raise HpvcError(f"server on port {port} in {ns}", why)
        r = bed.run(ns, "ss", "-Hltn", f"sport = :{port}", check=False)
        if r.stdout.strip():
            return
        time.sleep(0.05)
    raise HpvcError(f"server on port {port} in {ns}", f"not listening after {READY_S:g} s")


@contextmanager
def servers(bed: Testbed, ps: dict[str, Pair], logdir: Path) -> Iterator[None]:
    """iperf3 and sockperf servers on the server side of every pair, stopped by PID."""
    procs: list[subprocess.Popen[bytes]] = []
    logs: list[IO[bytes]] = []
    try:
        for p in ps.values():
            for tool, port in (("iperf3", IPERF_PORT), ("sockperf", SOCKPERF_PORT)):
                path = logdir / f"{tool}-{p.side}.log"
                logs.append(path.open("wb"))
                proc = subprocess.Popen(
                    bed.argv(p.server, *p.pinned(p.server_cpu, _server_argv(tool, p.address))),
                    stdin=subprocess.DEVNULL,
                    stdout=logs[-1],
                    stderr=subprocess.STDOUT,
                )
                procs.append(proc)
                _wait_listening(bed, p.server, port, proc, path)
        yield
    finally:
        for proc in procs:
            _stop(proc)
        for f in logs:
            f.close()


# --- clients ---------------------------------------------------------------------------


def _client(bed: Testbed, p: Pair, argv: list[str], seconds: int) -> str:
    """Run a client in the pair's client namespace; its output (the tools report errors in it)."""
    try:
        r = bed.run(p.client, *p.pinned(p.client_cpu, argv), check=False, timeout=seconds + SLACK_S)
    except subprocess.TimeoutExpired:
        raise HpvcError(f"{argv[0]} {p.side}", f"no answer within {seconds + SLACK_S} s") from None
    return r.stdout if argv[0] == "iperf3" else r.stdout + r.stderr


def bandwidth(bed: Testbed, p: Pair, seconds: int) -> dict[str, Any]:
    argv = ["iperf3", "-c", p.address, "-p", str(IPERF_PORT), "-t", str(seconds), "-J"]
    try:
        return network_report.parse_iperf3(_client(bed, p, argv, seconds))
    except HpvcError as e:
        raise HpvcError(f"iperf3 {p.side}", e.why) from None


def latency(bed: Testbed, p: Pair, seconds: int) -> dict[str, Any]:
    argv = ["sockperf", "ping-pong", "--tcp", "-i", p.address, "-p", str(SOCKPERF_PORT)]
    argv += ["-t", str(seconds), "-m", str(MESSAGE_BYTES)]
    try:
        return network_report.parse_sockperf(_client(bed, p, argv, seconds))
    except HpvcError as e:
        raise HpvcError(f"sockperf {p.side}", e.why) from None


MEASURE = (("bandwidth", "Gbit/s", bandwidth), ("latency", "us", latency))


def repetitions(
    bed: Testbed, ps: dict[str, Pair], repeat: int, seconds: int, progress: Progress
) -> list[dict[str, Any]]:
    """Every sample: per repetition, each metric on both pairs, the first pair alternating."""
    samples: list[dict[str, Any]] = []
    for rep in range(repeat):
        order = ["fabric", "node"] if rep % 2 == 0 else ["node", "fabric"]
        for metric, unit, measure in MEASURE:
            got = []
            for i, side in enumerate(order):
                s = measure(bed, ps[side], seconds)
                samples.append(
                    {"rep": rep, "order": i, "side": side, "metric": metric, "unit": unit, **s}
                )
                got.append(f"{side} {s['value']:.3g} {unit}")
            progress(f"repetition {rep + 1}/{repeat}: {metric}: {', '.join(got)}")
    return samples


def run(
    repeat: int,
    seconds: int,
    progress: Progress = quiet,
    bridge_netfilter: bool = False,
    steer_rx: bool = True,
) -> dict[str, Any]:
    """Build the test bed, measure both pairs ``repeat`` times, undo it all; the document."""
    preflight(repeat, seconds)
    facts = common.host_facts(mpi=False)
    tools = {
        "iperf3": common.tool_version(["iperf3", "--version"]),
        "sockperf": common.tool_version(["sockperf", "--version"]).replace(",", ""),
    }
    ca, cb = cpus()
    rx_cpus = (ca, cb) if steer_rx and ca is not None and cb is not None else None
    logdir = Path(tempfile.mkdtemp(prefix="hpvc-bench-network-"))
    try:
        with testbed.two_hosts(
            tag=f"n{os.getpid() % 100000}",
            progress=progress,
            bridge_netfilter=bridge_netfilter,
            rx_cpus=rx_cpus,
        ) as bed:
            ps = pairs(bed)
            knobs = bed.bridge_netfilter_state()
            with servers(bed, ps, logdir):
                progress(f"servers up; {repeat} repetitions of {4 * seconds} s or more each")
                samples = repetitions(bed, ps, repeat, seconds, progress)
    finally:
        shutil.rmtree(logdir, ignore_errors=True)
    params = {
        "repeat": repeat,
        "seconds": seconds,
        "message_bytes": MESSAGE_BYTES,
        "tools": tools,
        "sides": {side: p.describe for side, p in ps.items()},
        "pinning": {"host_a": ps["fabric"].client_cpu, "host_b": ps["fabric"].server_cpu},
        "testbed": {
            "what": "a fabric namespace with a bridge, two host namespaces on it, one node"
            " namespace per host on the host's cluster bridge",
            "fabric_mtu": bed.fabric_mtu,
            "node_mtu": bed.node_mtu,
            "vni": bed.vni,
            "bridge_netfilter": bridge_netfilter,
            "bridge_netfilter_knobs": knobs,
            "rx_cpus": None if rx_cpus is None else {"host_a": ca, "host_b": cb},
        },
    }
    return network_report.build(facts, params, samples)
