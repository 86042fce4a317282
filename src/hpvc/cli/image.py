"""``hpvc image build|import|ls|inspect|rm``: root filesystems for the nodes, stored by content."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from hpvc.cli.common import console, err_console, print_json
from hpvc.cli.listings import human_size, show_images
from hpvc.cli.listings import image_os as _os
from hpvc.cli.listings import with_os as _with_os
from hpvc.image import (
    DEFAULT_MIRROR,
    DEFAULT_PACKAGES,
    DEFAULT_SUITE,
    Image,
    build_image,
    oci,
    remove_image,
    resolve_image,
)
from hpvc.image import Store as ImageStore
from hpvc.image.extras import EXTRAS, preset_extras
from hpvc.image.model import split_packages

image_app = typer.Typer(
    help=(
        "Build, import, list and remove node images.\n\n"
        "Built images are Debian root filesystems made by debootstrap,"
        " stored by the digest of their recipe (suite, packages, mirror) so an identical"
        " rebuild is instant. Imported images come from OCI/Docker images or root"
        " filesystems, stored by the digest of their config, their layers shared.\n\n"
        "Examples:\n\n"
        "  hpvc image build hpc\n\n"
        "  hpvc image import mine docker-archive:mine.tar\n\n"
        "  hpvc image ls\n\n"
        "  hpvc image rm hpc"
    ),
    no_args_is_help=True,
)

BUILD_HELP = f"""Build the image NAME (or reuse an identical build at once) and point NAME at it.

The rootfs is `debootstrap --variant=minbase` of Debian {DEFAULT_SUITE} with the
default packages ({",".join(DEFAULT_PACKAGES)}) plus any given with
--packages. Needs root and debootstrap; downloads are cached in
/var/cache/hpvc/debootstrap. The store is $HPVC_IMAGE_DIR, else
/var/lib/hpvc/images.

--suite builds another Debian release (bullseye, trixie, ...): one the mirror
serves, this host's debootstrap has a script for and its debian-archive-keyring
can verify; any other is refused before anything is written, naming those
that build. The default packages are {DEFAULT_SUITE}'s names: a suite that
lacks one (bullseye has no hpcc, trixie no libopenmpi3) stops within seconds,
naming it, with the --no-defaults --packages line that leaves it out.

Extras are pinned software installed after debootstrap
({", ".join(f"{e.name}: {e.about}" for e in EXTRAS.values())}). The name
`spark` alone builds the Spark image: the default packages plus the
spark-3.5.3 extra, the Java it needs and the NFS server a VM cluster's shared
directory needs (nfs-ganesha, nfs-ganesha-vfs, rpcbind). Spark is fetched once
with pip into /var/cache/hpvc/spark; the TeraSort jar is compiled with the
host's openjdk-17-jdk-headless.

Examples:

  hpvc image build hpc

  hpvc image build spark

  hpvc image build analytics --extras spark-3.5.3

  hpvc image build tools --packages strace,gdb

  hpvc image build bare --packages busybox --no-defaults

  hpvc image build old --suite bullseye --no-defaults --packages mpich,procps

  hpvc image build hpc --mirror http://ftp.de.debian.org/debian --force --json
"""

IMPORT_HELP = f"""Import SOURCE as the image NAME (or reuse it at once when already stored).

SOURCE is one of {oci.SOURCE_HELP}. skopeo copies the image into the store
(each layer stored once, shared by every image that has it) and umoci unpacks
it; a root filesystem becomes a one-layer image. The image's own userland runs
in its nodes, containers or VMs: a container node needs only /bin/sh and sleep
in it, a VM node nothing (hpvc adds its init beside the image's files). Its Env
and WorkingDir apply to `hpvc exec`, `hpvc run` and Slurm tasks. Needs root
(the site vets the images its users run), skopeo and umoci.

Examples:

  podman save -o mine.tar localhost/mine && hpvc image import mine docker-archive:mine.tar

  hpvc image import mine podman:localhost/mine:latest

  hpvc image import lab oci:/srv/images/lab:v2

  hpvc image import tiny ./rootfs.tar.gz
"""

INSPECT_HELP = """Show the image NAME: suite or source, os, digest, size, layers, config.

The os is the image's own os-release PRETTY_NAME, e.g. Debian GNU/Linux 11 (bullseye).

Examples:

  hpvc image inspect mine

  tar -C "$(hpvc image inspect hpc --rootfs)" -c . | podman import - localhost/mine
"""

LS_HELP = """List the images in the store: name, digest, os, size, created, contents or source.

Examples:

  hpvc image ls

  hpvc image ls --json
"""

RM_HELP = """Remove the image NAME. Its rootfs is deleted when no other name points to it.

Refused, naming the clusters, while a cluster that exists (hpvc ls) has
nodes made from the image's digest; an imported image's layers are deleted
when no other image uses them.

Examples:

  hpvc image rm tools
"""


@contextmanager
def _spinner(name: str) -> Iterator[Callable[[str], None]]:
    """A progress callback: a spinner with the current step and elapsed time on a
    terminal; elsewhere (logs, CI) one line each time the kind of step changes."""
    if err_console.is_terminal:
        columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
        with Progress(*columns, console=err_console, transient=True) as bar:
            task = bar.add_task(f"image {name}: starting", total=None)
            yield lambda step: bar.update(task, description=f"image {name}: {step}")
        return
    started = time.monotonic()
    last = [""]

    def plain(step: str) -> None:
        kind = step.split(" ", 1)[0]
        if kind != last[0]:
            last[0] = kind
            err_console.print(f"[{time.monotonic() - started:5.1f}s] {step}", markup=False)

    yield plain


def _packages(packages: str | None, no_defaults: bool) -> list[str] | None:
    if packages is None:
        if no_defaults:
            raise typer.BadParameter("--no-defaults needs --packages", param_hint="--packages")
        return None
    extra = split_packages(packages)
    return extra if no_defaults else [*DEFAULT_PACKAGES, *extra]


@image_app.command("build", help=BUILD_HELP)
def build_cmd(
    name: str = typer.Argument(..., help="Image name, e.g. hpc."),
    packages: str | None = typer.Option(
        None, "--packages", help="Extra Debian packages, comma-separated. Example: strace,gdb"
    ),
    no_defaults: bool = typer.Option(
        False, "--no-defaults", help="Include only the --packages, not the default set."
    ),
    extras: str | None = typer.Option(
        None, "--extras", help="Pinned extras, comma-separated. Example: spark-3.5.3"
    ),
    suite: str = typer.Option(
        DEFAULT_SUITE, "--suite", help="Debian release to build. Example: bullseye"
    ),
    mirror: str = typer.Option(DEFAULT_MIRROR, "--mirror", help="Debian mirror URL."),
    force: bool = typer.Option(False, "--force", help="Rebuild even if an identical image exists."),
    store: Path | None = typer.Option(None, "--store", help="Image store directory."),
    as_json: bool = typer.Option(False, "--json", help="Print the image as JSON."),
) -> None:
    with _spinner(name) as progress:
        image = build_image(
            name,
            _packages(packages, no_defaults),
            store=store,
            mirror=mirror,
            suite=suite,
            force=force,
            progress=progress,
            extras=[*preset_extras(name), *split_packages(extras or "")],
        )
    if as_json:
        print_json(_with_os(image))
        return
    how = "reused" if image.reused else f"built in {image.build_seconds:.0f} s"
    console.print(
        f"image {image.name}: {image.short_digest}, {human_size(image.size_bytes)}, {how}",
        markup=False,
    )
    console.print(f"os: {_os(image)}", markup=False)
    console.print(f"rootfs: {image.rootfs}", markup=False)


@image_app.command("ls", help=LS_HELP)
def ls_cmd(
    store: Path | None = typer.Option(None, "--store", help="Image store directory."),
    as_json: bool = typer.Option(False, "--json", help="Print the images as JSON."),
) -> None:
    show_images(store, as_json)


@image_app.command("import", help=IMPORT_HELP)
def import_cmd(
    name: str = typer.Argument(..., help="Image name, e.g. mine."),
    source: str = typer.Argument(..., help="Where the image is, e.g. docker-archive:mine.tar"),
    store: Path | None = typer.Option(None, "--store", help="Image store directory."),
    as_json: bool = typer.Option(False, "--json", help="Print the image as JSON."),
) -> None:
    from hpvc.cluster.images import in_use
    from hpvc.image.importer import import_image

    with _spinner(name) as progress:
        image = import_image(
            name, source, store=store, progress=progress, in_use=in_use(images=ImageStore(store))
        )
    if as_json:
        print_json(image.as_dict())
        return
    how = "reused" if image.reused else f"imported in {image.build_seconds:.1f} s"
    console.print(
        f"image {image.name}: {image.short_digest}, {human_size(image.size_bytes)},"
        f" {len(image.layers)} layers, {how}",
        markup=False,
    )
    console.print(f"rootfs: {image.rootfs}", markup=False)


def describe(image: Image, store: ImageStore) -> dict[str, Any]:
    """What ``inspect`` shows: the image, and for each layer the other images using it."""
    doc = _with_os(image)
    if image.imported:
        users = store.blob_users()
        doc["layers"] = [
            {
                "digest": d,
                "size": n,
                "shared_with": sorted(
                    {u for u in users.get(d.removeprefix("sha256:"), []) if image.name not in u}
                ),
            }
            for d, n in image.layers
        ]
    return doc


@image_app.command("inspect", help=INSPECT_HELP)
def inspect_cmd(
    name: str = typer.Argument(..., help="Image name."),
    store: Path | None = typer.Option(None, "--store", help="Image store directory."),
    rootfs: bool = typer.Option(False, "--rootfs", help="Print only its root filesystem's path."),
) -> None:
    image = resolve_image(name, store)
    if rootfs:
        console.print(str(image.rootfs), markup=False, soft_wrap=True)
        return
    print_json(describe(image, ImageStore(store)))


@image_app.command("rm", help=RM_HELP)
def rm_cmd(
    name: str = typer.Argument(..., help="Image name."),
    store: Path | None = typer.Option(None, "--store", help="Image store directory."),
) -> None:
    from hpvc.cluster.images import in_use

    removed = remove_image(name, store, in_use=in_use(images=ImageStore(store)))
    if removed.deleted:
        console.print(f"removed {name} ({removed.digest[:12]}, rootfs deleted)", markup=False)
    else:
        kept = ", ".join(removed.kept_for) or "in use"
        console.print(f"removed {name} ({removed.digest[:12]} kept: {kept})", markup=False)


def register(app: typer.Typer) -> None:
    """Add ``image`` to the app."""
    app.add_typer(image_app, name="image")
