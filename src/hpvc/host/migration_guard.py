"""Who may reach a migration target's TCP port: nftables tables on both hosts.

A VM node moved between hosts (issue 27, docs/slurm.md "Moving a VM node to
another host") travels as one TCP stream from the source QEMU to the target
QEMU, which listens on the target host's fabric address (as the share's own
uid, never root). QEMU takes the first connection it gets as the guest: a
stream from anyone else would become the node. So, for as long as the target
listens:

* on the target (``guard_target``): TCP to the port is dropped unless it
  comes from the source host's fabric address (other hosts, guests routed
  through this host, and this host's own users are dropped);
* on the source (``guard_source``): TCP to the target's address and port is
  dropped unless the socket's owner is the source QEMU's uid (the share's
  own: no other user's process, which could otherwise connect first from the
  same address) or root; nothing routed through the source (a guest's
  packets) may go there either.

The rules' text is pure (``target_rules``, ``source_rules``; unit-tested);
``nft -f -`` applies it (``hpvc.host.nftables``, shared with host/vxlan.py).
Undo kind (architecture rule 5): ``"migration-guard"`` ``{table}`` deletes
the table. Architecture: docs/architecture.md (``host/``).
"""

from __future__ import annotations

from hpvc.host import nftables
from hpvc.host.journal import Args, Journal, undoer


def table_name(tag: str) -> str:
    return f"hpvc-mig-{tag}"


def _table(table: str, hook: str, rules: list[str]) -> str:
    chain = f"{{ type filter hook {hook} priority -190; policy accept; }}"
    lines = [f"add table inet {table}", f"add chain inet {table} {hook} {chain}",
             f"flush chain inet {table} {hook}"]  # fmt: skip
    return "\n".join([*lines, *(f"add rule inet {table} {hook} {r}" for r in rules)]) + "\n"


def target_rules(table: str, address: str, port: int, source: str) -> str:
    """The target host's table: only ``source`` reaches ``address``:``port``."""
    into = f"ip daddr {address} tcp dport {port}"
    return _table(table, "input", [f"{into} ip saddr != {source} counter drop"])


def source_rules(table: str, target: str, port: int, uid: int) -> str:
    """The source host's table: only ``uid`` (and root) connects to ``target``:``port``."""
    to = f"ip daddr {target} tcp dport {port}"
    out = _table(table, "output", [f"{to} meta skuid != {{ 0, {uid} }} counter drop"])
    fwd = _table(table, "forward", [f"{to} counter drop"])
    return out + "".join(line + "\n" for line in fwd.splitlines() if "add table" not in line)


def _apply(journal: Journal, table: str, text: str) -> None:
    nft = nftables.find("migration between hosts")
    journal.record("migration-guard", table=table)
    nftables.load(nft, table, text)


def guard_target(journal: Journal, tag: str, address: str, port: int, source: str) -> str:
    table = table_name(tag)
    _apply(journal, table, target_rules(table, address, port, source))
    return table


def guard_source(journal: Journal, tag: str, target: str, port: int, uid: int) -> str:
    table = table_name(tag)
    _apply(journal, table, source_rules(table, target, port, uid))
    return table


def remove(table: str) -> None:
    nftables.delete(table)


@undoer("migration-guard")
def _undo_guard(args: Args) -> None:
    remove(str(args["table"]))
