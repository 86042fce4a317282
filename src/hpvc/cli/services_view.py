"""How ``hpvc status`` shows what a cluster serves itself: its shared directory
(a host folder, or NFS from one of its nodes, with each node's mount) and Spark
(the master and the workers it reports alive)."""

from __future__ import annotations

from typing import Any

from hpvc.cli.common import console


def show_services(st: dict[str, Any]) -> None:
    """The shared directory and Spark, as status read them back."""
    sh = st.get("shared_dir")
    if sh and sh.get("server") == "nfs":
        use = _use(sh)
        bad = {n: h for n, h in sh.get("mounts", {}).items() if h != "ok"}
        console.print(
            f"shared {sh['path']}: NFS {sh['export']} from {sh['node']}, {use}"
            + (f"; [red]{'; '.join(f'{n}: {h}' for n, h in bad.items())}[/red]" if bad else
               f", mounted on {len(sh.get('mounts', {}))} node(s)")
        )  # fmt: skip
    elif sh and sh.get("host"):
        console.print(f"shared {sh.get('path', '/shared')}: host folder {sh['host']}, {_use(sh)}")
    sp = st.get("spark")
    if sp:
        if "error" in sp:
            console.print(f"[red]spark {sp['master']}: {sp['error']}[/red]")
        else:
            ws = ", ".join(f"{w['host']} ({w['cores']} cores, {w['memory_mib']} MiB)"
                           for w in sp["workers"])  # fmt: skip
            console.print(
                f"spark {sp['master']} ({sp['master_status']}), UI {sp['ui']}:"
                f" {len(sp['workers'])} of {sp['planned_workers']} workers alive: {ws or '-'}"
            )


def _use(sh: dict[str, Any]) -> str:
    if "size_bytes" not in sh:
        return "size unknown"
    gib = 1 << 30
    return f"{sh['used_bytes'] / gib:.2f} of {sh['size_bytes'] / gib:.2f} GiB used"
