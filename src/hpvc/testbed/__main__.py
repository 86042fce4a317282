"""``python -m hpvc.testbed``: the test beds' fabric for scripts (scripts/slurm/up.sh, down.sh).

    python -m hpvc.testbed fabric --journal J --bridge B [--address A/N] [--mtu M]
                                  --port NETNS ADDRESS [--port ...]
    python -m hpvc.testbed undo --journal J

``fabric`` undoes what ``J`` still holds (a fabric of an earlier start, gone with a
reboot or half there), then makes each port's namespace and wires it to the bridge
(``hpvc.testbed.fabric``), in the namespace this runs in; the veth's end on the
bridge is named after the port's namespace. ``undo`` removes what ``J`` made. Not
an ``hpvc`` command: a test bed is no part of a site's hpvc. Exit 1 with one line
on stderr when something fails.
"""

from __future__ import annotations

import argparse
import ipaddress
import sys
from pathlib import Path

from hpvc.errors import HpvcError
from hpvc.host.journal import Journal
from hpvc.testbed import fabric


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m hpvc.testbed")
    sub = p.add_subparsers(dest="op", required=True)
    f = sub.add_parser("fabric", help="make a private fabric (bridge, namespaces, veths)")
    f.add_argument("--journal", required=True, type=Path)
    f.add_argument("--bridge", required=True)
    f.add_argument("--address", default="", help="the bridge's own, ADDRESS/PREFIXLEN")
    f.add_argument("--mtu", type=int, default=fabric.FABRIC_MTU)
    f.add_argument("--port", nargs=2, action="append", metavar=("NETNS", "ADDRESS"), default=[])
    u = sub.add_parser("undo", help="remove what a fabric journal made")
    u.add_argument("--journal", required=True, type=Path)
    return p


def _undo(journal: Path) -> None:
    """Undo ``journal`` (removed once nothing is left in it; no file: nothing to do)."""
    errors = Journal(journal).undo_all()
    if errors:
        raise HpvcError(f"fabric journal {journal}", errors[0], "the journal keeps what is left")


def _fabric(args: argparse.Namespace) -> None:
    prefixlen = fabric.PREFIXLEN
    address = ""
    if args.address:
        iface = ipaddress.ip_interface(args.address)
        address, prefixlen = str(iface.ip), iface.network.prefixlen
    ports = tuple(fabric.Port(netns=ns, ifname=ns, address=a) for ns, a in args.port)
    fab = fabric.Fabric(args.bridge, ports, address, args.mtu, prefixlen)
    fabric.check(fab)
    _undo(args.journal)
    journal = Journal(args.journal)
    fabric.make_namespaces(journal, (p.netns for p in ports))
    fabric.build(journal, fab)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.op == "fabric":
            _fabric(args)
        else:
            _undo(args.journal)
    except (HpvcError, ValueError) as e:
        line = e.line() if isinstance(e, HpvcError) else str(e)
        sys.stderr.write(f"hpvc.testbed {args.op}: {line}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
