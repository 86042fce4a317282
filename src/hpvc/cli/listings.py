"""What ``hpvc ls``, ``hpvc image ls`` and ``hpvc node ls`` print, without typer.

Their command functions (hpvc.cli.cluster, hpvc.cli.image, hpvc.cli.node) and the quick
path in front of typer (hpvc.cli.quick) both call these, so the two ways to
run a listing print the same. This module imports neither typer nor, until
a table is drawn, rich (issue 33 item 4).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from hpvc.cli.common import console, print_json

if TYPE_CHECKING:
    from pathlib import Path

    from rich.table import Table

    from hpvc.image.model import Image


def image_text(name: str, digests: dict[str, list[str]]) -> str:
    """``mine 0123456789ab``; ``mine 0123456789ab on c-0, c-1; fedcba987654 on c-2``
    where nodes run different digests of it (hpvc.store.ClusterRecord.image_digests)."""
    if not digests:
        return f"{name} (digest not recorded)"
    if len(digests) == 1:
        return f"{name} {next(iter(digests))[:12]}"
    return f"{name} " + "; ".join(f"{d[:12]} on {', '.join(n)}" for d, n in digests.items())


def show_clusters(as_json: bool) -> None:
    """``hpvc ls``: the clusters on this host, a table or JSON."""
    from hpvc.cluster.listing import list_clusters

    rows = list_clusters()
    if as_json:
        print_json(rows)
        return
    from rich.table import Table

    t = Table(title="clusters")
    for col in ("name", "status", "kind", "nodes", "vCPUs", "subnet", "image", "age"):
        t.add_column(col)
    for r in rows:
        age = f"{time.time() - r['created']:.0f}s"
        state = f"{r['status']} (interrupted)" if r.get("interrupted") else r["status"]
        image = image_text(r["image"], r["image_digests"])
        t.add_row(r["name"], state, r["kind"], str(r["nodes"]), str(r["vcpus"]), r["subnet"],
                  image, age)  # fmt: skip
    console.print(t if rows else "no clusters")


def human_size(n: int) -> str:
    """``123456789`` -> ``117.7 MiB``."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"  # pragma: no cover


def image_os(image: Image) -> str:
    """What the image runs: its os-release's PRETTY_NAME, else its suite."""
    from hpvc.image.rootfs import os_name

    return os_name(image.rootfs) or image.suite or "unknown"


def with_os(image: Image) -> dict[str, Any]:
    return {**image.as_dict(), "os": image_os(image)}


def shared_layers(image: Image, users: dict[str, list[str]]) -> int:
    """How many of an imported image's layers other images use too (``users``:
    ``Store.blob_users``, whose owner is "name, name" of one digest)."""

    def others(digest: str) -> list[str]:
        owners = users.get(digest.removeprefix("sha256:"), [])
        return [u for u in owners if image.name not in u.split(", ")]

    return sum(1 for d, _ in image.layers if others(d))


def image_table(images: list[Image], users: dict[str, list[str]]) -> Table:
    from rich.table import Table

    t = Table(show_header=True, header_style="bold")
    for col in ("name", "digest", "os", "size", "created", "packages / source"):
        t.add_column(col, overflow="fold")
    for i in images:
        contents = ", ".join([*i.packages, *(f"+{e}" for e in i.extras)])
        if i.imported:
            contents = f"{i.source} ({len(i.layers)} layers, {shared_layers(i, users)} shared)"
        t.add_row(i.name, i.short_digest, image_os(i), human_size(i.size_bytes), i.created,
                  contents)  # fmt: skip
    return t


def show_images(store: Path | None, as_json: bool) -> None:
    """``hpvc image ls``: the images in the store, a table or JSON."""
    from hpvc.image.catalog import list_images
    from hpvc.image.store import Store

    images = list_images(store)
    users = Store(store).blob_users()
    if as_json:
        print_json([{**with_os(i), "layers_shared": shared_layers(i, users)} for i in images])
    elif images:
        console.print(image_table(images, users))
    else:
        console.print("no images (build one: hpvc image build hpc)", markup=False)


def show_shares(as_json: bool) -> None:
    """``hpvc node ls``: the Slurm jobs' shares on this host, a line each or JSON."""
    from hpvc.slurm.names import listing

    rows = listing()
    if as_json:
        print_json(rows)
        return
    if not rows:
        console.print("no Slurm job shares on this host")
    for r in rows:
        digests = " ".join(d[:12] for d in r["image_digests"]) or "digest not recorded"
        console.print(
            f"job {r['job']} share {r['share']} ({r['cluster']}): {r['status']},"
            f" nodes {', '.join(r['nodes'])}, {r['subnet']}, image {r['image']} {digests}",
            markup=False,
        )
        if "nfs" in r or "spark" in r:
            from hpvc.cluster import share_view

            console.print(f"  {share_view.text(r)}", markup=False)
